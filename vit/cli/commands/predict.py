"""Label images that have no labels: top-k classes and probabilities per image, in input order.

    python predict.py --checkpoint runs/default/best photos/ "more/*.jpg" list.txt       # files, folders, globs
    python predict.py --model vit_base_patch16_224 --weights vit_b16.safetensors img.jpg --topk 5
    python predict.py --checkpoint runs/x/best photos/ --format jsonl --cam --out preds/
    accelerate launch --multi_gpu --num_processes 2 predict.py --checkpoint ... photos/  # one row per image
    python predict.py --onnx exported/model.onnx photos/        # ONNX Runtime, no PyTorch needed (see below)

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

--onnx runs a file export.py wrote with ONNX Runtime and the reference preprocessing (vit/deploy/preprocess.py,
from the preprocessing.json beside the model) and writes the same files (a multi-label export: its sigmoids and
the labels at its threshold); it never imports torch, timm, accelerate or PyYAML, so it runs where only numpy,
Pillow, OpenCV and onnxruntime are installed (docs/predict-export.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vit.eval.inference import ImageFiles

# what a run writes into --out, all of it replaced by the next run (no stale --format or cam/ beside the new)
OWNED = ("predictions.csv", "predictions.json", "predictions.jsonl", "skipped.csv", "cam")


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
    ap.add_argument("--out", default="predictions", help="output folder")
    return ap


def rows_for(paths, probs, classes: list[str], topk: int, threshold: float | None = None) -> list[dict]:
    """One row per image: path, then pred1, pred1_name, prob1, ... as evaluate.py's predictions.csv.
    `probs`: (N, C) probabilities, a numpy array (both predictors, torch and ONNX, give one): softmax, or for a
    multi-label model (`threshold` given) sigmoids, with first `labels`, the classes at or above the threshold."""
    import numpy as np

    probs = np.asarray(probs, dtype=np.float32)
    order = np.argsort(-probs, axis=1, kind="stable")[:, :min(topk, len(classes))]  # ties: the lower index first
    rows = []
    for path, p, idx in zip(paths, probs, order):
        row: dict = {"path": str(path)}
        if threshold is not None:  # multi-label: the classes at or above the threshold come first
            row["labels"] = " ".join(classes[i] for i in np.flatnonzero(p >= threshold).tolist())
        for r, i in enumerate(idx.tolist(), 1):
            row.update({f"pred{r}": i, f"pred{r}_name": classes[i], f"prob{r}": float(p[i])})
        rows.append(row)
    return rows


ANOMALY_KEYS = ("anomaly_score", "verdict", "cam", "anomaly_map")  # what a row may add after the top-k


def add_anomaly(rows: list[dict], scores, threshold: float | None) -> None:
    """Each row gets anomaly_score (PatchCore's: the worst patch's distance to the bank of good patches) and
    verdict: defect at or above `threshold` (chosen on good validation images and saved with the bank), good
    below, empty when the bank has no threshold."""
    for row, s in zip(rows, scores):
        row["anomaly_score"] = float(s)
        row["verdict"] = "" if threshold is None else "defect" if s >= threshold else "good"


def write_rows(out: Path, fmt: str, rows: list[dict]) -> Path:
    from vit.utils.atomic import atomic_write_csv, atomic_write_text

    path = out / f"predictions.{fmt}"
    if fmt == "csv":  # probabilities with 6 decimals, as evaluate.py writes them
        text_rows = [{k: f"{v:.6f}" if k.startswith("prob") or k == "anomaly_score" else v for k, v in r.items()}
                     for r in rows]
        atomic_write_csv(path, list(rows[0]), text_rows)
        return path
    nested = []
    for r in rows:
        k = sum(key.startswith("prob") for key in r)
        item = {"path": r["path"], **({"labels": r["labels"].split()} if "labels" in r else {}),
                "topk": [{"index": r[f"pred{j}"], "class": r[f"pred{j}_name"], "prob": r[f"prob{j}"]}
                         for j in range(1, k + 1)]}
        nested.append({**item, **{k: r[k] for k in ANOMALY_KEYS if k in r}})
    text = json.dumps(nested, indent=1) if fmt == "json" else "".join(json.dumps(n) + "\n" for n in nested)
    atomic_write_text(path, text)
    return path


def check_threshold(threshold: float | None, multi_label: bool) -> None:
    """--threshold: a probability, and only for a multi-label model (ValueError, one sentence)."""
    if threshold is not None and not 0 < threshold < 1:
        raise ValueError(f"--threshold must be between 0 and 1 (a probability), got {threshold}.")
    if threshold is not None and not multi_label:
        raise ValueError("--threshold is for multi-label models (trained with data.labels_file); this model picks "
                         "one class per image: use --topk.")


def main_onnx(args) -> int:
    """--onnx: ONNX Runtime and the reference preprocessing, the same files as main(); no torch imported."""
    from vit.cli.images import collect_images, crop_note
    from vit.cli.outputs import OutputLock, check_writable, new_staging, publish
    from vit.deploy.onnx_anomaly import OnnxPatchCore
    from vit.deploy.onnx_predict import OnnxClassifier
    from vit.utils.atomic import atomic_write_csv
    from vit.utils.untrusted_text import printable

    unsupported = [f"--{k.replace('_', '-')}" for k in ("cam", "weights", "pretrained", "img_size", "num_workers")
                   if getattr(args, k)]
    if unsupported:
        raise ValueError(f"{unsupported[0]} does not apply to --onnx (the export fixes model and preprocessing); "
                         "drop it, or use --checkpoint.")
    for name in ("topk", "batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
    clf = OnnxClassifier(args.onnx)  # the model and its preprocessing.json first: cheap, and the likelier mistake
    folder = Path(args.onnx).parent / "anomaly"  # export.py's copy of an anomaly checkpoint's bank, if any
    patchcore = OnnxPatchCore(folder) if folder.is_dir() else None
    check_threshold(args.threshold, clf.threshold is not None)
    threshold = args.threshold if args.threshold is not None else clf.threshold  # None: single-label (softmax)
    if not args.images:
        raise ValueError("no images given; pass image files, folders, globs or a .txt list of paths.")
    check_writable(args.out)
    with OutputLock(args.out):
        paths, skipped = collect_images(args.images)
        if not paths:
            raise ValueError(f"no image files found in {' '.join(args.images)}; pass image files, folders, globs "
                             "or a .txt list of paths.")
        t0 = time.perf_counter()
        probs, ok, reasons = clf.predict(paths, args.batch_size or 32)
        seconds = time.perf_counter() - t0
        note = crop_note(clf.preprocess.size / clf.preprocess.resize, "predict.py --onnx",
                         "export again with --aug.eval_crop_pct=1.0")
        if note:  # once the run is on: a refusal stays one line
            print(note, file=sys.stderr)
        skipped += [(str(p), r) for p, r, good in zip(paths, reasons, ok) if not good]
        dest = Path(args.out)
        staging = new_staging(dest, "predict")
        atomic_write_csv(staging / "skipped.csv", ["path", "reason"], [{"path": p, "reason": r} for p, r in skipped])
        if not ok.any():
            publish(staging, dest, OWNED)
            raise ValueError(f"none of the {len(paths)} input file(s) could be read as an image; see "
                             f"{dest}/skipped.csv.")
        rows = rows_for([p for p, good in zip(paths, ok) if good], probs[ok], clf.classes, args.topk, threshold)
        if patchcore is not None:
            scores = patchcore.predict([p for p, good in zip(paths, ok) if good], args.batch_size or 32)[0]
            add_anomaly(rows, scores, patchcore.threshold)
        written = dest / write_rows(staging, args.format, rows).name
        publish(staging, dest, OWNED)
    print(f"{len(rows)} image(s), ONNX Runtime, {len(paths) / max(seconds, 1e-9):.0f} images/s; skipped "
          f"{len(skipped)}" + (f" (reasons in {dest}/skipped.csv)" if skipped else ""))
    print(printable(f"wrote {written}"))
    return 0


def main_clip(args) -> int:
    """--clip: zero-shot top-k over --classes (vit.eval.zero_shot.predict_zero_shot); the same files as main()."""
    from vit.cli.images import collect_images
    from vit.cli.outputs import check_writable, new_staging, publish
    from vit.data import DataError
    from vit.eval.zero_shot import predict_zero_shot
    from vit.utils.atomic import atomic_write_csv

    if not args.classes:
        raise ValueError("--clip needs --classes: a folder of class subfolders, a file of names or 'cat,dog'.")
    paths, skipped = collect_images(args.images)
    if not paths:
        raise DataError("no image files given; pass image files, folders, globs or a .txt list of paths.")
    check_writable(args.out)
    classes, probs, ok = predict_zero_shot(args.clip, args.classes, paths, args.templates, args.batch_size or 64)
    skipped += [(str(p), "not readable as an image") for p, good in zip(paths, ok) if not good]
    staging = new_staging(Path(args.out), "predict")
    atomic_write_csv(staging / "skipped.csv", ["path", "reason"], [{"path": p, "reason": r} for p, r in skipped])
    rows = rows_for([p for p, good in zip(paths, ok) if good], probs[ok].numpy(), classes, args.topk)
    written = Path(args.out) / write_rows(staging, args.format, rows).name
    publish(staging, Path(args.out), OWNED)
    print(f"{len(rows)} image(s), {len(classes)} classes (zero-shot, {args.clip}) -> {written}")
    return 0


def run_onnx(argv: list[str]) -> int:
    """main_onnx with run_cli's contract (one line and exit 2 for a user's mistake), without vit.cli.runtime's torch."""
    try:
        args, rest = build_parser().parse_known_args(argv)
        if rest:
            raise ValueError(f"--onnx takes no config overrides ({rest[0]}): the export's preprocessing.json "
                             "fixes the preprocessing.")
        return main_onnx(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C); files already written are complete.", file=sys.stderr)
        return 130


