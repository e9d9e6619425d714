"""Label images that have no labels: top-k classes and probabilities per image, in input order.

    python predict.py --checkpoint runs/default/best photos/ "more/*.jpg" list.txt       # files, folders, globs
    python predict.py --model vit_base_patch16_224 --weights vit_b16.safetensors img.jpg --topk 5
    python predict.py --checkpoint runs/x/best photos/ --format jsonl --cam --out preds/
    accelerate launch --multi_gpu --num_processes 2 predict.py --checkpoint ... photos/  # one row per image
    python predict.py --onnx exported/model.onnx photos/        # ONNX Runtime, no PyTorch needed (see below)
    python predict.py --openvino exported/ photos/              # its OpenVINO IR (model.xml), no PyTorch either

IMAGES are files, folders (searched recursively), globs, or text files (.txt, .lst) listing paths one a line.
A text checkpoint (train.py with data.dataset text_csv) labels sentences instead: its inputs are text files, one
sentence a line, or CSV files (their data.text_column column); each row names its file:line and the text.
Images go through the model's evaluation preprocessing (evaluate.py's: resize, centre crop, its mean and std).
An anomaly checkpoint (one whose folder holds anomaly/, written by anomaly.py fit) adds to every row its anomaly
score and verdict (defect at or above the threshold saved with the bank, good below; empty without one), and with
--cam its heat map, cam/<index>_<name>_anomaly.png; --onnx does the same from the export's anomaly/ folder.
Writes to --out (default: predictions/): predictions.csv (or .json / .jsonl), skipped.csv (every input passed
over, with the reason; a broken file never stops the run) and, with --cam, cam/<input index>_<name>.png: the
attention-rollout overlay of each image, named in its row.

A segmentation checkpoint (train.py with data.dataset segmentation) writes masks/<index>_<name>.png (a palette PNG,
the class per pixel), overlays/ (the classes tinted over the image) and segmentation.csv (per image, each class's
area in pixels and percent); images larger than the model's input are read in sliding windows (seg.window). --onnx
on its export (segmenter.onnx, or its folder) writes the same files.

--onnx runs a file export.py wrote with ONNX Runtime and the reference preprocessing (vit/deploy/preprocess.py,
from the preprocessing.json beside the model) and writes the same files (a multi-label export: its sigmoids and
the labels at its threshold); it never imports torch, timm, accelerate or PyYAML, so it runs where only numpy,
Pillow, OpenCV and onnxruntime are installed (docs/predict-export.md). --openvino runs the OpenVINO IR export.py
--format openvino wrote (model.xml, or its folder; an anomaly/features.xml beside) on OpenVINO's CPU runtime, the
same predictor with openvino in place of onnxruntime.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.args import add_model_source, add_zero_shot_inputs
    from vit.cli.help import AUG_EPILOG, HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter,
                                 usage="%(prog)s (--checkpoint DIR | --model NAME ...) IMAGES... [options]",
                                 epilog=AUG_EPILOG)
    add_model_source(ap, onnx=True, clip=True)  # --checkpoint | --model NAME [...] | --onnx FILE | --clip NAME
    add_zero_shot_inputs(ap)  # --classes DIR_OR_LIST, --templates FILE
    ap.add_argument("images", nargs="*", help="files, folders, globs, or .txt/.lst files listing paths")
    ap.add_argument("--topk", type=int, default=5, help="classes per row")
    ap.add_argument("--format", choices=("csv", "json", "jsonl"), default="csv", help="output file format")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="images per batch (default: the config's data.eval_batch_size, else data.batch_size)")
    ap.add_argument("--num-workers", type=int, default=None,
                    help="image-decoding worker processes (default: the config's data.num_workers)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="multi-label checkpoints: the probability from which a class is predicted (default: the one "
                         "training chose on its validation split)")
    ap.add_argument("--cam", action="store_true", help="also write each image's attention-rollout overlay")
    ap.add_argument("--detector", metavar="NAME", default=None,
                    help="--checkpoint: which of its anomaly detectors scores the images (<checkpoint>/anomaly/NAME/, "
                         "anomaly.py fit --detector NAME; default: <checkpoint>/anomaly/ itself)")
    ap.add_argument("--out", default="predictions", help="output folder")
    return ap


def main_clip(args) -> int:
    """--clip: zero-shot top-k over --classes (vit.eval.zero_shot.predict_zero_shot); the same files as main()."""
    from vit.cli.images import collect_images
    from vit.cli.outputs import check_writable
    from vit.cli.predict_outputs import write_outputs
    from vit.data import DataError
    from vit.deploy.predictions import rows_for
    from vit.eval.zero_shot import predict_zero_shot

    if not args.classes:
        raise ValueError("--clip needs --classes: a folder of class subfolders, a file of names or 'cat,dog'.")
    paths, skipped = collect_images(args.images)
    if not paths:
        raise DataError("no image files given; pass image files, folders, globs or a .txt list of paths.")
    check_writable(args.out)
    classes, probs, ok = predict_zero_shot(args.clip, args.classes, paths, args.templates, args.batch_size or 64)
    skipped += [(str(p), "not readable as an image") for p, good in zip(paths, ok) if not good]
    rows = rows_for([p for p, good in zip(paths, ok) if good], probs[ok].numpy(), classes, args.topk)
    written = write_outputs(Path(args.out), args.format, rows, skipped)
    if written is None:
        raise DataError(f"none of the {len(paths)} input file(s) could be read as an image; see "
                        f"{args.out}/skipped.csv.")
    print(f"{len(rows)} image(s), {len(classes)} classes (zero-shot, {args.clip}) -> {written}")
    return 0


def run_onnx(argv: list[str]) -> int:
    """main_onnx with run_cli's contract (one line and exit 2 for a user's mistake), without vit.cli.runtime's torch."""
    try:
        args, rest = build_parser().parse_known_args(argv)
        if rest:
            raise ValueError(f"--onnx and --openvino take no config overrides ({rest[0]}): the export's "
                             "preprocessing.json "
                             "fixes the preprocessing.")
        from vit.cli.predict_outputs import main_onnx  # torch-free

        return main_onnx(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C); files already written are complete.", file=sys.stderr)
        return 130




