"""Speed and memory of our ViT against timm's same-named model, measured side by side in one run.

    python benchmark.py --model vit_small_patch16_224 --batch-size 32            # CPU, fp32
    python benchmark.py --model vit_base_patch16_224 --device cuda --precision bf16 --compile
    python benchmark.py --data                                                   # the input pipeline
    python benchmark.py --model vit_tiny_patch16_224 --scaling 224 448 672 896 --out bench.json
    python benchmark.py --model vit_small_patch16_224 --batch-size 8 --no-model --runtime onnxruntime
    python benchmark.py --sparse-attention moba:0.125:block dsa:0.125:block dsa:0.25:block --sparse-tokens 1024 8192
    python benchmark.py --edge --edge-models vit_tiny_patch16_224 vit_small_patch16_224 --out edge.json

Inference and training-step (forward, backward, optimizer step) throughput are measured for ours and timm's
model interleaved (A, B, A, B, ...) after warm-up; each side uses its toolkit's own optimizer factory
(ours: `vit.train.optim.build_optimizer`, timm: `timm.optim.create_optimizer_v2`). Reported: medians, the ratio
ours/timm with its min-max spread over the paired repeats, counted FLOPs per image, achieved FLOP/s and
utilization against a matrix-multiply peak measured in the same run (the best of three measurements: before,
between and after the timed passes), activation memory kept for backward
(bytes of tensors saved by autograd; on CUDA also the allocator's peak), and the attention kernel the profiler saw.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path


def count(least: int):
    """An argparse type: an int of at least `least` (a repeat count of 0 has no median; a batch of 0 times nothing)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    parse.__name__ = "int"  # argparse's 'invalid int value' for text that is not a number
    return parse


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.help import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--model", default="vit_small_patch16_224", help="a vit.list_models() name (timm's too)")
    ap.add_argument("--batch-size", type=count(1), default=32, help="images per timed call")
    ap.add_argument("--img-size", type=count(1), default=224, help="input height and width")
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32", help="autocast dtype")
    ap.add_argument("--compile", action="store_true", help="torch.compile both models")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    ap.add_argument("--warmup", type=count(0), default=2, help="untimed calls before measuring")
    ap.add_argument("--repeats", type=count(1), default=5, help="timed repeats per model (medians are reported)")
    ap.add_argument("--iters", type=count(1), default=1, help="calls per timed repeat")
    ap.add_argument("--peak-size", type=count(1), default=2048, help="matrix size for the matmul peak (CUDA: >= 8192)")
    ap.add_argument("--scaling", type=count(1), nargs="*", default=None,
                    help="image sizes for the token-scaling table (default: none)")
    ap.add_argument("--scaling-repeats", type=count(1), default=2, help="timed repeats per size in the scaling table")
    ap.add_argument("--no-model", action="store_true", help="skip the throughput comparison")
    ap.add_argument("--data", action="store_true", help="benchmark the input pipeline")
    ap.add_argument("--data-images", type=count(1), default=100, help="--data: 500x375 JPEGs to time")
    ap.add_argument("--data-repeats", type=count(1), default=5, help="--data: timed passes")
    ap.add_argument("--data-large", type=count(0), default=20, help="2000x1500 JPEGs to time too (0: none)")
    ap.add_argument("--runtime", choices=("onnxruntime",), default=None,
                    help="also time our model in ONNX Runtime (CPU) against PyTorch eager")
    ap.add_argument("--edge", action="store_true",
                    help="the deployment table: PyTorch eager fp32, ONNX Runtime fp32, INT8 dynamic and static, and "
                         "token merging, per model, batch and thread count (skips the ours-vs-timm comparison)")
    ap.add_argument("--edge-models", nargs="+", help="--edge: models (random weights)",
                    default=["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224"])
    ap.add_argument("--edge-batches", type=int, nargs="+", default=[1, 16], help="--edge: batch sizes")
    ap.add_argument("--edge-threads", type=int, nargs="+", default=[1, 2], help="--edge: thread counts")
    ap.add_argument("--edge-merge", nargs="*", default=["merge:8"],
                    help="--edge: token-merging settings, each timed merged in eager, ONNX Runtime fp32 and INT8 "
                         "dynamic (none given: no merging)")
    ap.add_argument("--token-reduction", nargs="+", default=None, metavar="SPEC",
                    help="instead of the ours-vs-timm comparison, a token-reduction table for these settings, "
                         "e.g. merge:8 merge:16 topk:0.7")
    ap.add_argument("--checkpoint", default=None,
                    help="with --token-reduction or --edge: a train.py checkpoint (its model; adds top-1)")
    ap.add_argument("--sparse-attention", nargs="+", default=None, metavar="SPEC",
                    help="instead of the ours-vs-timm comparison, dense SDPA against sparse attention "
                         "METHOD[:DENSITY][:SELECT] (e.g. moba:0.125:block dsa:0.25:block), for one attention layer "
                         "(768 wide, 12 heads) and whole models, inference, interleaved")
    ap.add_argument("--sparse-tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192],
                    help="--sparse-attention: sequence lengths of the attention and text-encoder rows")
    ap.add_argument("--sparse-img-sizes", type=int, nargs="*", default=[512, 1024],
                    help="--sparse-attention: ViT-B/16 image sizes of the whole-model rows")
    ap.add_argument("--sparse-rows", nargs="+", default=["kernel", "attention", "text"],
                    choices=("kernel", "attention", "text"),
                    help="--sparse-attention: which rows per length (kernel: q, k, v given, scoring included)")
    ap.add_argument("--sparse-block-size", type=count(1), default=128,
                    help="--sparse-attention: tokens per key block (and per query block that shares a selection)")
    ap.add_argument("--sparse-depth", type=int, default=2,
                    help="--sparse-attention: blocks of the whole models (each block costs the same, so the ratio "
                         "is that of any depth up to the embedding and head)")
    ap.add_argument("--out", default=None, help="write the results as JSON to this file")
    return ap


if __name__ == "__main__":  # --help answers here, before torch and the model code are imported
    from vit.cli.help import exit_if_help

    exit_if_help(build_parser)


import torch

import vit
from vit.config import OptimConfig
from vit.train.optim import build_optimizer
from vit.utils import perf
from vit.utils.perf import count_flops, sync

KERNELS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_flash_attention_forward": "flash",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_efficient_attention_forward": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_softmax": "explicit softmax",
}


