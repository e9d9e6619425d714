"""Dense SDPA against sparse attention (DSA / MoBA top-k key blocks), inference, interleaved per length: the
kernel alone, one attention layer, a text encoder and a ViT-B/16, and the crossover length where sparse wins."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ..layers import Attention, SparseOptions
from ..layers.sparse_attention import parse_sparse_spec
from ..models.build import create_model
from ..models.text_encoder import TextEncoder
from ..utils.timing import interleaved, ratio_stats
from .sides import device_sync

__all__ = ["bench_sparse"]


def _with_dense_weights(make: Callable[[dict], torch.nn.Module], names: list[str], options: list[dict],
                        device: torch.device) -> list[SimpleNamespace]:
    """The dense module (`make({})`) first, then one per spec (`make(options[i])`, named `names[i]`) with the
    dense weights (an indexer keeps its own), all in eval mode on `device`."""
    torch.manual_seed(0)
    dense = make({}).to(device).eval()
    sides = [SimpleNamespace(name="dense", model=dense)]
    for name, o in zip(names, options):
        m = make(o).to(device).eval()
        m.load_state_dict(dense.state_dict(), strict=False)
        sides.append(SimpleNamespace(name=name, model=m))
    return sides


def bench_sparse(specs: list[str], device: torch.device, tokens: list[int] = (1024, 2048, 4096, 8192),
                 img_sizes: list[int] = (512, 1024), rows: list[str] = ("kernel", "attention", "text"),
                 block_size: int = 128, depth: int = 2, warmup: int = 2, repeats: int = 5,
                 log: Callable[[str], object] | None = None) -> dict:
    """Dense SDPA against each of `specs` (METHOD[:DENSITY][:SELECT], e.g. "moba:0.125:block"), inference,
    interleaved per size: the kernel on given q, k, v ("kernel"), one attention layer of ViT-B width ("attention")
    and a text encoder ("text") at each of `tokens`, and a ViT-B/16 at each of `img_sizes`, the models `depth`
    blocks deep. Sparse layers run at every length (min_tokens=0) so that the crossover, the shortest length where
    the first spec beats dense, is measured rather than assumed. The first call at a new length compiles
    FlexAttention. `log` is handed the table's header and each row's line as they are measured; a bad spec
    raises ValueError."""
    parsed = [(s, parse_sparse_spec(s)) for s in specs]
    # one options object per spec, taken whole by create_model, TextEncoder and Attention alike
    models = layers = [dict(sparse_attention=SparseOptions(o["method"], density=o["density"],
                                                           select=o["select"] or "block",
                                                           block_size=block_size, min_tokens=0))
                       for _, o in parsed]
    log = log or (lambda line: None)

    def build(make, options):
        return _with_dense_weights(make, [name for name, _ in parsed], options, device)

    def table(what, n, sides, inp):
        with torch.no_grad():
            times = interleaved({s.name: (lambda s=s: s.model(*inp)) for s in sides}, warmup, repeats, 1,
                                device_sync(device)).wall
        row = dict(what=what, tokens=n, dense_s=statistics.median(times["dense"]))
        row.update({name: ratio_stats(times[name], times["dense"]) for name, _ in parsed})
        log(f"{what:<10}{n:>7}{row['dense_s']:>10.3f}" + "".join(f"{row[name]['median']:>18.2f}" for name, _ in parsed))
        return row

    log(f"\n{'':<10}{'tokens':>7}{'dense s':>10}" + "".join(f"{name:>18}" for name, _ in parsed) + "   (x dense)")
    out = []
    for n in tokens:
        x = torch.randn(1, n, 768, device=device)
        if "kernel" in rows:  # q, k, v given: dense SDPA against scoring + selection + sparse kernel
            q, k, v = (torch.randn(1, 12, n, 64, device=device) for _ in range(3))
            cores = [SimpleNamespace(name="dense", model=lambda *t: F.scaled_dot_product_attention(*t[1:4]))]
            cores += [SimpleNamespace(name=name, model=Attention(768, 12, **o).to(device).sparse)
                      for (name, _), o in zip(parsed, layers)]
            out.append(table("kernel", n, cores, (x, q, k, v, None, False, False, 0.0)))
        if "attention" in rows:
            out.append(table("attention", n, build(lambda o: Attention(768, 12, **o), layers), (x,)))
        if "text" not in rows:
            continue
        ids = torch.randint(0, 1000, (1, n), device=device)
        out.append(table("text", n, build(lambda o, n=n: TextEncoder(1000, 768, depth, 12, max_len=n, **o), models),
                         (ids,)))
    for px in img_sizes:
        img = torch.randn(1, 3, px, px, device=device)
        sides = build(lambda o, px=px: create_model("vit_base_patch16_224", img_size=px, depth=depth, **o), models)
        for s in sides:  # every block on every token: a [CLS]-only last block attends densely to 1 query
            s.model.prune_last_block = False
        out.append(table(f"vit{px}", (px // 16) ** 2 + 1, sides, (img,)))
    first = parsed[0][0]
    level = "attention" if "attention" in rows else "kernel"  # what `min_tokens` decides
    faster = [r["tokens"] for r in out if r["what"] == level and r[first]["median"] > 1]
    return dict(device=str(device), threads=torch.get_num_threads(), depth=depth, block_size=block_size, rows=out,
                crossover_tokens=min(faster) if faster else None, crossover_spec=first)
