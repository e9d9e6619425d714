"""The argument groups the scripts share, so that evaluate.py, predict.py, export.py and visualize_attention.py
name a model the same way:

    --checkpoint DIR                      a train.py checkpoint folder (best/, last/)
    --model NAME [--pretrained]           a model by name with its weights by name (hub cache, vit/hub/names.py)
    --model NAME --weights FILE           a model by name with the weights of a timm / HF-timm file

`--pretrained` is the explicit spelling of what `--model NAME` alone means, in every script. `parse_command` is
the one front-end of the commands that take a model: arguments, --aug.* (and --data.*) overrides, counts, the model
source; `load_model` turns the parsed source into vit.eval.inference.load_model_and_config's plain arguments.
Standard library only at import: the scripts build their parsers before torch loads (--help).
"""

from __future__ import annotations

import argparse

__all__ = ["add_model_source", "add_zero_shot_inputs", "check_model_source", "parse_command", "model_source",
           "load_model"]


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
        src.add_argument("--openvino", metavar="PATH", help="a model.xml written by export.py --format openvino, or "
                         "its folder: the same rows as --onnx, on OpenVINO's CPU runtime; no torch")
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
    args.pretrained for a --model without --weights. An --onnx (--openvino) file is checked by the ONNX predictor."""
    if getattr(args, "onnx", None) or getattr(args, "openvino", None) or getattr(args, "clip", None):
        return
    if args.checkpoint:
        given = [f"--{k.replace('_', '-')}" for k in ("pretrained", "weights", "img_size") if getattr(args, k, None)]
        if given:
            raise ValueError(f"{given[0]} goes with --model NAME; a --checkpoint folder brings its own weights and "
                             "size: drop it.")
        return
    args.pretrained = not args.weights


def parse_command(parser: argparse.ArgumentParser, argv: list[str], script: str, overrides: tuple[str, ...] = ("aug.",),
                  counts: tuple[str, ...] = (), out: str = "out", intermixed: bool = False) -> tuple[argparse.Namespace,
                                                                                                   dict]:
    """(arguments, config overrides) of a command that takes a model: `argv` parsed, what is left read as
    --key=value overrides of the config sections in `overrides` only (ConfigError naming the first other), the
    `counts` at least 1 and --`out` not a file (vit.cli.runtime.check_options), then the model source checked."""
    from vit.config import ConfigError, parse_overrides

    from .runtime import check_options

    args, rest = (parser.parse_known_intermixed_args if intermixed else parser.parse_known_args)(argv)
    found = parse_overrides(rest)
    bad = [k for k in found if not k.startswith(overrides)]
    if bad:
        sections = " and ".join(f"--{s}*" if s.endswith(".") else f"--{s}" for s in overrides)
        note = " (the preprocessing)" if overrides == ("aug.",) else ""
        raise ConfigError(f"{script} takes only {sections} overrides{note}, not --{bad[0]}.")
    check_options(args, counts, out=out)
    check_model_source(args)  # after the counts: --img-size 0 is named as a count first
    return args, found


def model_source(args: argparse.Namespace) -> dict:
    """The parsed --checkpoint | --model NAME [--pretrained | --weights FILE] --img-size [--dynamic-img-size] as
    vit.eval.inference.load_model_and_config's keywords."""
    return dict(checkpoint=args.checkpoint, model_name=args.model, weights=args.weights,
                pretrained=getattr(args, "pretrained", True), img_size=args.img_size,
                dynamic_img_size=bool(getattr(args, "dynamic_img_size", False)))


def load_model(args: argparse.Namespace, overrides: dict):
    """(model, config, class names or None) for the parsed model source, printing what load_model_and_config
    says it loaded."""
    from vit.eval import inference

    model, cfg, classes, lines = inference.load_model_and_config(**model_source(args), overrides=overrides)
    for line in lines:
        print(line)
    return model, cfg, classes