def parse_args(argv):
    from vit.cli.args import parse_command

    return parse_command(build_parser(), argv, "predict.py", ("aug.",), ("topk", "batch_size", "img_size"))


def write_cams(model, dataset: ImageFiles, rows: list[dict], good: list[int], cfg, out: Path, batch: int,
               final: Path | None = None) -> None:
    """Attention rollout of each readable image, drawn over what the model saw (visualize_attention's plot; a
    NaFlex image at its own aspect ratio, on its own grid), written into `out`; rows name them as they will be in
    `final` (the --out they are moved to)."""
    from vit.data.naflex import as_picture
    from vit.eval.inference import batch_of
    from vit.eval.plots import plot_attention_map, to_display
    from vit.explain.rollout import attention_maps

    for start in range(0, len(good), batch):
        chunk = good[start:start + batch]
        items = [dataset[i] for i in chunk]
        maps, _ = attention_maps(model, batch_of(dataset, items), "rollout")  # (B, h, w) or B maps (h_i, w_i)
        for j, (i, row) in enumerate(zip(chunk, rows[start:start + batch])):
            path = out / "cam" / f"{i:06d}_{Path(row['path']).stem}.png"
            title = f"{Path(row['path']).name}: {row['pred1_name']} ({100 * row['prob1']:.1f}%)  |  rollout"
            seen = to_display(as_picture(items[j][0], cfg.model.patch_size), cfg.aug.mean, cfg.aug.std)
            plot_attention_map(path, seen, maps[j].numpy(), title)
            row["cam"] = str((final or out) / path.relative_to(out))


