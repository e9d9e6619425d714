"""The last families of timm's ViT tags, each on a tiny random instance against timm's twin holding the same weights:
so400m at 384 px with patch 14 (the grid drops the last pixels), differential attention
(vit/layers/diff_attention.py), the parallel blocks (plain and differential, vit/models/parallel_block.py) and
Sapiens2's grouped-query attention, SAM's image encoder (windows padded to whole ones, decomposed relative positions,
the neck: vit/models/sam_vit.py, vit/layers/windowed_attention.py). Logits and intermediates at a non-square size,
fused against explicit paths, timm loading our checkpoint (local-dir:), and the refusals of what does not combine."""

from __future__ import annotations

import pytest
import timm
import torch

import vit
from vit.config import load_config
from vit.layers import Attention
from vit.models.checkpoint import save_checkpoint

TINY = dict(depth=3, embed_dim=32, num_heads=2)
# family: (timm architecture, its tiny options, input size (H, W))
FAMILIES = {
    "so400m_384": ("vit_so400m_patch14_siglip_384", dict(TINY), (384, 384)),
    "diff": ("vit_dwee_patch16_reg1_gap_256", dict(TINY, img_size=(48, 64)), (48, 64)),
    "parallel": ("vit_pwee_patch16_reg1_gap_256", dict(TINY, img_size=(48, 64)), (48, 64)),
    "diff_parallel": ("vit_dpwee_patch16_reg1_gap_256", dict(TINY, img_size=(48, 64)), (48, 64)),
    "gqa": ("vit_large_patch16_sapiens2", dict(TINY, embed_dim=64, num_heads=4, num_kv_heads=(4, 2, 1),
                                               img_size=(48, 64)), (48, 64)),
    # a 5 x 7 grid in 3 x 3 windows: padded to 6 x 9, one global block
    "sam": ("samvit_base_patch16", dict(TINY, img_size=(80, 112), window_size=3, global_attn_indexes=(1,)),
            (80, 112)),
}


def _pair(family: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(ours, timm's) in eval mode with the same random weights, every tensor drawn (LayerScale, norms and lambda
    far from their inits, so that a part left out changes the output)."""
    arch, kw, _ = FAMILIES[family]
    torch.manual_seed(0)
    theirs = timm.create_model(arch, pretrained=False, **kw).eval()
    state = {k: torch.randn_like(v) * 0.2 for k, v in theirs.state_dict().items()}
    theirs.load_state_dict(state)
    ours = vit.create_model(arch, **kw).eval()
    ours.load_state_dict(state)  # strict: timm's keys and shapes
    return ours, theirs


def _images(family: str, n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, *FAMILIES[family][2], generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.slow) if f == "so400m_384" else f
                                        for f in FAMILIES])
def pair(request):
    return request.param, *_pair(request.param)


def test_logits_and_intermediates_equal_timms(pair):
    family, ours, theirs = pair
    x = _images(family)
    with torch.no_grad():
        want = theirs(x)
        assert want.std() > 1e-3  # not a trivially matching output
        torch.testing.assert_close(ours(x), want, atol=1e-5, rtol=0)
        got, ref = ours.forward_intermediates(x, indices=3), theirs.forward_intermediates(x, indices=3)
        torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=0)
        for g, w in zip(got[1], ref[1], strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=0)


def test_fused_and_explicit_paths_agree(pair):
    """Explicit softmax (and the maps forward_with_attention hands out) against the fused kernels, 1e-6."""
    family, ours, _ = pair
    x = _images(family)
    with torch.no_grad():
        fused = ours.forward_features(x)
        logits, maps = ours.forward_with_attention(x)
        ours.set_fused_attn(False)
        try:
            torch.testing.assert_close(ours.forward_features(x), fused, atol=1e-6, rtol=0)
        finally:
            ours.set_fused_attn(True)
    n = ours.num_prefix_tokens + ours.patch_embed.num_patches
    assert len(maps) == 3 and maps[0].shape == (2, ours.blocks[0].attn.num_heads, n, n)
    torch.testing.assert_close(logits, ours(x), atol=1e-6, rtol=0)


def test_windowed_maps_hold_each_tokens_window_and_the_padding_it_attended():
    """SAM's windowed blocks hand rollout a (B, H, N, N) map: a token's row is its 3 x 3 window (zero elsewhere),
    summing to 1 where the window is whole and to less where it reached into the padding; global blocks sum to 1."""
    ours, _ = _pair("sam")
    with torch.no_grad():
        _, maps = ours.forward_with_attention(_images("sam"))
    windowed, glob = maps[0], maps[1]
    rows = windowed.sum(-1)  # (B, H, 35) over the 5 x 7 grid
    inside = torch.tensor([y < 3 and x < 6 for y in range(5) for x in range(7)])  # windows with no padding
    torch.testing.assert_close(rows[..., inside], torch.ones_like(rows[..., inside]))
    assert (rows[..., ~inside] < 1 - 1e-3).all()
    same = torch.tensor([[(a // 7) // 3 == (b // 7) // 3 and (a % 7) // 3 == (b % 7) // 3 for b in range(35)]
                         for a in range(35)])
    assert (windowed[..., ~same] == 0).all() and (windowed[..., same] > 0).all()
    torch.testing.assert_close(glob.sum(-1), torch.ones_like(glob.sum(-1)))


def test_grouped_query_attention_repeats_each_kv_head_for_its_group():
    """A float64 formula: head h reads kv head h // (H / H_kv); the first-queries path and a padding mask too."""
    torch.manual_seed(0)
    attn = Attention(32, 4, options=vit.config.AttentionOptions(num_kv_heads=2)).double().eval()
    assert attn.qkv.weight.shape == (32 + 2 * 16, 32)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    keep = torch.tensor([[1] * 7, [1] * 5 + [0] * 2], dtype=torch.bool)
    q, k, v = attn.qkv(x).split([32, 16, 16], dim=-1)
    q = q.view(2, 7, 4, 8).transpose(1, 2)
    k, v = (t.view(2, 7, 2, 8).transpose(1, 2)[:, [0, 0, 1, 1]] for t in (k, v))
    scores = (q @ k.transpose(-2, -1)) / 8**0.5 + torch.where(keep[:, None, None], 0.0, float("-inf"))
    want = attn.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 7, 32))
    torch.testing.assert_close(attn(x, keep)[0], want)
    attn.fused_attn = False
    torch.testing.assert_close(attn(x, keep)[0], want)
    torch.testing.assert_close(attn(x, keep, num_queries=2)[0], want[:, :2])


