"""Dynamic sparse attention: each query attends only to the top-k key blocks that a cheap scorer picks.

Keys are cut into blocks of `block_size` tokens. A scorer rates every (query, key block) pair, the top
`topk_blocks` blocks are kept (the query's own block and, optionally, the first block as a sink always among
them), and softmax(Q K^T / sqrt(d)) V runs on the kept blocks only; a kept block is attended exactly.

Scorers (vit.layers.sparse_gates), both against pooled keys of each block, so N x N / block_size work:
  "moba"  MoBA's parameter-free gate per head, s[t, j] = q_t . mean_{s in block j} k_s.
  "dsa"   DeepSeek-V3.2-Exp's lightning indexer, a learned submodule with a few small heads, one key per token
          shared by the heads and per-token head weights, I[t, j] = sum_h w[t, h] ReLU(b[t, h, j]), b the upper
          bound of q_I[t, h] . k_I[s] over block j from its keys' elementwise max and min (Quest); shared by all
          attention heads.
Granularity (`select`): "token" gives every query its own blocks (the published semantics of both; run by a
masked kernel, exact but without a block-kernel speed-up, since the queries of a block together touch nearly
every block); "block" shares one selection among the `block_size` queries of a block (scores averaged over
them, as NSA shares its selection in a group), which FlexAttention's block-sparse kernel turns into skipped tiles.

Kernels (vit.layers.sparse_kernels): on CPU, for non-causal block selections (blocks of 16 or more), SDPA on
the kept blocks gathered side by side, padding and a partial last block hidden by a key mask (inference and
training); FlexAttention with a `BlockMask` made straight from the selected block ids (the GPU's kernel, and the
rest of CPU inference; FlexAttention has no backward on CPU); SDPA with the selection as a boolean mask (the rest
of CPU training, per-token selection, dropout; the same numbers); the explicit softmax where the probabilities
are asked for (a sparse map is a map with zeros, so rollout works). Causal and padding masks compose with the
selection: a future or padded key is never attended, a block of padding never chosen. Below `min_tokens` (the
measured crossover) attention stays dense, said once.

Training the indexer follows DeepSeek's two stages (scheduled by step in vit/train/indexer.py): "warmup" keeps
attention dense and teaches the indexer the dense attention's distribution, per query row, at the level selection uses:
KL(P_t || softmax_j(I[t, j])) with P_t[j] the attention that query t pays to block j, summed over heads;
"sparse" attends sparsely, the indexer's input detached, its KL restricted to the selected blocks. The loss of
the last forward is `indexer_loss(model)`. The rows are averaged alike (`kl_rows="mean"`, DeepSeek's, where every
row of a language model is a prediction) or weighted by how concentrated their target is (`kl_rows="peaked"`,
w_t = 1 - H(P_t) / log(blocks), normalised): a row that spreads its attention evenly loses little to any
selection, and in an encoder read at one token (a classifier's [CLS], the recall task's query) the few rows whose
attention points somewhere would otherwise weigh 1/N of a loss the even rows drive to nearly zero.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..config import SparseOptions
from .sparse_gates import LightningIndexer, moba_block_scores, query_block_mean, rows_of, select_blocks, selection_mask
from .sparse_kernels import flex, gathered, masked_attention

__all__ = [
    "LightningIndexer", "SparseAttention", "select_blocks", "selection_mask", "moba_block_scores",
    "indexer_loss", "parse_sparse_spec", "resolve", "retune", "set_indexer_stage", "sparse_modules",
]

STAGES = (None, "warmup", "sparse")
KL_ROWS = ("mean", "peaked")
KERNELS = ("auto", "flex", "gather", "sdpa")
# Below this block size `auto` leaves the gathered kernel alone: its backward keeps t * N keys per head, which at
# blocks of 4 took 10x the masked kernel's memory and 2-3x its time (N = 2,048, 1/8 density; about even at 16).
GATHER_MIN_BLOCK = 16
FLEX_CPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what compiled FlexAttention takes on CPU
# A method's defaults, where the user leaves an option at None: MoBA keeps the query's own block and no sink and
# selects per token (its published gate); DSA here selects per query block (what the kernel accelerates) and keeps
# the first block, where [CLS] sits, as a sink.
DEFAULTS = {"moba": dict(select="token", own_block=True, sink_block=False),
            "dsa": dict(select="block", own_block=True, sink_block=True)}
DENSITY = 0.125  # the kept share of blocks when neither topk_blocks nor density is given
# The sequence length below which dense SDPA is at least as fast: the shortest length benchmark.py
# --sparse-attention measured, where sparse attention at 1/8 density first matched or beat it (the table and
# its conditions: docs/sparse-attention.md, "Speed").
CROSSOVER_TOKENS = 1024
_WARNED = set()


def resolve(options: SparseOptions) -> SparseOptions:
    """`options` with every None that means "the method's" or "the default" filled in (DEFAULTS, DENSITY,
    CROSSOVER_TOKENS): what a layer runs with."""
    given = {k: v for k, v in DEFAULTS[options.method].items() if getattr(options, k) is None}
    if options.topk_blocks is None and options.density is None:
        given["density"] = DENSITY
    if options.min_tokens is None:
        given["min_tokens"] = CROSSOVER_TOKENS
    return dataclasses.replace(options, **given)


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, stacklevel=3)


def _split_mask(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """A mask in `expand_mask`'s (B|1, 1|H, N, N) form -> (key_valid (B, N) for a boolean key-padding mask,
    the boolean mask, the float mask), each None where absent."""
    if mask is None:
        return None, None, None
    if mask.dtype != torch.bool:
        return None, None, mask
    key_valid = mask[:, 0, 0] if mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1 else None
    return key_valid, mask, None


class SparseAttention(nn.Module):
    """The sparse core of `Attention`: q, k, v (B, H, N, d) and the layer's input x (B, N, D) -> the attention
    output (B, H, N, d) and, when asked, the probabilities (B, H, N, N) with zeros off the selection.

    Args:
        options: a `SparseOptions` (method, block_size, topk_blocks or density, select, own_block, sink_block,
            min_tokens; see vit.config), kept resolved (`resolve`) as `self.options`.
        dim, num_heads: the layer's width and heads (the indexer reads x).
    A sequence shorter than `block_size` is one block (the block is capped at the sequence length: the same
    selection, and no padding to a block of any size).
    """

    def __init__(self, options: SparseOptions, dim: int, num_heads: int) -> None:
        super().__init__()
        self.options = resolve(options)
        self.indexer = LightningIndexer(dim, heads=4, head_dim=min(32, dim)) if options.method == "dsa" else None
        self.kernel = "auto"  # "auto" | "flex" | "gather" | "sdpa" (KERNELS); auto: see `_kernel`
        self.compile_flex = True  # False: FlexAttention eager (tests; it is a dense reference computation then)
        self.stage: str | None = None  # set_indexer_stage: None, "warmup" or "sparse"
        self.kl_rows = "mean"  # set_indexer_stage: how the indexer KL weighs query rows (KL_ROWS)
        self.last_loss: torch.Tensor | None = None

    def extra_repr(self) -> str:
        return ", ".join(f"{f.name}={getattr(self.options, f.name)}" for f in dataclasses.fields(self.options))

    def block(self, num_tokens: int) -> int:
        """The block size over `num_tokens`: `block_size`, or the whole sequence when it is shorter."""
        return max(1, min(self.options.block_size, num_tokens))

    def topk(self, num_tokens: int) -> int:
        o = self.options
        nb = math.ceil(num_tokens / self.block(num_tokens))
        return o.topk_blocks if o.topk_blocks is not None else max(1, math.ceil(o.density * nb))

    def runs(self, num_tokens: int) -> bool:
        """Whether this core computes attention over `num_tokens`: sparsely from `min_tokens` on (dense below the
        crossover, said once), and at every length in the indexer's warm-up, whose attention is dense but which
        the indexer must see (`selects` says which of the two)."""
        if self.stage == "warmup":
            return True
        if num_tokens == 0:
            return False  # nothing to select from; dense attention returns the empty output
        if num_tokens < self.options.min_tokens:
            _warn_once("crossover", f"sparse attention runs dense below {self.options.min_tokens} tokens (got "
                       f"{num_tokens}), where dense SDPA is faster; set min_tokens=0 to force it "
                       "(SparseOptions(..., min_tokens=0), --model.sparse_attention.min_tokens=0 in train.py).")
            return False
        return True

    @property
    def selects(self) -> bool:
        """Whether a forward through this core attends to a selection (False in the warm-up: dense attention)."""
        return self.stage != "warmup"

    @torch.no_grad()
    def block_scores(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, key_valid: torch.Tensor | None,
                     S: int) -> torch.Tensor:
        """(B, Hs, R, nb) scores of the key blocks of S tokens: Hs = H for MoBA (per head), 1 for DSA (shared);
        R = N or the number of query blocks (`select="block"`)."""
        select = self.options.select
        if self.options.method == "moba":
            return moba_block_scores(q.float(), k.float(), S, key_valid, select)
        s = self.indexer.block_scores(x, S, key_valid).float()[:, None]  # (B, 1, N, nb)
        return query_block_mean(s, S) if select == "block" else s

    def forward(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, is_causal: bool, return_attention: bool,
                dropout_p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, N, D) the layer's input (the indexer reads it); q, k, v (B, H, N, d); `mask` in `expand_mask`'s
        form or None. Returns (output (B, H, N, d), probabilities (B, H, N, N) or None)."""
        N, o = q.shape[2], self.options
        S = self.block(N)
        key_valid, allowed, bias = _split_mask(mask)
        keep = None  # warm-up: dense attention, the indexer learns its distribution
        if self.selects:
            scores = self.block_scores(x, q, k, key_valid, S)
            if is_causal and not o.own_block:
                scores = self._hide_own(scores, S)  # a mean over the own block would read the future
            keep = select_blocks(scores, self.topk(N), S, o.select, is_causal, o.own_block, o.sink_block)
        self.last_loss = None
        if self.stage is not None and self.indexer is not None:
            self.last_loss = self._indexer_kl(x, q, k, allowed, key_valid, bias, is_causal, keep, S)
        kernel = None if keep is None else self._kernel(q, keep, mask, key_valid, is_causal, return_attention,
                                                       dropout_p, S)
        if kernel == "gather":
            return gathered(q, k, v, keep, S, key_valid), None
        if kernel == "flex":
            return flex(q, k, v, keep, key_valid, is_causal, S, self.compile_flex), None
        if is_causal:
            tri = torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
            allowed = tri if allowed is None else allowed & tri
        if keep is not None:
            sel = selection_mask(keep, S, N, o.select)
            allowed = sel if allowed is None else sel & allowed
        return masked_attention(q, k, v, allowed, bias, return_attention, dropout_p)

    def _hide_own(self, scores: torch.Tensor, S: int) -> torch.Tensor:
        R, nb = scores.shape[-2:]
        own = torch.arange(R, device=scores.device) // (S if self.options.select == "token" else 1)
        return scores.masked_fill(own[:, None] == torch.arange(nb, device=scores.device)[None, :], float("-inf"))

    def _kernel(self, q: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor | None,
                key_valid: torch.Tensor | None, causal: bool, return_attention: bool, dropout_p: float, S: int) -> str:
        """Which kernel runs a selection. auto: on CPU the gathered SDPA unless the mask is causal (faster than
        FlexAttention there, and it has a backward), else FlexAttention for inference and the masked SDPA for
        training (FlexAttention has no backward on CPU); on GPU FlexAttention. The map path, dropout, per-token
        selection and masks other than key padding always take the masked SDPA. A forced kernel (`kernel`) runs
        where it computes the same formula, the masked SDPA elsewhere."""
        if self.kernel not in KERNELS:
            raise ValueError(f"SparseAttention.kernel is {self.kernel!r}; use one of {', '.join(KERNELS)}.")
        # block selection, no map, no dropout, key padding at most
        plain = self.options.select == "block" and not return_attention and dropout_p == 0
        keyed = plain and (mask is None or key_valid is not None)
        gatherable = keyed and not causal  # causal: the own block would need a mask per query
        cpu, needs_grad = q.device.type == "cpu", torch.is_grad_enabled() and q.requires_grad
        # CPU FlexAttention has no backward, and compiles for float32/16 only
        flexible = keyed and not (cpu and (needs_grad or (self.compile_flex and q.dtype not in FLEX_CPU_DTYPES)))
        if self.kernel != "auto":  # a forced kernel where it computes the formula, else the masked SDPA
            ok = {"gather": gatherable, "flex": flexible, "sdpa": True}[self.kernel]
            return self.kernel if ok else "sdpa"
        if not cpu:
            return "flex" if flexible else "sdpa"
        if gatherable and S >= GATHER_MIN_BLOCK:
            return "gather"
        return "flex" if flexible else "sdpa"

    def _indexer_kl(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor | None,
                    key_valid: torch.Tensor | None, bias: torch.Tensor | None, causal: bool,
                    keep: torch.Tensor | None, S: int) -> torch.Tensor:
        """DeepSeek's indexer loss at the level selection reads, over query rows t (their mean, or weighted by
        `kl_rows`) of KL(P_t || softmax_j(I[t, j])): P_t[j] the dense attention of query t on key block j, summed
        over heads and L1-normalised (a target: no gradient), I the indexer's block scores of the detached input.
        In the sparse stage (`keep` given) both are restricted to the selected blocks. One head at a time, so
        that no (B, H, N, N) tensor exists."""
        B, N = x.shape[:2]
        nb = math.ceil(N / S)
        row_blocks = None  # (B|1, N, nb): the blocks a query row may use
        if allowed is not None:
            a = allowed.any(1) if allowed.dim() == 4 else allowed[None]  # (B|1, N, N): any head may attend
            if causal:
                a = a & torch.ones(N, N, dtype=torch.bool, device=x.device).tril()
        elif causal:
            a = torch.ones(1, N, N, dtype=torch.bool, device=x.device).tril()
        else:
            a = None
        if keep is not None:
            sel = rows_of(keep, S, N, self.options.select)[:, 0]  # (B, N, nb), shared by the heads (DSA)
            tok = sel.repeat_interleave(S, dim=-1)[..., :N]
            a = tok if a is None else a & tok
        with torch.no_grad():
            p = torch.zeros(B, N, N, device=x.device)
            for h in range(q.shape[1]):
                logits = (q[:, h].float() * q.shape[-1] ** -0.5) @ k[:, h].float().transpose(-2, -1)  # (B, N, N)
                if bias is not None:
                    logits = logits + (bias if bias.dim() == 2 else bias[:, h if bias.shape[1] > 1 else 0]).float()
                if a is not None:
                    logits = logits.masked_fill(~a, float("-inf"))
                p += torch.nan_to_num(logits.softmax(-1))
            if N % S:
                p = F.pad(p, (0, nb * S - N))
            p = p.view(B, N, nb, S).sum(-1)  # (B, N, nb): attention on each key block
            live = p.sum(-1) > 0  # rows that see anything
            p = p / p.sum(-1, keepdim=True).clamp(min=1e-12)
            if a is not None:
                a = F.pad(a, (0, nb * S - N)) if N % S else a
                row_blocks = a.view(a.shape[0], N, nb, S).any(-1)
        score = self.indexer.block_scores(x.detach(), S, key_valid).float()
        if row_blocks is not None:  # rows that may see nothing stay finite (their KL is not counted)
            score = score.masked_fill(~row_blocks, float("-inf")).masked_fill(~row_blocks.any(-1, keepdim=True), 0.0)
        logq = torch.log_softmax(score, -1).masked_fill(p == 0, 0.0)
        neg_entropy = torch.xlogy(p, p).sum(-1)  # -H(P_t), no gradient (p is a target)
        kl = neg_entropy - (p * logq).sum(-1)
        if self.kl_rows == "peaked":  # rows weighted by 1 - H(P_t) / log(blocks): see the module docstring
            weight = (1 + neg_entropy / math.log(max(nb, 2))).clamp(min=0) * live
            return (kl * weight).sum() / weight.sum().clamp(min=1e-12)
        return kl[live].mean() if bool(live.any()) else kl.sum() * 0


