"""Token reduction between attention and MLP: fewer tokens in every later layer, so a ViT runs faster.

Two published methods, both applied inside a block after the attention residual and before the MLP:

`topk` (EViT: Liang et al., ICLR 2022, "Not All Patches are What You Need", section 3):
    s_j = mean_h softmax(q_cls K^T / sqrt(d))_j           the [CLS] attention to patch token j
    keep the ceil(keep_rate * n) patch tokens with the largest s_j, fuse the others into one token
    x_fused = sum_{j not kept} s_j x_j                    (weighted by attention, not normalized, as EViT)
  applied at a few layers (EViT: blocks 3, 6, 9 of 12, keep_rate 0.7) and trained in, with the keep rate
  lowered from 1 during a warm-up (`topk_warmup`). The [CLS] row is one (B, H, 1, N) product computed next to
  the fused attention kernel (`Attention.forward_reduce`), never the N x N map.
`merge` (ToMe: Bolya et al., ICLR 2023, "Token Merging: Your ViT but Faster", section 3):
    split tokens alternately into A (even positions) and B (odd); score every A-B pair by the cosine similarity
    of their keys averaged over heads; each A token keeps its best B match; the r A tokens with the best matches
    are merged into their B partners by size-weighted average, x = sum(size * x) / sum(size); [CLS] is never
    merged. Later attention adds log(size) to the logits ("proportional attention"), passed to SDPA as a float
    mask, so a merged token weighs as much as the tokens it stands for. Off the shelf, no retraining.

Both keep a `TokenState`: each token's size (how many input tokens it stands for; patch sizes always sum to
the patch count) and, when asked, its source (which input tokens it stands for: ToMe's source tracking), so
attention maps can be spread back onto the full patch grid for rollout and visualization.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["TokenState", "Merge", "TopK", "bipartite_soft_matching", "parse_token_reduction",
           "build_token_reduction", "topk_warmup"]


@dataclass
class TokenState:
    """What the encoder carries beside the tokens while they are being reduced.

    size: (B, N, 1) input tokens each current token stands for (all ones before any reduction), in the tokens'
        dtype (its log is the attention mask, which SDPA must get in the dtype of its scores).
    source: (B, N, N0) 0/1 membership of the N0 input tokens in each current token, or None (not tracked).
    proportional: add log(size) to the attention logits (ToMe); set once a merge has happened.
    history: the source before each block's reduction, when tracked (for drawing what was merged).
    """

    size: torch.Tensor
    source: torch.Tensor | None = None
    proportional: bool = False
    history: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def start(cls, x: torch.Tensor, track_source: bool = False) -> TokenState:
        B, N, _ = x.shape
        size = x.new_ones(B, N, 1)
        source = torch.eye(N, device=x.device).expand(B, N, N) if track_source else None
        return cls(size, source)

    def attn_bias(self) -> torch.Tensor | None:
        """(B, 1, 1, N) float mask log(size) for proportional attention, or None while it changes nothing."""
        return self.size.log().transpose(1, 2)[:, None] if self.proportional else None

    def to_full_grid(self, attn: torch.Tensor) -> torch.Tensor:
        """(B, H, N, N) attention over current tokens -> (B, H, N0, N0) over the input tokens: an input token
        attends as the token it belongs to, and attention to a token is shared equally by its members, so rows
        still sum to 1:  A0 = S^T A (S / size)."""
        if self.source is None:
            raise ValueError("attention maps of a reduced model need source tracking; "
                             "run it with return_attention=True.")
        s = self.source.to(attn.dtype)  # (B, N, N0)
        spread = s / self.size.to(attn.dtype)  # (B, N, N0): each token's attention shared among its members
        return s.transpose(1, 2)[:, None] @ attn @ spread[:, None]

    def update(self, merge: Callable[[torch.Tensor, str], torch.Tensor]) -> None:
        self.size = merge(self.size, "sum")
        if self.source is not None:
            self.source = merge(self.source, "amax")


# --- ToMe: bipartite soft matching ----------------------------------------------------------------------------


def bipartite_soft_matching(
    metric: torch.Tensor, r: int, num_prefix_tokens: int = 1
) -> Callable[[torch.Tensor, str], torch.Tensor] | None:
    """ToMe's matching on metric (B, N, C) (the keys averaged over heads). Returns merge(t, mode) that maps any
    (B, N, ...) per-token tensor to (B, N - r, ...): the prefix tokens in their order, then the unmerged A tokens in
    their original order, then the B tokens, each with its merged A tokens reduced into it by `mode` ('sum',
    'mean', 'amax').
    The first `num_prefix_tokens` tokens are never merged (in A they are not chosen, in B nothing merges in).
    None when there is nothing to merge (r = 0)."""
    B, N, _ = metric.shape
    p = num_prefix_tokens
    r = min(r, (N - p) // 2)  # at most half the mergeable tokens, as ToMe
    if r <= 0:
        return None
    with torch.no_grad():
        metric = metric / metric.norm(dim=-1, keepdim=True)
        a, b = metric[:, ::2], metric[:, 1::2]  # (B, Na, C), (B, Nb, C)
        scores = a @ b.transpose(1, 2)  # (B, Na, Nb) cosine similarities
        scores[:, : (p + 1) // 2, :] = -math.inf  # prefix tokens in A (even positions) are never sources
        scores[:, :, : p // 2] = -math.inf  # ... and those in B (odd positions) never destinations
        node_max, node_idx = scores.max(dim=-1)  # (B, Na) best partner of each A token
        # ONNX has no stable sort; its TopK breaks ties by the lower index, the same order as a stable argsort
        if torch.compiler.is_exporting():
            order = node_max.topk(node_max.shape[-1], dim=-1).indices
            unm_idx = order[:, r:].topk(order.shape[-1] - r, dim=-1, largest=False).values
        else:
            order = node_max.argsort(dim=-1, descending=True, stable=True)  # (B, Na) best matches first
            unm_idx = order[:, r:].sort(dim=-1).values  # (B, Na - r) A tokens kept, in their original order
        src_idx = order[:, :r]  # (B, r) A tokens merged away
        dst_idx = node_idx.gather(1, src_idx)  # (B, r) their partners in B

    def merge(t: torch.Tensor, mode: str = "mean") -> torch.Tensor:
        src, dst = t[:, ::2], t[:, 1::2]
        rest = t.shape[2:]

        def idx(i: torch.Tensor) -> torch.Tensor:
            return i.view(*i.shape, *(1,) * len(rest)).expand(*i.shape, *rest)

        unm = src.gather(1, idx(unm_idx))  # (B, Na - r, ...): the A prefix tokens first, never merged
        dst = dst.scatter_reduce(1, idx(dst_idx), src.gather(1, idx(src_idx)), reduce=mode)
        # prefix tokens back in their places 0..p-1 (even ones lead `unm`, odd ones lead `dst`), so [DIST] and
        # registers stay prefix tokens for the next block and the head
        prefix = [unm[:, k // 2 : k // 2 + 1] if k % 2 == 0 else dst[:, k // 2 : k // 2 + 1] for k in range(p)]
        return torch.cat(prefix + [unm[:, (p + 1) // 2 :], dst[:, p // 2 :]], dim=1)

    return merge


class Merge(nn.Module):
    """ToMe in one block: merge `r` tokens by bipartite soft matching on the keys, size-weighted."""

    needs = "keys"

    def __init__(self, r: int, num_prefix_tokens: int = 1) -> None:
        super().__init__()
        self.r = r
        self.num_prefix_tokens = num_prefix_tokens

    def forward(self, x: torch.Tensor, keys: torch.Tensor, state: TokenState) -> torch.Tensor:
        """x: (B, N, D), keys: (B, N, d) mean over heads -> (B, N - r, D); updates state's sizes and sources.
        The first merging block must be able to take r (at most half the mergeable tokens): a larger r is a spec
        that does not fit the input and is refused; later blocks clamp r as the sequence shrinks (ToMe's own
        schedule)."""
        n = x.shape[1] - self.num_prefix_tokens
        if not state.proportional and self.r > n // 2:
            raise ValueError(f"merge:{self.r} asks to merge {self.r} tokens in one block, but {x.shape[1]} tokens "
                             f"({n} mergeable) allow at most {n // 2}; lower r, or use a larger input.")
        merge = bipartite_soft_matching(keys, self.r, self.num_prefix_tokens)
        if merge is None:  # r = 0: exactly the plain block
            return x
        size = state.size.to(x.dtype)
        x = merge(x * size, "sum") / merge(size, "sum")  # size-weighted average of each merged group
        state.update(merge)
        state.proportional = True
        return x

    def extra_repr(self) -> str:
        return f"r={self.r}"


# --- EViT: keep the attentive tokens, fuse the rest ------------------------------------------------------------


class TopK(nn.Module):
    """EViT in one block: keep the patch tokens [CLS] attends to most, fuse the others into one token."""

    needs = "cls"

    def __init__(self, keep_rate: float, num_prefix_tokens: int = 1) -> None:
        super().__init__()
        self.keep_rate = keep_rate
        self.num_prefix_tokens = num_prefix_tokens
        self.warmup = 1.0  # 0 -> 1 during EViT's keep-rate warm-up (`topk_warmup`); keep rate 1 at 0

    @property
    def current_keep_rate(self) -> float:
        return 1.0 - (1.0 - self.keep_rate) * self.warmup

    def forward(self, x: torch.Tensor, cls_attn: torch.Tensor, state: TokenState) -> torch.Tensor:
        """x: (B, N, D), cls_attn: (B, H, 1, N) the [CLS] attention row -> (B, p + k + 1, D)."""
        p = self.num_prefix_tokens
        B, N, D = x.shape
        n = N - p
        k = math.ceil(self.current_keep_rate * n)
        if k >= n:
            return x
        score = cls_attn[:, :, 0, p:].mean(dim=1)  # (B, n) mean over heads, as EViT
        order = score.argsort(dim=1, descending=True, stable=True)
        keep = order[:, :k].sort(dim=1).values  # (B, k) kept patch tokens, in their original order
        fuse = order[:, k:]  # (B, n - k) the inattentive rest

        def select(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            rest = t[:, p:]
            g = lambda i: rest.gather(1, i[..., None].expand(-1, -1, rest.shape[-1]))  # noqa: E731
            return g(keep), g(fuse)

        kept, fused = select(x)
        w = score.gather(1, fuse)[..., None].to(x.dtype)  # (B, n - k, 1)
        x = torch.cat([x[:, :p], kept, (w * fused).sum(dim=1, keepdim=True)], dim=1)

        size_kept, size_fused = select(state.size)
        state.size = torch.cat([state.size[:, :p], size_kept, size_fused.sum(1, keepdim=True)], dim=1)
        if state.source is not None:
            src_kept, src_fused = select(state.source)
            state.source = torch.cat([state.source[:, :p], src_kept, src_fused.amax(1, keepdim=True)], dim=1)
        return x

    def extra_repr(self) -> str:
        return f"keep_rate={self.keep_rate}"


# --- options: parse, build, warm up ----------------------------------------------------------------------------


def parse_token_reduction(spec: str | None) -> dict:
    """'merge:8', 'merge:8,8,4,...' (r per block), 'topk:0.7', 'topk:0.7@3,6,9' (0-based blocks), 'none' ->
    the keyword arguments of `build_token_reduction` ({'method': None} for none)."""
    if spec is None or str(spec).strip().lower() in ("", "none", "null"):
        return {"method": None}
    method, _, arg = str(spec).strip().partition(":")
    if method == "topk" and arg.endswith("@"):  # else the default layers, without a word
        raise ValueError(f"token reduction {spec!r} names no layers after '@'; list them (e.g. "
                         f"topk:{arg[:-1]}@3,6,9), or drop the '@' for the default ones.")
    try:
        if method == "merge" and arg:
            r = [int(v) for v in arg.split(",")]
            return {"method": "merge", "r": r[0] if len(r) == 1 else r}
        if method == "topk" and arg:
            rate, _, layers = arg.partition("@")
            out: dict = {"method": "topk", "keep_rate": float(rate)}
            if layers:
                out["layers"] = tuple(int(v) for v in layers.split(","))
            return out
    except ValueError:
        pass
    raise ValueError(f"token reduction {spec!r} is not understood; write 'merge:R' (e.g. merge:8, or one r per "
                     "block: merge:16,16,8,8), 'topk:RATE' or 'topk:RATE@L1,L2' (e.g. topk:0.7@3,6,9), or 'none'.")


def default_topk_layers(depth: int) -> tuple[int, ...]:
    """EViT's blocks 3, 6, 9 of 12 (0-based), scaled to `depth`: a quarter, half and three quarters in."""
    return tuple(sorted({depth // 4, depth // 2, (3 * depth) // 4} - {0} or {0}))


def build_token_reduction(
    depth: int,
    num_prefix_tokens: int,
    method: str | None,
    r: int | list[int] | tuple[int, ...] | None = None,
    keep_rate: float | None = None,
    layers: tuple[int, ...] | list[int] | None = None,
) -> list[nn.Module | None]:
    """One reduction module (or None) per block."""
    if method is None:
        return [None] * depth
    if method == "merge":
        if r is None or keep_rate is not None or layers is not None:
            raise ValueError("token reduction 'merge' takes r (an int, or one per block) and nothing else.")
        rs = [r] * depth if isinstance(r, int) else list(r)
        if len(rs) != depth or any(v < 0 for v in rs):
            raise ValueError(f"merge needs r >= 0 as one int or a list of {depth} (one per block), got {r!r}.")
        return [Merge(v, num_prefix_tokens) for v in rs]
    if method == "topk":
        if num_prefix_tokens != 1:
            has = "no [CLS] token" if num_prefix_tokens == 0 else f"{num_prefix_tokens} prefix tokens (registers)"
            raise ValueError(f"token reduction 'topk' ranks tokens by [CLS] attention, with [CLS] the only prefix "
                             f"token, and this model has {has}; use 'merge'.")
        if keep_rate is None or not 0.0 < keep_rate <= 1.0 or r is not None:
            raise ValueError(f"topk needs keep_rate in (0, 1] (and optionally layers), got keep_rate={keep_rate!r}.")
        layers = default_topk_layers(depth) if layers is None else tuple(layers)
        if any(not 0 <= i < depth for i in layers):
            raise ValueError(f"topk layers {layers} must be block indices in 0..{depth - 1}.")
        return [TopK(keep_rate, num_prefix_tokens) if i in layers else None for i in range(depth)]
    raise ValueError(f"unknown token reduction {method!r}; choose 'merge', 'topk' or None.")


def topk_warmup(model: nn.Module, progress: float, warmup_fraction: float = 1 / 3) -> None:
    """EViT's keep-rate warm-up: keep rate 1 at the start of training, lowered to its target along a cosine over
    the first `warmup_fraction` of training (progress in [0, 1]), then held. A no-op for other models."""
    t = min(1.0, max(0.0, progress) / warmup_fraction)
    for m in model.modules():
        if isinstance(m, TopK):
            m.warmup = 0.5 * (1.0 - math.cos(math.pi * t))