@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f in ("diff_parallel", "gqa", "sam") else
                                                 pytest.mark.slow) for f in FAMILIES])
def test_timm_loads_our_checkpoint(family, tmp_path):
    arch, kw, _ = FAMILIES[family]
    cfg = load_config(None, [f"--model.name={arch}"])
    model = vit.create_model(arch, **dict(kw, num_classes=10)).eval()
    state = _pair(family)[0].state_dict()
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("head")}, strict=False)
    save_checkpoint(tmp_path / "best", model, cfg, [str(i) for i in range(10)])
    theirs = timm.create_model(f"local-dir:{tmp_path / 'best'}", pretrained=True).eval()
    x = _images(family)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model(x), atol=1e-5, rtol=0)


def test_what_does_not_combine_is_refused_in_one_sentence():
    diff = vit.create_model("vit_dwee_patch16_reg1_gap_256", **FAMILIES["diff"][1])
    with pytest.raises(ValueError, match="token reduction ranks and merges tokens by one softmax map"):
        diff.set_token_reduction("merge:2")
    with pytest.raises(ValueError, match="differential attention subtracts two dense softmax maps"):
        diff.set_sparse_attention("moba")
    parallel = vit.create_model("vit_pwee_patch16_reg1_gap_256", **FAMILIES["parallel"][1])
    with pytest.raises(ValueError, match="a parallel block adds attention and MLP from one input"):
        parallel.set_token_reduction("merge:2")
    with pytest.raises(ValueError, match="num_kv_heads 3 does not divide num_heads 4"):
        vit.create_model("vit_large_patch16_sapiens2", **dict(FAMILIES["gqa"][1], num_kv_heads=3))
    sam = vit.create_model("samvit_base_patch16", **FAMILIES["sam"][1])
    with pytest.raises(ValueError, match="windowed attention cuts the patch grid into windows"):
        sam.set_token_reduction("merge:2")
    with pytest.raises(ValueError, match="windowed attention already keeps each query to its window"):
        sam.set_sparse_attention("moba")
    with pytest.raises(ValueError, match="differs from the model's 80x112"):
        sam(torch.randn(1, 3, 96, 96))
    with pytest.raises(ValueError, match="image height 100 is not divisible by patch size 14"):
        vit.create_model("vit_so400m_patch14_siglip_384", img_size=100)


def test_grouped_query_attention_equals_multi_head_with_its_kv_heads_repeated():
    """The oracle for every path that reads keys and values: a GQA model equals the plain model whose k / v rows
    repeat each kv head for its group, with token merging (ToMe) and with MoBA sparse attention on both."""
    kw = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5)
    torch.manual_seed(0)
    gqa = vit.create_model("vit_small_patch16_224", num_kv_heads=2, **kw).eval()
    mha = vit.create_model("vit_small_patch16_224", **kw).eval()
    state = dict(gqa.state_dict())
    for i in range(2):
        for part in ("weight", "bias"):
            q, k, v = state[f"blocks.{i}.attn.qkv.{part}"].split([32, 16, 16])
            rep = lambda t: t.reshape(2, 8, *t.shape[1:]).repeat_interleave(2, 0).reshape(32, *t.shape[1:])  # noqa
            state[f"blocks.{i}.attn.qkv.{part}"] = torch.cat([q, rep(k), rep(v)])
    mha.load_state_dict(state)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(gqa(x), mha(x), atol=1e-5, rtol=0)
        for model in (gqa, mha):
            model.set_token_reduction("merge:3")
        torch.testing.assert_close(gqa(x), mha(x), atol=1e-5, rtol=0)
        for model in (gqa, mha):
            model.set_token_reduction(None)
            model.set_sparse_attention("moba", density=0.5, min_tokens=0)
        torch.testing.assert_close(gqa(x), mha(x), atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["diff", "parallel", "diff_parallel", "gqa", "sam"])
def test_onnx_export_equals_eager(family, tmp_path):
    """Grouped-query attention on a plain ViT: Sapiens2's rotary positions export 2e-2 off eager, as DINOv3's do
    on the same code (a rotary export matter, not GQA's)."""
    from vit.deploy.export import ExportableClassifier, export_model, load_exported

    if family == "gqa":
        torch.manual_seed(0)
        model = vit.create_model("vit_small_patch16_224", img_size=(48, 64), num_kv_heads=2, **dict(
            TINY, embed_dim=64, num_heads=4)).eval()
    else:
        model, _ = _pair(family)
    x = _images(family)
    src = export_model(ExportableClassifier(model), "onnx", tmp_path, x[:1])
    with torch.no_grad():
        want = model(x)
    assert (torch.as_tensor(load_exported(src, "onnx")(x)) - want).abs().max() <= 1e-4
