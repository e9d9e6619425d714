"""Speed and memory of our ViT against timm's same-named model, measured side by side in one run.

    python benchmark.py --model vit_small_patch16_224 --batch-size 32            # CPU, fp32
    python benchmark.py --model vit_base_patch16_224 --device cuda --precision bf16 --compile
    python benchmark.py --data                                                   # the input pipeline
    python benchmark.py --model vit_tiny_patch16_224 --scaling 224 448 672 896 --out bench.json
    python benchmark.py --model vit_small_patch16_224 --batch-size 8 --no-model --runtime onnxruntime
    python benchmark.py --sparse-attention moba:0.125:block dsa:0.125:block dsa:0.25:block --sparse-tokens 1024 8192
    python benchmark.py --edge --edge-models vit_tiny_patch16_224 vit_small_patch16_224 --out edge.json
    python benchmark.py --clip ViT-B-16 --batch-size 64 --device cuda --precision bf16   # CLIP vs open_clip
    python benchmark.py --probe --probe-widths 384 49152 --repeats 3    # linear probe vs scikit-learn, CPU

Inference and training-step (forward, backward, optimizer step) throughput are measured for ours and timm's
model interleaved (A, B, A, B, ...) after warm-up; each side uses its toolkit's own optimizer factory
(ours: `vit.train.optim.build_optimizer`, timm: `timm.optim.create_optimizer_v2`). Reported: medians, the ratio
ours/timm with its min-max spread over the paired repeats, counted FLOPs per image, achieved FLOP/s and
utilization against a matrix-multiply peak measured in the same run (the best of three measurements: before,
between and after the timed passes), activation memory kept for backward
(bytes of tensors saved by autograd; on CUDA also the allocator's peak), and the attention kernel the profiler saw.
Each mode is one public function of `vit.bench` (`vit.bench.model.bench_model`, ...); this script parses, calls
them and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def count(least: int):
    """An argparse type: an int of at least `least` (a repeat count of 0 has no median; a batch of 0 times nothing)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    parse.__name__ = "int"  # argparse's 'invalid int value' for text that is not a number
    return parse


def model_kwarg(text: str) -> tuple[str, object]:
    """An argparse type: KEY=VALUE with the value a Python literal (ast.literal_eval: nothing runs) or else text."""
    import ast

    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE such as depth=6, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def check_model_kwargs(args) -> str | None:
    """Why --model-kwargs cannot be used as given (a key another flag owns, an option ours or timm's model does not
    take: both are built on the meta device), or None."""
    import torch

    kw = dict(args.model_kwargs)
    owned = {"img_size": "--img-size", "num_classes": "the benchmark's 1000-way head"}
    taken = [k for k in owned if k in kw]
    if taken:
        return (f"--model-kwargs {taken[0]} is set by {owned[taken[0]]}; remove it from --model-kwargs"
                + (" and pass --img-size." if taken[0] == "img_size" else "."))
    if not kw:
        return None
    import timm

    from vit.models.build import create_model

    for who, build in (("ours", lambda: create_model(args.model, **kw)),
                       ("timm's", lambda: timm.create_model(args.model, pretrained=False, **kw))):
        try:
            with torch.device("meta"):
                build()
        except (TypeError, ValueError, AssertionError, RuntimeError) as e:
            first = (str(e).splitlines() or [type(e).__name__])[0]
            return f"--model-kwargs: {who} {args.model} does not build with them ({first})"
    return None


