"""Anomaly detection from good parts only (PatchCore): a memory bank of the patch features of good images, each
new image scored by its worst patch's distance to the bank, with a heat map of where.

    python anomaly.py fit --checkpoint runs/parts/best --good parts/train/good --val parts/val/good
    python anomaly.py score --checkpoint runs/parts/best parts/test/ --out inspect/ --maps

fit writes <checkpoint>/anomaly/ (or --bank): bank.safetensors (the coreset of good patch features, float32) and
patchcore.json (the blocks read, the threshold: the highest score of the good --val images unless
--false-alarm-rate says otherwise). score writes to --out: scores.csv (path, score, verdict: defect at or above
the threshold), with --maps maps/<index>_<name>.png (the patch scores over the image), and, where the images sit
in folders and some folder is named good (parts/test/good/, parts/test/scratch/, ...), metrics.json with the
image-level AUROC of good against the rest. Any model evaluate.py takes serves as the backbone.

With the bank in <checkpoint>/anomaly/, predict.py adds the score and verdict to its rows (and with --cam the heat
map), demo.py shows them, and export.py writes anomaly/ beside model.onnx for predict.py --onnx (docs/few-labels.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the options one mode reads and the other does not (their help says 'fit:' or 'score:')
FIT_ONLY = ("good", "val", "ratio", "max_bank", "layers", "neighbourhood", "false_alarm_rate", "seed")
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
    ap.add_argument("--val", nargs="+", default=None,
                    help="fit: other good images that set the threshold (default: none; then score gives no verdict)")
    ap.add_argument("--bank", default=None, help="the bank folder (default: <checkpoint>/anomaly)")
    ap.add_argument("--ratio", type=float, default=0.1, help="fit: the share of good patches the coreset keeps")
    ap.add_argument("--max-bank", type=int, default=None,
                    help="fit: at most this many patch features in the bank (the coreset's time is then linear in "
                         "images; default: no cap)")
    ap.add_argument("--layers", type=int, nargs="+", default=None,
                    help="fit: the blocks whose patch tokens are read (default: the two around the middle)")
    ap.add_argument("--neighbourhood", type=int, default=3,
                    help="fit: average each patch's features over this many patches across (odd; 1: none)")
    ap.add_argument("--false-alarm-rate", type=float, default=0.0,
                    help="fit: the share of good --val images allowed above the threshold")
    ap.add_argument("--seed", type=int, default=0, help="fit: seed of the coreset's projection and start")
    ap.add_argument("--out", default="anomaly-scores", help="score: output folder")
    ap.add_argument("--maps", action="store_true", help="score: also write each image's heat map")
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
    from pathlib import Path

    from vit.cli.args import load_model, parse_command
    from vit.cli.images import crop_note
    from vit.cli.outputs import check_writable
    from vit.config import ConfigError
    from vit.data.datasets import image_transform
    from vit.eval.inference import ImageFiles

    args, overrides = parse_command(build_parser(), sys.argv[1:] if argv is None else argv, "anomaly.py", ("aug.",),
                                    ("batch_size", "img_size"), intermixed=True)
    if not 0 <= args.false_alarm_rate < 1:
        raise ConfigError(f"--false-alarm-rate must be in [0, 1), got {args.false_alarm_rate}.")
    bank_dir = Path(args.bank) if args.bank else Path(args.checkpoint) / "anomaly" if args.checkpoint else None
    if bank_dir is None:
        raise ConfigError("with --model, pass --bank FOLDER: where the bank is written and read.")
    _check_mode_options(args)
    if args.mode == "fit" and not args.good:
        raise ConfigError("anomaly.py fit needs --good: images of good parts only.")
    if args.mode == "score" and not args.images:
        raise ConfigError("anomaly.py score needs images to score.")
    check_writable(bank_dir if args.mode == "fit" else args.out)
    model, cfg, _ = load_model(args, overrides)
    transform = image_transform(cfg, train=False)  # data.naflex: each image whole, on its own grid of patches
    note = None if cfg.data.naflex else crop_note(cfg.aug.resolved().eval_crop_pct, f"anomaly.py {args.mode}")
    if note:
        print(note, file=sys.stderr)

    def files(paths):
        return ImageFiles(paths, transform, cfg.model.in_chans)

    if args.mode == "fit":
        return _fit(args, model, files, bank_dir)
    return _score(args, model, cfg, files, bank_dir)


def _check_mode_options(args) -> None:
    """An option only the other mode reads is refused: it would be ignored (fit --out wrote nothing)."""
    from vit.config import ConfigError

    parser = build_parser()
    other = SCORE_ONLY if args.mode == "fit" else FIT_ONLY
    given = [k for k in other if getattr(args, k) not in (parser.get_default(k), [])]
    if given:
        shown = "images to score" if given[0] == "images" else "--" + given[0].replace("_", "-")
        raise ConfigError(f"anomaly.py {args.mode} does not read {shown} (anomaly.py "
                          f"{'score' if args.mode == 'fit' else 'fit'} does); remove it.")


def _fit(args, model, files, bank_dir) -> int:
    """anomaly.py fit: the bank of good patches (and, with --val, its threshold) saved into `bank_dir`."""
    import time

    from vit.eval.anomaly import choose_threshold, fit_patchcore, save_patchcore
    from vit.utils.untrusted_text import printable

    t0 = time.perf_counter()
    good = _files(args.good, "--good")
    pc = fit_patchcore(model, files(good), tuple(args.layers) if args.layers else None, args.ratio,
                       args.batch_size, args.seed, neighbourhood=args.neighbourhood, max_bank=args.max_bank)
    extra = {"ratio": args.ratio, "good_images": len(good)}
    if args.val:
        scores, _, _ = pc.score_files(model, files(_files(args.val, "--val")), args.batch_size)
        pc.threshold = choose_threshold(scores, args.false_alarm_rate)
        extra["false_alarm_rate"] = args.false_alarm_rate
    save_patchcore(bank_dir, pc, extra)
    seconds = time.perf_counter() - t0
    thr = f", threshold {pc.threshold:.4f}" if pc.threshold is not None else " (no --val: no threshold)"
    print(printable(f"bank of {len(pc.bank)} patch features from {len(good)} good image(s), blocks "
                    f"{list(pc.layers)}, neighbourhood {pc.neighbourhood}{thr}, {seconds:.1f} s; wrote {bank_dir}"))
    return 0


def _score(args, model, cfg, files, bank_dir) -> int:
    """anomaly.py score: scores.csv (and maps/, and metrics.json when good and defect folders are both there)."""
    import json
    import time
    from pathlib import Path

    from vit.data.naflex import as_picture
    from vit.eval.anomaly import auroc, load_patchcore
    from vit.eval.plots import plot_attention_map, to_display
    from vit.utils.atomic import atomic_write_csv, atomic_write_text
    from vit.utils.untrusted_text import printable

    pc = load_patchcore(bank_dir)
    paths = _files(args.images, "IMAGES")
    dataset = files(paths)
    t0 = time.perf_counter()
    scores, maps, ok = pc.score_files(model, dataset, args.batch_size)
    seconds = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (p, s, good) in enumerate(zip(paths, scores, ok)):
        verdict = "unreadable" if not good else "" if pc.threshold is None else \
            "defect" if s >= pc.threshold else "good"
        row = {"path": str(p), "score": f"{s:.6f}" if good else "", "verdict": verdict}
        if args.maps and good:
            png = out / "maps" / f"{i:06d}_{p.stem}.png"
            seen = to_display(as_picture(dataset[i][0], cfg.model.patch_size), cfg.aug.mean, cfg.aug.std)
            plot_attention_map(png, seen, maps[i], f"{p.name}: score {s:.3f} {verdict}")
            row["map"] = str(png)
        rows.append(row)
    atomic_write_csv(out / "scores.csv", ["path", "score", "verdict"] + (["map"] if args.maps else []), rows)
    print(f"{int(ok.sum())} image(s) scored, {ok.sum() / max(seconds, 1e-9):.0f} images/s")
    labelled = [(float(s), p.parent.name != "good") for p, s, good in zip(paths, scores, ok) if good]
    if any(not d for _, d in labelled) and any(d for _, d in labelled):
        auc = auroc([s for s, _ in labelled], [d for _, d in labelled])
        metrics = {"auroc": auc, "n": len(labelled), "threshold": pc.threshold}
        if pc.threshold is not None:
            metrics["recall"] = sum(s >= pc.threshold for s, d in labelled if d) / sum(d for _, d in labelled)
            metrics["false_alarms"] = int(sum(s >= pc.threshold for s, d in labelled if not d))
        atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=1))
        print(f"image AUROC {auc:.4f} (folders named good against the rest)")
    print(printable(f"wrote {out}/scores.csv" + (f" and {out}/maps/" if args.maps else "")))
    return 0

