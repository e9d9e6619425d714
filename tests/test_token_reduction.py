"""Token reduction (ToMe merge, EViT top-k) against float64 references written from the papers."""

# Token reduction (ToMe merge, EViT top-k): exact when off, ToMe's algorithm against a float64 reference written
# here from the paper, EViT's selection against the [CLS] attention computed here, the fused kernel still used,
# and rollout back on the full patch grid.

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vit
from vit.explain.rollout import attention_maps, attention_rollout, to_grid
from vit.layers import TokenState, parse_token_reduction, topk_warmup
from vit.layers.token_reduction import Merge, TopK, default_topk_layers
from vit.models.encoder import Encoder


def _model(**kw):
    torch.manual_seed(0)
    args = dict(img_size=32, patch_size=4, embed_dim=32, depth=3, num_heads=4, num_classes=5)  # 64 patches
    return vit.create_model("vit_tiny_patch16_224", **{**args, **kw}).eval()


def _images(n=3):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))


# --- off means off ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["merge:0", "topk:1.0", "merge:0,0,0", "topk:1.0@0,1,2"])
def test_zero_reduction_gives_the_plain_logits(spec):
    m, x = _model(), _images()
    with torch.no_grad():
        plain = m(x)
        m.set_token_reduction(spec)
        reduced = m(x)
        reduced_attn, _ = m.forward_with_attention(x)
    assert torch.allclose(reduced, plain, atol=1e-6, rtol=0)
    assert torch.allclose(reduced_attn, plain, atol=1e-6, rtol=0)
    # the factory and the API are the same option
    built = vit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=32, depth=3,
                             num_heads=4, num_classes=5, token_reduction="merge:4")
    assert [type(b.token_reduction).__name__ for b in built.blocks] == ["Merge"] * 3
    m.set_token_reduction(None)
    assert all(b.token_reduction is None for b in m.blocks)


def test_reduction_changes_the_logits_and_the_token_count():
    """Guard against the tests above passing because nothing happens at all."""
    m, x = _model(), _images()
    with torch.no_grad():
        plain = m.forward_features(x)
        for spec, expected in (("merge:8", 65 - 3 * 8), ("topk:0.5@0", 1 + 32 + 1)):
            m.set_token_reduction(spec)
            feats = m.forward_features(x)
            assert feats.shape[1] == expected
            assert (m.forward_head(feats) - m.forward_head(plain)).abs().max() > 1e-3


@pytest.mark.parametrize("spec", ["merge:8", "merge:20,10,5", "topk:0.5", "topk:0.3@0,1,2"])
def test_sizes_and_sources_account_for_every_patch(spec):
    m, x = _model(), _images()
    m.set_token_reduction(spec)
    with torch.no_grad():
        m.forward_with_attention(x)
    t = m.blocks.last_tokens
    for source in t.history + [t.source]:
        assert torch.equal(source.sum(1), torch.ones(3, 65))  # every input token is in exactly one token
    assert torch.equal(t.size[:, 0, 0], torch.ones(3))  # [CLS] is never merged or fused
    assert torch.equal(t.size[:, 1:].sum((1, 2)), torch.full((3,), 64.0))  # sizes sum to the patch count
    assert torch.equal(t.source.sum(2, keepdim=True), t.size)


# --- ToMe -----------------------------------------------------------------------------------------------------


def test_merging_identical_tokens_changes_nothing():
    """Tokens 2i+1 and 2i+2 are twins. Merging each pair (the best possible match, cosine 1) into one token of
    size 2 must leave [CLS] and the survivors exactly as in the plain encoder: proportional attention weighs the
    merged token as the two it replaces."""
    torch.manual_seed(0)
    enc = Encoder(depth=2, dim=32, num_heads=4).eval()
    pairs = torch.randn(2, 10, 32)
    x = torch.cat([torch.randn(2, 1, 32), pairs.repeat_interleave(2, dim=1)], dim=1)  # (2, 21, 32)
    with torch.no_grad():
        plain, _ = enc(x)
        enc.set_token_reduction([Merge(10), None])
        merged, _ = enc(x)
    assert merged.shape[1] == 11
    assert torch.allclose(merged[:, 0], plain[:, 0], atol=1e-5)
    assert torch.allclose(merged[:, 1:], plain[:, 1::2], atol=1e-5)  # the survivors are the B twins, in order


