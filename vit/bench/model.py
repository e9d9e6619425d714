"""Ours against timm's same-named model, side by side in one run: inference and training-step throughput
(interleaved after warm-up, each side with its toolkit's own optimizer factory: ours
`vit.train.optim.build_optimizer`, timm's `timm.optim.create_optimizer_v2`), counted FLOPs per image, achieved
FLOP/s and utilization against a matrix-multiply peak measured in the same run (the best of three: before,
between and after the timed passes), activation memory kept for backward and the attention kernel; and the
token-scaling table (activation memory and a training step's time as the image grows)."""

from __future__ import annotations

import statistics

import torch

from ..config import OptimConfig
from ..models.build import create_model
from ..train.optim import build_optimizer
from ..utils.timing import interleaved, ratio_stats
from .sides import (
    Side,
    attention_kernels,
    checkpointed_activation_bytes,
    cuda_peak_mib,
    device_sync,
    matmul_peak,
    saved_activation_bytes,
    side_flops,
)

__all__ = ["build_sides", "bench_model", "bench_scaling", "format_model_report"]


def build_sides(model: str, img_size: int, device: torch.device, precision: str = "fp32",
                compile: bool = False, model_kwargs: dict | None = None) -> list[Side]:
    """Ours and timm's `model` (any family by name or tag: CLIP, SigLIP, DINOv2 with registers, DeiT3, distilled
    DeiT, ...) with the same weights, each with its toolkit's AdamW (lr 1e-4, weight decay 0.05). `model_kwargs`
    go to both create_model calls (e.g. depth=6: a big model's blocks at a CPU's scale, as timm's benchmark.py)."""
    import timm
    import timm.optim

    # a 1000-way head on both (a tag's own may have none, e.g. DINOv2, or CLIP's 512-wide projection); the rest,
    # prefix tokens and pooling included, is the name's in each toolkit
    kw = dict(model_kwargs or {}, img_size=img_size, num_classes=1000)
    ours = create_model(model, **kw).to(device)
    ref = timm.create_model(model, pretrained=False, **kw).to(device)
    ref.load_state_dict(ours.state_dict())
    cfg = OptimConfig(lr=1e-4, weight_decay=0.05)
    sides = [Side("ours", ours, build_optimizer(ours, cfg), device, precision),
             Side("timm", ref, timm.optim.create_optimizer_v2(ref, "adamw", lr=1e-4, weight_decay=0.05),
                  device, precision)]
    if compile:
        for s in sides:
            s.model = torch.compile(s.model)
    return sides


def bench_model(model: str, device: torch.device, batch_size: int = 32, img_size: int = 224,
                precision: str = "fp32", compile: bool = False, warmup: int = 2, repeats: int = 5, iters: int = 1,
                peak_size: int = 2048, model_kwargs: dict | None = None) -> dict:
    """The ours-vs-timm comparison (module docstring); medians and the ratio ours/timm per paired repeat."""
    torch.manual_seed(0)
    sides = build_sides(model, img_size, device, precision, compile, model_kwargs)
    B = batch_size
    x = torch.randn(B, 3, img_size, img_size, device=device)
    y = torch.randint(0, 1000, (B,), device=device)
    peak = matmul_peak(device, precision, n=peak_size)
    # counted per side: timm runs the full last block for every token, ours for [CLS] only
    flops = {s.name: {mode: side_flops(s, x, mode) for mode in ("inference", "train_step")} for s in sides}
    res = {"model": model, "model_kwargs": dict(model_kwargs or {}), "batch_size": B, "img_size": img_size,
           "precision": precision, "device": str(device), "compile": compile, "threads": torch.get_num_threads(),
           "flops_per_image": flops["ours"]}
    all_times, peaks = {}, [peak]
    for mode, make in (("inference", lambda s: (lambda: s.infer(x))),
                       ("train_step", lambda s: (lambda: s.train_step(x, y)))):
        all_times[mode] = interleaved({s.name: make(s) for s in sides}, warmup, repeats, iters,
                                      device_sync(device)).wall
        # a shared machine's speed drifts: keep the best peak seen
        peaks.append(matmul_peak(device, precision, n=peak_size))
    peak = max(peaks)
    res["matmul_peak_tflops"] = peak / 1e12
    for mode, times in all_times.items():
        entry = {}
        for s in sides:
            med = statistics.median(times[s.name])
            fl = flops[s.name][mode]
            entry[s.name] = dict(images_per_s=B / med, seconds_median=med, seconds_all=times[s.name],
                                 tflops=fl * B / med / 1e12, utilization=fl * B / med / peak, flops_per_image=fl)
        entry["ratio_ours_over_timm"] = ratio_stats(times["ours"], times["timm"])
        res[mode] = entry
    res["memory"] = {s.name: dict(saved_activation_mib=saved_activation_bytes(s, x, y) / 2**20,
                                  checkpointed_activation_mib=checkpointed_activation_bytes(s, x, y) / 2**20,
                                  cuda_peak_mib=cuda_peak_mib(s, x, y)) for s in sides}
    res["attention_kernels"] = {s.name: attention_kernels(s, x, y) for s in sides}
    return res


