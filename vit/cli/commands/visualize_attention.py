"""See where a trained ViT looks: attention rollout, gradient rollout or one layer's raw attention.

    python visualize_attention.py --checkpoint runs/default/best digits:0-7          # held-out digits
    python visualize_attention.py --checkpoint runs/x/best photos/ "more/*.jpg" --method grad_rollout
    python visualize_attention.py --checkpoint runs/x/best img.png --target-class dog --out attn/
    python visualize_attention.py --checkpoint runs/digits_196/best digits:0-3 --token-reduction merge:16 --show-tokens

Per image it writes <name>_<method>.png (input | heatmap | overlay, a colour bar; the true class when known,
the prediction and the method's settings in the title), <name>_<method>.npy (the raw patch-grid map) and
<name>_<method>.json (method, parameters, top-5, title), by default into attention/ of the checkpoint's run
folder. An image named twice is drawn once; files sharing a name in different folders get <folder>_<name>.
Images go through the checkpoint's own evaluation preprocessing, in batches; headless. A model with token
reduction still gives full-grid maps; --show-tokens also writes <name>_tokens.png (which patches were merged
into one token, or fused away by top-k) and <name>_tokens.npy (the final token of every patch, -1: fused).
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.args import add_model_source
    from vit.cli.help import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    add_model_source(ap)  # --checkpoint | --model NAME [--pretrained | --weights FILE], --img-size (vit/cli/args.py)
    ap.add_argument("images", nargs="+", help="files, folders, globs, or digits:I[-J] (held-out digits indices)")
    ap.add_argument("--method", choices=("rollout", "grad_rollout", "attention"), default="rollout",
                    help="rollout: attention rollout (Abnar & Zuidema, 2020); grad_rollout: rollout weighted by "
                         "gradients for one class (Chefer et al., 2021); attention: one layer's [CLS] attention")
    ap.add_argument("--head-fusion", choices=("mean", "max", "min"), default="mean",
                    help="rollout and attention: how the heads of a layer are combined")
    ap.add_argument("--discard-ratio", type=float, default=0.0,
                    help="rollout: share of the weakest attention weights set to zero in each layer, in [0, 1)")
    ap.add_argument("--start-layer", type=int, default=0,
                    help="rollout and grad_rollout: first block multiplied in")
    ap.add_argument("--residual-alpha", type=float, default=0.5,
                    help="rollout: weight of the attention against the identity (the residual path), in [0, 1]")
    ap.add_argument("--layer", type=int, default=-1, help="block for --method attention (-1: the last)")
    ap.add_argument("--target-class", default=None, help="class index or name (default: the predicted class)")
    ap.add_argument("--batch-size", type=int, default=16, help="images per forward pass")
    ap.add_argument("--token-reduction", default=None, metavar="SPEC",
                    help="run with token reduction, e.g. merge:16 or topk:0.5@1,2,3 ('none': off; default: the "
                         "checkpoint's setting)")
    ap.add_argument("--show-tokens", action="store_true", help="draw which patches were merged or dropped")
    ap.add_argument("--out", default=None,
                    help="output folder (default: attention/ in the checkpoint's run folder, or "
                         "runs/attention-<checkpoint folder name> for a checkpoint outside a run folder)")
    return ap


def parse_args(argv):
    from vit.cli.args import check_model_source

    args = build_parser().parse_args(argv)
    check_model_source(args)
    if args.out is None:
        args.out = str(default_out(Path(args.checkpoint)) if args.checkpoint
                       else Path("runs") / f"attention-{args.model.replace('/', '_').replace(':', '_')}")
    return args


def default_out(checkpoint: Path) -> Path:
    """attention/ beside the checkpoint in its train.py run folder (runs/<name>/best -> runs/<name>/attention),
    which git ignores with runs/; a checkpoint elsewhere writes runs/attention-<its folder name>."""
    run_dir = checkpoint.absolute().parent
    if (run_dir / "config.yaml").is_file():
        return Path(checkpoint).parent / "attention"
    return Path("runs") / f"attention-{checkpoint.absolute().name}"


def check_options(args, depth: int) -> None:
    """Option values the model can serve, checked before any image is read or file written."""
    from vit.data import DataError

    if not -depth <= args.layer < depth:
        raise DataError(f"--layer {args.layer} does not exist: the model has {depth} blocks (0 to {depth - 1}, "
                        "or -1 for the last).")
    if not 0 <= args.start_layer < depth:
        raise DataError(f"--start-layer {args.start_layer} must be between 0 and {depth - 1} (the model's blocks).")
    if args.batch_size < 1:
        raise DataError(f"--batch-size must be at least 1, got {args.batch_size}.")
    if not 0 <= args.discard_ratio < 1 or not 0 <= args.residual_alpha <= 1:
        raise DataError("--discard-ratio must be in [0, 1) and --residual-alpha in [0, 1].")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise DataError(f"--out {args.out} is an existing file; pass a folder to write the maps into.")


def collect_inputs(specs: list[str], cfg, classes: list[str]) -> list[tuple[str, np.ndarray | Path, str | None]]:
    """(name, image array or path, true class or None) for every requested image, in order; an image named
    twice (a folder and a glob, or digits:0-3 and digits:2) once, where it first appears. The true class is known
    for a held-out digit, and for a file whose folder is named after one of the checkpoint's classes (the
    ImageFolder layout, root/<class>/<file>)."""

    from vit.data import IMG_EXTENSIONS, DataError, build_datasets

    items: list[tuple[str, np.ndarray | Path, str | None]] = []
    seen: set = set()
    val = None
    for spec in specs:
        if spec.startswith("digits:"):
            if cfg.data.dataset != "digits":
                raise DataError(f"{spec!r} names held-out digits, but this checkpoint was trained on "
                                f"{cfg.data.dataset}; pass image files instead.")
            if val is None:
                val = build_datasets(cfg, splits=("val",))[1]
            lo, _, hi = spec[len("digits:"):].partition("-")
            try:
                idx = range(int(lo), int(hi or lo) + 1)
            except ValueError:
                raise DataError(f"{spec!r} is not a digits index or range like digits:0-7.") from None
            for i in idx:
                if not 0 <= i < len(val):
                    raise DataError(f"digits index {i} is outside the held-out split (0-{len(val) - 1}).")
                if ("digits", i) not in seen:
                    seen.add(("digits", i))
                    items.append((f"digits_{i:04d}", val.images[i], classes[val.labels[i]]))
            continue
        p = Path(spec)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.suffix.lower() in IMG_EXTENSIONS)
        elif p.is_file():
            files = [p]
        else:
            files = sorted(Path(f) for f in glob.glob(spec) if Path(f).suffix.lower() in IMG_EXTENSIONS)
        if not files:
            raise DataError(f"no images found for {spec!r}; pass image files, folders or globs.")
        for f in files:
            if f.resolve() not in seen:
                seen.add(f.resolve())
                items.append((f.stem, f, f.parent.name if f.parent.name in classes else None))
    return unique_names(items)


def unique_names(items: list[tuple]) -> list[tuple]:
    """Files that share a stem get as many of their parent folders as tell them apart: val/cat/0.png and
    val/dog/0.png become cat_0 and dog_0, val/cat/0.png and train/cat/0.png val_cat_0 and train_cat_0 (numbered
    only if the paths agree to the root), so that no map overwrites another's; the sidecar keeps the path."""
    out, used = [], set()
    for name, src, *rest in items:
        twins = [s.resolve() for n, s, *_ in items if n == name and isinstance(s, Path)]
        if len(twins) > 1 and isinstance(src, Path):
            me = src.resolve()
            for depth in range(1, len(me.parts)):
                key = me.parts[-depth - 1:-1]
                if sum(t.parts[-depth - 1:-1] == key for t in twins) == 1:
                    break
            name = "_".join([*key, name])
        base, k = name, 1
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        out.append((name, src, *rest))
    return out