def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def matmul_peak(device: torch.device, precision: str, n: int = 2048, reps: int = 10) -> float:
    """FLOP/s of a large square matmul at `precision`, the practical peak for dense layers on this device."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    if device.type == "cpu" and precision != "fp32":
        dtype = torch.float32  # autocast on CPU still multiplies most matrices in fp32 on machines without AMX
    return perf.matmul_peak(device, dtype, max(n, 8192) if device.type == "cuda" else n, reps)


class Side:
    """One model (ours or timm's) with its optimizer and step functions."""

    def __init__(self, name: str, model: torch.nn.Module, optimizer, device, precision: str) -> None:
        self.name, self.model, self.opt, self.device, self.precision = name, model, optimizer, device, precision

    def infer(self, x):
        self.model.eval()
        with torch.inference_mode(), autocast(self.device, self.precision):
            self.model(x)

    def train_step(self, x, y):
        self.model.train()
        with autocast(self.device, self.precision):
            loss = torch.nn.functional.cross_entropy(self.model(x).float(), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def build_sides(args, device) -> list[Side]:
    import timm
    import timm.optim

    kw = dict(img_size=args.img_size)
    ours = vit.create_model(args.model, **kw).to(device)
    ref = timm.create_model(args.model, pretrained=False, **kw).to(device)
    ref.load_state_dict(ours.state_dict())
    cfg = OptimConfig(lr=1e-4, weight_decay=0.05)
    sides = [Side("ours", ours, build_optimizer(ours, cfg), device, args.precision),
             Side("timm", ref, timm.optim.create_optimizer_v2(ref, "adamw", lr=1e-4, weight_decay=0.05),
                  device, args.precision)]
    if args.compile:
        for s in sides:
            s.model = torch.compile(s.model)
    return sides


def timed(fn, device, n_iter: int) -> float:
    sync(device)
    t = time.perf_counter()
    for _ in range(n_iter):
        fn()
    sync(device)
    return (time.perf_counter() - t) / n_iter


def interleaved(sides, make_fn, device, warmup, repeats, n_iter) -> dict[str, list[float]]:
    """Seconds per call for each side, measured A, B, A, B, ... after warm-up."""
    for s in sides:
        for _ in range(warmup):
            make_fn(s)()
    times = {s.name: [] for s in sides}
    for _ in range(repeats):
        for s in sides:
            times[s.name].append(timed(make_fn(s), device, n_iter))
    return times


def saved_activation_bytes(side: Side, x, y) -> int:
    """Bytes of distinct tensors autograd keeps for backward during one training forward."""
    seen: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            try:
                key = t.untyped_storage().data_ptr()
                seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
            except (RuntimeError, NotImplementedError):
                pass
        return t

    side.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(side.device, side.precision):
        loss = torch.nn.functional.cross_entropy(side.model(x).float(), y)
    params = {p.untyped_storage().data_ptr() for p in side.model.parameters()}
    loss.backward()
    side.opt.zero_grad(set_to_none=True)
    return sum(v for k, v in seen.items() if k not in params)


def checkpointed_activation_bytes(side: Side, x, y) -> int:
    """`saved_activation_bytes` with gradient checkpointing on (`model.grad_checkpointing: true`): what is kept is
    each block's input (B, N, D), held by torch.utils.checkpoint, plus what lies outside the blocks."""
    model = getattr(side.model, "_orig_mod", side.model)  # torch.compile'd: the module it wraps
    model.set_grad_checkpointing(True)
    try:
        return saved_activation_bytes(side, x, y)
    finally:
        model.set_grad_checkpointing(False)


def cuda_peak_mib(side: Side, x, y) -> float | None:
    """The CUDA allocator's peak during one training step, above what was allocated before it; None on CPU."""
    if side.device.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    side.train_step(x, y)
    sync(side.device)
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def attention_kernels(side: Side, x, y) -> list[str]:
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                    if side.device.type == "cuda" else [])
    # the profiler's native library (kineto) logs 'profiler_start' and, without a GPU, 'gpuGetDeviceCount failed'
    # to stderr; level 6 silences it (read when the profiler starts, so setting it here is in time)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with torch.profiler.profile(activities=acts) as prof:
        side.train_step(x, y)
    names = {e.key for e in prof.key_averages()}
    return sorted({label for op, label in KERNELS.items() if op in names})


def ratio_stats(a: list[float], b: list[float]) -> dict:
    """b / a for each paired repeat, then median, min and max. With seconds (ours, timm) it is our speed-up;
    with images/s (reference, ours) it is ours over the reference."""
    r = [y / x for x, y in zip(a, b)]
    return dict(median=statistics.median(r), min=min(r), max=max(r))


def bench_model(args, device) -> dict:
    torch.manual_seed(0)
    sides = build_sides(args, device)
    B = args.batch_size
    x = torch.randn(B, 3, args.img_size, args.img_size, device=device)
    y = torch.randint(0, 1000, (B,), device=device)
    peak = matmul_peak(device, args.precision, n=args.peak_size)
    # counted per side: timm runs the full last block for every token, ours for [CLS] only
    flops = {s.name: {mode: side_flops(s, x, mode) for mode in ("inference", "train_step")} for s in sides}
    res = {"model": args.model, "batch_size": B, "img_size": args.img_size, "precision": args.precision,
           "device": str(device), "compile": args.compile, "threads": torch.get_num_threads(),
           "flops_per_image": flops["ours"]}
    all_times, peaks = {}, [peak]
    for mode, make in (("inference", lambda s: (lambda: s.infer(x))),
                       ("train_step", lambda s: (lambda: s.train_step(x, y)))):
        all_times[mode] = interleaved(sides, make, device, args.warmup, args.repeats, args.iters)
        # a shared machine's speed drifts: keep the best peak seen
        peaks.append(matmul_peak(device, args.precision, n=args.peak_size))
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


def side_flops(side: Side, x, mode: str) -> int:
    """FLOPs per image of one inference or one forward+backward, counted on a single image."""
    if mode == "inference":
        with torch.no_grad():
            return count_flops(lambda: side.model(x[:1]))
    def once():
        side.model(x[:1]).sum().backward()
    f = count_flops(once)
    side.opt.zero_grad(set_to_none=True)
    return f


def bench_scaling(args, device, sizes: list[int]) -> list[dict]:
    """Activation memory and fwd+bwd time as the token count grows (batch 1)."""
    rows = []
    for size in sizes:
        a = argparse.Namespace(**{**vars(args), "img_size": size})
        torch.manual_seed(0)
        sides = build_sides(a, device)
        x = torch.randn(1, 3, size, size, device=device)
        y = torch.zeros(1, dtype=torch.long, device=device)
        row = {"img_size": size, "tokens": sides[0].model.num_prefix_tokens + sides[0].model.patch_embed.num_patches}
        times = interleaved(sides, lambda s, x=x, y=y: (lambda: s.train_step(x, y)), device, 1,
                            args.scaling_repeats, 1)
        for s in sides:
            row[s.name] = dict(saved_activation_mib=saved_activation_bytes(s, x, y) / 2**20,
                               train_step_s=statistics.median(times[s.name]),
                               cuda_peak_mib=cuda_peak_mib(s, x, y))
        rows.append(row)
    return rows


def _jpeg_files(rng, n: int, width: int, height: int, tmp: str) -> list[str]:
    """Photo-like JPEGs (1/f spectrum, quality 90: ~120 KB at 500x375, decoding as slowly as a photo of that
    size; a smooth or blank image decodes 2-3x faster and would flatter any pipeline's ratio to decoding)."""
    from PIL import Image

    from vit.data.synthetic import photo_like

    paths = []
    for i in range(n):
        p = f"{tmp}/{width}x{height}-{i:04d}.jpg"
        Image.fromarray(photo_like(rng, width, height)).save(p, format="JPEG", quality=90)
        paths.append(p)
    return paths


def bench_data(args) -> dict:
    """Images/s of one worker (one thread) on generated photo-like JPEGs, 500x375 (an ImageNet-sized photo)
    and, unless --data-large 0, 2000x1500 (a phone photo): decoding alone (our decoder, and PIL's), our
    training pipeline (decode, random resized crop 224, flip, colour jitter 0.4 with p=0.8, normalize), and
    the same recipe in torchvision-v2, from PIL images (what ImageFolder's loader gives it) and from tensors
    decoded by torchvision.io. Every pipeline gets a fresh seed per image; the passes are interleaved."""
    import tempfile

    import numpy as np
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg, read_file
    from torchvision.transforms import v2

    from vit.config import AugConfig
    from vit.data.decode import decode_image
    from vit.data.transforms import build_transform

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    aug = AugConfig(random_resized_crop=True, hflip=0.5, color_jitter=0.4, mean=mean, std=std)
    ours = build_transform(aug, 224, train=True)
    recipe = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
              v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4)], p=0.8)]
    tv_pil = v2.Compose([*recipe, v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    tv_tensor = v2.Compose([*recipe, v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cv2 = __import__("cv2")
    cv2_threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    pipelines = {
        "decode_only": lambda p, i: decode_image(p),
        "decode_only_pil": lambda p, i: np.asarray(Image.open(p).convert("RGB")),
        "ours": lambda p, i: ours.load(p, seed=i),
        "torchvision_v2": lambda p, i: tv_pil(Image.open(p).convert("RGB")),
        "torchvision_v2_tensor": lambda p, i: tv_tensor(decode_jpeg(read_file(p), mode=ImageReadMode.RGB)),
    }

    def run(fn, paths):
        fn(paths[0], 0)
        t = time.perf_counter()
        for i, p in enumerate(paths):
            fn(p, i)
        return len(paths) / (time.perf_counter() - t)

    rng = np.random.default_rng(0)
    out = {}
    with tempfile.TemporaryDirectory(prefix="vit-bench-") as tmp:
        sets = {"500x375": _jpeg_files(rng, args.data_images, 500, 375, tmp)}
        if args.data_large:
            sets["2000x1500"] = _jpeg_files(rng, args.data_large, 2000, 1500, tmp)
        try:
            for size, paths in sets.items():
                results: dict[str, list[float]] = {}
                for _ in range(args.data_repeats):
                    for name, fn in pipelines.items():
                        results.setdefault(name, []).append(run(fn, paths))
                rows = {k: dict(images_per_s=statistics.median(v), all=v) for k, v in results.items()}
                for ref in ("torchvision_v2", "torchvision_v2_tensor", "decode_only", "decode_only_pil"):
                    # ratio per pass (the two timed back to back), then the median and spread of those
                    rows["ours"][f"vs_{ref}"] = ratio_stats(results[ref], results["ours"])  # img/s: ours / ref
                out[size] = rows
        finally:
            torch.set_num_threads(threads)
            cv2.setNumThreads(cv2_threads)
    return out


def bench_onnxruntime(args) -> dict:
    """ONNX Runtime (CPU execution provider) against PyTorch eager: our model at the same batch, size and thread
    count, exported by `vit.deploy.export` (dynamo exporter, SDPA as ONNX Attention), timed interleaved after
    warm-up."""
    import contextlib
    import io
    import tempfile
    import warnings
    from types import SimpleNamespace

    from vit.deploy.export import ExportableClassifier, export_model, require_onnx

    require_onnx()
    import onnxruntime as ort

    torch.manual_seed(0)
    model = vit.create_model(args.model, img_size=args.img_size).eval()
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        path = export_model(ExportableClassifier(model), "onnx", tmp, x)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = torch.get_num_threads(), 1  # same cores as torch
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    feed = {"x": x.numpy()}

    def eager():
        with torch.inference_mode():
            model(x)

    calls = {"pytorch": eager, "onnxruntime": lambda: session.run(None, feed)}
    sides = [SimpleNamespace(name=k) for k in calls]
    times = interleaved(sides, lambda s: calls[s.name], torch.device("cpu"), args.warmup, args.repeats, args.iters)
    out = {k: dict(images_per_s=args.batch_size / statistics.median(t), seconds_all=t) for k, t in times.items()}
    return dict(model=args.model, batch_size=args.batch_size, img_size=args.img_size, threads=torch.get_num_threads(),
                ort_version=ort.__version__, **out,
                ratio_onnxruntime_over_pytorch=ratio_stats(times["onnxruntime"], times["pytorch"]))
def bench_token_reduction(args, device) -> dict:
    """Token reduction (ToMe `merge`, EViT `topk`) against the plain model and timm, interleaved in one run:
    images/s for inference (and a training step for `topk`, which is trained in), counted GFLOPs per image, and
    top-1 on the held-out split when --checkpoint is given (the model then comes from the checkpoint)."""
    import copy

    import timm
    import timm.optim

    from vit.data import build_datasets
    from vit.models.checkpoint import load_checkpoint

    torch.manual_seed(0)
    if args.checkpoint:
        base, cfg, _, _ = load_checkpoint(args.checkpoint)
        base.set_token_reduction(None)  # the plain model is the reference, whatever the checkpoint trained with
        name, img = cfg.model.name, cfg.model.img_size
    else:
        name, img, cfg = args.model, args.img_size, None
        base = vit.create_model(name, img_size=img)
    base = base.to(device)
    blk = base.blocks[0]
    ref = timm.create_model(name, pretrained=False, img_size=img, patch_size=base.patch_embed.patch_size,
                            embed_dim=base.embed_dim, depth=len(base.blocks), num_heads=blk.attn.num_heads,
                            mlp_ratio=blk.mlp.fc1.out_features / base.embed_dim, num_classes=base.num_classes,
                            global_pool=base.global_pool, in_chans=base.in_chans).to(device)
    ref.load_state_dict(base.state_dict())
    opt = OptimConfig(lr=1e-4, weight_decay=0.05)
    sides = [Side("ours", base, build_optimizer(base, opt), device, args.precision)]
    for spec in args.token_reduction:
        m = copy.deepcopy(base)
        m.set_token_reduction(spec)
        sides.append(Side(spec, m, build_optimizer(m, opt), device, args.precision))
    sides.append(Side("timm", ref, timm.optim.create_optimizer_v2(ref, "adamw", lr=1e-4, weight_decay=0.05),
                      device, args.precision))
    acc = {}  # first: the timed training steps below change the weights
    if cfg is not None:
        val = build_datasets(cfg, splits=("val",))[1]
        loader = torch.utils.data.DataLoader(val, batch_size=64)
        for s in sides[:-1]:
            s.model.eval()
            with torch.inference_mode():
                hits = sum(int((s.model(xb.to(device)).argmax(1).cpu() == yb).sum()) for xb, yb in loader)
            acc[s.name] = hits / len(val)
    B = args.batch_size
    x = torch.randn(B, base.in_chans, img, img, device=device)  # a grey checkpoint takes one channel
    y = torch.randint(0, base.num_classes, (B,), device=device)
    times = interleaved(sides, lambda s: (lambda: s.infer(x)), device, args.warmup, args.repeats, args.iters)
    trained = [s for s in sides if s.name in ("ours", "timm") or s.name.startswith("topk")]
    train_times = interleaved(trained, lambda s: (lambda: s.train_step(x, y)), device, args.warmup,
                              args.repeats, args.iters) if len(trained) > 2 else {}
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
    return dict(model=name, img_size=img, batch_size=B, device=str(device), precision=args.precision,
                threads=torch.get_num_threads(), checkpoint=args.checkpoint, rows=rows)


def bench_edge(args) -> dict:
    """The deployment table (issue 28): for each model, PyTorch eager fp32 against ONNX Runtime fp32, INT8
    dynamic and static (vit.deploy.quantize, no fallback: the raw methods), and with --edge-merge the merged
    model in eager, ONNX Runtime fp32 and INT8 dynamic; every variant of one (model, threads, batch) timed in
    one interleaved run, ratios against eager from its paired repeats. Sizes are the files' bytes; top-1 on the
    checkpoint's validation split with --checkpoint (its model then replaces --edge-models)."""
    import contextlib
    import copy
    import io
    import tempfile
    import warnings
    from types import SimpleNamespace

    import numpy as np

    from vit.deploy.export import ExportableClassifier, export_model, require_onnx
    from vit.deploy.quantize import OnnxModel, quantize

    require_onnx()
    data = None
    if args.checkpoint:
        from vit.data import build_datasets
        from vit.data.transforms import build_transform
        from vit.models.checkpoint import load_checkpoint

        base, cfg, classes, _ = load_checkpoint(args.checkpoint)
        base.set_token_reduction(None)
        t = build_transform(cfg.aug, cfg.model.img_size, train=False)
        train, val, _ = build_datasets(cfg, check_images=False, classes=classes)
        train.transform = val.transform = t
        data = dict(x=torch.stack([val[i][0] for i in range(len(val))]).numpy(),
                    y=np.array([int(val[i][1]) for i in range(len(val))]),
                    calib=torch.stack([train[i][0] for i in range(min(64, len(train)))]).numpy())
        models = [(cfg.model.name + f" ({args.checkpoint})", base)]
    else:
        models = [(name, None) for name in args.edge_models]
    out = []
    for name, model in models:
        torch.manual_seed(0)
        model = (model or vit.create_model(name)).eval()
        chans, img = model.patch_embed.proj.in_channels, model.patch_embed.img_size[0]
        calib = data["calib"] if data else np.random.default_rng(0).normal(0, 1, (16, chans, img, img)).astype(
            np.float32)
        eager = {"eager fp32": model}
        for spec in args.edge_merge:
            merged = copy.deepcopy(model)
            merged.set_token_reduction(spec)
            eager[f"eager fp32 {spec}"] = merged
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), \
                contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            example = torch.randn(2, chans, img, img)
            files = {"ort fp32": export_model(ExportableClassifier(model), "onnx", Path(tmp) / "plain", example)}
            files["ort int8 dynamic"] = quantize(files["ort fp32"], Path(tmp) / "dyn.onnx", "dynamic")
            files["ort int8 static"] = quantize(files["ort fp32"], Path(tmp) / "static.onnx", "static", calib=calib)
            for i, spec in enumerate(args.edge_merge):
                m = export_model(ExportableClassifier(eager[f"eager fp32 {spec}"]), "onnx", Path(tmp) / f"merged{i}",
                                 example)
                files[f"ort fp32 {spec}"] = m
                files[f"ort int8 dynamic {spec}"] = quantize(m, Path(tmp) / f"mdyn{i}.onnx", "dynamic")
            sizes = {k: p.stat().st_size for k, p in files.items()}
            top1 = {}
            if data:
                for k, mdl in eager.items():
                    with torch.inference_mode():
                        logits = torch.cat([mdl(torch.from_numpy(data["x"][i:i + 64]))
                                            for i in range(0, len(data["x"]), 64)])
                    top1[k] = float((logits.argmax(-1).numpy() == data["y"]).mean())
                for k, p in files.items():
                    top1[k] = float((OnnxModel(p)(data["x"]).argmax(-1) == data["y"]).mean())
            for threads in args.edge_threads:
                torch.set_num_threads(threads)
                sessions = {k: OnnxModel(p, threads) for k, p in files.items()}
                for batch in args.edge_batches:
                    x = torch.randn(batch, chans, img, img)
                    xn = x.numpy()

                    def run_eager(mdl, x=x):
                        def call():
                            with torch.inference_mode():
                                mdl(x)
                        return call

                    calls = {**{k: run_eager(m) for k, m in eager.items()},
                             **{k: (lambda s=s, xn=xn, b=batch: s(xn, b)) for k, s in sessions.items()}}
                    cpu = {k: [] for k in calls}  # this thread's CPU seconds per call, beside the wall clock

                    def counted(k, fn, log=cpu):
                        def call():
                            c0 = time.thread_time()
                            fn()
                            log[k].append(time.thread_time() - c0)
                        return call

                    calls = {k: counted(k, fn) for k, fn in calls.items()}
                    sides = [SimpleNamespace(name=k) for k in calls]
                    times = interleaved(sides, lambda s, c=calls: c[s.name], torch.device("cpu"), args.warmup,
                                        args.repeats, args.iters)
                    # With one thread, everything runs on the calling thread, so its CPU time is the time the
                    # model computed, without the waits for a core of a shared machine (load > cores): the
                    # steadier ratio there. With more threads the CPU time sums the threads: not recorded.
                    cpu = {k: [sum(v[args.warmup + i * args.iters:args.warmup + (i + 1) * args.iters]) / args.iters
                               for i in range(args.repeats)] for k, v in cpu.items()}
                    for k in calls:
                        out.append(dict(model=name, threads=threads, batch=batch, variant=k,
                                        images_per_s=batch / statistics.median(times[k]),
                                        x_eager=ratio_stats(times[k], times["eager fp32"]),
                                        cpu_x_eager=ratio_stats(cpu[k], cpu["eager fp32"]) if threads == 1 else None,
                                        mib=sizes.get(k, sizes["ort fp32"] if "merge" not in k else None),
                                        top1=top1.get(k)))
                    print_edge_rows(out[-len(calls):], file=sys.__stdout__)
    return dict(rows=out, ort_version=__import__("onnxruntime").__version__, load_average=os.getloadavg(),
                checkpoint=args.checkpoint, repeats=args.repeats)


def print_edge_rows(rows: list[dict], file=None) -> None:
    for r in rows:
        sp, top1 = r["x_eager"], r["top1"]
        size = "" if r["mib"] is None else f"{r['mib'] / 2**20:.1f}"
        if r["variant"].startswith("eager"):
            size = ""
        cpu = r.get("cpu_x_eager")
        cpu = "" if cpu is None else f"{cpu['median']:.2f} ({cpu['min']:.2f}-{cpu['max']:.2f})"
        print(f"{r['model'][:28]:<29}{r['threads']:>3}{r['batch']:>4}  {r['variant']:<26}{r['images_per_s']:>9.1f}"
              f"{sp['median']:>7.2f} ({sp['min']:.2f}-{sp['max']:.2f})"
              f"{cpu:>19}{size:>8}"
              f"{'' if top1 is None else f'{100 * top1:.2f}':>8}", file=file)


def print_token_reduction(res: dict) -> None:
    ckpt = f"  checkpoint {res['checkpoint']}" if res["checkpoint"] else ""
    print(f"\ntoken reduction: {res['model']}  {res['img_size']} px  batch {res['batch_size']}  {res['precision']}  "
          f"{res['device']}  {res['threads']} threads{ckpt}")
    print(f"{'setting':<16}{'img/s':>9}{'x plain (min-max)':>21}{'x timm':>8}{'GFLOPs':>8}{'top-1':>8}"
          f"{'train img/s':>13}{'x plain':>9}")
    for r in res["rows"]:
        sp, top1 = r["speedup"], r["top1"]
        train = (f"{r['train_images_per_s']:>13.1f}{r['train_speedup']['median']:>9.2f}"
                 if "train_images_per_s" in r else "")
        print(f"{r['setting']:<16}{r['images_per_s']:>9.1f}{sp['median']:>9.2f} ({sp['min']:.2f}-{sp['max']:.2f})"
              f"{r['vs_timm']['median']:>8.2f}{r['gflops']:>8.2f}"
              f"{'' if top1 is None else f'{100 * top1:.2f}':>8}{train}")


def bench_sparse(args, device) -> dict:
    """Dense SDPA against each sparse-attention spec, inference, interleaved per size: one attention layer (ViT-B
    width), a text encoder (`--sparse-tokens`) and a ViT-B/16 (`--sparse-img-sizes`) of `--sparse-depth` blocks.
    Sparse layers run at every length (min_tokens=0) so that the crossover, the shortest length where the first
    spec beats dense, is measured rather than assumed. The first call at a new length compiles FlexAttention."""
    from types import SimpleNamespace

    import torch.nn.functional as F

    from vit.layers import Attention, SparseOptions
    from vit.layers.sparse_attention import parse_sparse_spec

    specs = [(s, parse_sparse_spec(s)) for s in args.sparse_attention]
    # one options object per spec, taken whole by create_model, TextEncoder and Attention alike
    models = layers = [dict(sparse_attention=SparseOptions(o["method"], density=o["density"],
                                                           select=o["select"] or "block",
                                                           block_size=args.sparse_block_size, min_tokens=0))
                       for _, o in specs]

    def build(make, options):  # dense first, then each spec with the dense weights (an indexer keeps its own)
        torch.manual_seed(0)
        dense = make({}).to(device).eval()
        sides = [SimpleNamespace(name="dense", model=dense)]
        for (name, _), o in zip(specs, options):
            m = make(o).to(device).eval()
            m.load_state_dict(dense.state_dict(), strict=False)
            sides.append(SimpleNamespace(name=name, model=m))
        return sides

    def table(what, n, sides, inp):
        with torch.no_grad():
            times = interleaved(sides, lambda s: (lambda: s.model(*inp)), device, args.warmup, args.repeats, 1)
        row = dict(what=what, tokens=n, dense_s=statistics.median(times["dense"]))
        row.update({name: ratio_stats(times[name], times["dense"]) for name, _ in specs})
        print(f"{what:<10}{n:>7}{row['dense_s']:>10.3f}"
              + "".join(f"{row[name]['median']:>18.2f}" for name, _ in specs), flush=True)
        return row

    print(f"\n{'':<10}{'tokens':>7}{'dense s':>10}" + "".join(f"{name:>18}" for name, _ in specs) + "   (x dense)")
    rows = []
    for n in args.sparse_tokens:
        x = torch.randn(1, n, 768, device=device)
        if "kernel" in args.sparse_rows:  # q, k, v given: dense SDPA against scoring + selection + sparse kernel
            q, k, v = (torch.randn(1, 12, n, 64, device=device) for _ in range(3))
            cores = [SimpleNamespace(name="dense", model=lambda *t: F.scaled_dot_product_attention(*t[1:4]))]
            cores += [SimpleNamespace(name=name, model=Attention(768, 12, **o).to(device).sparse)
                      for (name, _), o in zip(specs, layers)]
            rows.append(table("kernel", n, cores, (x, q, k, v, None, False, False, 0.0)))
        if "attention" in args.sparse_rows:
            rows.append(table("attention", n, build(lambda o: Attention(768, 12, **o), layers), (x,)))
        if "text" not in args.sparse_rows:
            continue
        ids = torch.randint(0, 1000, (1, n), device=device)
        rows.append(table("text", n, build(lambda o, n=n: vit.TextEncoder(
            1000, 768, args.sparse_depth, 12, max_len=n, **o), models), (ids,)))
    for px in args.sparse_img_sizes:
        img = torch.randn(1, 3, px, px, device=device)
        sides = build(lambda o, px=px: vit.create_model(
            "vit_base_patch16_224", img_size=px, depth=args.sparse_depth, **o), models)
        for s in sides:  # every block on every token: a [CLS]-only last block attends densely to 1 query
            s.model.prune_last_block = False
        rows.append(table(f"vit{px}", (px // 16) ** 2 + 1, sides, (img,)))
    first = specs[0][0]
    level = "attention" if "attention" in args.sparse_rows else "kernel"  # what `min_tokens` decides
    faster = [r["tokens"] for r in rows if r["what"] == level and r[first]["median"] > 1]
    return dict(device=str(device), threads=torch.get_num_threads(), depth=args.sparse_depth,
                block_size=args.sparse_block_size, rows=rows,
                crossover_tokens=min(faster) if faster else None, crossover_spec=first)


def print_report(res: dict) -> None:
    if "inference" in res:
        print(f"\n{res['model']}  batch {res['batch_size']}  {res['img_size']} px  {res['precision']}  "
              f"{res['device']}  {res['threads']} threads  compile={res['compile']}")
        print(f"matmul peak measured: {res['matmul_peak_tflops'] * 1e3:.0f} GFLOP/s;  FLOPs/image: inference "
              f"{res['flops_per_image']['inference'] / 1e9:.2f} G (ours), train step "
              f"{res['flops_per_image']['train_step'] / 1e9:.2f} G (ours)")
        print(f"{'':12}{'ours img/s':>12}{'timm img/s':>12}{'ratio (min-max)':>22}{'ours util':>11}{'timm util':>11}")
        for mode in ("inference", "train_step"):
            e = res[mode]
            r = e["ratio_ours_over_timm"]
            print(f"{mode:12}{e['ours']['images_per_s']:>12.1f}{e['timm']['images_per_s']:>12.1f}"
                  f"{r['median']:>9.3f} ({r['min']:.3f}-{r['max']:.3f})"
                  f"{100 * e['ours']['utilization']:>10.0f}%{100 * e['timm']['utilization']:>10.0f}%")
        m = res["memory"]
        print(f"activations kept for backward: ours {m['ours']['saved_activation_mib']:.1f} MiB, "
              f"timm {m['timm']['saved_activation_mib']:.1f} MiB")
        if "checkpointed_activation_mib" in m["ours"]:
            c = m["ours"]["checkpointed_activation_mib"]
            print(f"  with gradient checkpointing: ours {c:.1f} MiB "
                  f"({m['ours']['saved_activation_mib'] / max(c, 1e-9):.1f}x less), "
                  f"timm {m['timm']['checkpointed_activation_mib']:.1f} MiB")
        print(f"attention kernels: ours {res['attention_kernels']['ours']}, timm {res['attention_kernels']['timm']}")
    if "scaling" in res:
        print(f"\n{'px':>6}{'tokens':>8}{'ours MiB':>10}{'timm MiB':>10}{'ours/timm':>10}{'ours s':>9}{'timm s':>9}")
        for r in res["scaling"]:
            o, t = r["ours"], r["timm"]
            print(f"{r['img_size']:>6}{r['tokens']:>8}{o['saved_activation_mib']:>10.1f}"
                  f"{t['saved_activation_mib']:>10.1f}{o['saved_activation_mib'] / t['saved_activation_mib']:>10.3f}"
                  f"{o['train_step_s']:>9.3f}{t['train_step_s']:>9.3f}")
    for size, rows in res.get("data", {}).items():
        print(f"\ninput pipeline, one worker, {size} JPEG -> 224 training tensor (median of passes):")
        for k, v in rows.items():
            print(f"  {k:<24}{v['images_per_s']:>8.0f} img/s")
        o = rows["ours"]
        for ref, what in (("torchvision_v2", "x torchvision-v2 from PIL images"),
                          ("torchvision_v2_tensor", "x torchvision-v2 from torchvision.io tensors"),
                          ("decode_only", "x decoding alone (our decoder)"),
                          ("decode_only_pil", "x decoding alone (PIL)")):
            r = o[f"vs_{ref}"]
            print(f"  ours = {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}) {what}")
    if "onnxruntime" in res:
        o = res["onnxruntime"]
        r = o["ratio_onnxruntime_over_pytorch"]
        print(f"\n{o['model']}  batch {o['batch_size']}  {o['img_size']} px  CPU fp32  {o['threads']} threads: "
              f"PyTorch eager {o['pytorch']['images_per_s']:.1f} img/s, ONNX Runtime {o['ort_version']} "
              f"{o['onnxruntime']['images_per_s']:.1f} img/s, ratio onnxruntime/pytorch "
              f"{r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.model not in vit.list_models():
        print(f"error: unknown model {args.model!r}; known: {', '.join(vit.list_models())}", file=sys.stderr)
        return 2
    res: dict = {}
    if args.edge:
        print(f"{'model':<29}{'thr':>3}{'bs':>4}  {'variant':<26}{'img/s':>9}{'x eager (min-max)':>19}"
              f"{'cpu x eager':>19}{'MiB':>8}"
              f"{'top-1':>8}")
        try:
            res["edge"] = bench_edge(args)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"load average {' '.join(f'{v:.1f}' for v in res['edge']['load_average'])}; ONNX Runtime "
              f"{res['edge']['ort_version']}; medians of {args.repeats} interleaved repeats; cpu x eager: "
              "the same ratio in the calling thread's CPU time (1 thread only)")
        args.no_model = True
    if args.token_reduction:
        try:
            for spec in args.token_reduction:
                vit.layers.parse_token_reduction(spec)
            res["token_reduction"] = bench_token_reduction(args, device)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print_token_reduction(res["token_reduction"])
        args.no_model = True
    if args.sparse_attention:
        try:
            res["sparse_attention"] = bench_sparse(args, device)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        c = res["sparse_attention"]["crossover_tokens"]
        print(f"crossover: {args.sparse_attention[0]} beats dense attention from {c} tokens on (of those measured)"
              if c is not None else f"crossover: {args.sparse_attention[0]} beat dense at none of the lengths measured")
        args.no_model = True
    if not args.no_model:
        res.update(bench_model(args, device))
    if args.scaling:
        res["scaling"] = bench_scaling(args, device, args.scaling)
    if args.data:
        res["data"] = bench_data(args)
    if args.runtime == "onnxruntime":
        try:
            res["onnxruntime"] = bench_onnxruntime(args)
        except ValueError as e:  # the export extra is missing: one sentence
            print(f"error: {e}", file=sys.stderr)
            return 2
    print_report(res)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
