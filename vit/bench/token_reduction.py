"""Token reduction (ToMe `merge`, EViT `topk`) against the plain model and timm, interleaved in one run."""

from __future__ import annotations

import statistics

import torch

from ..config import OptimConfig
from ..layers import parse_token_reduction
from ..models.build import create_model
from ..train.optim import build_optimizer
from ..utils.timing import interleaved, ratio_stats
from .sides import Side, device_sync, side_flops

__all__ = ["bench_token_reduction", "timm_twin", "format_token_reduction_report"]


def bench_token_reduction(specs: list[str], device: torch.device, model: str = "vit_small_patch16_224",
                          img_size: int = 224, batch_size: int = 32, precision: str = "fp32",
                          checkpoint: str | None = None, warmup: int = 2, repeats: int = 5, iters: int = 1) -> dict:
    """Per setting of `specs` (e.g. "merge:8", "topk:0.7"), beside the plain model ("ours") and timm: images/s for
    inference (and a training step for `topk`, which is trained in), the ratios per paired repeat, counted GFLOPs
    per image, and top-1 on the held-out split when `checkpoint` is given (the model then comes from the
    checkpoint, and `model` and `img_size` are its). A bad spec or checkpoint raises ValueError or
    FileNotFoundError before anything is timed."""
    import copy

    import timm.optim

    from ..data import build_datasets
    from ..models.checkpoint import load_checkpoint

    for spec in specs:
        parse_token_reduction(spec)
    torch.manual_seed(0)
    if checkpoint:
        base, cfg, _, _ = load_checkpoint(checkpoint)
        base.set_token_reduction(None)  # the plain model is the reference, whatever the checkpoint trained with
        name, img = cfg.model.name, cfg.model.img_size
    else:
        name, img, cfg = model, img_size, None
        base = create_model(name, img_size=img)
    base = base.to(device)
    ref = timm_twin(base, name, img).to(device)
    opt = OptimConfig(lr=1e-4, weight_decay=0.05)
    sides = [Side("ours", base, build_optimizer(base, opt), device, precision)]
    for spec in specs:
        m = copy.deepcopy(base)
        m.set_token_reduction(spec)
        sides.append(Side(spec, m, build_optimizer(m, opt), device, precision))
    sides.append(Side("timm", ref, timm.optim.create_optimizer_v2(ref, "adamw", lr=1e-4, weight_decay=0.05),
                      device, precision))
    # first: the timed training steps below change the weights
    acc = _top1(sides[:-1], build_datasets(cfg, splits=("val",))[1], device) if cfg is not None else {}
    B = batch_size
    x = torch.randn(B, base.in_chans, img, img, device=device)  # a grey checkpoint takes one channel
    y = torch.randint(0, base.num_classes, (B,), device=device)
    sync = device_sync(device)
    times = interleaved({s.name: (lambda s=s: s.infer(x)) for s in sides}, warmup, repeats, iters, sync).wall
    trained = [s for s in sides if s.name in ("ours", "timm") or s.name.startswith("topk")]
    train_times = interleaved({s.name: (lambda s=s: s.train_step(x, y)) for s in trained}, warmup, repeats, iters,
                              sync).wall if len(trained) > 2 else {}
    rows = []
    for s in sides:
        row = dict(setting=s.name, images_per_s=B / statistics.median(times[s.name]),
                   speedup=ratio_stats(times[s.name], times["ours"]),
                   vs_timm=ratio_stats(times[s.name], times["timm"]),
                   gflops=side_flops(s, x, "inference") / 1e9, top1=acc.get(s.name))
        if s.name in train_times:
            row["train_images_per_s"] = B / statistics.median(train_times[s.name])
            row["train_speedup"] = ratio_stats(train_times[s.name], train_times["ours"])
        rows.append(row)
    return dict(model=name, img_size=img, batch_size=B, device=str(device), precision=precision,
                threads=torch.get_num_threads(), checkpoint=checkpoint, rows=rows)


def timm_twin(model: torch.nn.Module, name: str, img_size: int) -> torch.nn.Module:
    """timm's `name` shaped as `model` (a checkpoint's width, depth, classes, channels) with its weights."""
    import timm

    blk = model.blocks[0]
    ref = timm.create_model(name, pretrained=False, img_size=img_size, patch_size=model.patch_embed.patch_size,
                            embed_dim=model.embed_dim, depth=len(model.blocks), num_heads=blk.attn.num_heads,
                            mlp_ratio=blk.mlp.fc1.out_features / model.embed_dim, num_classes=model.num_classes,
                            global_pool=model.global_pool, in_chans=model.in_chans)
    ref.load_state_dict(model.state_dict())
    return ref


def _top1(sides: list[Side], val, device: torch.device) -> dict[str, float]:
    """Each side's top-1 on the validation set `val`."""
    loader = torch.utils.data.DataLoader(val, batch_size=64)
    acc = {}
    for s in sides:
        s.model.eval()
        with torch.inference_mode():
            hits = sum(int((s.model(xb.to(device)).argmax(1).cpu() == yb).sum()) for xb, yb in loader)
        acc[s.name] = hits / len(val)
    return acc


def format_token_reduction_report(res: dict) -> str:
    """`bench_token_reduction`'s result as the table benchmark.py prints."""
    ckpt = f"  checkpoint {res['checkpoint']}" if res["checkpoint"] else ""
    lines = [f"\ntoken reduction: {res['model']}  {res['img_size']} px  batch {res['batch_size']}  "
             f"{res['precision']}  {res['device']}  {res['threads']} threads{ckpt}",
             f"{'setting':<16}{'img/s':>9}{'x plain (min-max)':>21}{'x timm':>8}{'GFLOPs':>8}{'top-1':>8}"
             f"{'train img/s':>13}{'x plain':>9}"]
    for r in res["rows"]:
        sp, top1 = r["speedup"], r["top1"]
        train = (f"{r['train_images_per_s']:>13.1f}{r['train_speedup']['median']:>9.2f}"
                 if "train_images_per_s" in r else "")
        lines.append(f"{r['setting']:<16}{r['images_per_s']:>9.1f}{sp['median']:>9.2f} ({sp['min']:.2f}-"
                     f"{sp['max']:.2f}){r['vs_timm']['median']:>8.2f}{r['gflops']:>8.2f}"
                     f"{'' if top1 is None else f'{100 * top1:.2f}':>8}{train}")
    return "\n".join(lines)