def parse_sparse_spec(spec: str) -> dict:
    """A command line's "METHOD[:DENSITY][:SELECT]" ("moba", "dsa:0.125:block", "none") -> set_sparse_attention's
    keywords {method, density, select}; a bad spec raises ValueError with one sentence."""
    parts = spec.strip().split(":")
    method = None if parts[0] in ("none", "") else parts[0]
    out: dict = dict(method=method, density=None, select=None)
    try:
        if len(parts) > 1 and parts[1]:
            out["density"] = float(parts[1])
    except ValueError:
        raise ValueError(f"sparse attention spec {spec!r}: the density {parts[1]!r} is not a number; write e.g. "
                         "dsa:0.125:block.") from None
    if len(parts) > 2:
        out["select"] = parts[2]
    if len(parts) > 3 or (method is None and len(parts) > 1):
        raise ValueError(f"sparse attention spec {spec!r} has too many parts; write METHOD[:DENSITY][:SELECT], "
                         "e.g. dsa:0.125:block, or none.")
    if method is not None:
        SparseOptions(**out)  # its check, one sentence
    return out


def retune(current: SparseAttention | None, method: str | None, dim: int, num_heads: int,
           **changes) -> SparseAttention | None:
    """A layer's sparse core with other options (`changes`: SparseOptions fields, None = unchanged), weights kept
    (evaluation and benchmarks): the indexer of a "dsa" layer is carried over; a dense layer may become "moba" (no
    weights) but not "dsa" (untrained). A new method takes its own defaults for select, own_block and sink_block."""
    if method is None:
        return None
    if method == "dsa" and (current is None or current.indexer is None):
        raise ValueError("this model has no trained DSA indexer; train it with model.sparse_attention.method=dsa, "
                         "or evaluate with the parameter-free moba.")
    if current is None:
        options = SparseOptions(method)
    elif current.options.method == method:
        options = current.options
    else:
        options = dataclasses.replace(current.options, method=method, select=None, own_block=None, sink_block=None)
    size = {k: changes.pop(k, None) for k in ("density", "topk_blocks")}
    if any(v is not None for v in size.values()):  # the selection's size is one of the two
        options = dataclasses.replace(options, **size)
    options = dataclasses.replace(options, **{k: v for k, v in changes.items() if v is not None})
    new = SparseAttention(options, dim, num_heads)
    if method == "dsa":
        new.indexer = current.indexer
    if current is not None:
        new.kernel, new.compile_flex = current.kernel, current.compile_flex
    return new.to(next(iter(current.parameters()), torch.empty(0)).device) if current is not None else new