def write_anomaly_maps(dataset: ImageFiles, rows: list[dict], good: list[int], maps, cfg, out: Path,
                       final: Path) -> None:
    """Each readable image's anomaly heat map (the patch scores, (h, w)) drawn as write_cams draws rollout, into
    `out`/cam/; rows name them as they will be in `final`."""
    from vit.data.naflex import as_picture
    from vit.eval.plots import plot_attention_map, to_display

    for i, row in zip(good, rows):
        path = out / "cam" / f"{i:06d}_{Path(row['path']).stem}_anomaly.png"
        title = (f"{Path(row['path']).name}: anomaly score {row['anomaly_score']:.3f} {row['verdict']}  |  "
                 "distance to the good patches")
        seen = to_display(as_picture(dataset[i][0], cfg.model.patch_size), cfg.aug.mean, cfg.aug.std)
        plot_attention_map(path, seen, maps[i], title)
        row["anomaly_map"] = str(final / path.relative_to(out))


def multilabel_threshold(args, cfg) -> float | None:
    """None for a single-label model; for a multi-label one (its config has data.labels_file), --threshold,
    else the threshold training chose on its validation split, else 0.5."""
    from vit.eval.multilabel import decision_threshold

    check_threshold(args.threshold, bool(cfg.data.labels_file))
    if not cfg.data.labels_file:
        return None
    return args.threshold if args.threshold is not None else decision_threshold(cfg, args.checkpoint)