def _reference_tome_block(blk, x, size, r):
    """One ToMe block in float64, written from the paper (section 3) with explicit loops: attention with
    log(size) added to the logits, then bipartite soft matching on the head-averaged keys, size-weighted merge,
    then the MLP. Output order: unmerged A tokens, then B tokens, each in original order."""
    B, N, D = x.shape
    H = blk.attn.num_heads
    d = D // H
    h = F.layer_norm(x, (D,), blk.norm1.weight, blk.norm1.bias, blk.norm1.eps)
    q, k, v = (h @ blk.attn.qkv.weight.T + blk.attn.qkv.bias).reshape(B, N, 3, H, d).unbind(2)  # (B, N, H, d)
    logits = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(d) + size.log()[:, None, None, :]
    out = torch.einsum("bhij,bjhd->bihd", logits.softmax(-1), v).reshape(B, N, D)
    x = x + out @ blk.attn.proj.weight.T + blk.attn.proj.bias
    keys = k.mean(2)  # (B, N, d)
    results, sizes = [], []
    for b in range(B):
        A, Bset = list(range(0, N, 2)), list(range(1, N, 2))
        best = {}
        for i in A:
            if i == 0:  # [CLS]
                continue
            sims = [float(F.cosine_similarity(keys[b, i], keys[b, j], dim=0)) for j in Bset]
            best[i] = (max(sims), Bset[sims.index(max(sims))])
        merged_away = sorted(best, key=lambda i: -best[i][0])[:r]
        groups = {j: [j] for j in Bset}
        for i in merged_away:
            groups[best[i][1]].append(i)
        keep = [i for i in A if i not in merged_away] + Bset
        toks, szs = [], []
        for t in keep:
            members = groups.get(t, [t])
            s = sum(size[b, m] for m in members)
            toks.append(sum(size[b, m] * x[b, m] for m in members) / s)
            szs.append(s)
        results.append(torch.stack(toks))
        sizes.append(torch.stack(szs))
    x, size = torch.stack(results), torch.stack(sizes)
    h = F.layer_norm(x, (D,), blk.norm2.weight, blk.norm2.bias, blk.norm2.eps)
    return x + blk.mlp(h), size


def test_merge_matches_a_float64_reference_of_the_paper():
    torch.manual_seed(0)
    enc = Encoder(depth=2, dim=32, num_heads=4).double().eval()
    enc.set_token_reduction([Merge(6), Merge(4)])
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    with torch.no_grad():
        ours, _ = enc(x)
        ref, size = x, torch.ones(2, 17, dtype=torch.float64)
        for blk, r in zip(enc, (6, 4)):
            ref, size = _reference_tome_block(blk, ref, size, r)
    assert ours.shape == ref.shape == (2, 17 - 10, 32)
    assert torch.allclose(ours, ref, atol=1e-10)
    assert sorted(size[0].tolist()) != [1.0] * 7  # the second block saw merged sizes (proportional attention)


# --- EViT -----------------------------------------------------------------------------------------------------


def test_topk_keeps_the_tokens_cls_attends_to_most_and_fuses_the_rest():
    torch.manual_seed(0)
    blk = Encoder(depth=1, dim=32, num_heads=4)[0].double().eval()
    blk.token_reduction = TopK(0.25)
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    tokens = TokenState.start(x, track_source=True)
    with torch.no_grad():
        out, _ = blk._forward_reduced(x, tokens, False, None)
        # the [CLS] attention row, computed here from the weights: mean over heads of softmax(q_cls K^T / sqrt d)
        h = blk.norm1(x)
        q, k, _ = (h @ blk.attn.qkv.weight.T + blk.attn.qkv.bias).reshape(2, 17, 3, 4, 8).unbind(2)
        cls_attn = (torch.einsum("bhd,bjhd->bhj", q[:, 0], k) / math.sqrt(8)).softmax(-1).mean(1)[:, 1:]  # (B, 16)
        after_attn = x + blk.attn(h)[0]
    assert out.shape == (2, 1 + 4 + 1, 32)  # [CLS], ceil(0.25 * 16) kept, one fused
    for b in range(2):
        top = set((cls_attn[b].topk(4).indices + 1).tolist())
        kept = {int(t) for t in tokens.source[b, 1:5].argmax(1)}
        assert kept == top
        rest = sorted(set(range(1, 17)) - top)
        assert tokens.source[b, 5, rest].sum() == len(rest) and tokens.size[b, 5, 0] == len(rest)
        fused = (cls_attn[b, [j - 1 for j in rest], None] * after_attn[b, rest]).sum(0)  # EViT: sum s_j x_j
        h2 = fused + blk.mlp(blk.norm2(fused))
        assert torch.allclose(out[b, 5], h2, atol=1e-10)


