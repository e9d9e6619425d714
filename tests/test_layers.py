"""Layers against PyTorch's own modules and float64 formulas."""

import math

import pytest
import torch
from torch import nn

import vit
from vit.encoder import Block
from vit.layers import DropPath, Mlp, PatchEmbed, SwiGLU, get_norm_layer, resample_abs_pos_embed, sincos_1d, sincos_2d


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


def test_block_options_build_and_differ():
    x = torch.randn(2, 5, 16)
    outs = {}
    for opts in [dict(), dict(norm_layer="rmsnorm"), dict(mlp_layer="swiglu"), dict(init_values=1e-5),
                 dict(norm_first=False)]:
        torch.manual_seed(0)
        blk = Block(16, 2, **opts).eval()
        outs[str(opts)] = blk(x)[0]
    assert isinstance(Block(16, 2, init_values=1e-5).ls1, vit.layers.LayerScale)
    assert isinstance(Block(16, 2).ls1, nn.Identity)
    base = outs["{}"]
    for k, v in outs.items():
        if k != "{}":
            assert not torch.allclose(v, base), k
    with pytest.raises(ValueError, match="unknown mlp_layer 'relu2'"):
        Block(16, 2, mlp_layer="relu2")
