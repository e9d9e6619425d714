"""predict.py's outputs and its torch-free mode: the files a run owns in --out, written in a staging folder and
published together, its summary line, and --onnx (ONNX Runtime and the export's preprocessing; no torch, timm,
accelerate or PyYAML imported, docs/predict-export.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from vit.deploy.predictions import write_rows
from vit.eval.anomaly_settings import ANOMALY_DIR
from vit.utils.atomic import atomic_write_csv
from vit.utils.untrusted_text import printable

from .images import collect_images, crop_note
from .outputs import OutputLock, check_writable, new_staging, publish

__all__ = ["OWNED", "write_outputs", "summary", "main_onnx", "openvino_model", "segmenter_folder", "anomaly_pictures"]

# what a run writes into --out, all of it replaced by the next run (no stale --format or cam/ beside the new)
OWNED = ("predictions.csv", "predictions.json", "predictions.jsonl", "skipped.csv", "cam")


def write_outputs(dest: Path, fmt: str, rows: list[dict], skipped: list[tuple[str, str]] | None,
                  extra: Callable[[Path], None] | None = None) -> Path | None:
    """predictions.<fmt> (and skipped.csv, and what `extra` writes into the staging folder: --cam's pictures)
    replacing the previous run's files in `dest`; without rows only skipped.csv is published and None returned."""
    staging = new_staging(dest, "predict")  # everything is written here, then replaces the previous run's outputs
    if skipped is not None:
        atomic_write_csv(staging / "skipped.csv", ["path", "reason"],
                         [{"path": p, "reason": r} for p, r in skipped])
    if not rows:
        publish(staging, dest, OWNED)
        return None
    if extra is not None:
        extra(staging)
    written = dest / write_rows(staging, fmt, rows).name
    publish(staging, dest, OWNED)
    return written


def summary(rows: list[dict], what: str, seconds: float, n: int, skipped: list, dest: Path) -> None:
    """The run's first line: how many images, on what, how fast, how many passed over."""
    print(f"{len(rows)} image(s), {what}, {n / max(seconds, 1e-9):.0f} images/s; skipped "
          f"{len(skipped)}" + (f" (reasons in {dest}/skipped.csv)" if skipped else ""))


@contextmanager
def _locked_inputs(args):
    """(image paths, skipped) of args.images while args.out is locked for this run: no image given, an unwritable
    --out or no image file found is one sentence first."""
    if not args.images:
        raise ValueError("no images given; pass image files, folders, globs or a .txt list of paths.")
    check_writable(args.out)
    with OutputLock(args.out):
        paths, skipped = collect_images(args.images)
        if not paths:
            raise ValueError(f"no image files found in {' '.join(args.images)}; pass image files, folders, globs "
                             "or a .txt list of paths.")
        yield paths, skipped


def openvino_model(path: str) -> Path:
    """--openvino's model.xml: the path itself, or model.xml in the folder it names; one sentence otherwise."""
    from vit.deploy.openvino_ir import OPENVINO_FILE, require_openvino

    p = Path(path)
    xml = p / OPENVINO_FILE if p.is_dir() else p
    if not xml.is_file() or xml.suffix != ".xml":
        where = f"{p} has no {OPENVINO_FILE}" if p.is_dir() else f"{p} is not an OpenVINO model.xml"
        raise ValueError(f"{where}; export one with export.py --format openvino, or pass its model.xml.")
    require_openvino("predict.py --openvino")
    return xml


def main_onnx(args) -> int:
    """--onnx (ONNX Runtime) or --openvino (OpenVINO's CPU runtime): vit.deploy.predictions.predict_onnx_images, the
    same files as main(); no torch imported."""
    from vit.deploy.onnx_predict import OnnxClassifier
    from vit.deploy.predictions import check_threshold, predict_onnx_images

    flag = "--openvino" if getattr(args, "openvino", None) else "--onnx"
    unsupported = [f"--{k.replace('_', '-')}" for k in ("weights", "pretrained", "img_size", "num_workers")
                   if getattr(args, k)]
    if unsupported:
        raise ValueError(f"{unsupported[0]} does not apply to {flag} (the export fixes model and preprocessing); "
                         "drop it, or use --checkpoint.")
    if flag == "--openvino":
        args.onnx = str(openvino_model(args.openvino))  # the same predictor; the file's suffix picks the runtime
    elif Path(args.onnx).is_dir() and segmenter_folder(args.onnx) is None and (Path(args.onnx) / "model.onnx").exists():
        args.onnx = str(Path(args.onnx) / "model.onnx")  # the export's folder, as --openvino takes it
    for name in ("topk", "batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
    if args.cam and not (Path(args.onnx).parent / ANOMALY_DIR).is_dir():  # before anything is loaded
        raise ValueError(f"--cam with {flag} draws an anomaly export's heat maps, and {args.onnx} has no "
                         f"{ANOMALY_DIR}/ beside it (attention rollout needs PyTorch); drop --cam, or use "
                         "--checkpoint.")
    if segmenter_folder(args.onnx) is not None:  # export.py's segmenter.onnx (or its folder): masks, not labels
        return _main_onnx_segmenter(args, *segmenter_folder(args.onnx))
    clf = OnnxClassifier(args.onnx)  # the model and its preprocessing.json first: cheap, and the likelier mistake
    check_threshold(args.threshold, clf.threshold is not None)
    with _locked_inputs(args) as (paths, skipped):
        result = predict_onnx_images(args.onnx, paths, args.batch_size or 32, args.topk, args.threshold, clf)
        note = crop_note(clf.preprocess.size / clf.preprocess.resize, f"predict.py {flag}",
                         "export again with --aug.eval_crop_pct=1.0")
        if note:  # once the run is on: a refusal stays one line
            print(note, file=sys.stderr)
        skipped += result.skipped
        dest = Path(args.out)
        maps = anomaly_pictures(result, paths, dest) if args.cam else None
        written = write_outputs(dest, args.format, result.rows, skipped, maps)
        if written is None:
            raise ValueError(f"none of the {len(paths)} input file(s) could be read as an image; see "
                             f"{dest}/skipped.csv.")
    summary(result.rows, clf.runtime, result.seconds, len(paths), skipped, dest)
    print(printable(f"wrote {written}" + (f" and {dest}/cam/" if maps else "")))
    return 0


def anomaly_pictures(result, paths: list[Path], dest: Path) -> Callable[[Path], None]:
    """--cam for the torch-free predictor: write_outputs' `extra` drawing each readable image's anomaly map as
    predict.py --checkpoint draws it (vit.eval.plots.plot_anomaly_maps: 0 to twice the detector's threshold), over
    the image as the export's preprocessing gives it; no torch."""
    from vit.eval.plots import plot_anomaly_maps, to_display

    det = result.detector
    pre = det.preprocess

    def seen(i: int):
        return to_display(pre.load(paths[i]), pre.mean, pre.std)

    return lambda staging: plot_anomaly_maps(seen, result.rows, result.good, result.anomaly_maps, staging, dest,
                                             det.threshold)


def segmenter_folder(onnx: str) -> tuple[Path, str] | None:
    """(folder, file) of an exported segmenter when --onnx names its segmenter.onnx, segmenter.int8.onnx or the
    folder holding them (segmenter.onnx then; segmentation.json beside), else None."""
    from vit.deploy.onnx_segment import SEG_SETTINGS, SEGMENTER_INT8, SEGMENTER_ONNX

    p = Path(onnx)
    folder, file = (p, SEGMENTER_ONNX) if p.is_dir() else (p.parent, p.name)
    if file not in (SEGMENTER_ONNX, SEGMENTER_INT8) or not (folder / file).is_file():
        return None
    # a segmenter's file by name is read as one (OnnxSegmenter says when segmentation.json is missing or bad);
    # a folder counts as one when it has both
    return (folder, file) if not p.is_dir() or (folder / SEG_SETTINGS).is_file() else None


def _main_onnx_segmenter(args, folder: Path, file: str) -> int:
    """--onnx on a segmenter: the same masks/, overlays/ and segmentation.csv as predict.py --checkpoint writes
    (vit/deploy/seg_outputs.py), from ONNX Runtime (vit/deploy/onnx_segment.py)."""
    from vit.deploy.onnx_segment import OnnxSegmenter
    from vit.deploy.seg_outputs import write_seg_outputs

    if args.threshold is not None:
        raise ValueError(f"--threshold reads the scores of whole images, and {folder} is a segmenter (a class per "
                         "pixel); drop it.")
    seg = OnnxSegmenter(folder, file)
    with _locked_inputs(args) as (paths, skipped):
        rows, bad = write_seg_outputs(seg.segment, seg.classes, paths, Path(args.out), skipped=skipped)
    if not rows:
        raise ValueError(f"none of the {len(paths)} input file(s) could be read as an image; see "
                         f"{args.out}/skipped.csv.")
    print(f"{len(rows)} image(s) segmented with ONNX Runtime, {len(bad)} skipped")
    for r in rows[:5]:
        areas = ", ".join(f"{c} {r[f'area_pct_{c}']:.2f}%" for c in seg.classes[1:])
        print(f"  {printable(r['path'])}: {printable(areas)}")
    print(printable(f"wrote {args.out}/: segmentation.csv masks/ overlays/"))
    return 0
