"""What our ViT-B/16 does on this machine's GPUs, next to timm's same model: one table, started by gpu_check.sh.

    torchrun --standalone --nproc_per_node 8 scripts/gpu_check.py            # ViT-B/16, bf16, 20 steps each
    torchrun --standalone --nproc_per_node 2 scripts/gpu_check.py --tiny     # CPU (gloo): tiny model, fp32

1. The attention kernel: a training step of our model runs with SDPA restricted to flash and cuDNN attention
   (`torch.nn.attention.sdpa_kernel`), so a fallback to the math kernel (which materialises the (B, H, N, N)
   attention matrix) raises instead of running; the profiler names the kernel that ran. CPU: flash only.
2. Training steps of ours and timm's model (the same weights, data and AdamW) wrapped in DDP, then in FSDP2
   (`fully_shard` per Block, then the root; parameters in bf16 and gradients reduced in fp32, as
   configs/accelerate/fsdp.yaml does through Accelerate), each eager and under torch.compile. Timed after
   warm-up steps (which include compilation).
3. images/s over all processes; MFU (model FLOPs utilization) = the FLOPs of a training step (forward +
   backward, counted by vit.utils.perf on one image; the optimizer's are negligible) x images/s per process, over
   the FLOP/s of a large bf16 matmul measured in the same run on the same device (the practical peak, not the
   datasheet's: MFU as in PaLM, Chowdhery et al. 2022, appendix B, against a measured rather than a quoted
   peak); ours/timm: the ratio of images/s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repository's vit/

import vit  # noqa: E402
from vit.models.encoder import Block  # noqa: E402
from vit.utils.perf import count_flops, matmul_peak, sync  # noqa: E402

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
KERNELS = {  # profiler op names -> the attention kernel they belong to
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_flash_attention_forward": "flash",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_attention_math": "math",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="vit_base_patch16_224")
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=64, help="images per process and step")
    ap.add_argument("--steps", type=int, default=20, help="timed training steps per configuration")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them (compilation happens here)")
    ap.add_argument("--tiny", action="store_true", help="CI on CPU: a 2-block model at 32 px, batch 4, 3 steps")
    ap.add_argument("--compile-backend", default=None,
                    help="torch.compile backend (default: inductor on CUDA; aot_eager on CPU, which traces the "
                         "same graphs without building C++ kernels)")
    ap.add_argument("--out", default=None, help="also write the results as JSON (main process)")
    args = ap.parse_args(argv)
    if args.tiny:
        args.batch_size, args.steps, args.warmup = min(args.batch_size, 4), min(args.steps, 3), min(args.warmup, 1)
    for name in ("batch_size", "steps", "img_size"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def setup() -> torch.device:
    """One process per GPU (nccl), or gloo processes on CPU; also works as one process without torchrun."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if "RANK" not in os.environ:  # a plain `python scripts/gpu_check.py`: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29577")
    dist.init_process_group("nccl" if cuda else "gloo")
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


def make_models(args, device) -> dict[str, torch.nn.Module]:
    """Ours and timm's same-named model with the same weights (timm's keys are ours)."""
    import timm

    kw = dict(TINY) if args.tiny else dict(img_size=args.img_size)
    torch.manual_seed(0)
    ours = vit.create_model(args.model, **kw)
    ref = timm.create_model(args.model, pretrained=False, **kw)
    ref.load_state_dict(ours.state_dict())
    return {"ours": ours.to(device), "timm": ref.to(device)}