def check_out_file(out: str) -> str | None:
    """Why --out could not be written (a folder, or no writable folder above it), or None; before the run."""
    import os
    import tempfile
    from pathlib import Path

    path = Path(out)
    if path.is_dir():
        return f"--out {out} is a folder; pass a file name such as {path / 'bench.json'}."
    existing = path.absolute().parent
    while not existing.exists():
        existing = existing.parent
    try:  # a real write (root passes os.access on a folder such as /proc that takes no file)
        fd, probe = tempfile.mkstemp(prefix=".vit-write-test-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"--out {out} cannot be written ({existing}: {e.strerror}); pass another path."
    return None


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.help import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--model", default="vit_small_patch16_224", help="a list_models() name (timm's too)")
    ap.add_argument("--model-kwargs", nargs="*", type=model_kwarg, default=[], metavar="KEY=VALUE",
                    help="options for both models' create_model, as timm's benchmark.py (values read as Python "
                         "literals: depth=6 'num_kv_heads=(12, 6, 6, 12)')")
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
    _edge_args(ap)
    ap.add_argument("--token-reduction", nargs="+", default=None, metavar="SPEC",
                    help="instead of the ours-vs-timm comparison, a token-reduction table for these settings, "
                         "e.g. merge:8 merge:16 topk:0.7")
    ap.add_argument("--checkpoint", default=None,
                    help="with --token-reduction or --edge: a train.py checkpoint (its model; adds top-1)")
    _sparse_args(ap)
    ap.add_argument("--clip", default=None, metavar="CONFIG",
                    help="instead of the ours-vs-timm comparison, our CLIP / SigLIP against open_clip's on the same "
                         "random weights: zero-shot images/s and a contrastive training step; CONFIG: an open_clip "
                         "config name (ViT-B-16, ViT-B-16-SigLIP, ...), 'tiny' or 'tiny-siglip'")
    ap.add_argument("--clip-classes", type=count(1), default=1000, help="--clip: classes of the zero-shot classifier")
    _probe_args(ap)
    ap.add_argument("--out", default=None, help="write the results as JSON to this file")
    return ap


def _edge_args(ap: argparse.ArgumentParser) -> None:
    """--edge: the deployment table's options."""
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


def _sparse_args(ap: argparse.ArgumentParser) -> None:
    """--sparse-attention: dense SDPA against sparse attention, and its options."""
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


def _probe_args(ap: argparse.ArgumentParser) -> None:
    """--probe: the linear probe against scikit-learn, and its options."""
    ap.add_argument("--probe", action="store_true",
                    help="instead of the ours-vs-timm comparison, the linear probe (probe.py --method linear) against "
                         "scikit-learn's LogisticRegression doing the same work on the same features (CPU), "
                         "interleaved, with both top-1s")
    ap.add_argument("--probe-widths", type=count(1), nargs="+", default=[384, 16 * 16 * 192],
                    help="--probe: feature widths (384: a ViT-S embedding; 49152: its 16x16 patch tokens at 192)")
    ap.add_argument("--probe-n", type=count(2), default=2000, help="--probe: training features (test: half as many)")
    ap.add_argument("--probe-classes", type=count(2), default=10, help="--probe: classes")
    ap.add_argument("--probe-C", type=float, nargs="+", default=[1.0],
                    help="--probe: one C (one fit each), or several (the cross-validated sweep, then the refit)")
    ap.add_argument("--probe-threads", type=count(1), default=1, help="--probe: CPU threads of each side")


def run_modes(args, device: torch.device) -> dict:
    """Each mode the arguments ask for, in the order their tables print; ValueError / FileNotFoundError: a bad
    setting, said in one sentence."""
    from vit.bench.clip import bench_clip, format_clip_report
    from vit.bench.data import bench_data
    from vit.bench.edge import EDGE_HEADER, bench_edge, format_edge_rows
    from vit.bench.model import bench_model, bench_scaling
    from vit.bench.probes import bench_linear_probe, format_probe_report
    from vit.bench.runtime import bench_onnxruntime
    from vit.bench.sparse import bench_sparse
    from vit.bench.token_reduction import bench_token_reduction, format_token_reduction_report

    res: dict = {}
    timing = dict(warmup=args.warmup, repeats=args.repeats)
    if args.edge:
        print(EDGE_HEADER)
        res["edge"] = bench_edge(args.edge_models, args.edge_batches, args.edge_threads, args.edge_merge,
                                 iters=args.iters, checkpoint=args.checkpoint, on_rows=lambda rows: print(
                                     format_edge_rows(rows), flush=True), **timing)
        print(f"load average {' '.join(f'{v:.1f}' for v in res['edge']['load_average'])}; ONNX Runtime "
              f"{res['edge']['ort_version']}; medians of {args.repeats} interleaved repeats; cpu x eager: "
              "the same ratio in the calling thread's CPU time (1 thread only)")
    if args.token_reduction:
        res["token_reduction"] = bench_token_reduction(
            args.token_reduction, device, args.model, args.img_size, args.batch_size, args.precision,
            args.checkpoint, iters=args.iters, **timing)
        print(format_token_reduction_report(res["token_reduction"]))
    if args.sparse_attention:
        res["sparse_attention"] = bench_sparse(
            args.sparse_attention, device, args.sparse_tokens, args.sparse_img_sizes, args.sparse_rows,
            args.sparse_block_size, args.sparse_depth, log=partial(print, flush=True), **timing)
        c = res["sparse_attention"]["crossover_tokens"]
        print(f"crossover: {args.sparse_attention[0]} beats dense attention from {c} tokens on (of those measured)"
              if c is not None else f"crossover: {args.sparse_attention[0]} beat dense at none of the lengths measured")
    if args.clip:
        res["clip"] = bench_clip(args.clip, device, args.batch_size, args.precision, args.clip_classes,
                                 iters=args.iters, **timing)
        print(format_clip_report(res["clip"]))
    if args.probe:
        res["probe"] = bench_linear_probe(args.probe_widths, args.probe_n, max(2, args.probe_n // 2),
                                          args.probe_classes, tuple(args.probe_C), args.probe_threads, **timing)
        print(format_probe_report(res["probe"]))
    if not (args.no_model or args.edge or args.token_reduction or args.sparse_attention or args.clip or args.probe):
        res.update(bench_model(args.model, device, args.batch_size, args.img_size, args.precision, args.compile,
                               iters=args.iters, peak_size=args.peak_size, model_kwargs=dict(args.model_kwargs),
                               **timing))
    if args.scaling:
        res["scaling"] = bench_scaling(args.model, device, args.scaling, args.precision, args.compile,
                                       args.scaling_repeats, dict(args.model_kwargs))
    if args.data:
        res["data"] = bench_data(args.data_images, args.data_repeats, args.data_large)
    if args.runtime == "onnxruntime":
        res["onnxruntime"] = bench_onnxruntime(args.model, args.batch_size, args.img_size, iters=args.iters,
                                               model_kwargs=dict(args.model_kwargs), **timing)
    return res


def main(argv=None) -> int:
    import torch

    from vit.bench.data import format_data_report
    from vit.bench.model import format_model_report
    from vit.bench.runtime import format_onnxruntime_report
    from vit.models.build import list_models

    args = build_parser().parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.model.split(".")[0] not in list_models():  # a tag (vit_base_patch16_clip_224.openai) names its arch
        print(f"error: unknown model {args.model!r}; known: {', '.join(list_models())}", file=sys.stderr)
        return 2
    error = check_model_kwargs(args)  # one sentence before any model is built for real
    if error is None and args.out:
        error = check_out_file(args.out)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        res = run_modes(args, device)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for report in (format_model_report(res), format_data_report(res.get("data", {})),
                   format_onnxruntime_report(res["onnxruntime"]) if "onnxruntime" in res else ""):
        if report:
            print(report)
    if args.out:
        from vit.utils.atomic import atomic_write_text

        atomic_write_text(args.out, json.dumps(res, indent=1))
    return 0



def run(argv: list[str]) -> int:
    """benchmark.py as a process: --help before torch loads, then main, which says its own errors."""
    from vit.cli.help import exit_if_help

    exit_if_help(build_parser, argv)
    return main(argv)