def settings_text(args, depth: int) -> str:
    """The method and the settings that shaped the map (only those it uses), for the picture's title."""
    if args.method == "attention":
        return f"raw attention of block {args.layer % depth} (of 0-{depth - 1}), heads: {args.head_fusion}"
    if args.method == "grad_rollout":  # gradient-weighted heads: no fusion, discarding or residual weight
        return f"grad rollout, blocks {args.start_layer}-{depth - 1}"
    return (f"rollout, heads: {args.head_fusion}, discard ratio {args.discard_ratio:g}, "
            f"blocks {args.start_layer}-{depth - 1}, residual alpha {args.residual_alpha:g}")


def resolve_target(target: str | None, classes: list[str]) -> int | None:
    from vit.data import DataError

    if target is None:
        return None
    if target in classes:
        return classes.index(target)
    if target.lstrip("-").isdigit() and 0 <= int(target) < len(classes):
        return int(target)
    raise DataError(f"--target-class {target!r} is neither a class name nor an index below {len(classes)}.")


def token_groups(model, grid: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """After a tracked forward: (B, h, w) index of the final token that stands for each patch (-1 for EViT's
    fused token of inattentive patches) and (B, h, w) that token's size in patches."""
    from vit.layers.token_reduction import TopK

    tokens = model.blocks.last_tokens
    p = model.num_prefix_tokens
    source = tokens.source[:, p:, p:]  # (B, tokens, patches)
    labels = source.argmax(1)  # (B, patches)
    sizes = tokens.size[:, p:, 0].gather(1, labels)
    if isinstance(model.blocks[max(i for i, b in enumerate(model.blocks) if b.token_reduction is not None)]
                  .token_reduction, TopK):  # top-k fuses the dropped patches into the last token
        labels = labels.masked_fill(labels == source.shape[1] - 1, -1)
    B = labels.shape[0]
    return labels.reshape(B, *grid).numpy(), sizes.reshape(B, *grid).numpy()


def plot_tokens(path: Path, image: np.ndarray, labels: np.ndarray, sizes: np.ndarray, title: str) -> None:
    """Input | merged groups (one colour per token of 2+ patches, dark: fused away, clear: kept alone)."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    from vit.eval.plots import save_figure

    h, w = image.shape[:2]
    colours = colormaps["tab20"](np.arange(20))
    over = np.zeros((*labels.shape, 4))
    merged = (sizes > 1) & (labels >= 0)
    over[merged] = colours[labels[merged] % 20]
    over[merged, 3] = 0.6
    over[labels < 0] = (0.0, 0.0, 0.0, 0.75)
    fig = Figure(figsize=(6.4, 3.4))
    axes = fig.subplots(1, 2)
    axes[0].imshow(image)
    axes[0].set_title("input")
    axes[1].imshow(image)
    axes[1].imshow(over, extent=(-0.5, w - 0.5, h - 0.5, -0.5), interpolation="nearest")
    axes[1].set_title("merged (colour) / dropped (dark)")
    for a in axes:
        a.axis("off")
    fig.suptitle(title)
    save_figure(fig, path, dpi=100)


def main(argv=None) -> int:
    from vit.cli.outputs import OutputLock, check_writable

    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_writable(args.out)  # before the model loads or an image is read
    with OutputLock(args.out):  # one visualization per --out at a time
        return _visualize(args)


def _visualize(args) -> int:
    import numpy as np
    import torch

    from vit.cli.args import load_model
    from vit.data.transforms import build_transform
    from vit.eval.inference import label_names
    from vit.eval.plots import plot_attention_map
    from vit.explain.rollout import attention_maps
    from vit.utils.atomic import atomic_write_bytes, atomic_write_text

    model, cfg, classes = load_model(args, {})  # a checkpoint, or a model by name (vit/cli/args.py)
    classes = classes or label_names(model, model.num_classes)
    check_options(args, len(model.blocks))
    if args.token_reduction is not None:
        model.set_token_reduction(args.token_reduction)
    if args.show_tokens and all(b.token_reduction is None for b in model.blocks):
        raise ValueError("--show-tokens needs a model with token reduction; add --token-reduction merge:8 "
                         "(or a checkpoint trained with one).")
    items = collect_inputs(args.images, cfg, classes)
    truths = {name: truth for name, _, truth in items}
    sources = {name: str(src) if isinstance(src, Path) else name for name, src, _ in items}  # for the sidecar
    settings = settings_text(args, len(model.blocks))
    target = resolve_target(args.target_class, classes)
    transform = build_transform(cfg.aug, cfg.model.img_size, train=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    params = dict(head_fusion=args.head_fusion, discard_ratio=args.discard_ratio, start_layer=args.start_layer,
                  residual_alpha=args.residual_alpha, layer=args.layer)
    written = skipped = 0
    for start in range(0, len(items), args.batch_size):
        batch, shown, names, bad = _decode(items[start : start + args.batch_size], transform, cfg)
        skipped += bad
        if not batch:
            continue
        x = torch.stack(batch)
        tgt = None if target is None else torch.full((len(batch),), target, dtype=torch.long)
        maps, logits = attention_maps(model, x, args.method, tgt, args.head_fusion, args.discard_ratio,
                                      args.start_layer, args.layer, args.residual_alpha)
        probs = logits.softmax(1)
        groups = token_groups(model, maps.shape[1:]) if args.show_tokens else None
        top_p, top_i = probs.topk(min(5, len(classes)), dim=1)
        for j, name in enumerate(names):
            pred = int(top_i[j, 0])
            stem = out / f"{name}_{args.method}"
            grid_map = maps[j].numpy()
            buf = io.BytesIO()
            np.save(buf, grid_map)
            atomic_write_bytes(stem.with_suffix(".npy"), buf.getvalue())
            explained = classes[target] if target is not None else classes[pred]
            truth = f"true {truths[name]}, " if truths[name] is not None else ""
            title = (f"{name}: {truth}predicted {classes[pred]} ({100 * float(top_p[j, 0]):.1f}%)"
                     + (f", map for '{explained}'" if args.method == "grad_rollout" else "") + f"\n{settings}")
            plot_attention_map(stem.with_suffix(".png"), shown[j], grid_map, title)
            sidecar = dict(image=name, source=sources[name], method=args.method, params=params,
                           explained_class=explained, true_class=truths[name], title=title,
                           grid=list(grid_map.shape), checkpoint=args.checkpoint, model=args.model,
                           token_reduction=args.token_reduction or cfg.model.token_reduction,
                           top5=[dict(cls=classes[int(i)], index=int(i), prob=float(p))
                                 for p, i in zip(top_p[j], top_i[j])])
            atomic_write_text(stem.with_suffix(".json"), json.dumps(sidecar, indent=1))
            if groups is not None:
                _write_tokens(out, name, shown[j], groups[0][j], groups[1][j],
                              args.token_reduction or cfg.model.token_reduction)
            written += 1
    print(f"wrote {written} map(s) to {out}/" + (f"; skipped {skipped} unreadable file(s)" if skipped else ""))
    return 0 if written else 2


def _decode(items, transform, cfg) -> tuple[list, list, list, int]:
    """(model inputs, the images as shown, names, unreadable count) for one batch of `collect_inputs` items; an
    unreadable file is named on stderr and skipped."""
    import numpy as np

    from vit.data.decode import BadImageError
    from vit.eval.plots import to_display
    from vit.utils.untrusted_text import printable

    batch, shown, names, skipped = [], [], [], 0
    for name, src, _ in items:
        try:  # a file is decoded at the smallest JPEG scale the evaluation resize allows
            x = transform(src) if isinstance(src, np.ndarray) else transform.load(src)
        except BadImageError as e:
            print(f"skipping {printable(e)}", file=sys.stderr)
            skipped += 1
            continue
        batch.append(x)
        names.append(name)
        shown.append(to_display(x, cfg.aug.mean, cfg.aug.std))  # what the model saw, in [0, 1]
    return batch, shown, names, skipped


def _write_tokens(out: Path, name: str, shown, labels, sizes, spec: str) -> None:
    """<name>_tokens.npy (each patch's token id) and <name>_tokens.png (the merged tokens drawn)."""
    import numpy as np

    from vit.utils.atomic import atomic_write_bytes

    buf = io.BytesIO()
    np.save(buf, labels)
    atomic_write_bytes(out / f"{name}_tokens.npy", buf.getvalue())
    left = len(np.unique(labels[labels >= 0])) + int((labels < 0).any())
    plot_tokens(out / f"{name}_tokens.png", shown, labels, sizes,
                f"{name}: {left} tokens for {labels.size} patches ({spec})")