def sparse_modules(model: nn.Module) -> list[SparseAttention]:
    return [m for m in model.modules() if isinstance(m, SparseAttention)]


def set_indexer_stage(model: nn.Module, stage: str | None, kl_rows: str | None = None) -> None:
    """DeepSeek's indexer training stage for every sparse layer: "warmup" (dense attention, the indexer learns it;
    freeze the rest yourself), "sparse" (sparse attention, the indexer keeps learning on the selection) or None
    (no indexer loss); `kl_rows` ("mean" or "peaked", see the module docstring; None: unchanged) how its KL
    weighs the query rows."""
    if stage not in STAGES:
        raise ValueError(f"unknown indexer stage {stage!r}; choose 'warmup', 'sparse' or None.")
    if kl_rows is not None and kl_rows not in KL_ROWS:
        raise ValueError(f"unknown indexer KL row weighting {kl_rows!r}; choose 'mean' or 'peaked'.")
    for m in sparse_modules(model):
        m.stage = stage
        if kl_rows is not None:
            m.kl_rows = kl_rows


def indexer_loss(model: nn.Module) -> torch.Tensor | None:
    """Sum over sparse layers of the last forward's indexer KL, or None when no layer computed one."""
    losses = [m.last_loss for m in sparse_modules(model) if m.last_loss is not None]
    return torch.stack(losses).sum() if losses else None
