"""Anomaly detection from good parts only, three methods by name (--method): PatchCore (a coreset memory bank of
good patch features; a new image's score is its worst patch's distance to it), AnomalyDINO (the same search,
training-free and few-shot: every patch of a few good images, cosine distance) and Dinomaly (a decoder trained
on good images to rebuild the frozen backbone's features; the score is where it fails), each with a heat map.

    python anomaly.py fit --checkpoint runs/parts/best --good parts/train/good --val parts/val/good
    python anomaly.py fit --checkpoint runs/parts/best --method dinomaly --good parts/train/good --val parts/val/good
    python anomaly.py score --checkpoint runs/parts/best parts/test/ --out inspect/ --maps

fit writes <checkpoint>/anomaly/ (or --bank; a folder that holds a detector is replaced only with --force):
bank.safetensors or dinomaly.safetensors, and patchcore.json: the method, backbone, blocks, folders, and the
threshold with how it was chosen: above every good --val image, at --false-alarm-rate on them, or, with
--val-defects, the F1-optimal one. score writes to --out: scores.csv (path, score, verdict: defect at or above
the threshold), with --maps maps/<index>_<name>.png (every map on one colour scale, 0 to twice the threshold)
and maps/<index>_<name>.npy (the raw patch scores), and, where the images sit in folders and some folder is
named good, metrics.json: image AUROC of good against the rest, and pixel AUROC and AUPRO (to 30% FPR) where
each defective image has its mask beside it (<name>.mask.npy, as scripts/anomaly_parts.py writes them). --tile N
reads images larger than the model's input at their own scale in overlapping N x N tiles: fit learns the tiles
and chooses the threshold on tiled validation images, score (by default with the fitted tile) stitches one map per
image (vit/eval/anomaly_tiles.py).

With the bank in <checkpoint>/anomaly/, predict.py adds the score and verdict to its rows (and with --cam the heat
map), demo.py shows them, and export.py writes anomaly/ beside model.onnx for predict.py --onnx (docs/few-labels.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the options one mode reads and the other does not (their help says 'fit:' or 'score:')
FIT_ONLY = ("good", "val", "val_defects", "method", "ratio", "max_bank", "layers", "neighbourhood", "false_alarm_rate",
            "seed", "steps", "force")
SCORE_ONLY = ("images", "out", "maps")


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.args import add_model_source
    from vit.cli.help import AUG_EPILOG, HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter,
                                 usage="%(prog)s {fit,score} (--checkpoint DIR | --model NAME ...) [IMAGES...]",
                                 epilog=AUG_EPILOG)
    ap.add_argument("mode", choices=("fit", "score"), help="fit: build the bank from good images; score: use it")
    add_model_source(ap)
    ap.add_argument("images", nargs="*", help="score: files, folders, globs or .txt lists of images to score")
    ap.add_argument("--good", nargs="+", default=None, help="fit: images of good parts (folders, globs, lists)")
    ap.add_argument("--method", choices=("patchcore", "anomalydino", "dinomaly"), default="patchcore",
                    help="fit: the detector (anomalydino: every patch of a few good images, cosine distance)")
    ap.add_argument("--val", nargs="+", default=None,
                    help="fit: other good images that set the threshold (default: none; then score gives no verdict)")
    ap.add_argument("--val-defects", nargs="+", default=None,
                    help="fit: defective validation images: the threshold is then the F1-optimal one")
    ap.add_argument("--bank", default=None, help="the bank folder (default: <checkpoint>/anomaly)")
    ap.add_argument("--detector", metavar="NAME", default=None,
                    help="one of several detectors beside --checkpoint (one per part type): "
                         "<checkpoint>/anomaly/NAME/, which predict.py and demo.py take by the same --detector NAME")
    ap.add_argument("--ratio", type=float, default=None,
                    help="fit: the share of good patches the coreset keeps (patchcore 0.1, anomalydino 1)")
    ap.add_argument("--max-bank", type=int, default=None,
                    help="fit: at most this many patch features in the bank (the coreset's time is then linear in "
                         "images; default: no cap)")
    ap.add_argument("--layers", type=int, nargs="+", default=None,
                    help="fit: the blocks whose patch tokens are read (default: the two around the middle)")
    ap.add_argument("--neighbourhood", type=int, default=None,
                    help="fit: average each patch's features over this many patches across (odd; 1: none; "
                         "patchcore 3, anomalydino 1)")
    ap.add_argument("--false-alarm-rate", type=float, default=None,
                    help="fit: the share of good --val images allowed at or above the threshold, in (0, 1) "
                         "(default: none of them)")
    ap.add_argument("--seed", type=int, default=0, help="fit: seed of the coreset, or of Dinomaly's training")
    ap.add_argument("--steps", type=int, default=1000, help="fit: Dinomaly's training steps (batches)")
    ap.add_argument("--force", action="store_true", help="fit: replace a detector already in the folder")
    ap.add_argument("--out", default="anomaly-scores", help="score: output folder")
    ap.add_argument("--maps", action="store_true", help="score: also write each image's heat map")
    ap.add_argument("--tile", type=int, default=None,
                    help="read each image at its own scale in overlapping N x N tiles (N: the model's input size, or "
                         "one it takes): fit builds the detector and threshold on tiles, score stitches one map per "
                         "image (default: the tile the detector was fitted with; vit/eval/anomaly_tiles.py)")
    ap.add_argument("--batch-size", type=int, default=32, help="images per batch")
    return ap


def _files(specs: list[str], what: str) -> list[Path]:
    from vit.cli.images import collect_images
    from vit.data import DataError

    paths, _ = collect_images(specs)
    if not paths:
        raise DataError(f"no image files found in {' '.join(specs)} ({what}); pass folders, globs or lists of images.")
    return paths


def main(argv=None) -> int:
    from vit.cli.anomaly_inputs import bank_dir_of, check_tile_option, load_backbone
    from vit.cli.args import parse_command
    from vit.cli.images import crop_note
    from vit.cli.outputs import check_writable
    from vit.config import ConfigError
    from vit.data.datasets import image_transform
    from vit.eval.anomaly_settings import SETTINGS_FILE
    from vit.eval.inference import ImageFiles

    args, overrides = parse_command(build_parser(), sys.argv[1:] if argv is None else argv, "anomaly.py", ("aug.",),
                                    ("batch_size", "img_size"), intermixed=True)
    if args.false_alarm_rate is not None and not 0 < args.false_alarm_rate < 1:
        raise ConfigError(f"--false-alarm-rate must be a share strictly between 0 and 1 (0.01: one good image in 100 "
                          f"flagged), got {args.false_alarm_rate}; leave it out to set the threshold above every good "
                          "--val image.")
    bank_dir = bank_dir_of(args)
    _check_mode_options(args)
    if args.mode == "fit" and (bank_dir / SETTINGS_FILE).is_file() and not args.force:
        raise ConfigError(f"{bank_dir} already holds a fitted detector; pass --force to replace it, or --bank another "
                          "folder.")
    if args.mode == "fit" and not args.good:
        raise ConfigError("anomaly.py fit needs --good: images of good parts only.")
    if args.mode == "fit" and args.val_defects and not args.val:
        raise ConfigError("--val-defects sets an F1 threshold against good validation images: pass --val too.")
    if args.mode == "score" and not args.images:
        raise ConfigError("anomaly.py score needs images to score.")
    check_writable(bank_dir if args.mode == "fit" else args.out)
    model, cfg = load_backbone(args, overrides)
    transform = image_transform(cfg, train=False)  # data.naflex: each image whole, on its own grid of patches
    note = None if cfg.data.naflex else crop_note(cfg.aug.resolved().eval_crop_pct, f"anomaly.py {args.mode}")
    if note:
        print(note, file=sys.stderr)

    def files(paths):
        return ImageFiles(paths, transform, cfg.model.in_chans)

    if args.tile is not None:
        check_tile_option(args.tile, cfg, model)
    if args.mode == "fit":
        return _fit(args, model, cfg, files, bank_dir)
    return _score(args, model, cfg, files, bank_dir)


def _check_mode_options(args) -> None:
    """An option only the other mode reads is refused: it would be ignored (fit --out wrote nothing)."""
    from vit.config import ConfigError

    parser = build_parser()
    other = SCORE_ONLY if args.mode == "fit" else FIT_ONLY
    given = [k for k in other if getattr(args, k) not in (parser.get_default(k), [])]
    if args.mode == "fit" and args.method == "dinomaly":  # a bank's settings would be ignored
        given += [k for k in ("ratio", "max_bank", "neighbourhood") if getattr(args, k) is not None]
    elif args.mode == "fit" and args.steps != parser.get_default("steps"):
        given.append("steps")
    if given:
        shown = "images to score" if given[0] == "images" else "--" + given[0].replace("_", "-")
        if args.mode == "fit" and given[0] in ("ratio", "max_bank", "neighbourhood", "steps"):
            raise ConfigError(f"anomaly.py fit --method {args.method} does not read {shown}; remove it.")
        raise ConfigError(f"anomaly.py {args.mode} does not read {shown} (anomaly.py "
                          f"{'score' if args.mode == 'fit' else 'fit'} does); remove it.")


def _fit(args, model, cfg, files, bank_dir) -> int:
    """anomaly.py fit: the detector of good images (and, with --val, its threshold) saved into `bank_dir`."""
    import time

    from vit.config import ConfigError
    from vit.deploy.export import fingerprint
    from vit.eval.anomaly import METHODS, fit_patchcore, save_patchcore
    from vit.eval.anomaly_threshold import choose_threshold
    from vit.utils.untrusted_text import printable

    t0 = time.perf_counter()
    good = _files(args.good, "--good")
    depth = model.depth if hasattr(model, "default_layers") else len(model.blocks)
    bad = [i for i in args.layers or () if not -depth <= i < depth]
    if bad:
        raise ConfigError(f"--layers {bad[0]} is not one of the backbone's {depth} blocks (levels for a CNN); use 0 to "
                          f"{depth - 1}, or -1 for the last.")
    layers = tuple(i % depth for i in args.layers) if args.layers else None  # saved as read back: 0..depth-1
    extra = {"backbone": args.checkpoint or args.model, "weights": args.weights,
             "backbone_fingerprint": fingerprint(model), "good": args.good, "val": args.val,
             "val_defects": args.val_defects, "good_images": len(good), "tile": args.tile}
    if args.tile is not None:  # the detector learns tiles at the images' own scale, as score will read them
        from vit.eval.anomaly_tiles import TileFiles

        aug = cfg.aug.resolved()
        files = lambda paths: TileFiles(paths, args.tile, aug.mean, aug.std)  # noqa: E731
    if args.method == "dinomaly":
        from vit.eval.dinomaly import fit_dinomaly, save_dinomaly

        det = fit_dinomaly(model, files(good), args.steps, seed=args.seed, layers=layers, progress=sys.stderr.isatty())
        save, extra["steps"], what = save_dinomaly, args.steps, f"Dinomaly decoder trained {args.steps} steps"
    else:
        kw = {**METHODS[args.method], **{k: getattr(args, k) for k in ("ratio", "neighbourhood")
                                           if getattr(args, k) is not None}}
        det = fit_patchcore(model, files(good), layers, kw["ratio"], args.batch_size, args.seed,
                            neighbourhood=kw["neighbourhood"], max_bank=args.max_bank, normalize=kw["normalize"],
                            top_share=kw["top_share"], method=args.method, progress=sys.stderr.isatty())
        save, extra["ratio"] = save_patchcore, kw["ratio"]
        what = f"bank of {len(det.bank)} patch features, neighbourhood {det.neighbourhood}"
    extra["fit_seconds"] = round(time.perf_counter() - t0, 3)
    if args.val:
        def scores(paths):  # whole validation images, tiled as score will tile them
            if args.tile is None:
                return det.score_files(model, files(paths), args.batch_size)[0]
            return _score_tiled(args, model, cfg, det, paths)[0]

        g = scores(_files(args.val, "--val"))
        d = scores(_files(args.val_defects, "--val-defects")) if args.val_defects else None
        choice = choose_threshold(g, d, args.false_alarm_rate)
        det.threshold, extra["threshold_choice"] = choice.value, choice.record()
        if choice.note:
            print(choice.note, file=sys.stderr)
    save(bank_dir, det, extra)
    thr = f", threshold {det.threshold:.4f}" if det.threshold is not None else " (no --val: no threshold)"
    blocks = "levels" if hasattr(model, "default_layers") else "blocks"  # a CNN's features_only levels
    print(printable(f"{args.method}: {what} from {len(good)} good image(s), {blocks} {list(det.layers)}{thr}, "
                    f"{time.perf_counter() - t0:.1f} s; wrote {bank_dir}"))
    return 0


def _pixel_metrics(paths, maps, ok) -> dict:
    """Pixel AUROC and AUPRO where every image outside a folder named good has its mask (<name>.mask.npy) beside
    it (a good image's pixels are all good); {} otherwise."""
    import numpy as np

    from vit.eval.anomaly_metrics import aupro, pixel_auroc, upsample_maps

    chosen = [(p, m) for p, m, good in zip(paths, maps, ok) if good]
    masks = []
    for p, _ in chosen:
        f = p.with_suffix(".mask.npy")
        if p.parent.name != "good" and not f.is_file():
            return {}
        masks.append(np.load(f, allow_pickle=False).astype(bool) if f.is_file() else None)
    shape = next((m.shape for m in masks if m is not None), None)
    if shape is None or any(m is not None and m.shape != shape for m in masks):
        return {}
    masks = np.stack([m if m is not None else np.zeros(shape, bool) for m in masks])
    full = np.concatenate([upsample_maps(np.asarray(m)[None], shape) for _, m in chosen])  # (N, H, W)
    return {"pixel_auroc": pixel_auroc(full, masks), "aupro": aupro(full, masks)}


def _score(args, model, cfg, files, bank_dir) -> int:
    from vit.cli.anomaly_inputs import detector_and_tile
    """anomaly.py score: scores.csv (and maps/, and metrics.json when good and defect folders are both there)."""
    import json
    import time

    import numpy as np

    from vit.data.naflex import as_picture
    from vit.eval.anomaly_metrics import auroc
    from vit.eval.plots import plot_attention_map, to_display
    from vit.utils.atomic import atomic_write_csv, atomic_write_text
    from vit.utils.untrusted_text import printable

    det = detector_and_tile(args, model, cfg, bank_dir)
    paths = _files(args.images, "IMAGES")
    dataset = files(paths)
    t0 = time.perf_counter()
    if args.tile is not None:
        scores, maps, ok, pictures = _score_tiled(args, model, cfg, det, paths)
    else:
        scores, maps, ok = det.score_files(model, dataset, args.batch_size)
    seconds = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    top = max((float(np.max(m)) for m, good in zip(maps, ok) if good), default=1.0)
    scale = (0.0, 2 * det.threshold) if det.threshold else (0.0, top)  # one scale for all, threshold in the middle
    rows = []
    for i, (p, s, good) in enumerate(zip(paths, scores, ok)):
        verdict = "unreadable" if not good else "" if det.threshold is None else \
            "defect" if s >= det.threshold else "good"
        row = {"path": str(p), "score": f"{s:.6f}" if good else "", "verdict": verdict}
        if args.maps and good:
            png = out / "maps" / f"{i:06d}_{p.stem}.png"
            seen = pictures[i] if args.tile is not None else to_display(as_picture(dataset[i][0], cfg.model.patch_size),
                                                             cfg.aug.mean, cfg.aug.std)
            plot_attention_map(png, seen, maps[i], f"{p.name}: score {s:.3f} {verdict}", scale)
            np.save(png.with_suffix(".npy"), np.asarray(maps[i], np.float32), allow_pickle=False)
            row["map"] = str(png)
        rows.append(row)
    atomic_write_csv(out / "scores.csv", ["path", "score", "verdict"] + (["map"] if args.maps else []), rows)
    print(f"{int(ok.sum())} image(s) scored, {ok.sum() / max(seconds, 1e-9):.0f} images/s")
    labelled = [(float(s), p.parent.name != "good") for p, s, good in zip(paths, scores, ok) if good]
    if any(not d for _, d in labelled) and any(d for _, d in labelled):
        auc = auroc([s for s, _ in labelled], [d for _, d in labelled])
        metrics = {"auroc": auc, "n": len(labelled), "threshold": det.threshold, **_pixel_metrics(paths, maps, ok)}
        if det.threshold is not None:
            metrics["recall"] = sum(s >= det.threshold for s, d in labelled if d) / sum(d for _, d in labelled)
            metrics["false_alarms"] = int(sum(s >= det.threshold for s, d in labelled if not d))
        atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=1))
        pixel = f", pixel AUROC {metrics['pixel_auroc']:.4f}, AUPRO {metrics['aupro']:.4f}" if "aupro" in metrics \
            else ""
        print(f"image AUROC {auc:.4f}{pixel} (folders named good against the rest)")
    print(printable(f"wrote {out}/scores.csv" + (f" and {out}/maps/" if args.maps else "")))
    return 0


def _score_tiled(args, model, cfg, det, paths):
    """--tile: (scores (N,), maps (H_i, W_i) per image, readable (N,), the images as drawn) of each file read at
    its own scale and scored in tiles (vit/eval/anomaly_tiles.py); an unreadable file scores nan."""
    import numpy as np

    from vit.data.decode import BadImageError, decode_image
    from vit.eval.anomaly_tiles import check_tile, normalised, tiled_score

    aug = cfg.aug.resolved()
    scores, maps, ok, pictures = [], [], [], []
    for p in paths:
        try:
            image = decode_image(p)
        except (BadImageError, ValueError, OSError):
            scores.append(np.nan), maps.append(None), ok.append(False), pictures.append(None)
            continue
        check_tile(args.tile, *image.shape[:2], f"image {p}")
        s, m = tiled_score(det, model, normalised(image, aug.mean, aug.std), args.tile, args.batch_size)
        scores.append(s), maps.append(m), ok.append(True), pictures.append(image)
    return np.array(scores, np.float64), maps, np.array(ok), pictures