def bench_scaling(model: str, device: torch.device, sizes: list[int], precision: str = "fp32",
                  compile: bool = False, repeats: int = 2, model_kwargs: dict | None = None) -> list[dict]:
    """Activation memory and fwd+bwd time as the token count grows (batch 1), one row per image size."""
    rows = []
    for size in sizes:
        torch.manual_seed(0)
        sides = build_sides(model, size, device, precision, compile, model_kwargs)
        x = torch.randn(1, 3, size, size, device=device)
        y = torch.zeros(1, dtype=torch.long, device=device)
        row = {"img_size": size, "tokens": sides[0].model.num_prefix_tokens + sides[0].model.patch_embed.num_patches}
        times = interleaved({s.name: (lambda s=s, x=x, y=y: s.train_step(x, y)) for s in sides}, 1, repeats, 1,
                            device_sync(device)).wall
        for s in sides:
            row[s.name] = dict(saved_activation_mib=saved_activation_bytes(s, x, y) / 2**20,
                               train_step_s=statistics.median(times[s.name]),
                               cuda_peak_mib=cuda_peak_mib(s, x, y))
        rows.append(row)
    return rows


def format_model_report(res: dict) -> str:
    """`bench_model`'s result (and `bench_scaling`'s rows under "scaling") as the table benchmark.py prints."""
    lines = []
    if "inference" in res:
        kw = "".join(f" {k}={v!r}" for k, v in res.get("model_kwargs", {}).items())
        lines += [f"\n{res['model']}{kw}  batch {res['batch_size']}  {res['img_size']} px  {res['precision']}  "
                  f"{res['device']}  {res['threads']} threads  compile={res['compile']}",
                  f"matmul peak measured: {res['matmul_peak_tflops'] * 1e3:.0f} GFLOP/s;  FLOPs/image: inference "
                  f"{res['flops_per_image']['inference'] / 1e9:.2f} G (ours), train step "
                  f"{res['flops_per_image']['train_step'] / 1e9:.2f} G (ours)",
                  f"{'':12}{'ours img/s':>12}{'timm img/s':>12}{'ratio (min-max)':>22}{'ours util':>11}"
                  f"{'timm util':>11}"]
        for mode in ("inference", "train_step"):
            e = res[mode]
            r = e["ratio_ours_over_timm"]
            lines.append(f"{mode:12}{e['ours']['images_per_s']:>12.1f}{e['timm']['images_per_s']:>12.1f}"
                         f"{r['median']:>9.3f} ({r['min']:.3f}-{r['max']:.3f})"
                         f"{100 * e['ours']['utilization']:>10.0f}%{100 * e['timm']['utilization']:>10.0f}%")
        m = res["memory"]
        lines.append(f"activations kept for backward: ours {m['ours']['saved_activation_mib']:.1f} MiB, "
                     f"timm {m['timm']['saved_activation_mib']:.1f} MiB")
        if "checkpointed_activation_mib" in m["ours"]:
            c = m["ours"]["checkpointed_activation_mib"]
            lines.append(f"  with gradient checkpointing: ours {c:.1f} MiB "
                         f"({m['ours']['saved_activation_mib'] / max(c, 1e-9):.1f}x less), "
                         f"timm {m['timm']['checkpointed_activation_mib']:.1f} MiB")
        lines.append(f"attention kernels: ours {res['attention_kernels']['ours']}, "
                     f"timm {res['attention_kernels']['timm']}")
    if "scaling" in res:
        lines.append(f"\n{'px':>6}{'tokens':>8}{'ours MiB':>10}{'timm MiB':>10}{'ours/timm':>10}{'ours s':>9}"
                     f"{'timm s':>9}")
        for r in res["scaling"]:
            o, t = r["ours"], r["timm"]
            lines.append(f"{r['img_size']:>6}{r['tokens']:>8}{o['saved_activation_mib']:>10.1f}"
                         f"{t['saved_activation_mib']:>10.1f}"
                         f"{o['saved_activation_mib'] / t['saved_activation_mib']:>10.3f}"
                         f"{o['train_step_s']:>9.3f}{t['train_step_s']:>9.3f}")
    return "\n".join(lines)