def main(argv=None) -> int:
    from vit.cli.outputs import OutputLock, check_writable

    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    if args.onnx:
        return main_onnx(args)
    if args.clip:
        return main_clip(args)
    check_writable(args.out)  # before the model loads or an image is read
    with OutputLock(args.out, hold=os.environ.get("RANK", "0") == "0"):  # one predict per --out at a time
        return _predict(args, overrides)


def _predict_text(args) -> int:
    """A text checkpoint: its sentences' top-k classes, in input order (vit/eval/text.py)."""
    from vit.cli.outputs import new_staging, publish
    from vit.config import ConfigError
    from vit.data import DataError
    from vit.eval.text import predict_texts, read_texts
    from vit.hub.tokenizer import load_tokenizer
    from vit.models.checkpoint import load_checkpoint
    from vit.utils.untrusted_text import printable

    if args.cam:
        raise ConfigError("--cam draws attention over images; a text checkpoint has none, so leave it out.")
    model, cfg, classes, _ = load_checkpoint(args.checkpoint)
    texts, where = read_texts(args.images, cfg.data.text_column)
    if not texts:
        raise DataError(f"no sentences in {' '.join(args.images)}; pass text files (one a line) or CSVs.")
    t0 = time.perf_counter()
    logits = predict_texts(model, load_tokenizer(cfg.model.pretrained), texts,
                           args.batch_size or cfg.data.eval_batch_size or cfg.data.batch_size)
    seconds = time.perf_counter() - t0
    rows = [{"path": r.pop("path"), "text": t, **r}
            for t, r in zip(texts, rows_for(where, logits.softmax(1).numpy(), classes, args.topk))]
    dest = Path(args.out)
    staging = new_staging(dest, "predict")
    written = dest / write_rows(staging, args.format, rows).name
    publish(staging, dest, OWNED)
    print(f"{len(rows)} sentence(s), {len(rows) / max(seconds, 1e-9):.0f} sentences/s")
    for r in rows[:5]:
        print(f"  {printable(r['text'][:60])}: {printable(r['pred1_name'])} {100 * r['prob1']:.1f}%")
    print(printable(("  ...\n" if len(rows) > 5 else "") + f"wrote {written}", keep="\n"))
    return 0