def test_fused_cls_row_equals_the_explicit_one():
    torch.manual_seed(0)
    attn = Encoder(depth=1, dim=32, num_heads=4)[0].attn.eval()
    x = torch.randn(2, 17, 32)
    bias = torch.rand(2, 1, 1, 17).log()
    for b in (None, bias):
        out_f, maps, row_f = attn.forward_reduce(x, b, "cls")
        out_e, probs, row_e = attn.forward_reduce(x, b, "cls", return_attention=True)
        assert maps is None and row_f.shape == (2, 4, 1, 17)
        assert torch.allclose(row_f, row_e, atol=1e-6) and torch.allclose(out_f, out_e, atol=1e-6)
        assert torch.allclose(row_e, probs[:, :, :1])


def test_topk_warmup_and_training_reach_every_parameter():
    m = _model().train()
    m.set_token_reduction("topk", keep_rate=0.5, layers=(0, 1))
    topks = [b.token_reduction for b in m.blocks if b.token_reduction is not None]
    topk_warmup(m, 0.0)
    assert all(t.current_keep_rate == 1.0 for t in topks)
    topk_warmup(m, 0.5)
    assert all(t.current_keep_rate == 0.5 for t in topks)
    m(_images()).logsumexp(1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())
    assert default_topk_layers(12) == (3, 6, 9)


# --- kernels, rollout, errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["merge:8", "topk:0.5"])
def test_flash_attention_still_runs(spec):
    m = _model().train()
    m.set_token_reduction(spec)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        m(_images(2)).sum().backward()
    events = prof.key_averages(group_by_input_shape=True)
    ops = {e.key for e in events}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in ops
    # no N x N map anywhere: the only softmax is EViT's one [CLS] row (B, H, 1, N)
    softmax_shapes = [e.input_shapes[0] for e in events if e.key == "aten::_softmax"]
    assert all(s[-2] == 1 for s in softmax_shapes), softmax_shapes
    assert bool(softmax_shapes) == spec.startswith("topk")


@pytest.mark.parametrize("spec", ["merge:8", "topk:0.5"])
def test_rollout_of_a_reduced_model_is_on_the_full_grid(spec):
    m, x = _model(), _images()
    with torch.no_grad():
        _, plain_attn = m.forward_with_attention(x)
        m.set_token_reduction(spec)
        _, attn = m.forward_with_attention(x)
    assert [a.shape for a in attn] == [a.shape for a in plain_attn]  # (B, H, 65, 65) for every block
    for maps in (plain_attn, attn):
        rollout = attention_rollout(maps)
        assert torch.allclose(rollout.sum(-1), torch.ones(3, 65), atol=1e-5)  # rows sum to 1, as plain
        grid = to_grid(rollout, (8, 8))
        assert torch.allclose(grid.sum((1, 2)) + rollout[:, 0, 0], torch.ones(3), atol=1e-5)
    maps, _ = attention_maps(m, x)
    assert maps.shape == (3, 8, 8) and torch.isfinite(maps).all()


def test_bad_options_are_one_clear_sentence():
    for spec in ("merge", "merge:x", "topk:abc", "pool:3"):
        with pytest.raises(ValueError, match="not understood"):
            parse_token_reduction(spec)
    m = _model()
    with pytest.raises(ValueError, match="one per block"):
        m.set_token_reduction("merge:1,2")
    with pytest.raises(ValueError, match="block indices"):
        m.set_token_reduction("topk:0.5@7")
    with pytest.raises(ValueError, match="keep_rate"):
        m.set_token_reduction("topk", keep_rate=1.5)
    with pytest.raises(ValueError, match="no \\[CLS\\] token"):
        _model(global_pool="avg", class_token=False).set_token_reduction("topk:0.5")
    with pytest.raises(ValueError, match="attention mask"):
        enc = Encoder(depth=1, dim=32, num_heads=4)
        enc.set_token_reduction([Merge(2)])
        enc(torch.randn(1, 9, 32), mask=torch.ones(1, 9))


# --- scripts: evaluate.py --token-reduction, visualize_attention.py --show-tokens -------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from vit.config import from_dict
    from vit.models.checkpoint import save_checkpoint

    cfg = from_dict({"model": dict(img_size=32, patch_size=4, embed_dim=32, depth=3, num_heads=4, mlp_ratio=4.0),
                     "aug": dict(random_resized_crop=False, hflip=0.0), "data": dict(val_fraction=0.05)})
    m = _model(num_classes=10)
    for p in (m.head.weight, *(b.attn.qkv.weight for b in m.blocks)):  # confident, non-uniform, like a trained one
        torch.nn.init.normal_(p, std=0.5)
    folder = tmp_path_factory.mktemp("tr") / "best"
    save_checkpoint(folder, m, cfg, [str(i) for i in range(10)])
    return folder


