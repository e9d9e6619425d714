"""Relative position bias (vit/layers/rel_pos.py): indices and biases equal timm's, attention with the bias is the same
on the fused and explicit paths and equals a float64 formula, and timm's relpos models (MLP bias, shared, residual
post-norm) give timm's logits from timm's weights, also after set_input_size."""

import math

import pytest
import timm
import torch
from timm.layers.pos_embed_rel import RelPosMlp as TimmRelPosMlp
from timm.layers.pos_embed_rel import gen_relative_position_index
from timm.models.beit import gen_relative_position_index as beit_index

import vit
from vit.layers import Attention, RelPos, rel_pos_layers
from vit.layers.rel_pos import RelPosMlp, RelPosTable, relative_index

GRIDS = [(4, 4), (3, 5)]  # square and non-square


def _perturbed(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


@pytest.mark.parametrize("grid", GRIDS)
def test_indices_equal_timms(grid):
    assert torch.equal(relative_index(grid), gen_relative_position_index(grid))
    assert torch.equal(relative_index(grid, class_token=True), gen_relative_position_index(grid, class_token=True))
    assert torch.equal(relative_index(grid, class_token=True), beit_index(grid))


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("prefix", [0, 1])
def test_mlp_bias_equals_timms(grid, prefix):
    """Same fc1 / fc2 weights, same (1, H, prefix + N, prefix + N) bias; prefix rows and columns are zero."""
    ours = _perturbed(RelPosMlp(grid, 3, prefix, hidden_dim=16))
    ref = TimmRelPosMlp(grid, num_heads=3, hidden_dim=16, prefix_tokens=prefix).eval()
    ref.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(ours(), ref.get_bias(), rtol=0, atol=1e-6)
    assert ours().shape == (1, 3, prefix + grid[0] * grid[1], prefix + grid[0] * grid[1])


def _formula64(x, attn, bias, pad):
    """softmax(q k^T / sqrt(d) + B) v in float64, padding keys masked, then the output projection."""
    B, N, D = x.shape
    H, d = attn.num_heads, attn.head_dim
    qkv = (x.double() @ attn.qkv.weight.double().T).reshape(B, N, 3, H, d)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    s = q @ k.transpose(-1, -2) / math.sqrt(d) + bias.double()
    s = s.masked_fill(~pad[:, None, None, :], float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, N, D)
    return o @ attn.proj.weight.double().T + attn.proj.bias.double()


@pytest.mark.parametrize("kind", ["mlp", "table"])
def test_biased_attention_fused_equals_explicit_and_formula(kind):
    """The bias goes into SDPA as a float mask: fused and explicit paths and a float64 formula agree within 1e-6,
    with a key-padding mask on top; every bias parameter gets a gradient through the fused path; the bias changes
    the output (so the comparison is not vacuous)."""
    torch.manual_seed(0)
    grid, heads, D = (3, 5), 2, 32
    _, make = rel_pos_layers(RelPos(kind), grid, heads, prefix=1)
    attn = _perturbed(Attention(D, heads, qkv_bias=False, rel_pos=make))
    x = torch.randn(2, 1 + 15, D)
    pad = torch.ones(2, 16, dtype=torch.bool)
    pad[0, -4:] = False
    with torch.no_grad():
        fused, _ = attn(x, pad)
        explicit, probs = attn(x, pad, return_attention=True)
        bias = attn.rel_pos()
        first, _ = attn(x, pad, num_queries=1)  # the [CLS]-only path takes the bias' first row
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-6)
    torch.testing.assert_close(fused.double(), _formula64(x, attn, bias, pad), rtol=0, atol=1e-6)
    torch.testing.assert_close(first, fused[:, :1], rtol=0, atol=1e-6)
    assert probs[0, :, :, -4:].abs().max() == 0
    attn(x, pad)[0].square().sum().backward()  # through the fused kernel's float mask into the bias' parameters
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in attn.rel_pos.parameters())
    with torch.no_grad():
        plain = Attention(D, heads, qkv_bias=False)
        plain.load_state_dict({k: v for k, v in attn.state_dict().items() if "rel_pos" not in k
                               and "relative_position" not in k})
        assert (plain(x, pad)[0] - fused).abs().max() > 1e-3


def _pair(arch, **kw):
    """timm's model with its random weights moved from init, and ours loaded from them (strictly)."""
    torch.manual_seed(0)
    ref = _perturbed(timm.create_model(arch, pretrained=False, **kw))
    ours = vit.create_model(arch, **kw).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    assert set(ours.state_dict()) == set(ref.state_dict())
    return ours, ref


TINY = dict(img_size=64, embed_dim=48, depth=2, num_heads=3, num_classes=5)


@pytest.mark.parametrize("arch", ["vit_relpos_medium_patch16_cls_224", "vit_srelpos_small_patch16_224",
                                  pytest.param("vit_relpos_medium_patch16_rpn_224", marks=pytest.mark.slow)],
                         ids=["cls-token", "shared", "res-post-norm"])
