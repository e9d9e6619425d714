"""Layers against PyTorch's own modules and float64 formulas."""

import math

import pytest
import torch
from torch import nn

import vit
from vit.layers import DropPath, Mlp, PatchEmbed, SwiGLU, get_norm_layer, resample_abs_pos_embed, sincos_1d, sincos_2d
from vit.models.encoder import Block


def test_sincos_1d_is_the_papers_formula():
    N, D = 11, 16
    pe = sincos_1d(N, D).double()
    for pos in range(N):
        for i in range(D // 2):
            angle = pos / 10000 ** (2 * i / D)
            assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("grid,D", [((3, 5), 8), ((4, 2), 24)])
def test_sincos_2d_is_big_visions_formula(grid, D):
    """big_vision's posemb_sincos_2d written out per entry in float64: for the token at row y, column x,
    omega_i = 1 / 10000**(i / (D/4 - 1)) and the row is [sin(x w), cos(x w), sin(y w), cos(y w)]."""
    h, w = grid
    q = D // 4
    ref = torch.empty(h * w, D, dtype=torch.float64)
    for y in range(h):
        for x in range(w):
            for i in range(q):
                om = 1.0 / 10000 ** (i / (q - 1))
                row = ref[y * w + x]
                row[i], row[q + i], row[2 * q + i], row[3 * q + i] = (
                    math.sin(x * om), math.cos(x * om), math.sin(y * om), math.cos(y * om))
    torch.testing.assert_close(sincos_2d(grid, D).double(), ref, atol=1e-7, rtol=0)
    assert ref[:, : D // 2].std() > 0.1 and ref[:, D // 2 :].std() > 0.1  # both halves vary: not a vacuous check
    with pytest.raises(ValueError, match="divisible by 4 and at least 8"):
        sincos_2d(grid, 4)


def test_sincos_vit_is_fixed_and_not_saved():
    m = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, pos_embed="sincos")
    assert "pos_embed" not in m.state_dict()
    assert "pos_embed" not in dict(m.named_parameters())


def test_rmsnorm_matches_formula():
    x = torch.randn(4, 7, 12)
    norm = get_norm_layer("rmsnorm")(12)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(12))
    ref = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.double()
    torch.testing.assert_close(norm(x).double(), ref, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="unknown norm_layer 'batchnorm'"):
        get_norm_layer("batchnorm")


def test_swiglu_matches_formula():
    m = SwiGLU(8, 12)
    x = torch.randn(3, 8)
    ref = m.fc2((nn.functional.silu(m.fc1_g(x))) * m.fc1_x(x))
    torch.testing.assert_close(m(x), ref)


def test_mlp_is_gelu_erf():
    m = Mlp(8, 32)
    x = torch.randn(3, 8)
    ref = m.fc2(0.5 * m.fc1(x) * (1 + torch.erf(m.fc1(x) / math.sqrt(2))))
    torch.testing.assert_close(m(x), ref)


def test_patch_embed_is_a_linear_map_of_each_patch():
    pe = PatchEmbed(img_size=(32, 48), patch_size=16, in_chans=3, embed_dim=10)
    x = torch.randn(2, 3, 32, 48)
    out = pe(x)
    assert out.shape == (2, 6, 10)
    # patch (row 1, col 2) -> token 1*3 + 2, flattened as (C, P, P)
    patch = x[:, :, 16:32, 32:48].reshape(2, -1)
    ref = patch @ pe.proj.weight.reshape(10, -1).T + pe.proj.bias
    torch.testing.assert_close(out[:, 5], ref, atol=1e-5, rtol=0)


def test_drop_path_keeps_expectation_and_is_identity_in_eval():
    dp = DropPath(0.25).train()
    x = torch.ones(20000, 4)
    y = dp(x)
    assert set(y[:, 0].unique().tolist()) <= {0.0, torch.tensor(1 / 0.75).item()}
    assert abs(y.mean().item() - 1.0) < 0.03
    assert torch.all(y[:, 0:1] == y)  # one draw per sample
    assert torch.equal(dp.eval()(x), x)


