"""Rotary positions: tables equal timm's, and rotary attention (fused and explicit) equals a float64 formula."""

import math

import pytest
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, RotaryEmbeddingDinoV3

from vit.layers import Attention
from vit.layers.rope import MixedRotaryEmbedding, Rope, RotaryEmbedding, apply_rope, rope_table

GRIDS = [(4, 4), (3, 5)]  # square and non-square


def _timm(rope: Rope, head_dim: int):
    if rope.kind == "axial":
        return RotaryEmbeddingCat(head_dim, in_pixels=False, temperature=rope.temperature,
                                  rotate_half=rope.rotate_half, grid_offset=rope.grid_offset,
                                  grid_indexing=rope.grid_indexing,
                                  ref_feat_shape=None if rope.ref_grid is None else list(rope.ref_grid))
    return RotaryEmbeddingDinoV3(head_dim, temperature=rope.temperature, rotate_half=rope.rotate_half,
                                 grid_offset=rope.grid_offset, grid_indexing=rope.grid_indexing,
                                 normalize_coords=rope.normalize_coords)


ROPES = [
    Rope(),  # EVA02 / RoPE-ViT axial, interleaved pairs
    Rope(rotate_half=True, grid_indexing="xy", grid_offset=0.5),
    Rope(ref_grid=(7, 6)),  # EVA's fine-tune rescale onto the pretraining grid
    Rope("dinov3", temperature=100.0, rotate_half=True),  # vit_*_dinov3
    Rope("dinov3", temperature=100.0, normalize_coords="max", grid_indexing="xy"),
]


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("rope", ROPES, ids=lambda r: f"{r.kind}-half{r.rotate_half}-{r.grid_indexing}")
def test_table_equals_timm(rope, grid):
    """Our table is timm's RotaryEmbeddingCat / RotaryEmbeddingDinoV3 table for the same grid, bit for bit, and the
    cached module recomputes it when the grid changes."""
    emb = RotaryEmbedding(rope, 32)
    emb((6, 6))  # a different grid first: the cache must not leak into the next one
    torch.testing.assert_close(emb(grid), _timm(rope, 32).get_embed(list(grid)), rtol=0, atol=0)