def test_relpos_models_give_timms_logits(arch):
    """Per-block MLP bias with [CLS] and token pooling (the [CLS]-only last block), the shared MLP bias, and residual
    post-norm: timm's logits within 1e-5, on both attention paths and traced with torch.fx; again after
    set_input_size to a non-square grid (timm recomputes the MLP's offsets, so do we)."""
    ours, ref = _pair(arch, **TINY)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-5)
        torch.testing.assert_close(torch.fx.symbolic_trace(ours)(x), ref(x), rtol=0, atol=1e-5)
        logits, maps = ours.forward_with_attention(x)
    torch.testing.assert_close(logits, ref(x), rtol=0, atol=1e-5)
    torch.testing.assert_close(maps[0].sum(-1), torch.ones_like(maps[0][..., 0]))
    ours.set_input_size((48, 80))
    ref.set_input_size((48, 80))
    x = torch.randn(2, 3, 48, 80)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("make,message", [
    (lambda: RelPos(kind="swin"), "RelPos option 'kind' must be one of"),
    (lambda: RelPos(hidden_dim=0), "RelPos option 'hidden_dim' must be a whole number"),
    (lambda: RelPosTable((4, 4), 2, prefix=0), "entries for one \\[CLS\\] token"),
    (lambda: vit.create_model("vit_relpos_small_patch16_224", dynamic_img_size=True),
     "built for one patch grid"),
    (lambda: vit.create_model("vit_relpos_small_patch16_224", **TINY)(torch.randn(1, 3, 96, 96)),
     "differs from the model's 64x64; resize the input, call model.set_input_size\\(\\(96, 96\\)\\)"),
    (lambda: vit.create_model("vit_relpos_small_patch16_224", token_reduction="merge:2", **TINY)(
        torch.randn(1, 3, 64, 64)), "call set_token_reduction\\(None\\)"),
    (lambda: vit.create_model("vit_relpos_small_patch16_224", **TINY).encode(
        torch.randn(1, 3, 64, 64), patch_keep=torch.arange(10)[None]), "drop patch_keep"),
])
def test_bad_relative_position_settings_say_what_to_do(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_beit_gives_timms_logits_and_keys():
    """BEiT v2 (timm's Beit): per-block tables with [CLS] entries, q_bias / v_bias (k's fixed at zero), gamma_1 /
    gamma_2; timm's logits within 1e-5 on both attention paths, again after set_input_size to a non-square grid
    (both resample the tables the same way), and a checkpoint from another grid resampled as timm's loader does."""
    from timm.models.beit import checkpoint_filter_fn as timm_filter

    from vit.models.vision_weights import checkpoint_filter_fn

    ours, ref = _pair("beitv2_base_patch16_224", **TINY)
    keys = set(ours.state_dict())
    assert {"blocks.0.attn.q_bias", "blocks.0.attn.v_bias", "blocks.0.attn.relative_position_bias_table",
            "blocks.0.gamma_1"} <= keys and "blocks.0.attn.qkv.bias" not in keys
    assert ours.blocks[0].attn.qkv.bias is None and ours.blocks[0].attn.k_bias.abs().max() == 0  # k's stays 0
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = ref(x)
        torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-5)
        ours.blocks.fused_attn = False
        torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-5)
        ref.blocks[0].attn.relative_position_bias_table.zero_()
        assert (ref(x) - expected).abs().max() > 1e-4  # the tables matter (10x the tolerance above)
        ours.blocks[0].attn.rel_pos.relative_position_bias_table.zero_()
    saved = ref.state_dict()
    ours.set_input_size((48, 80))
    ref.set_input_size((48, 80))
    x = torch.randn(2, 3, 48, 80)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-5)
    big = vit.create_model("beitv2_base_patch16_224", **{**TINY, "img_size": 96})
    theirs = timm_filter(saved, timm.create_model("beitv2_base_patch16_224", **{**TINY, "img_size": 96}))
    mine = checkpoint_filter_fn(saved, big, type("Report", (), {"actions": []})())
    key = "blocks.1.attn.relative_position_bias_table"
    assert mine[key].shape == (11 * 11 + 3, 3)
    torch.testing.assert_close(mine[key], theirs[key], rtol=0, atol=1e-6)


@pytest.mark.slow  # builds a 224 px model four times (timm's and ours, saved and loaded)
def test_beit_tag_loads_by_name_from_an_offline_hub_cache(tmp_path, offline_hub):
    """A new tag by name, pretrained=True, from a Hugging Face cache that timm's save_for_hf wrote (HF_HUB_OFFLINE):
    the same logits as timm's own pretrained=True."""
    from helpers import hub_snapshot
    from timm.models import save_for_hf

    tag, small = "beitv2_base_patch16_224.in1k_ft_in1k", dict(embed_dim=48, depth=2, num_heads=3)
    torch.manual_seed(0)
    save_for_hf(_perturbed(timm.create_model(tag, **small)), str(hub_snapshot(tmp_path, f"timm/{tag}")),
                safe_serialization=True)
    offline_hub(tmp_path)
    ours = vit.create_model(tag, pretrained=True, **small).eval()
    ref = timm.create_model(tag, pretrained=True, cache_dir=tmp_path, **small).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-5)
    assert ours.pretrained_cfg["hf_hub_id"] == f"timm/{tag}"