def test_resample_keeps_prefix_and_identity_when_same_size():
    pos = torch.randn(1, 1 + 16, 8)
    assert resample_abs_pos_embed(pos, (4, 4)) is pos
    out = resample_abs_pos_embed(pos, (6, 2))
    assert out.shape == (1, 13, 8)
    torch.testing.assert_close(out[:, :1], pos[:, :1])


@pytest.mark.parametrize("old,new", [((14, 14), (10, 20)), ((6, 9), (12, 7)), ((6, 9), (6, 9 * 2))])
@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_resample_from_any_grid_equals_timm(old, new, prefix):
    """Non-square grids, either way round, with 0, 1 or 2 prefix rows: timm's resample_abs_pos_embed (which
    loads timm's and our pretrained weights at another size) is the oracle, bicubic with antialiasing."""
    from timm.layers import resample_abs_pos_embed as timm_resample

    pos = torch.randn(1, prefix + old[0] * old[1], 8, generator=torch.Generator().manual_seed(0))
    ours = resample_abs_pos_embed(pos, new, old_size=old, num_prefix_tokens=prefix)
    expected = timm_resample(pos, list(new), old_size=list(old), num_prefix_tokens=prefix)
    assert ours.shape == (1, prefix + new[0] * new[1], 8)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)
    swapped = timm_resample(pos, list(new[::-1]), old_size=list(old), num_prefix_tokens=prefix)
    swapped = swapped[:, prefix:].reshape(new[1], new[0], 8).transpose(0, 1).reshape(1, -1, 8)
    assert (swapped - expected[:, prefix:]).abs().max() > 0.1  # a grid resampled the other way round is told apart


@pytest.mark.parametrize("norm_first", [True, False])
def test_block_matches_torch_transformer_layer(norm_first):
    """Our Block (GELU, LayerNorm) against nn.TransformerEncoderLayer, pre- and post-norm."""
    D, H = 32, 4
    ref = nn.TransformerEncoderLayer(D, H, 64, dropout=0.0, activation="gelu", batch_first=True,
                                     norm_first=norm_first).eval()
    blk = Block(D, H, mlp_ratio=2.0, norm_layer=get_norm_layer("layernorm", 1e-5), norm_first=norm_first).eval()
    with torch.no_grad():
        blk.attn.qkv.weight.copy_(ref.self_attn.in_proj_weight)
        blk.attn.qkv.bias.copy_(ref.self_attn.in_proj_bias)
        blk.attn.proj.load_state_dict(ref.self_attn.out_proj.state_dict())
        blk.mlp.fc1.load_state_dict(ref.linear1.state_dict())
        blk.mlp.fc2.load_state_dict(ref.linear2.state_dict())
        blk.norm1.load_state_dict(ref.norm1.state_dict())
        blk.norm2.load_state_dict(ref.norm2.state_dict())
        x = torch.randn(2, 6, D)
        torch.testing.assert_close(blk(x)[0], ref(x), atol=1e-5, rtol=0)


def _ref_norm(x, norm, kind):
    """LayerNorm (Ba et al., 2016) or RMSNorm (Zhang & Sennrich, 2019) over the last axis, float64."""
    w = norm.weight.double()
    if kind == "rmsnorm":
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * w
    mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    return (x - mu) / torch.sqrt(var + norm.eps) * w + norm.bias.double()


def _ref_attention(x, attn):
    """softmax(Q K^T / sqrt(d)) V per head, heads concatenated, then the output projection; float64."""
    B, N, D = x.shape
    H = attn.num_heads
    d = D // H
    qkv = x @ attn.qkv.weight.double().T + attn.qkv.bias.double()  # (B, N, 3D): [q | k | v], heads inside each
    q, k, v = (qkv[..., i * D:(i + 1) * D].reshape(B, N, H, d).transpose(1, 2) for i in range(3))  # (B, H, N, d)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    p = torch.exp(scores - scores.amax(-1, keepdim=True))
    out = (p / p.sum(-1, keepdim=True)) @ v  # (B, H, N, d)
    return out.transpose(1, 2).reshape(B, N, D) @ attn.proj.weight.double().T + attn.proj.bias.double()