def wrap(model: torch.nn.Module, how: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from timm.models.vision_transformer import Block as TimmBlock
    from torch.nn.parallel import DistributedDataParallel

    if how == "ddp":
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 \
        else MixedPrecisionPolicy()
    for m in [m for m in model.modules() if isinstance(m, (Block, TimmBlock))]:
        fully_shard(m, mp_policy=mp)  # each block one unit, gathered just before it runs and freed after
    return fully_shard(model, mp_policy=mp)


def train_steps(model, x, y, args, device, dtype, how: str) -> tuple[float, float]:
    """Seconds for args.steps timed training steps after args.warmup untimed ones; the last loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=device.type == "cuda")
    # DDP keeps fp32 weights and autocasts; FSDP's policy already casts the gathered weights to `dtype`
    cast = torch.autocast(device.type, dtype=dtype) if how == "ddp" and dtype != torch.float32 \
        else contextlib.nullcontext()
    t0 = 0.0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            sync(device)
            dist.barrier()
            t0 = time.perf_counter()
        with cast:
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(device)
    seconds = torch.tensor([time.perf_counter() - t0], device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest process sets the pace
    return seconds.item(), loss.item()


def check_attention(args, device, dtype) -> str:
    """Run one training step of our model with the math kernel disallowed; return the kernel(s) that ran."""
    allowed = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION] if device.type == "cuda" \
        else [SDPBackend.FLASH_ATTENTION]
    model = make_models(args, device)["ours"]
    x = torch.randn(2, 3, model.patch_embed.img_size[0], model.patch_embed.img_size[1], device=device)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                    if device.type == "cuda" else [])
    try:
        with sdpa_kernel(allowed), torch.profiler.profile(activities=acts) as prof, \
                torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            model(x).float().sum().backward()
    except RuntimeError as e:
        raise SystemExit(f"error: attention found no flash or cuDNN kernel for {args.model} in {dtype} on this "
                         f"device and would fall back to math ({str(e).splitlines()[0][:160]}); check the GPU "
                         "(Ampere or newer), the PyTorch build and the head dimension.") from None
    names = {e.key for e in prof.key_averages()}
    ran = sorted({label for op, label in KERNELS.items() if op in names})
    if not ran or "math" in ran:
        raise SystemExit(f"error: the attention kernels that ran were {ran or 'none we know'}, not flash or cuDNN.")
    return ", ".join(ran)


def reference(args, device, rank: int) -> tuple[torch.Tensor, torch.Tensor, int, dict[str, torch.Tensor]]:
    """This process's batch (its own, as in training), the FLOPs of one image's training step (counted in fp32:
    they do not depend on the precision) and the weights every model starts from."""
    ours = make_models(args, device)["ours"]
    g = torch.Generator(device="cpu").manual_seed(1234 + rank)
    x = torch.randn(args.batch_size, 3, *ours.patch_embed.img_size, generator=g).to(device)
    y = torch.randint(0, ours.num_classes, (args.batch_size,), generator=g).to(device)
    flops = count_flops(lambda: F.cross_entropy(ours(x[:1]).float(), y[:1]).backward())
    return x, y, flops, {k: v.detach().cpu().clone() for k, v in ours.state_dict().items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    dtype = torch.bfloat16 if bf16 else torch.float32
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    say(f"gpu_check: {args.model}{' (tiny)' if args.tiny else ''}, {world} x {name}, {dtype}, batch "
        f"{args.batch_size} per process, {args.steps} timed steps after {args.warmup}; torch {torch.__version__}")
    backend = args.compile_backend or ("inductor" if device.type == "cuda" else "aot_eager")

    kernel = check_attention(args, device, dtype)
    say(f"attention: {kernel} (math disallowed)")

    peak_n = 8192 if device.type == "cuda" else 512
    peaks = [matmul_peak(device, dtype, peak_n)]
    x, y, flops_per_image, state = reference(args, device, rank)

    rows = []
    for how in ("ddp", "fsdp"):
        for compiled in (False, True):
            row = dict(wrapper=how, compile=backend if compiled else "no")
            for who in ("ours", "timm"):  # the same configuration back to back: drift hits both alike
                model = make_models(args, device)[who]
                model.load_state_dict(state)
                model = wrap(model, how, device, dtype)
                if compiled:
                    model = torch.compile(model, backend=backend)
                seconds, loss = train_steps(model, x, y, args, device, dtype, how)
                ips = args.steps * args.batch_size * world / seconds
                row[who] = dict(images_per_s=ips, loss=loss, mfu=flops_per_image * ips / world / max(peaks))
                del model
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            row["ratio"] = row["ours"]["images_per_s"] / row["timm"]["images_per_s"]
            rows.append(row)
            say(f"  {how:5} compile={row['compile']:9} ours {row['ours']['images_per_s']:9.1f} img/s   "
                f"timm {row['timm']['images_per_s']:9.1f} img/s   ours/timm {row['ratio']:.3f}")
    peaks.append(matmul_peak(device, dtype, peak_n))  # a shared or throttling device drifts: keep the best
    peak = max(peaks)
    for r in rows:  # MFU against the best peak seen
        for who in ("ours", "timm"):
            r[who]["mfu"] = flops_per_image * r[who]["images_per_s"] / world / peak

    say(f"\nmatmul peak {peak / 1e12:.2f} TFLOP/s per device ({dtype}, {peak_n}^2); "
        f"training step {flops_per_image / 1e9:.3f} GFLOP per image")
    say(f"{'wrapper':8}{'compile':>10}{'ours img/s':>12}{'timm img/s':>12}{'ours/timm':>11}{'ours MFU':>10}"
        f"{'timm MFU':>10}{'ours loss':>11}{'timm loss':>11}")
    for r in rows:
        o, t = r["ours"], r["timm"]
        say(f"{r['wrapper']:8}{r['compile']:>10}{o['images_per_s']:>12.1f}{t['images_per_s']:>12.1f}"
            f"{r['ratio']:>11.3f}{100 * o['mfu']:>9.1f}%{100 * t['mfu']:>9.1f}%{o['loss']:>11.4f}{t['loss']:>11.4f}")
    bad = [f"{r['wrapper']}/{r['compile']}/{w}" for r in rows for w in ("ours", "timm")
           if not torch.isfinite(torch.tensor(r[w]["loss"]))]
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps(dict(model=args.model, tiny=args.tiny, world=world, device=name,
                                                  dtype=str(dtype), attention=kernel, peak_flops=peak,
                                                  flops_per_image=flops_per_image, rows=rows), indent=1))
    dist.destroy_process_group()
    if bad:
        print(f"error: the loss became non-finite in {', '.join(bad)}.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
