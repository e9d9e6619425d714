"""Dynamic sparse attention (DSA indexer, MoBA gate) against dense attention, float64, MoBA and transformers."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import vit.layers.sparse_attention as sa
from vit.layers import Attention, SparseOptions
from vit.layers.sparse_attention import LightningIndexer, indexer_loss, set_indexer_stage

D, H, S = 32, 4, 16  # width, heads, block size


def _pair(method, dtype=torch.float64, **opts):
    """A sparse Attention and a dense one with the same weights."""
    torch.manual_seed(0)
    sparse = Attention(D, H, sparse_attention=SparseOptions(method, block_size=S, min_tokens=0, **opts)).to(dtype)
    dense = Attention(D, H).to(dtype)
    dense.load_state_dict({k: v for k, v in sparse.state_dict().items() if not k.startswith("sparse.")})
    return sparse, dense


def _record(monkeypatch):
    """Capture the block selections `SparseAttention.forward` makes."""
    seen = []
    real = sa.select_blocks

    def spy(*args, **kwargs):
        keep = real(*args, **kwargs)
        seen.append(keep)
        return keep

    monkeypatch.setattr(sa, "select_blocks", spy)
    return seen


def _reference(att, x, keep, select, causal, pad):
    """Float64 attention written out, with the selection `keep` (B, Hs, R, nb) turned into a mask entry by entry."""
    B, N, _ = x.shape
    q, k, v = att.qkv(x).reshape(B, N, 3, H, D // H).permute(2, 0, 3, 1, 4)
    t, s = torch.arange(N)[:, None], torch.arange(N)[None, :]  # query and key positions
    row = t if select == "token" else t // S  # the selection row each query reads
    allowed = keep[:, :, row, s // S].expand(B, H, N, N)  # query t may see key s if s's block is kept for t
    if causal:
        allowed = allowed & (s <= t)
    if pad is not None:
        allowed = allowed & pad[:, None, None, :]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
    p = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    p = torch.nan_to_num(p)  # rows that see nothing: zeros
    out = (p @ v).transpose(1, 2).reshape(B, N, D)
    return att.proj(out), p


def _select_by_hand(scores, topk, block_size, select, causal, own_block, sink):
    """select_blocks' rule written out row by row: the forced blocks (own, sink), then the best-scoring others
    among the allowed (finite score; with causal, not after the row's own block) until topk are kept."""
    B, Hs, R, nb = scores.shape
    keep = torch.zeros(B, Hs, R, nb, dtype=torch.bool)
    for b in range(B):
        for h in range(Hs):
            for r in range(R):
                own = r // block_size if select == "token" else r
                forced = ({own} if own_block else set()) | ({0} if sink else set())
                others = [c for c in range(nb) if c not in forced and scores[b, h, r, c] > float("-inf")
                          and not (causal and c > own)]
                others.sort(key=lambda c: -scores[b, h, r, c].item())
                for c in [*forced, *others][:topk]:
                    keep[b, h, r, c] = True
    return keep


@pytest.mark.parametrize("select", ["token", "block"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("own_block,sink", [(True, False), (False, True), (True, True), (False, False)])
def test_select_blocks_is_the_rule_written_out(select, causal, own_block, sink):
    """Which key blocks each row keeps, against the rule by hand: the forced blocks always, never a block after the
    row's own under causal, never a block scored -inf (some rows have fewer candidates than topk), the best of the
    rest. The attention tests build their reference from select_blocks' own choice, so only this one checks it."""
    bs, nb = 4, 6
    R = nb * bs if select == "token" else nb
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 2, R, nb, generator=g, dtype=torch.float64)
    scores[torch.rand(scores.shape, generator=g) < 0.3] = float("-inf")  # padding-only blocks
    for topk in (2, 3, 5):
        got = sa.select_blocks(scores, topk, bs, select, causal, own_block, sink)
        expected = _select_by_hand(scores, topk, bs, select, causal, own_block, sink)
        assert torch.equal(got, expected), (topk, (got != expected).nonzero()[:3].tolist())
    assert (expected.sum(-1) < topk).any()  # rows with fewer candidates than topk were tried


@pytest.mark.parametrize("method", ["dsa", "moba"])
@pytest.mark.parametrize("select", ["token", "block"])
@pytest.mark.parametrize("causal", [False, True])
def test_every_block_selected_is_dense(method, select, causal):
    """topk_blocks covering every block is dense attention, output and gradients (also the map path)."""
    sparse, dense = _pair(method, topk_blocks=100, select=select)
    x = torch.randn(2, 70, D, dtype=torch.float64, requires_grad=True)  # 5 blocks, the last partial
    out, _ = sparse(x, is_causal=causal)
    ref, _ = dense(x, is_causal=causal)
    assert (out - ref).abs().max() <= 1e-6
    g = torch.randn_like(out)
    gs = torch.autograd.grad(out, [x, sparse.qkv.weight], g)
    gd = torch.autograd.grad(ref, [x, dense.qkv.weight], g)
    for a, b in zip(gs, gd):
        assert (a - b).abs().max() <= 1e-6
    _, p = sparse(x, is_causal=causal, return_attention=True)
    _, pd = dense(x, is_causal=causal, return_attention=True)
    assert (p - pd).abs().max() <= 1e-6
    few, _ = _pair(method, topk_blocks=2, select=select)[0](x, is_causal=causal)
    assert (few - ref).abs().max() > 1e-3  # the guard: fewer blocks do change the output


@pytest.mark.parametrize("method,select", [("dsa", "block"), ("dsa", "token"), ("moba", "token"), ("moba", "block")])
@pytest.mark.parametrize("causal,padded", [(False, False), (True, False), (False, True), (True, True)])
def test_equals_masked_float64_reference(monkeypatch, method, select, causal, padded):
    """Each kernel (masked SDPA in training, the explicit map path, FlexAttention) equals the float64 formula with
    the module's own selection turned into a mask, with causal and padding masks; gradients of the training path."""
    seen = _record(monkeypatch)
    att, _ = _pair(method, topk_blocks=2, select=select)
    torch.manual_seed(1)
    x = torch.randn(2, 75, D, dtype=torch.float64, requires_grad=True)
    pad = torch.ones(2, 75, dtype=torch.bool)
    pad[1, 40:] = False
    mask = pad if padded else None

    att.sparse.kernel = "sdpa"
    out, _ = att(x, mask, causal)
    ref, pref = _reference(att, x, seen[-1], att.sparse.options.select, causal, mask)
    assert (out - ref).abs().max() <= 1e-6
    g = torch.randn_like(out)
    ga = torch.autograd.grad(out, [x, att.qkv.weight], g)
    gr = torch.autograd.grad(ref, [x, att.qkv.weight], g)
    for a, b in zip(ga, gr):
        assert (a - b).abs().max() <= 1e-6

    _, p = att(x, mask, causal, return_attention=True)  # rollout's input: a map with zeros, rows summing to 1
    assert (p - pref).abs().max() <= 1e-6 and (p == 0).float().mean() > 0.3

    if select == "block":
        att.sparse.kernel, att.sparse.compile_flex = "flex", False
        with torch.no_grad():
            out_flex, _ = att(x.float().double(), mask, causal)
        assert (out_flex - ref).abs().max() <= 1e-6
    assert (ref - _pair(method, topk_blocks=100)[1](x, mask, causal)[0]).abs().max() > 1e-3  # not dense


@pytest.mark.parametrize("method", ["dsa", "moba"])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("n,padded,topk", [(80, None, 2), (75, None, 2), (80, "right", 4), (75, "right", 1),
                                            (80, "left", 4)])
def test_gathered_kernel_equals_masked_float64_reference(monkeypatch, method, grad, n, padded, topk):
    """The CPU kernel of non-causal block selections (SDPA on the gathered blocks) is what `auto` picks, in
    inference and in training, and equals the float64 formula with the same selection, gradients included: N a
    multiple of the block or not (a key mask hides the tail), padded at the end or the start (rows keeping fewer
    blocks than the others where only blocks of padding are left; with one block, padding queries that may see
    nothing give zeros).
    Without autograd it runs a query block or two at a time, groups that span heads and batch items."""
    import vit.layers.sparse_kernels as sk

    seen = _record(monkeypatch)
    picked = []
    real = sk.gathered
    monkeypatch.setattr(sa, "gathered", lambda *a: picked.append(a[3].shape) or real(*a))
    monkeypatch.setattr(sk, "_GATHER_KEYS", 3 * S)
    att, dense = _pair(method, topk_blocks=topk, select="block")
    torch.manual_seed(1)
    x = torch.randn(2, n, D, dtype=torch.float64, requires_grad=grad)  # 5 blocks, the last partial at 75
    pad = torch.ones(2, n, dtype=torch.bool)
    if padded == "right":
        pad[1, 30:] = False  # batch item 1: blocks 0-1 real, 2-4 padding only
    else:
        pad[1, :50] = False  # blocks 0-2 padding only, 3-4 real (the slots past a row's count must stay hidden)
    mask = pad if padded else None
    with torch.set_grad_enabled(grad):
        out, _ = att(x, mask)
    assert len(picked) == 1  # auto chose the gathered kernel
    ref, _ = _reference(att, x, seen[-1], "block", False, mask)
    assert (out - ref).abs().max() <= 1e-6
    if grad:
        g = torch.randn_like(out)
        ga = torch.autograd.grad(out, [x, att.qkv.weight], g)
        gr = torch.autograd.grad(ref, [x, att.qkv.weight], g)
        for a, b in zip(ga, gr):
            assert (a - b).abs().max() <= 1e-6
    assert (ref - dense(x, mask)[0]).abs().max() > 1e-3  # not dense
    counts = seen[-1].sum(-1)
    if padded and topk > 1:  # what the case is there for: rows keeping fewer blocks than others
        assert counts.amin() < counts.amax()
    if padded == "right" and topk == 1 and method == "moba":  # MoBA keeps only the own block: padding rows see nothing
        assert (out[1, 32:] - att.proj.bias).abs().max() == 0
    att(x, mask, True)  # causal: another kernel
    assert len(picked) == 1


def test_kernel_choice_reads_no_values_and_survives_the_odd_selection():
    """Choosing a kernel reads no tensor values (no host sync: a meta tensor stands in for a GPU, reading it
    raises), so `kernel="sdpa"` runs under torch.func.vmap (per-sample gradients); a typo in `kernel` is refused;
    float64 inference under a causal mask avoids CPU FlexAttention (float32/16 only); a selection that keeps no
    block (NaN scores, no forced block) gives the masked kernel's zeros from the gathered kernel too; small blocks
    stay on the masked kernel in training."""
    core = Attention(D, H, sparse_attention=SparseOptions("moba", block_size=S, topk_blocks=2, select="block",
                     min_tokens=0)).sparse
    q = torch.empty(1, H, 4 * S, D // H, device="meta")
    keep = torch.empty(1, H, 4, 4, dtype=torch.bool, device="meta")
    for kernel, want in [("auto", "flex"), ("flex", "flex"), ("sdpa", "sdpa"), ("gather", "gather")]:
        core.kernel = kernel
        assert core._kernel(q, keep, None, None, False, False, 0.0, S) == want
    core.kernel = "gathered"
    with pytest.raises(ValueError, match="use one of auto, flex, gather, sdpa"):
        core._kernel(q, keep, None, None, False, False, 0.0, S)
    core.kernel = "auto"
    q64 = torch.zeros(1, H, 4 * S, D // H, dtype=torch.float64)
    assert core._kernel(q64, keep, None, None, True, False, 0.0, S) == "sdpa"  # causal float64 inference
    small = Attention(D, H, sparse_attention=SparseOptions("moba", block_size=4, topk_blocks=2, select="block",
                      min_tokens=0)).sparse
    assert small._kernel(q64.requires_grad_(), keep, None, None, False, False, 0.0, 4) == "sdpa"

    att, _ = _pair("moba", topk_blocks=2, select="block")
    att.sparse.kernel = "sdpa"
    params = {k: v.detach() for k, v in att.named_parameters()}
    x = torch.randn(2, 4 * S, D, dtype=torch.float64)

    def loss(p, xi):
        return torch.func.functional_call(att, p, (xi[None],))[0].pow(2).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vmap's fallback for the selection's in-place scatter_ warns about speed
        per = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    one = torch.func.grad(loss)(params, x[1])
    assert (per["qkv.weight"][1] - one["qkv.weight"]).abs().max() <= 1e-10

    for kernel in ("gather", "sdpa"):
        core = Attention(D, H, sparse_attention=SparseOptions("moba", block_size=S, topk_blocks=2, select="block",
                         own_block=False, sink_block=False, min_tokens=0)).sparse
        core.kernel = kernel
        nan = torch.full((1, H, 4 * S, D // H), float("nan"))
        for grad in (False, True):
            t = nan.clone().requires_grad_(grad)
            with torch.set_grad_enabled(grad):
                out, _ = core(None, t, t, t, None, False, False, 0.0)
            assert torch.equal(out, torch.zeros_like(out))


def test_forced_flex_runs_only_what_it_computes():
    """`kernel="flex"` on a per-token selection, a map or dropout would compute something else (FlexAttention
    shares a selection per query block and returns no map): those take the masked SDPA, so the forced kernel
    still equals the formula."""
    torch.manual_seed(0)
    att = Attention(D, H, sparse_attention=SparseOptions("moba", block_size=S, topk_blocks=2, min_tokens=0)).double()
    assert att.sparse.options.select == "token"  # MoBA's default
    x = torch.randn(2, 128, D, dtype=torch.float64)
    with torch.no_grad():
        att.sparse.kernel = "sdpa"
        ref, pref = att(x, is_causal=True, return_attention=True)
        att.sparse.kernel, att.sparse.compile_flex = "flex", False
        out, _ = att(x, is_causal=True)
        _, p = att(x, is_causal=True, return_attention=True)
    assert (out - ref).abs().max() <= 1e-12 and p is not None and (p - pref).abs().max() <= 1e-12


def test_indexer_loss_is_none_after_a_dense_forward():
    """A DSA layer that ran dense (below min_tokens, or the [CLS]-only last block) leaves no indexer KL behind: a
    stale one from the previous step would be summed into this step's loss, and its graph is already freed
    ("backward through the graph a second time"), so training on mixed lengths crashed."""
    import vit
    from vit.train.indexer import indexer_schedule

    te = vit.TextEncoder(50, D, 1, H, max_len=64, sparse_attention=SparseOptions("dsa", block_size=S, min_tokens=48))
    for step, n in enumerate([64, 32, 64]):
        indexer_schedule(te, step, warmup_steps=0)  # the sparse stage: KL on the selection
        out = te(torch.randint(0, 50, (2, n)))
        aux = indexer_loss(te)
        assert (aux is None) == (n < 48)
        (out.last_hidden_state.sum() * 0 + (0 if aux is None else aux)).backward()


def test_an_empty_sequence_runs_dense():
    """Zero tokens: nothing to select from, the dense layer's empty output (as dense attention gives)."""
    att, dense = _pair("moba", topk_blocks=2, select="block")
    x = torch.randn(1, 0, D, dtype=torch.float64)
    assert att(x)[0].shape == (1, 0, D) and torch.equal(att(x)[0], dense(x)[0])


@pytest.mark.slow
@pytest.mark.parametrize("method,padded", [("moba", False), ("dsa", True)])
def test_compiled_flex_equals_masked_float64_reference(monkeypatch, method, padded):
    """The compiled FlexAttention kernel (what inference runs; float32 only on CPU): without any mask inside the
    kept blocks it skips the mask function (SKIP_MASK_SCORE), with padding it applies it; both equal the float64
    formula with the same selection to float32's rounding."""
    import copy

    seen = _record(monkeypatch)
    att, dense = _pair(method, torch.float32, topk_blocks=2, select="block")
    torch.manual_seed(1)
    x = torch.randn(2, 64, D)  # 4 blocks
    pad = torch.ones(2, 64, dtype=torch.bool)
    pad[1, 40:] = False
    mask = pad if padded else None
    att.sparse.kernel, att.sparse.compile_flex = "flex", True
    with torch.no_grad():
        out, _ = att(x, mask)
        ref, _ = _reference(copy.deepcopy(att).double(), x.double(), seen[-1], "block", False, mask)
        full, _ = dense.double()(x.double(), mask)
    assert (out.double() - ref).abs().max() <= 2e-6
    assert (ref - full).abs().max() > 1e-3  # not dense


def _moba_naive_rewrite(q, k, v, chunk, topk):
    """MoBA's reference semantics (moba_naive.py), rewritten: q, k, v (S, H, d) of one causal sequence. The gate
    is q . mean(keys of a chunk); chunks after the query's own are excluded, its own is always chosen; the top-k
    chunks are attended with a causal mask."""
    n, h, d = q.shape
    nc = math.ceil(n / chunk)
    means = torch.stack([k[c * chunk:(c + 1) * chunk].mean(0) for c in range(nc)])  # (nc, H, d)
    gate = torch.einsum("shd,chd->hsc", q, means)
    for c in range(nc):
        gate[:, : (c + 1) * chunk, c] = float("-inf")
        gate[:, c * chunk:(c + 1) * chunk, c] = float("inf")
    chosen = torch.zeros_like(gate, dtype=torch.bool).scatter_(-1, gate.topk(min(topk, nc), -1).indices, True)
    allowed = chosen.repeat_interleave(chunk, -1)[..., :n] & torch.ones(n, n, dtype=torch.bool).tril()
    scores = torch.einsum("xhd,yhd->hxy", q, k).masked_fill(~allowed, float("-inf")) * d**-0.5
    return torch.einsum("hxy,yhd->xhd", scores.softmax(-1), v)


def test_moba_gate_matches_moba_naive_semantics():
    """MoBA per token, causal (its defaults: own block kept, no sink) equals MoBA's reference on the same q, k, v."""
    torch.manual_seed(2)
    n, chunk, topk = 150, 16, 3
    q, k, v = (torch.randn(n, H, 8, dtype=torch.float64) for _ in range(3))
    opts = SparseOptions("moba", block_size=chunk, topk_blocks=topk, min_tokens=0)
    core = Attention(D, H, sparse_attention=opts).sparse
    assert (core.options.select, core.options.own_block, core.options.sink_block) == ("token", True, False)
    core.kernel = "sdpa"
    out, _ = core(None, *(t.permute(1, 0, 2)[None] for t in (q, k, v)), None, True, False, 0.0)
    ref = _moba_naive_rewrite(q, k, v, chunk, topk)
    assert (out[0].permute(1, 0, 2) - ref).abs().max() <= 1e-6
    dense = F.scaled_dot_product_attention(*(t.permute(1, 0, 2) for t in (q, k, v)), is_causal=True)
    assert (dense.permute(1, 0, 2) - ref).abs().max() > 1e-3


class _CaptureTopk(torch.overrides.TorchFunctionMode):
    """Records the tensor `topk` is called on (transformers' indexer returns indices only)."""

    def __init__(self):
        super().__init__()
        self.scores = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.topk, torch.Tensor.topk):
            self.scores = args[0]
        return func(*args, **(kwargs or {}))


def test_indexer_scores_match_transformers_deepseek_v32():
    """Our lightning indexer's token scores equal transformers' DeepseekV32Indexer with the same weights (no
    rotary: cos 1, sin 0; its query latent is the token itself), and so do its top-k picks."""
    from transformers.models.deepseek_v32.configuration_deepseek_v32 import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer

    cfg = DeepseekV32Config(hidden_size=D, q_lora_rank=D, index_n_heads=4, index_head_dim=16, qk_rope_head_dim=8,
                            index_topk=8)
    torch.manual_seed(3)
    theirs = DeepseekV32Indexer(cfg, layer_idx=0)
    for p in theirs.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ours = LightningIndexer(D, heads=4, head_dim=16)
    ours.load_state_dict({"wq.weight": theirs.wq_b.weight, "wk.weight": theirs.wk.weight,
                          "k_norm.weight": theirs.k_norm.weight, "k_norm.bias": theirs.k_norm.bias,
                          "weights_proj.weight": theirs.weights_proj.weight})
    x = torch.randn(2, 40, D)
    rope = (torch.ones(2, 40, 8), torch.zeros(2, 40, 8))
    with _CaptureTopk() as cap:
        picks = theirs(x, x, rope, torch.ones(2, 40, 40, dtype=torch.bool), None)
    mine = ours(x)
    assert (mine - cap.scores).abs().max() <= 1e-5 and mine.abs().max() > 0.1
    assert torch.equal(mine.topk(8, -1).indices.sort(-1).values, picks.long().sort(-1).values)
    assert (ours.block_scores(x, 1) - cap.scores).abs().max() <= 1e-5  # blocks of one token: the token scores


def _pooled_indexer_reference(ix, x, S, pad=None):
    """The pooled DSA score written out in float64: sum_h w[t,h] ReLU(sum_i max(q[t,h,i] hi[j,i], q[t,h,i] lo[j,i]))
    with hi, lo the elementwise max and min of the block's real keys (Quest's bound on q . k)."""
    B, N, _ = x.shape
    q = (x @ ix.wq.weight.T).view(B, N, ix.heads, ix.head_dim) / math.sqrt(ix.head_dim)
    k = F.layer_norm(x @ ix.wk.weight.T, (ix.head_dim,), ix.k_norm.weight, ix.k_norm.bias, 1e-6)
    w = (x @ ix.weights_proj.weight.T) / math.sqrt(ix.heads)
    nb = math.ceil(N / S)
    out = torch.full((B, N, nb), float("-inf"), dtype=x.dtype)
    for b in range(B):
        for j in range(nb):
            real = [s for s in range(j * S, min(N, (j + 1) * S)) if pad is None or pad[b, s]]
            if real:
                hi, lo = k[b, real].amax(0), k[b, real].amin(0)
                bound = torch.maximum(q[b] * hi, q[b] * lo).sum(-1)  # (N, heads)
                out[b, :, j] = (w[b] * torch.relu(bound)).sum(-1)
    return out


def test_indexer_block_scores_are_the_bound_over_the_block():
    """The selection's DSA score is DeepSeek's formula with q . k bounded over the block's keys (N x N / S work),
    padding keys left out and a block of padding never chosen; per query block, the mean over its queries."""
    torch.manual_seed(4)
    ix = LightningIndexer(D, heads=4, head_dim=16).double()
    x = torch.randn(2, 75, D, dtype=torch.float64)
    pad = torch.ones(2, 75, dtype=torch.bool)
    pad[1, 30:] = False  # sample 1: blocks 2..4 hold padding only
    ref = _pooled_indexer_reference(ix, x, S, pad)
    got = ix.block_scores(x, S, pad)
    assert torch.equal(torch.isinf(got), torch.isinf(ref)) and torch.isinf(ref[1, :, 2:]).all()
    fin = torch.isfinite(ref)
    assert (got[fin] - ref[fin]).abs().max() <= 1e-10
    opts = SparseOptions("dsa", block_size=S, select="block", min_tokens=0)
    core = Attention(D, H, sparse_attention=opts).double().sparse
    core.indexer = ix
    blocks = core.block_scores(x, None, None, None, S)[:, 0]  # (B, nq, nb)
    ref = _pooled_indexer_reference(ix, x, S)
    want = torch.stack([ref[:, i * S:(i + 1) * S].mean(1) for i in range(5)], 1)
    assert (blocks - want).abs().max() <= 1e-6  # selection scores in float32


def test_indexer_kl_is_deepseeks_loss_and_trains_the_indexer_only():
    """The warm-up loss is DeepSeek's KL per query row at the block level selection reads: KL(P_t || softmax_j
    I[t, j]) with P_t[j] the dense attention of query t on block j summed over heads (F.kl_div on the written-out
    pooled score); its gradient reaches the indexer and nothing else, and attention stays dense in the warm-up."""
    att, dense = _pair("dsa", topk_blocks=2)
    set_indexer_stage(att, "warmup")
    x = torch.randn(2, 56, D, dtype=torch.float64)  # 4 blocks, the last partial
    out, _ = att(x)
    assert (out - dense(x)[0]).abs().max() <= 1e-6
    q, k, _ = att._qkv(x)
    p = ((q @ k.transpose(-2, -1)) / math.sqrt(D // H)).softmax(-1).sum(1)
    p = F.pad(p / p.sum(-1, keepdim=True), (0, 8)).view(2, 56, 4, S).sum(-1)  # (B, N, blocks)
    score = _pooled_indexer_reference(att.sparse.indexer, x, S)
    want = F.kl_div(score.log_softmax(-1), p, reduction="none").sum(-1).mean()
    loss = indexer_loss(att)
    assert abs(loss.item() - want.item()) <= 1e-8 and loss.item() > 1e-3
    loss.backward()
    assert all(p.grad is not None for p in att.sparse.indexer.parameters())
    assert att.qkv.weight.grad is None
    set_indexer_stage(att, "sparse")
    att(x)
    assert indexer_loss(att) is not None and indexer_loss(att).item() < loss.item()  # restricted: fewer blocks
    set_indexer_stage(att, None)
    att(x)
    assert indexer_loss(att) is None


def test_peaked_kl_rows_weigh_rows_by_how_concentrated_their_attention_is():
    """kl_rows="peaked": the same per-row KL, rows weighted by 1 - H(P_t) / log(blocks) (normalised), written out
    in float64; a row attending evenly weighs nothing, and the mean weighting stays DeepSeek's plain mean."""
    att, _ = _pair("dsa", topk_blocks=2)
    x = torch.randn(2, 64, D, dtype=torch.float64)  # 4 full blocks
    set_indexer_stage(att, "warmup", kl_rows="peaked")
    att(x)
    q, k, _ = att._qkv(x)
    p = ((q @ k.transpose(-2, -1)) / math.sqrt(D // H)).softmax(-1).sum(1)
    p = (p / p.sum(-1, keepdim=True)).view(2, 64, 4, S).sum(-1)
    kl = F.kl_div(_pooled_indexer_reference(att.sparse.indexer, x, S).log_softmax(-1), p, reduction="none").sum(-1)
    weight = 1 - (-(p * p.log()).sum(-1)) / math.log(4)
    want = ((kl * weight).sum() / weight.sum()).item()  # the target is summed in float32: near-even rows'
    assert abs(indexer_loss(att).item() / want - 1) <= 1e-5  # small weights carry its rounding
    assert abs(indexer_loss(att).item() / kl.mean().item() - 1) > 1e-2  # not the plain mean
    set_indexer_stage(att, "warmup", kl_rows="mean")
    att(x)
    assert abs(indexer_loss(att).item() / kl.mean().item() - 1) <= 1e-5
    with pytest.raises(ValueError, match="choose 'mean' or 'peaked'"):
        set_indexer_stage(att, "warmup", kl_rows="max")


def test_a_block_longer_than_the_sequence_is_the_whole_sequence():
    """block_size=10**12 on 40 tokens asked F.pad for terabytes (blocks padded to whole blocks): a block is capped
    at the sequence length, so there is one block, always kept, and attention is the dense float64 formula; in
    DSA's stages the indexer's KL over one block is 0."""
    x = torch.randn(2, 40, D, dtype=torch.float64)
    for method, stages in (("moba", (None,)), ("dsa", (None, "warmup", "sparse"))):
        torch.manual_seed(0)
        att = Attention(D, H, sparse_attention=SparseOptions(method, block_size=10**12, min_tokens=0)).double()
        dense = Attention(D, H).double()
        dense.load_state_dict({k: v for k, v in att.state_dict().items() if not k.startswith("sparse.")})
        assert att.sparse.block(40) == 40 and att.sparse.topk(40) == 1
        for stage in stages:
            set_indexer_stage(att, stage)
            for causal in (False, True):
                out, _ = att(x, is_causal=causal)
                assert (out - dense(x, is_causal=causal)[0]).abs().max() <= 1e-12
                if stage is not None:
                    assert indexer_loss(att).abs().item() <= 1e-12


def test_the_warmup_teaches_the_indexer_below_min_tokens_too():
    """The warm-up's attention is dense at every length and its indexer learns from it at every length (`runs` is
    True there whatever min_tokens says; `selects` is False); in the sparse stage a short input runs dense with no
    KL."""
    torch.manual_seed(0)
    att = Attention(D, H, sparse_attention=SparseOptions("dsa", block_size=S, min_tokens=64)).double()
    dense = Attention(D, H).double()
    dense.load_state_dict({k: v for k, v in att.state_dict().items() if not k.startswith("sparse.")})
    x = torch.randn(2, 40, D, dtype=torch.float64)
    set_indexer_stage(att, "warmup")
    assert att.sparse.runs(40) and not att.sparse.selects
    out, _ = att(x)
    assert indexer_loss(att) is not None and indexer_loss(att).item() > 0
    assert (out - dense(x)[0]).abs().max() <= 1e-12
    set_indexer_stage(att, "sparse")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the crossover's note
        att(x)
    assert indexer_loss(att) is None


def test_dense_below_crossover_says_so_once():
    torch.manual_seed(0)
    att = Attention(D, H, sparse_attention=SparseOptions("moba", block_size=S, topk_blocks=1, min_tokens=64))
    dense = Attention(D, H)
    dense.load_state_dict(att.state_dict())
    x = torch.randn(1, 40, D)
    sa._WARNED.discard("crossover")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out, _ = att(x)
        att(x)
    assert sum("runs dense below 64 tokens" in str(m.message) for m in w) == 1
    assert torch.equal(out, dense(x)[0])


@pytest.mark.parametrize("bad,match", [
    (dict(method="nsa"), "'method' must be 'dsa' or 'moba', got 'nsa'"),
    (dict(method="dsa", topk_blocks=2, density=0.5), "'density' and topk_blocks both size the selection"),
    (dict(method="dsa", density=1.5), "'density' must be a number in"),
    (dict(method="dsa", density=0), "'density' must be a number in"),  # no block selected at all
    (dict(method="dsa", density="0.5"), "'density' must be a number in"),
    (dict(method="dsa", density=True), "'density' must be a number in"),
    (dict(method="dsa", topk_blocks=True), "'topk_blocks' must be a positive integer"),
    (dict(method="moba", own_block="no"), "'own_block' must be True, False or None"),
    (dict(method="moba", min_tokens=-1), "'min_tokens' must be a non-negative integer"),
    (dict(method="moba", select="tile"), "'select' must be 'token', 'block' or None"),
    (dict(method="moba", block_size=0), "'block_size' must be a positive integer"),
])
def test_bad_options_say_what_is_wrong(bad, match):
    with pytest.raises(ValueError, match=match):
        SparseOptions(**bad)


def test_sparse_options_without_a_method_are_refused():
    """An option of sparse attention without a method would train dense without a word: refused in Python
    (SparseOptions needs its method; create_model's flat keys, which config.json files saved before the options
    object hold; TextEncoder) and in a config (nested or flat keys), before a run folder is made. A block size
    alone (sparse_block_size=64) was let through."""
    import vit
    from vit.config import ConfigError, load_config

    with pytest.raises(TypeError, match="method"):
        SparseOptions(block_size=64)
    for key, value in (("sparse_density", 0.5), ("sparse_block_size", 64)):
        with pytest.raises(ValueError, match=f"'{key}' sets sparse attention, which sparse_attention leaves off"):
            vit.create_model("vit_tiny_patch16_224", **{key: value})
        with pytest.raises(ConfigError, match=f"'model.{key}' sets sparse attention"):
            load_config(None, [f"--model.{key}={value}"])
    with pytest.raises(TypeError, match="sparse_block_size"):
        vit.TextEncoder(50, D, 1, H, sparse_block_size=64)
    with pytest.raises(ValueError, match="'method' is missing"):
        vit.TextEncoder(50, D, 1, H, sparse_attention=dict(block_size=64))
    with pytest.raises(ConfigError, match="'model.sparse_attention.method' is missing"):
        load_config(None, ["--model.sparse_attention.block_size=64"])


def test_a_checkpoint_saved_with_the_flat_sparse_keys_still_loads(tmp_path):
    """A run folder written before the options object: config.yaml and config.json hold the flat keys
    (sparse_attention: dsa, sparse_block_size: 4, ...) as that code wrote them; it loads with the same options and
    weights, and a dense one (sparse_attention: null, sparse_block_size: 128, ...) loads dense."""
    import json

    import yaml

    from vit.config import Config, load_config, to_dict
    from vit.models import build_model
    from vit.models.checkpoint import load_checkpoint, save_checkpoint

    opts = SparseOptions("dsa", block_size=4, density=0.25, select="token", min_tokens=0)
    cfg = load_config(None, ["--model.img_size=32", "--model.patch_size=8", f"--model.embed_dim={D}",
                             "--model.depth=2", f"--model.num_heads={H}"])
    cfg.model.sparse_attention = opts
    torch.manual_seed(0)
    model = build_model(cfg, 3)
    flat = dict(sparse_attention="dsa", sparse_block_size=4, sparse_topk_blocks=None, sparse_density=0.25,
                sparse_select="token", sparse_own_block=None, sparse_sink_block=None, sparse_min_tokens=0)
    for name, sparse, old in (("sparse", model, flat), ("dense", None, dict(flat, sparse_attention=None,
                              sparse_block_size=128, sparse_density=None, sparse_select=None, sparse_min_tokens=None))):
        folder = tmp_path / name
        m = model if sparse is not None else build_model(Config(), 3)
        save_checkpoint(folder, m, cfg if sparse is not None else Config(), ["a", "b", "c"])
        saved = yaml.safe_load((folder / "config.yaml").read_text())
        saved["model"].pop("sparse_attention")
        saved["model"].update(old)  # the model section as the flat-key code dumped it, every key written
        (folder / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
        timm = json.loads((folder / "config.json").read_text())
        timm["model_args"].pop("sparse_attention", None)  # model_args: the options that differ from the defaults
        timm["model_args"].update({k: v for k, v in old.items() if v is not None and k != "sparse_block_size"
                                   or k == "sparse_block_size" and v != 128})
        (folder / "config.json").write_text(json.dumps(timm))
        loaded, loaded_cfg, _, _ = load_checkpoint(folder)
        assert loaded_cfg.model.sparse_attention == (opts if sparse is not None else None)
        assert to_dict(loaded_cfg)["model"]["sparse_attention"] == (to_dict(cfg)["model"]["sparse_attention"]
                                                                    if sparse is not None else None)
        cores = [b.attn.sparse for b in loaded.blocks]
        if sparse is None:
            assert cores == [None] * len(loaded.blocks)
            continue
        assert [c.options for c in cores] == [sa.resolve(opts)] * 2
        state = model.state_dict()
        assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())
        x = torch.randn(2, 3, 32, 32)
        assert torch.equal(_sdpa_kernel(loaded)(x), _sdpa_kernel(model).eval()(x))


def _sdpa_kernel(model):
    for m in sa.sparse_modules(model):
        m.kernel = "sdpa"  # FlexAttention compiled would take a minute here; its numbers are tested above
    return model


def test_models_take_sparse_attention_and_rollout_reads_sparse_maps():
    """create_model and TextEncoder build the option into every block; every block kept is the dense model;
    a sparse model's maps hold zeros off the selection and rollout runs on them."""
    import vit
    from vit.explain.rollout import attention_rollout

    opts = dict(img_size=64, patch_size=8, embed_dim=D, depth=2, num_heads=H, num_classes=3)
    torch.manual_seed(0)
    dense = vit.create_model("vit_tiny_patch16_224", **opts).eval()
    every = vit.create_model("vit_tiny_patch16_224", **opts, sparse_attention=SparseOptions(
        "dsa", block_size=8, topk_blocks=100, min_tokens=0)).eval()
    every.load_state_dict(dense.state_dict(), strict=False)
    x = torch.randn(2, 3, 64, 64)
    assert (_sdpa_kernel(every)(x) - dense(x)).abs().max() <= 1e-5
    few = _sdpa_kernel(vit.create_model("vit_tiny_patch16_224", **opts, sparse_attention=SparseOptions(
        "moba", block_size=8, topk_blocks=2, min_tokens=0)).eval())
    assert [type(b.attn.sparse).__name__ for b in few.blocks] == ["SparseAttention"] * 2
    _, maps = few.forward_with_attention(x)
    assert (maps[0] == 0).float().mean() > 0.5 and torch.allclose(maps[0].sum(-1), torch.ones(2, H, 65))
    r = attention_rollout(maps)
    assert torch.isfinite(r).all()

    text = vit.TextEncoder(50, D, 2, H, max_len=80, causal=True, sparse_attention=SparseOptions(
        "moba", block_size=S, topk_blocks=100, min_tokens=0))
    plain = vit.TextEncoder(50, D, 2, H, max_len=80, causal=True)
    plain.load_state_dict(text.state_dict())
    ids, keep = torch.randint(0, 50, (2, 70)), torch.ones(2, 70, dtype=torch.long)
    keep[0, 50:] = 0
    a, b = text(ids, keep), plain(ids, keep)
    assert (a.pooler_output - b.pooler_output).abs().max() <= 1e-5


def test_switching_methods_keeps_weights_and_refuses_an_untrained_indexer():
    import vit

    m = vit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=D, depth=1, num_heads=H)
    m.set_sparse_attention("moba:0.5:block")
    core = m.blocks[0].attn.sparse.options
    assert (core.method, core.density, core.select, core.own_block, core.sink_block) == ("moba", 0.5, "block", True,
                                                                                          False)
    with pytest.raises(ValueError, match="no trained DSA indexer"):
        m.set_sparse_attention("dsa")
    m.set_sparse_attention("none")
    assert m.blocks[0].attn.sparse is None
    with pytest.raises(ValueError, match="density 'x' is not a number"):
        m.set_sparse_attention("moba:x")
    with pytest.raises(ValueError, match="either the spec 'moba:0.25' or keyword options"):
        m.set_sparse_attention("moba:0.25", density=0.5)  # was: the keyword dropped without a word
    m.set_sparse_attention("moba", density=0.25, select="block")
    assert m.blocks[0].attn.sparse.options.density == 0.25


def test_indexer_schedule_moves_only_the_indexers_without_touching_requires_grad():
    """The warm-up step updates the indexers alone (no weight decay or moment elsewhere) and toggles no
    requires_grad (DDP fixes the parameters it reduces when it wraps the model); the sparse stage moves all."""
    import vit
    from vit.train.indexer import indexer_only_grads, indexer_schedule

    torch.manual_seed(0)
    m = vit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=D, depth=2, num_heads=H,
                         sparse_attention=SparseOptions("dsa", block_size=4, min_tokens=0))
    assert m.training and m.prune_last_block  # a DSA last block runs every token in training: its indexer learns
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    flags = {n: p.requires_grad for n, p in m.named_parameters()}
    x = torch.randn(2, 3, 32, 32)
    for step in range(2):
        stage = indexer_schedule(m, step, 1)
        assert stage == ("warmup", "sparse")[step]
        task = m(x).logsumexp(-1).mean()
        loss = indexer_loss(m) + (0.0 * task if stage == "warmup" else task)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        assert all(p.grad is not None for p in m.parameters())  # every parameter takes part (DDP)
        if stage == "warmup":
            indexer_only_grads(m)
        opt.step()
        assert {n: p.requires_grad for n, p in m.named_parameters()} == flags
        moved = {n for n, p in m.named_parameters() if not torch.equal(p, before[n])}
        if stage == "warmup":
            assert moved and all(".indexer." in n for n in moved)
        else:
            assert "head.weight" in moved and "blocks.0.attn.qkv.weight" in moved
    assert indexer_schedule(vit.create_model("vit_tiny_patch16_224", img_size=32, depth=1), 0, 2) is None


def test_config_refuses_unknown_sparse_values():
    from vit.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="'model.sparse_attention.method' must be one of 'dsa', 'moba', got 'nsa'"):
        load_config(None, ["--model.sparse_attention.method=nsa"])
    with pytest.raises(ConfigError, match="'model.sparse_attention.density' and topk_blocks .* set one of them"):
        load_config(None, ["--model.sparse_attention.method=dsa", "--model.sparse_attention.density=0.2",
                           "--model.sparse_attention.topk_blocks=2"])
    with pytest.raises(ConfigError, match="'optim.indexer_kl_rows' must be one of 'mean', 'peaked', got 'max'"):
        load_config(None, ["--model.sparse_attention.method=dsa", "--optim.indexer_kl_rows=max"])
    with pytest.raises(ConfigError, match="'model.sparse_attention.method' is missing"):
        load_config(None, ["--model.sparse_attention.density=0.25"])
    with pytest.raises(ConfigError, match="unknown config key 'model.sparse_attention.sink'"):
        load_config(None, ["--model.sparse_attention.method=dsa", "--model.sparse_attention.sink=true"])
    with pytest.raises(ConfigError, match="'model.sparse_attention.block_size' must be int, got str"):
        load_config(None, ["--model.sparse_attention.method=dsa", "--model.sparse_attention.block_size=big"])
    cfg = load_config(None, ["--model.sparse_attention.method=dsa", "--model.sparse_attention.density=0.25",
                             "--model.sparse_attention.select=token", "--optim.indexer_warmup_steps=5"])
    from vit.models import build_model

    m = build_model(cfg, 3)
    core = m.blocks[0].attn.sparse.options
    assert (core.method, core.density, core.select) == ("dsa", 0.25, "token")


@pytest.mark.slow
def test_recall_task_trained_indexer_finds_the_needle(tmp_path):
    """The long-sequence recall task at test size: the dense model learns it, and DeepSeek's two stages, the KL's
    rows weighted by concentration (the script's default), teach the indexer to keep the needle's block (DSA at
    25% density: 0.34 with the untrained indexer, 0.953 of dense's 0.977 here; 99.1% of dense over 3 seeds, 96.0%
    with DeepSeek's plain mean); a run under 99% of dense is reported as an expected failure (the figures:
    docs/sparse-attention.md)."""
    import importlib.util

    from tests.helpers import ROOT

    spec = importlib.util.spec_from_file_location("sparse_recall", ROOT / "scripts" / "sparse_recall.py")
    recall = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recall)
    args = recall.build_parser().parse_args([
        "--tokens", "256", "--short", "128", "--short-steps", "400", "--steps", "10", "--warmup", "200",
        "--sparse-steps", "40", "--density", "0.25", "--block-size", "16", "--keys", "4", "--pairs", "1",
        "--dim", "32", "--long-batch", "16", "--eval", "256"])
    out = recall.run(args)
    got = out["sparse"]["0.25"]
    assert out["dense_acc"] > 0.8  # chance: 1/8
    assert got["untrained_indexer_acc"] < 0.6 and got["acc"] >= 0.8  # the trained indexer keeps the needle
    if got["of_dense"] < 0.99:
        pytest.xfail(f"goal unmet: DSA at 1/4 density keeps {got['of_dense']:.1%} of dense accuracy")


def test_dense_weights_load_into_a_dsa_model(tmp_path):
    """Fine-tuning a dense checkpoint with DSA: every dense tensor loads, the indexers alone start untrained."""
    from safetensors.torch import save_file

    import vit
    from vit.hub import load_pretrained

    opts = dict(img_size=32, patch_size=8, embed_dim=D, depth=2, num_heads=H, num_classes=3)
    dense = vit.create_model("vit_tiny_patch16_224", **opts)
    save_file(dense.state_dict(), tmp_path / "w.safetensors")
    m = vit.create_model("vit_tiny_patch16_224", **opts, sparse_attention=SparseOptions("dsa"))
    report = load_pretrained(m, tmp_path / "w.safetensors")
    assert "10 DSA indexer tensors start untrained" in str(report)  # 5 per block
    assert torch.equal(m.blocks[1].attn.qkv.weight, dense.blocks[1].attn.qkv.weight)
    with pytest.raises(ValueError, match="missing: blocks.0.attn.qkv.weight"):
        state = {k: v for k, v in dense.state_dict().items() if k != "blocks.0.attn.qkv.weight"}
        save_file(state, tmp_path / "cut.safetensors")
        load_pretrained(m, tmp_path / "cut.safetensors")


@pytest.mark.slow
def test_indexer_warmup_trains_under_ddp(tmp_path):
    """train.py with DSA and the indexer warm-up under 2 CPU DDP processes: no parameter goes without a gradient
    (DDP refuses a step otherwise), and the indexer's KL is logged, in epochs without an evaluation too."""
    import csv
    import sys

    from tests.helpers import TINY, run_script

    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
                "29541"]
    r = run_script("train.py", "--data.dataset=synthetic", "--data.synthetic_train_size=16",
                   "--data.synthetic_val_size=4", "--run.epochs=2", f"--run.output_dir={tmp_path}",
                   *TINY, "--run.eval_every=2", "--data.batch_size=2", "--model.sparse_attention.method=dsa",
                   "--model.sparse_attention.min_tokens=0", "--model.sparse_attention.block_size=4",
                   "--optim.indexer_warmup_steps=2",
                   launcher=launcher,
                   env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    rows = list(csv.DictReader(open(next(tmp_path.rglob("metrics.csv")))))
    assert float(rows[0]["indexer_loss"]) > 0 and rows[0]["val_acc1"] == ""  # an epoch without evaluation too
    assert rows[-1]["indexer_loss"] != ""