def test_evaluate_with_token_reduction_scores_the_reduced_model(checkpoint, tmp_path):
    import json

    import evaluate
    from vit.cli.runtime import run_cli
    from vit.data import build_datasets
    from vit.models.checkpoint import load_checkpoint

    assert evaluate.main(["--checkpoint", str(checkpoint), "--token-reduction", "merge:6", "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    model, cfg, _, _ = load_checkpoint(checkpoint)
    val = build_datasets(cfg, splits=("val",))[1]
    x, y = map(torch.stack, zip(*[(a, torch.tensor(b)) for a, b in val]))
    with torch.no_grad():
        plain = F.cross_entropy(model(x), y).item()
        model.set_token_reduction("merge:6")
        reduced = F.cross_entropy(model(x), y).item()
    assert metrics["token_reduction"] == "merge:6" and metrics["n"] == len(y)
    assert metrics["loss"] == pytest.approx(reduced, rel=1e-5)
    assert abs(reduced - plain) > 1e-4  # the option reached the model
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: evaluate.main(["--checkpoint", str(checkpoint), "--token-reduction", "merge:x"]))
    assert e.value.code == 2


def test_visualize_show_tokens_draws_every_patch(checkpoint, tmp_path):
    import visualize_attention

    args = ["--checkpoint", str(checkpoint), "digits:0-1", "--out", str(tmp_path), "--show-tokens"]
    with pytest.raises(ValueError, match="--show-tokens needs"):
        visualize_attention.main(args)
    assert visualize_attention.main(args + ["--token-reduction", "topk:0.5@1,2"]) == 0
    labels = np.load(tmp_path / "digits_0000_tokens.npy")
    grid_map = np.load(tmp_path / "digits_0000_rollout.npy")
    assert labels.shape == grid_map.shape == (8, 8)
    # 64 patches -> 32 kept + 1 fused (block 1) -> of those 33, 17 kept + 1 fused (block 2)
    assert len(np.unique(labels[labels >= 0])) == 17 and (labels < 0).sum() >= 16
    assert (tmp_path / "digits_0001_tokens.png").stat().st_size > 0


def test_tracing_a_reduced_model_says_to_turn_reduction_off():
    import torch.fx

    m = _model()
    m.set_token_reduction("merge:2")
    with pytest.raises(ValueError, match="set_token_reduction\\(None\\) before tracing"):
        torch.fx.symbolic_trace(m)
    m.set_token_reduction(None)
    torch.fx.symbolic_trace(m)  # the plain model traces


# --- Token merging follows the model's dtype: a float64 model with ToMe computes what its float32 twin does, to


@pytest.fixture
def merged():
    torch.manual_seed(0)
    m = vit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2,
                         num_classes=5).eval()
    m.set_token_reduction("merge:8")
    return m


@pytest.mark.parametrize("fused", [True, False])
def test_merged_float64_agrees_with_float32(merged, fused):
    merged.set_fused_attn(fused)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        f32 = merged(x).double()
        f64 = copy.deepcopy(merged).double()(x.double())
    assert (f32 - f64).abs().max() < 1e-5  # a float32 size mask in float64 SDPA was 2e-3 off


def test_merged_sizes_follow_the_model_dtype(merged):
    from vit.layers.token_reduction import TokenState

    x = torch.randn(1, 5, 4, dtype=torch.float64)
    assert TokenState.start(x).size.dtype == torch.float64
    assert TokenState.start(x.half()).size.dtype == torch.float16


@pytest.mark.parametrize("spec,match", [("topk:0.5@", r"no layers"), ("topk:0.5@,", r"not understood"),
                                        ("merge:", r"not understood")])
def test_token_reduction_specs_without_their_values_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_token_reduction(spec)


def test_merging_more_than_half_the_tokens_is_refused(merged):
    # 8x8 patches + [CLS] = 65 tokens: at most 32 can merge in the first block
    merged.set_token_reduction("merge:33")
    with pytest.raises(ValueError, match=r"merge:33.*at most 32"):
        merged(torch.randn(1, 3, 32, 32))
    merged.set_token_reduction("merge:32")
    assert merged(torch.randn(1, 3, 32, 32)).shape == (1, 5)