def _angles64(rope: Rope, d: int, grid) -> torch.Tensor:
    """float64 angles (H * W, d / 2), written from the papers: (row, column) angles per frequency."""
    H, W = grid
    n = d // 4
    out = torch.zeros(H * W, d // 2, dtype=torch.float64)
    for r in range(H):
        for c in range(W):
            if rope.kind == "axial":
                pos, freqs = (r, c), [rope.temperature ** (-j / n) for j in range(n)]
            else:  # centred coordinates in [-1, 1], angle = 2 pi p / period
                pos = ((r + 0.5) / H * 2 - 1, (c + 0.5) / W * 2 - 1)
                freqs = [2 * math.pi / rope.temperature ** (2 * j / (d // 2)) for j in range(n)]
            out[r * W + c] = torch.tensor([p * f for p in pos for f in freqs], dtype=torch.float64)
    return out


def _rotate64(x: torch.Tensor, angles: torch.Tensor, half: bool) -> torch.Tensor:
    """Rotate channel pairs of the last M tokens of x (B, H, N, d) as complex numbers a + ib times e^(i angle)."""
    d, m = x.shape[-1], angles.shape[0]
    a_idx = torch.arange(d // 2) if half else torch.arange(0, d, 2)
    b_idx = a_idx + d // 2 if half else a_idx + 1
    z = torch.complex(x[..., -m:, a_idx], x[..., -m:, b_idx]) * torch.polar(torch.ones_like(angles), angles)
    out = x.clone()
    out[..., -m:, a_idx], out[..., -m:, b_idx] = z.real, z.imag
    return out


def _formula64(x, attn, rope, grid, mask):
    B, N, D = x.shape
    H, d = attn.num_heads, attn.head_dim
    qkv = (x.double() @ attn.qkv.weight.double().T + attn.qkv.bias.double()).reshape(B, N, 3, H, d)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, N, d)
    angles = _angles64(rope, d, grid)
    q, k = _rotate64(q, angles, rope.rotate_half), _rotate64(k, angles, rope.rotate_half)
    s = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask[:, None, None, :], float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, N, D)
    return o @ attn.proj.weight.double().T + attn.proj.bias.double()


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("rope,prefix", [(ROPES[0], 1), (ROPES[3], 5)], ids=["axial-cls", "dinov3-cls+4reg"])
def test_rotary_attention_fused_equals_explicit_and_formula(rope, prefix, grid):
    """Rotary attention with a key-padding mask: the fused SDPA path, the explicit path and a float64 formula agree
    within 1e-6; prefix tokens are not rotated (the formula rotates only the last H * W tokens)."""
    torch.manual_seed(0)
    B, D, heads = 2, 64, 2
    N = prefix + grid[0] * grid[1]
    attn = Attention(D, heads, rope=rope).eval()
    x = torch.randn(B, N, D)
    pad = torch.ones(B, N, dtype=torch.bool)
    pad[0, -3:] = False  # sample 0 has 3 padding tokens at the end
    table = RotaryEmbedding(rope, D // heads)(grid)
    with torch.no_grad():
        fused, _ = attn(x, pad, rope=table)
        explicit, probs = attn(x, pad, return_attention=True, rope=table)
        plain, _ = attn(x, pad)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-6)
    torch.testing.assert_close(fused.double(), _formula64(x, attn, rope, grid, pad), rtol=0, atol=1e-6)
    assert probs[0, :, :, -3:].abs().max() == 0  # padding keys get no weight
    assert (fused - plain).abs().max() > 1e-3  # the rotation changed the output


@pytest.mark.parametrize("grid", GRIDS)
def test_mixed_tables_equal_timm_and_train(grid):
    """RoPE-Mixed: with timm's frequencies, our per-block, per-head table is timm's RotaryEmbeddingMixed table bit
    for bit (square and non-square grids); the frequencies receive gradients through attention."""
    from timm.layers.pos_embed_sincos import RotaryEmbeddingMixed

    torch.manual_seed(0)
    ref = RotaryEmbeddingMixed(64, depth=3, num_heads=2, temperature=10.0, grid_indexing="xy")
    ours = MixedRotaryEmbedding(Rope("mixed", temperature=10.0, grid_indexing="xy"), 32, depth=3, num_heads=2)
    ours.load_state_dict(ref.state_dict())
    table = ours(grid)  # (depth, 1, heads, N, 2d)
    torch.testing.assert_close(table[:, 0], ref.get_embed(list(grid)), rtol=0, atol=0)
    attn = Attention(64, 2, rope=ours.rope)
    attn(torch.randn(2, 1 + grid[0] * grid[1], 64), rope=table[1])[0].square().sum().backward()
    assert ours.freqs.grad[:, 1].abs().sum() > 0 and ours.freqs.grad[:, 0].abs().sum() == 0  # block 1's only


def test_per_image_tables_equal_a_shared_table():
    """A (B, M, 2d) table (one per image, as variable-grid batches need) rotates as the shared (M, 2d) one."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 1 + 12, 16)
    table = rope_table(Rope(), 16, (3, 4))
    torch.testing.assert_close(apply_rope(x, table[None].expand(2, -1, -1)), apply_rope(x, table), rtol=0, atol=0)
    assert torch.equal(apply_rope(x, table)[:, :, :1], x[:, :, :1])


@pytest.mark.parametrize("make,message", [
    (lambda: Rope(kind="learned"), "Rope option 'kind' must be one of"),
    (lambda: Rope(rotate_half="yes"), "Rope option 'rotate_half' must be true or false"),
    (lambda: Rope("dinov3", ref_grid=(14, 14)), "Rope option 'ref_grid' rescales 'axial' positions only"),
    (lambda: Rope(min_period=1.0), "give both min_period and max_period"),
    (lambda: Rope("mixed", rotate_half=True), "set rotate_half=false"),
    (lambda: RotaryEmbedding(Rope(), 30), "head width divisible by 4"),
    (lambda: rope_table(Rope(), 32, (0, 4)), "two whole numbers > 0"),
    (lambda: Attention(32, 2, rope=Rope())(torch.randn(1, 5, 32), num_queries=2, rope=torch.zeros(4, 32)),
     "reaches into the rotated patch tokens"),
])
def test_bad_rotary_settings_say_what_to_do(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("settings, key", [
    (dict(grid_offset=NAN), "grid_offset"), (dict(grid_offset=-INF), "grid_offset"),
    (dict(grid_offset=1e38), "grid_offset"), (dict(temperature=NAN), "temperature"),
    (dict(temperature=INF), "temperature"), (dict(temperature=1e-300), "temperature"),
    (dict(kind="dinov3", min_period=NAN, max_period=10.0), "min_period"),
    (dict(kind="dinov3", min_period=1.0, max_period=INF), "max_period"),
    (dict(kind="dinov3", min_period=1e-300, max_period=10.0), "min_period"),
])
def test_settings_that_make_every_angle_nan_are_refused(settings, key):
    """NaN, inf, or magnitudes whose float32 angles overflow (every table, so every output, NaN) are one sentence
    naming the setting; at the bounds, the table of a large grid is still finite."""
    with pytest.raises(ValueError, match=f"Rope option '{key}' must be a .*finite number") as e:
        Rope(**settings)
    assert "\n" not in str(e.value)
    tables = [rope_table(Rope(temperature=1e-6, grid_offset=-1e6), 32, (64, 48)),
              rope_table(Rope("dinov3", grid_offset=1e6, min_period=1e-6, max_period=1e12), 32, (64, 48)),
              rope_table(Rope("dinov3", temperature=1e12, grid_offset=1e6), 32, (64, 48))]
    assert all(torch.isfinite(t).all() for t in tables)


def test_a_nan_grid_offset_in_a_saved_config_is_refused_by_key(tmp_path):
    """A config.json whose model_args give rotary positions a NaN offset built a model that answers NaN for every
    image; it is refused when the folder is read, naming the file and the key."""
    import json

    from safetensors.torch import save_file

    import vit

    model = vit.create_model("vit_base_patch16_rope_224", img_size=32, patch_size=8, embed_dim=32, depth=1,
                             num_heads=2, num_classes=3)
    args = dict(model._model_args, rope=dict(grid_offset=NAN))
    (tmp_path / "config.json").write_text(json.dumps(dict(
        architecture="vit_base_patch16_rope_224", num_classes=3, model_args=args,
        pretrained_cfg=dict(input_size=[3, 32, 32], num_classes=3))))
    save_file(model.state_dict(), tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"config.json: config key 'model_args.rope.grid_offset' must be a "
                                         r"finite number") as e:
        vit.create_model(f"local-dir:{tmp_path}", pretrained=True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("arch,pool", [("vit_small_patch16_dinov3", "avg"), ("vit_small_plus_patch16_dinov3", "token")])
def test_dinov3_loads_timms_weights_and_gives_its_logits(arch, pool):
    """A tiny DINOv3 (timm's Eva class with DINOv3 rope): timm's random weights load strictly under timm's names
    (gamma_1 / gamma_2 included); logits and intermediate maps equal timm's within 1e-5 on a square and a
    non-square input ('token' pooling also runs the [CLS]-only last block with rotated keys)."""
    import timm

    torch.manual_seed(0)
    kw = dict(img_size=64, embed_dim=64, depth=2, num_heads=2, num_classes=5, global_pool=pool)
    ref = timm.create_model(arch, pretrained=False, **kw).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():  # away from init: LayerScale near 1, sharp attention (so the
            p.normal_(1.0 if "gamma" in name else 0.0, 0.3 if "qkv" in name else 0.1)  # rotation matters)
    import vit

    ours = vit.create_model(arch, **kw).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    assert set(ours.state_dict()) == set(ref.state_dict())
    for shape in [(2, 3, 64, 64), (2, 3, 48, 80)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-5)
            mine, theirs = ours.forward_intermediates(x)[1], ref.forward_intermediates(x)[1]
        torch.testing.assert_close(mine[-1], theirs[-1], rtol=0, atol=1e-5)


def test_token_reduction_on_a_rotary_model_is_refused_not_run_without_positions():
    """ToMe / EViT change which tokens exist, and the rotary table rotates by grid place: the reduced stack would
    run without positions, silently. Refused where it is switched on, and in the encoder if reached another way."""
    import vit

    model = vit.create_model("vit_small_patch16_rope_224", img_size=32, depth=2, embed_dim=64, num_heads=2)
    with pytest.raises(ValueError, match=r"^token reduction merges or drops patches whose rotary positions"):
        model.set_token_reduction("merge", r=2)
    model.set_token_reduction(None)
    from vit.layers import build_token_reduction

    model.blocks.set_token_reduction(build_token_reduction(2, model.num_prefix_tokens, "merge", 2, None, None))
    with pytest.raises(ValueError, match=r"^token reduction cannot run with rotary positions"):
        model(torch.randn(1, 3, 32, 32))