def parse_args(argv):
    from vit.cli.args import parse_command

    return parse_command(build_parser(), argv, "predict.py", ("aug.", "seg.window"),  # seg.window: as evaluate.py
                         ("topk", "batch_size", "img_size"))


def main(argv=None) -> int:
    from vit.cli.outputs import OutputLock, check_writable

    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    if args.detector is not None and not args.checkpoint:
        raise ValueError("--detector names one of a --checkpoint's anomaly detectors (<checkpoint>/anomaly/NAME/); "
                         "an --onnx or --openvino export carries the one it was exported with.")
    if args.onnx or args.openvino:
        from vit.cli.predict_outputs import main_onnx

        return main_onnx(args)
    if args.clip:
        return main_clip(args)
    check_writable(args.out)  # before the model loads or an image is read
    with OutputLock(args.out, hold=os.environ.get("RANK", "0") == "0"):  # one predict per --out at a time
        return _predict(args, overrides)


def _predict_text(args) -> int:
    """A text checkpoint: its sentences' top-k classes, in input order (vit.deploy.predict.predict_sentences)."""
    from vit.cli.predict_outputs import write_outputs
    from vit.config import ConfigError
    from vit.deploy.predict import predict_sentences
    from vit.utils.untrusted_text import printable

    if args.cam:
        raise ConfigError("--cam draws attention over images; a text checkpoint has none, so leave it out.")
    result = predict_sentences(args.checkpoint, args.images, args.topk, args.batch_size)
    rows, seconds = result.rows, result.seconds
    written = write_outputs(Path(args.out), args.format, rows, None)
    print(f"{len(rows)} sentence(s), {len(rows) / max(seconds, 1e-9):.0f} sentences/s")
    for r in rows[:5]:
        print(f"  {printable(r['text'][:60])}: {printable(r['pred1_name'])} {100 * r['prob1']:.1f}%")
    print(printable(("  ...\n" if len(rows) > 5 else "") + f"wrote {written}", keep="\n"))
    return 0