def _predict(args, overrides) -> int:
    from vit.cli.args import load_model
    from vit.cli.images import collect_images, crop_note
    from vit.cli.outputs import new_staging, publish
    from vit.cli.runtime import make_accelerator, resolve_workers
    from vit.data import DataError
    from vit.data.datasets import image_transform
    from vit.eval.anomaly import find_patchcore
    from vit.eval.inference import ImageFiles, decode_error, label_names, predict_files
    from vit.models.checkpoint import is_text_checkpoint
    from vit.utils.atomic import atomic_write_csv
    from vit.utils.untrusted_text import printable

    if args.checkpoint and is_text_checkpoint(args.checkpoint):
        return _predict_text(args)
    if not args.images:
        raise DataError("no images given; pass image files, folders, globs or a .txt list of paths.")
    paths, skipped = collect_images(args.images)
    if not paths:
        raise DataError(f"no image files found in {' '.join(args.images)}; pass image files, folders, globs "
                        "or a .txt list of paths.")
    model, cfg, classes = load_model(args, overrides)
    classes = classes or label_names(model, model.num_classes)
    threshold = multilabel_threshold(args, cfg)
    transform = image_transform(cfg, train=False)  # data.naflex: each image at its own aspect ratio, patchified
    note = None if cfg.data.naflex else crop_note(cfg.aug.resolved().eval_crop_pct, "predict.py")
    if note:
        print(note, file=sys.stderr)
    patchcore = find_patchcore(args.checkpoint)  # <checkpoint>/anomaly/ from anomaly.py fit, else None
    dataset = ImageFiles(paths, transform, cfg.model.in_chans)
    accelerator = make_accelerator()
    batch = args.batch_size or cfg.data.eval_batch_size or cfg.data.batch_size
    workers = resolve_workers(cfg.data.num_workers) if args.num_workers is None else args.num_workers

    t0 = time.perf_counter()
    out = predict_files(model, dataset, batch, workers, accelerator)  # input order, one entry per file
    seconds = time.perf_counter() - t0
    num_processes, is_main = accelerator.num_processes, accelerator.is_main_process
    # the last collective: close the process group on every rank before one leaves (see evaluate.py)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if not is_main:  # nothing left to write here; skip interpreter teardown, where a still-joinable native thread
        sys.stdout.flush()  # has aborted a rank (SIGABRT, "terminate called without an active exception") in CI
        sys.stderr.flush()
        os._exit(0)

    ok, index = out["ok"], out["index"].tolist()
    good = [i for i, flag in zip(index, ok.tolist()) if flag]
    skipped += [(str(paths[i]), decode_error(paths[i], transform)) for i, flag in zip(index, ok.tolist()) if not flag]
    dest = Path(args.out)
    staging = new_staging(dest, "predict")  # everything is written here, then replaces the previous run's outputs
    atomic_write_csv(staging / "skipped.csv", ["path", "reason"], [{"path": p, "reason": r} for p, r in skipped])
    if not good:
        publish(staging, dest, OWNED)
        raise DataError(f"none of the {len(paths)} input file(s) could be read as an image; see {dest}/skipped.csv.")
    logits = out["logits"][ok].float()
    probs = logits.softmax(1) if threshold is None else logits.sigmoid()  # multi-label: one sigmoid per class
    rows = rows_for([paths[i] for i in good], probs.numpy(), classes, args.topk, threshold)
    if patchcore is not None:
        scores, maps, _ = patchcore.score_files(model, dataset, batch)  # (N,), (N, h, w) in input order
        add_anomaly(rows, scores[good], patchcore.threshold)
    if args.cam:
        write_cams(model, dataset, rows, good, cfg, staging, batch, dest)
        if patchcore is not None:
            write_anomaly_maps(dataset, rows, good, maps, cfg, staging, dest)
    written = dest / write_rows(staging, args.format, rows).name
    publish(staging, dest, OWNED)

    print(f"{len(rows)} image(s), {num_processes} process(es), {len(paths) / max(seconds, 1e-9):.0f} images/s; "
          f"skipped {len(skipped)}" + (f" (reasons in {dest}/skipped.csv)" if skipped else ""))
    for r in rows[:5]:
        chosen = f"[{printable(r['labels'])}] at threshold {threshold:.2f}; top " if threshold is not None else ""
        anomaly = f"; anomaly score {r['anomaly_score']:.3f} {r['verdict']}" if "anomaly_score" in r else ""
        print(f"  {printable(r['path'])}: {chosen}{printable(r['pred1_name'])} {100 * r['prob1']:.1f}%{anomaly}")
    cams = f" and {dest}/cam/" if args.cam else ""
    print(printable(("  ...\n" if len(rows) > 5 else "") + f"wrote {written}{cams}", keep="\n"))
    return 0



def run(argv: list[str]) -> int:
    """predict.py as a process: --help, then --onnx before torch is imported (run_onnx), else main under run_cli."""
    from vit.cli.help import exit_if_help

    exit_if_help(build_parser, argv)
    if any(a == "--onnx" or a.startswith("--onnx=") for a in argv):  # before torch is imported
        return run_onnx(argv)
    from vit.cli.runtime import run_cli

    run_cli(lambda: main(argv))
