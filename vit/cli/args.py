"""The argument groups the scripts share, so that evaluate.py, predict.py, export.py and visualize_attention.py
name a model the same way:

    --checkpoint DIR                      a train.py checkpoint folder (best/, last/)
    --model NAME [--pretrained]           a model by name with its weights by name (hub cache, vit/hub/names.py)
    --model NAME --weights FILE           a model by name with the weights of a timm / HF-timm file

`--pretrained` is the explicit spelling of what `--model NAME` alone means, in every script. Standard library
only: the scripts build their parsers before torch loads (--help).
"""

from __future__ import annotations

import argparse

__all__ = ["add_model_source", "add_zero_shot_inputs", "check_model_source"]


def add_model_source(ap: argparse.ArgumentParser, img_size_help: str = "input size for --model (default: the "
                     "weights' own, else 224)", onnx: bool = False, clip: bool = False) -> None:
    """Add --checkpoint | --model NAME [--pretrained | --weights FILE] and --img-size to `ap`; with `onnx`, also
    --onnx FILE (predict.py: an export.py model run without torch); with `clip`, also --clip NAME (a CLIP /
    SigLIP model for zero-shot classification, vit.eval.zero_shot)."""
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a checkpoint folder written by train.py (best/ or last/)")
    src.add_argument("--model", help="a model name (vit_base_patch16_224, a .tag, hf-hub:org/repo, "
                     "local-dir:/folder): its weights by name, or with --weights those of a file")
    if onnx:
        src.add_argument("--onnx", help="a model.onnx written by export.py (preprocessing.json beside it); no torch")
    if clip:
        src.add_argument("--clip", metavar="NAME", help="a CLIP / SigLIP model (hf-hub:org/repo, local-dir:/folder) "
                         "classifying zero-shot into --classes")
    weights = ap.add_mutually_exclusive_group()
    weights.add_argument("--pretrained", action="store_true",
                         help="--model's weights by name from the hub cache (what --model alone means)")
    weights.add_argument("--weights", help="timm / HF-timm weights file (.safetensors, .pth, .bin) for --model")
    ap.add_argument("--img-size", type=int, default=None, help=img_size_help)


def add_zero_shot_inputs(ap: argparse.ArgumentParser, classes_note: str = "") -> None:
    """--classes and --templates for --clip (predict.py, evaluate.py; vit.eval.zero_shot.class_names reads them),
    with the rule that tells a path from names; `classes_note`: what the script adds about the folder."""
    ap.add_argument("--classes", metavar="DIR_OR_LIST", help="--clip: class names: a folder (its class subfolders"
                    f"{classes_note}), a file of names (one a line; .json: a list, as classes.json) or names separated "
                    "by commas ('cat,dog'). A value with a '/' or ending in .txt, .lst, .csv or .json, or naming "
                    "an existing file or folder, is a path and must be a readable folder or regular file; anything "
                    "else is names, however long")
    ap.add_argument("--templates", metavar="FILE", help="--clip: prompt templates, a file with one per line, {} "
                    "where the class goes (default: a short set of our own, vit/eval/zero_shot.py)")


def check_model_source(args: argparse.Namespace) -> None:
    """One sentence (ValueError) for --pretrained, --weights or --img-size without --model; sets
    args.pretrained for a --model without --weights. An --onnx file is checked by the ONNX predictor."""
    if getattr(args, "onnx", None) or getattr(args, "clip", None):
        return
    if args.checkpoint:
        given = [f"--{k.replace('_', '-')}" for k in ("pretrained", "weights", "img_size") if getattr(args, k, None)]
        if given:
            raise ValueError(f"{given[0]} goes with --model NAME; a --checkpoint folder brings its own weights and "
                             "size: drop it.")
        return
    args.pretrained = not args.weights