def _predict(args, overrides) -> int:
    from vit.cli.args import load_model
    from vit.cli.images import crop_note, images_given
    from vit.cli.predict_outputs import summary, write_outputs
    from vit.cli.runtime import make_accelerator, resolve_workers
    from vit.data import DataError
    from vit.deploy.predict import multilabel_threshold, predict_images
    from vit.eval.dinomaly import find_detector
    from vit.explain.overlays import write_anomaly_maps, write_cams
    from vit.models.checkpoint import is_text_checkpoint
    from vit.utils.untrusted_text import printable

    if args.checkpoint and is_text_checkpoint(args.checkpoint):
        return _predict_text(args)
    paths, skipped = images_given(args.images, DataError)
    model, cfg, classes = load_model(args, overrides)
    if cfg.data.dataset == "segmentation":  # a class per pixel: masks, overlays, areas (vit/deploy/seg_predict.py)
        return _predict_segmentation(args, model, cfg, classes, paths, skipped)
    threshold = multilabel_threshold(cfg, args.threshold, args.checkpoint)
    note = None if cfg.data.naflex else crop_note(cfg.aug.resolved().eval_crop_pct, "predict.py")
    if note:
        print(note, file=sys.stderr)
    patchcore = find_detector(args.checkpoint, args.detector)  # <checkpoint>/anomaly/[NAME/] (any method), or None
    workers = resolve_workers(cfg.data.num_workers) if args.num_workers is None else args.num_workers
    result = predict_images(model, cfg, classes, paths, args.topk, threshold, args.batch_size, workers, patchcore,
                            make_accelerator())
    if result is None:  # not the main process: nothing left to write here; skip interpreter teardown, where a
        sys.stdout.flush()  # still-joinable native thread has aborted a rank (SIGABRT, "terminate called without
        sys.stderr.flush()  # an active exception") in CI
        os._exit(0)
    rows, skipped, dest = result.rows, skipped + result.skipped, Path(args.out)

    def cams(staging: Path) -> None:  # --cam: each image's rollout overlay (and anomaly map), named in its row
        batch = args.batch_size or cfg.data.eval_batch_size or cfg.data.batch_size
        write_cams(model, result.dataset, rows, result.good, cfg, staging, batch, dest)
        if patchcore is not None:
            write_anomaly_maps(result.dataset, rows, result.good, result.anomaly_maps, cfg, staging, dest,
                               patchcore.threshold)

    written = write_outputs(dest, args.format, rows, skipped, cams if args.cam else None)
    if written is None:
        raise DataError(f"none of the {len(paths)} input file(s) could be read as an image; see {dest}/skipped.csv.")
    summary(rows, f"{result.num_processes} process(es)", result.seconds, len(paths), skipped, dest)
    for r in rows[:5]:
        chosen = f"[{printable(r['labels'])}] at threshold {threshold:.2f}; top " if threshold is not None else ""
        anomaly = f"; anomaly score {r['anomaly_score']:.3f} {r['verdict']}" if "anomaly_score" in r else ""
        print(f"  {printable(r['path'])}: {chosen}{printable(r['pred1_name'])} {100 * r['prob1']:.1f}%{anomaly}")
    cams = f" and {dest}/cam/" if args.cam else ""
    print(printable(("  ...\n" if len(rows) > 5 else "") + f"wrote {written}{cams}", keep="\n"))
    return 0


def _predict_segmentation(args, model, cfg, classes, paths, skipped) -> int:
    from vit.data import DataError
    from vit.deploy.seg_predict import predict_seg_images
    from vit.utils.untrusted_text import printable

    rows, bad = predict_seg_images(model, cfg, classes, paths, Path(args.out), skipped=skipped)
    if not rows:
        raise DataError(f"none of the {len(paths)} input file(s) could be read as an image; see "
                        f"{args.out}/skipped.csv.")
    print(f"{len(rows)} image(s) segmented, {len(bad)} skipped")
    for r in rows[:5]:
        areas = ", ".join(f"{c} {r[f'area_pct_{c}']:.2f}%" for c in classes[1:])
        print(f"  {printable(r['path'])}: {printable(areas)}")
    print(f"wrote {args.out}/: segmentation.csv masks/ overlays/")
    return 0


def run(argv: list[str]) -> int:
    """predict.py as a process: --help, then --onnx before torch is imported (run_onnx), else main under run_cli."""
    from vit.cli.help import exit_if_help

    exit_if_help(build_parser, argv)
    if any(a in ("--onnx", "--openvino") or a.startswith(("--onnx=", "--openvino=")) for a in argv):  # before torch
        return run_onnx(argv)
    from vit.cli.runtime import run_cli

    run_cli(lambda: main(argv))