def _ref_ffn(x, mlp, kind):
    def lin(layer, z):
        return z @ layer.weight.double().T + layer.bias.double()

    if kind == "swiglu":  # Shazeer (2020): W2 (SiLU(x Wg) * (x Wx)), SiLU(g) = g / (1 + e^-g)
        g = lin(mlp.fc1_g, x)
        return lin(mlp.fc2, g / (1 + torch.exp(-g)) * lin(mlp.fc1_x, x))
    z = lin(mlp.fc1, x)  # GELU, erf form: z * Phi(z)
    return lin(mlp.fc2, 0.5 * z * (1 + torch.erf(z / math.sqrt(2))))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("opts", [
    dict(), dict(norm_layer="rmsnorm"), dict(mlp_layer="swiglu"), dict(init_values=0.5), dict(norm_first=False),
    dict(norm_first=False, norm_layer="rmsnorm", mlp_layer="swiglu", init_values=0.5),
], ids=["default", "rmsnorm", "swiglu", "layerscale", "post-norm", "post-norm-all"])
def test_block_options_match_their_formula_in_float64(opts, fused):
    """Each block option against the block written out by hand (pre-norm: x + LS(Attn(Norm(x))), then
    x + LS(FFN(Norm(x))); post-norm: Norm(x + LS(Attn(x))), then Norm(x + LS(FFN(x)))), so a miswiring (a norm
    in the wrong place, the gate on the wrong projection, LayerScale on one branch only) fails here."""
    torch.manual_seed(0)
    blk = Block(16, 2, mlp_ratio=2.0, fused_attn=fused, **opts).double().eval()
    with torch.no_grad():
        for p in blk.parameters():  # norms, biases and LayerScale away from their 1 / 0 / constant inits
            p.add_(torch.randn_like(p) * 0.3)
    kind = opts.get("norm_layer", "layernorm")
    ffn_kind = opts.get("mlp_layer", "gelu")
    ls1 = blk.ls1.gamma.double() if "init_values" in opts else 1.0
    ls2 = blk.ls2.gamma.double() if "init_values" in opts else 1.0
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    if opts.get("norm_first", True):
        h = x + ls1 * _ref_attention(_ref_norm(x, blk.norm1, kind), blk.attn)
        ref = h + ls2 * _ref_ffn(_ref_norm(h, blk.norm2, kind), blk.mlp, ffn_kind)
    else:
        h = _ref_norm(x + ls1 * _ref_attention(x, blk.attn), blk.norm1, kind)
        ref = _ref_norm(h + ls2 * _ref_ffn(h, blk.mlp, ffn_kind), blk.norm2, kind)
    with torch.no_grad():
        torch.testing.assert_close(blk(x)[0], ref, atol=1e-12, rtol=0)
    assert isinstance(blk.ls1, vit.layers.LayerScale if "init_values" in opts else nn.Identity)


def test_unknown_block_options_are_named():
    with pytest.raises(ValueError, match="unknown mlp_layer 'relu2'"):
        Block(16, 2, mlp_layer="relu2")



def test_residual_post_norm_matches_timms_res_post_block():
    """vit_base_patch16_rpn_224 (timm's ResPostBlock: Swin-V2's x + Norm(Attn(x)), no LayerScale, norms started at
    init_values), tiny: timm's init of the norms, timm's keys, timm's logits. Built by name, so it holds whatever
    option carries res-post-norm."""
    import timm

    torch.manual_seed(0)
    kw = dict(img_size=32, embed_dim=32, depth=2, num_heads=2, num_classes=3)
    ref = timm.create_model("vit_base_patch16_rpn_224", pretrained=False, **kw).eval()
    ours = vit.create_model("vit_base_patch16_rpn_224", **kw).eval()
    torch.testing.assert_close(ours.blocks[0].norm1.weight, ref.blocks[0].norm1.weight, rtol=0, atol=0)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.3)
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-5)
