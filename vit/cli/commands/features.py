"""Write each image's frozen features: the pooled embedding the head reads and, with --patch-tokens, the final
patch tokens, for any model evaluate.py and predict.py take, in input order with the image paths.

    python features.py --checkpoint runs/default/best data/train/ --out feats/train.npz    # + feats/train.parquet
    python features.py --model vit_small_patch16_224 photos/ --out photos.npz --patch-tokens
    python probe.py --train feats/train.npz --test feats/val.npz --method knn             # k-NN, linear probe

IMAGES are files, folders (searched recursively), globs, or .txt/.lst lists, as predict.py reads them. Each
image's label is the name of its folder (an ImageFolder's <class>/). The .npz holds paths, labels, embeddings
(N, D) float32 and, with --patch-tokens, patch_tokens (N, h*w, D) and grid (h, w); no pickled objects, so
`numpy.load(f, allow_pickle=False)` reads it. The .parquet beside it (columns path, label, embedding) is for
pandas, polars or DuckDB. Unreadable images are passed over and named.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.args import add_model_source
    from vit.cli.help import AUG_EPILOG, HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter,
                                 usage="%(prog)s (--checkpoint DIR | --model NAME ...) IMAGES... --out FILE.npz",
                                 epilog=AUG_EPILOG)
    add_model_source(ap)  # --checkpoint | --model NAME [--pretrained | --weights FILE], --img-size (vit/cli/args.py)
    ap.add_argument("images", nargs="*", help="files, folders, globs, or .txt/.lst files listing paths")
    ap.add_argument("--out", default="features.npz", help="the .npz to write (a .parquet is written beside it)")
    ap.add_argument("--patch-tokens", action="store_true", help="also write the final patch tokens (N, h*w, D)")
    ap.add_argument("--no-parquet", action="store_true", help="write the .npz only")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="images per batch (default: the config's data.eval_batch_size, else data.batch_size)")
    ap.add_argument("--num-workers", type=int, default=None,
                    help="image-decoding worker processes (default: the config's data.num_workers)")
    return ap


def main(argv=None) -> int:
    from vit.cli.args import load_model, parse_command
    from vit.cli.images import images_given
    from vit.cli.outputs import check_writable
    from vit.cli.runtime import make_accelerator, resolve_workers
    from vit.config import ConfigError
    from vit.data import DataError
    from vit.data.datasets import image_transform
    from vit.eval.features import extract_features, save_features
    from vit.eval.inference import ImageFiles, decode_error
    from vit.utils.untrusted_text import printable

    args, overrides = parse_command(build_parser(), sys.argv[1:] if argv is None else argv, "features.py", ("aug.",),
                                    ("batch_size", "img_size"), out="")
    out = Path(args.out)
    if out.suffix != ".npz" or out.is_dir():
        raise ConfigError(f"--out {out} must name a .npz file to write, e.g. --out features.npz.")
    check_writable(out.parent or Path("."), "the folder of --out")
    paths, skipped = images_given(args.images, DataError)
    model, cfg, _ = load_model(args, overrides)
    transform = image_transform(cfg, train=False)  # data.naflex: each image whole, at its own aspect ratio
    dataset = ImageFiles(paths, transform, cfg.model.in_chans)
    accelerator = make_accelerator()
    batch = args.batch_size or cfg.data.eval_batch_size or cfg.data.batch_size
    workers = resolve_workers(cfg.data.num_workers) if args.num_workers is None else args.num_workers

    t0 = time.perf_counter()
    feats = extract_features(model, dataset, batch, workers, accelerator, patch_tokens=args.patch_tokens)
    seconds = time.perf_counter() - t0
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if not accelerator.is_main_process:
        return 0
    skipped += [(p, decode_error(Path(p), transform)) for p, ok in zip(feats["paths"], feats["ok"]) if not ok]
    if not feats["ok"].any():
        raise DataError(f"none of the {len(paths)} input file(s) could be read as an image.")
    written = save_features(out, feats, parquet=not args.no_parquet)
    n, dim = int(feats["ok"].sum()), feats["embeddings"].shape[1]
    print(f"{n} image(s), {dim}-d embeddings, {len(paths) / max(seconds, 1e-9):.0f} images/s; skipped {len(skipped)}")
    for p, reason in skipped[:5]:
        print(printable(f"  skipped {p}: {reason}"))
    print(printable("wrote " + ", ".join(str(w) for w in written)))
    return 0

