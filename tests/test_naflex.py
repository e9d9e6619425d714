"""NaFlex (vit/layers/naflex.py): timm's NaFlexVit logits on the same patches and mask at three aspect ratios,
padding that never leaks into another image, rotary positions per image grid against a float64 formula, per-image
intermediates and rollout maps, and ONNX with two sequence lengths."""

import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.naflexvit import batch_patchify

import vit
from vit.explain.rollout import attention_maps, attention_rollout, naflex_to_grids
from vit.layers import Attention, Rope, RotaryEmbedding, naflex_rope_table, patchify
from vit.models.variants import VARIANTS

SMALL = dict(embed_dim=32, depth=2, num_heads=2, num_classes=7)
GRIDS = [(4, 4), (2, 8), (6, 2)]  # 1:1, 4:1 and 1:3 images, in patches
P = 16


def _images(grids, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 3, h * P, w * P, generator=g) for h, w in grids]


def _batch(images) -> dict:
    """Images of different sizes -> one NaFlex batch, patchified by timm's batch_patchify, padded at the end."""
    items = [batch_patchify(im, (P, P))[0][0] for im in images]
    coords = [torch.stack(torch.meshgrid(torch.arange(im.shape[-2] // P), torch.arange(im.shape[-1] // P),
                                         indexing="ij"), -1).reshape(-1, 2) for im in images]
    B, N = len(items), max(len(p) for p in items)
    out = dict(patches=torch.zeros(B, N, items[0].shape[1]), patch_coord=torch.zeros(B, N, 2, dtype=torch.long),
               patch_valid=torch.zeros(B, N, dtype=torch.bool))
    for b, (p, c) in enumerate(zip(items, coords)):
        out["patches"][b, : len(p)], out["patch_coord"][b, : len(p)], out["patch_valid"][b, : len(p)] = p, c, True
    return out


def _pair(arch, **extra):
    """timm's NaFlexVit and ours, tiny, with the same random weights (std 0.1, the position tables 1.0 to weigh as
    much as a projected patch: positions, prefix tokens and norms all matter)."""
    ours_kw = dict(SMALL, **extra)
    timm_kw = dict(SMALL, **extra)
    if "radio" in arch:  # a small table for the tiny model: timm's pos_embed_grid_size, our naflex.pos_grid
        timm_kw["pos_embed_grid_size"] = (8, 8)
        ours_kw["naflex"] = dict(VARIANTS[arch]["naflex"], pos_grid=(8, 8))
    ref = timm.create_model(arch, **timm_kw).eval()
    g = torch.Generator().manual_seed(1)
    ref.load_state_dict({k: torch.randn(v.shape, generator=g) * (1.0 if "pos_embed" in k else 0.1)
                         for k, v in ref.state_dict().items()})
    ours = vit.create_model(arch, **ours_kw).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


ARCHS = ["naflexvit_base_patch16_gap",  # avg pooling, 4 registers, bicubic antialiased table
         "naflexvit_base_patch16_parfac_gap",  # factorized, aspect-preserving table
         "naflexvit_base_patch16_siglip",  # attention pooling (padding masked there too), bilinear
         "naflexvit_base_patch16_radio_v3"]  # [CLS] pooling, 128-style table: bilinear, align_corners, no antialias


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_timms_naflexvit_and_padding_never_leaks(arch):
    """Three aspect ratios in one padded batch: the same logits as timm's NaFlexVit on the same patches and mask,
    and each image's logits equal what it gets alone (no padding) within 1e-5."""
    ref, ours = _pair(arch)
    images = _images(GRIDS)
    batch = _batch(images)
    assert (~batch["patch_valid"]).sum() > 0  # the batch really is padded
    with torch.no_grad():
        logits = ours(batch)
        torch.testing.assert_close(logits, ref(batch), rtol=0, atol=1e-5)
        alone = torch.cat([ours(_batch([im])) for im in images])
        torch.testing.assert_close(logits, alone, rtol=0, atol=1e-5)
        valid, tokens = batch["patch_valid"], ours.forward_features(batch)["patches"]
        p = ours.num_prefix_tokens
        for b, im in enumerate(images):  # every real token, not only the pooled vector, as alone
            own = ours.forward_features(_batch([im]))["patches"][0]
            torch.testing.assert_close(tokens[b, : p + int(valid[b].sum())], own, rtol=0, atol=1e-5)
        # guard: positions matter (each image read with rows and columns swapped gets other tokens)
        swapped = ours.forward_features(dict(batch, patch_coord=batch["patch_coord"].flip(-1)))["patches"]
        assert (swapped - tokens)[:, p:][valid].abs().max() > 1e-2


def test_images_equal_their_patches_and_timm_on_images():
    """A plain image tensor into a NaFlex model: patchified whole (timm's (p_h, p_w, C) order), same logits as the
    batch dict and as timm's NaFlexVit on the image; the Linear equals the square ViT's patch Conv2d."""
    ref, ours = _pair("naflexvit_base_patch16_gap")
    x = torch.randn(2, 3, 3 * P, 5 * P)
    batch = patchify(x, (P, P))
    torch.testing.assert_close(batch["patches"], batch_patchify(x, (P, P))[0], rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ours(batch), rtol=0, atol=1e-6)
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-5)
        conv = torch.nn.Conv2d(3, 32, P, P)
        w = ours.embeds.proj.weight.reshape(32, P, P, 3).permute(0, 3, 1, 2)  # (D, p_h*p_w*C) -> (D, C, p_h, p_w)
        conv.weight.copy_(w), conv.bias.copy_(ours.embeds.proj.bias)
        torch.testing.assert_close(ours.embeds.proj(batch["patches"]), conv(x).flatten(2).transpose(1, 2),
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["naflexvit_base_patch16_gap", "naflexvit_base_patch16_parfac_gap",
                                  "naflexvit_base_patch16_radio_v3"])
def test_exportable_positions_equal_the_per_grid_resampling(arch):
    """The lookup-table positions (per-axis resampling weights, what ONNX export traces) equal the eager per-grid
    F.interpolate, for grids smaller and larger than a non-square table (so the two axes cannot be confused)."""
    ours = vit.create_model(arch, **SMALL, naflex=dict(VARIANTS[arch]["naflex"], pos_grid=(6, 10)))
    batch = _batch(_images(GRIDS + [(9, 3), (1, 12)]))
    c, v = batch["patch_coord"], batch["patch_valid"]
    wy, wx = ours.embeds.position_weights(12)
    with torch.no_grad():
        eager = ours.embeds.positions(c, v)
        torch.testing.assert_close(ours.embeds.positions_by_weights(c, v, wy, wx)[v], eager[v], rtol=0, atol=1e-5)


def _angles64(rope: Rope, d: int, h: int, w: int, coord: torch.Tensor) -> torch.Tensor:
    """float64 angles (M, d / 2) of patches at coord (M, 2) in an h x w image, from the papers' formulas."""
    n = d // 4
    out = []
    for r, c in coord.tolist():
        if rope.kind == "axial":
            pos, freqs = (r, c), [rope.temperature ** (-j / n) for j in range(n)]
        else:  # DINOv3: centred coordinates in [-1, 1] of the image's own grid
            pos = ((r + 0.5) / h * 2 - 1, (c + 0.5) / w * 2 - 1)
            freqs = [2 * math.pi / rope.temperature ** (2 * j / (d // 2)) for j in range(n)]
        out.append([p * f for p in pos for f in freqs])
    return torch.tensor(out, dtype=torch.float64)


def _rotate64(x: torch.Tensor, angles: torch.Tensor, half: bool) -> torch.Tensor:
    """Channel pairs of x (H, M, d) as complex numbers a + ib, times e^(i angle)."""
    d = x.shape[-1]
    a = torch.arange(d // 2) if half else torch.arange(0, d, 2)
    b = a + d // 2 if half else a + 1
    z = torch.complex(x[..., a], x[..., b]) * torch.polar(torch.ones_like(angles), angles)
    out = x.clone()
    out[..., a], out[..., b] = z.real, z.imag
    return out


@pytest.mark.parametrize("rope", [Rope(), Rope("dinov3", temperature=100.0, rotate_half=True)],
                         ids=["axial", "dinov3"])
def test_rotary_naflex_attention_fused_explicit_and_float64(rope):
    """Rotary attention on a padded batch of a square (3 x 3) and a non-square (2 x 5) grid, positions from
    patch_coord in each image's own grid: fused SDPA = explicit path = a float64 formula on the valid tokens
    within 1e-6 (the formula sees one image alone, no padding at all)."""
    torch.manual_seed(0)
    D, heads, prefix = 64, 2, 1
    batch = _batch(_images([(3, 3), (2, 5)]))
    coord, valid = batch["patch_coord"], batch["patch_valid"]
    table = naflex_rope_table(RotaryEmbedding(rope, D // heads), coord, valid)  # (B, N, 2d)
    mask = vit.layers.key_padding_mask(valid, prefix)
    attn = Attention(D, heads, rope=rope).eval()
    x = torch.randn(2, prefix + coord.shape[1], D)
    with torch.no_grad():
        fused, _ = attn(x, mask, rope=table)
        explicit, _ = attn(x, mask, return_attention=True, rope=table)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-6)
    d = D // heads
    for b, (h, w) in enumerate([(3, 3), (2, 5)]):
        keep = torch.cat([torch.ones(prefix, dtype=torch.bool), valid[b]])
        xb = x[b, keep].double()  # (prefix + h*w, D): the image alone
        q, k, v = (xb @ attn.qkv.weight.double().T + attn.qkv.bias.double()).reshape(-1, 3, heads, d).unbind(1)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # (H, M, d)
        ang = _angles64(rope, d, h, w, coord[b, valid[b]])
        q = torch.cat([q[:, :prefix], _rotate64(q[:, prefix:], ang, rope.rotate_half)], 1)
        k = torch.cat([k[:, :prefix], _rotate64(k[:, prefix:], ang, rope.rotate_half)], 1)
        o = ((q @ k.transpose(-1, -2) / math.sqrt(d)).softmax(-1) @ v).transpose(0, 1).reshape(-1, D)
        o = o @ attn.proj.weight.double().T + attn.proj.bias.double()
        torch.testing.assert_close(fused[b, keep].double(), o, rtol=0, atol=1e-6)


def test_rotary_naflex_model_padding_never_leaks():
    """A NaFlex model with DINOv3-style rotary positions only: each image's logits in a mixed batch equal its
    logits alone, and the explicit path (forward_with_attention) gives the fused path's logits."""
    model = vit.create_model("naflexvit_base_patch16_gap", **SMALL, pos_embed="none",
                             rope=dict(kind="dinov3", temperature=100.0, rotate_half=True)).eval()
    images = _images(GRIDS)
    batch = _batch(images)
    with torch.no_grad():
        logits = model(batch)
        torch.testing.assert_close(logits, torch.cat([model(_batch([im])) for im in images]), rtol=0, atol=1e-5)
        torch.testing.assert_close(model.forward_with_attention(batch)[0], logits, rtol=0, atol=1e-6)


def test_forward_intermediates_match_timm_and_give_per_image_grids():
    """'NLC' intermediates equal timm's NaFlexVit's at every real patch (with patch_valid in the dict); 'NCHW' gives
    each image its own (D, h_i, w_i) grid, equal to the grid it gets alone, with each patch at its (row, column)."""
    ref, ours = _pair("naflexvit_base_patch16_gap")
    images = _images(GRIDS)
    batch = _batch(images)
    with torch.no_grad():
        out = ours.forward_intermediates(batch, indices=2, output_fmt="NLC", output_dict=True)
        want = ref.forward_intermediates(batch, indices=2, output_fmt="NLC", output_dict=True)
        valid = batch["patch_valid"]  # padded rows differ: timm's symmetric mask, our key-only one (both unused)
        for a, b in zip(out["image_intermediates"], want["image_intermediates"]):
            torch.testing.assert_close(a[valid], b[valid], rtol=0, atol=1e-5)
        p = ours.num_prefix_tokens
        torch.testing.assert_close(out["image_features"][:, p:][valid], want["image_features"][:, p:][valid],
                                   rtol=0, atol=1e-5)
        assert torch.equal(out["patch_valid"], want["patch_valid"])
        grids = ours.forward_intermediates(batch, indices=[0], output_fmt="NCHW", intermediates_only=True)[0]
        for im, grid, nlc in zip(images, grids, out["image_intermediates"][0]):
            h, w = im.shape[-2] // P, im.shape[-1] // P
            assert grid.shape == (32, h, w)
            alone = ours.forward_intermediates(_batch([im]), indices=[0], output_fmt="NCHW",
                                               intermediates_only=True)[0][0]
            torch.testing.assert_close(grid, alone, rtol=0, atol=1e-5)
            torch.testing.assert_close(grid[:, h - 1, w - 1], nlc[h * w - 1], rtol=0, atol=0)  # last patch's place


def test_rollout_gives_each_image_its_own_map():
    """Rollout on a NaFlex batch: one (h_i, w_i) map per image, equal to its map alone (padding never leaks), and
    for an unpadded image equal to the square readout (the [CLS] row over the patches, reshaped)."""
    ref, model = _pair("naflexvit_base_patch16_radio_v3")  # [CLS] pooling: the [CLS] row
    images = _images(GRIDS)
    maps, _ = attention_maps(model, _batch(images))
    for im, m in zip(images, maps):
        assert m.shape == (im.shape[-2] // P, im.shape[-1] // P)
        torch.testing.assert_close(m, attention_maps(model, _batch([im]))[0][0], rtol=0, atol=1e-6)
        assert m.std() > 0  # a map, not a constant
    one = _batch(images[1:2])
    with torch.no_grad():
        rel = attention_rollout(model.forward_with_attention(one)[1], num_prefix_tokens=model.num_prefix_tokens)
    p = model.num_prefix_tokens
    torch.testing.assert_close(naflex_to_grids(rel, one["patch_coord"], one["patch_valid"], p)[0],
                               rel[0, 0, p:].reshape(2, 8), rtol=0, atol=0)


@pytest.mark.parametrize("change,message", [
    (lambda b: {k: v for k, v in b.items() if k != "patch_valid"}, "needs the keys patches, patch_coord, patch_valid"),
    (lambda b: dict(b, patches=b["patches"][..., :-1]), r"must be \(batch, patches, 768\)"),
    (lambda b: dict(b, patch_valid=b["patch_valid"].long()), "patch_valid must be boolean"),
    (lambda b: dict(b, patch_coord=b["patch_coord"].float()), "patch_coord must be integer"),
    (lambda b: dict(b, patch_valid=b["patch_valid"] & torch.tensor([[True], [False]])), "has no valid patch"),
    (lambda b: dict(b, patch_coord=b["patch_coord"] - 1), "negative row or column"),
])
def test_bad_naflex_batches_say_what_is_wrong(change, message):
    model = vit.create_model("naflexvit_base_patch16_gap", **SMALL)
    with pytest.raises(ValueError, match=message):
        model(change(_batch(_images([(2, 2), (1, 3)]))))


def test_a_square_model_refuses_a_naflex_batch_and_a_naflex_model_its_impossible_options():
    """Each refusal is one sentence naming what to do."""
    with pytest.raises(TypeError, match="built without NaFlex"):
        vit.create_model("vit_tiny_patch16_224", depth=1)(_batch(_images([(2, 2)])))
    with pytest.raises(ValueError, match="no distillation token"):
        vit.create_model("naflexvit_base_patch16_gap", **SMALL, dist_token=True, class_token=True,
                         global_pool="token")
    with pytest.raises(ValueError, match="naflex option .interp_mode. must be one of"):
        vit.create_model("naflexvit_base_patch16_gap", **SMALL, naflex=dict(interp_mode="nearest"))
    from vit.deploy.export import ExportableClassifier, ExportableNaFlexClassifier

    naflex = vit.create_model("naflexvit_base_patch16_gap", **SMALL)
    with pytest.raises(ValueError, match="export it with vit.deploy.export.ExportableNaFlexClassifier"):
        ExportableClassifier(naflex)
    with pytest.raises(ValueError, match="rotary positions computes its per-image tables in Python"):
        ExportableNaFlexClassifier(vit.create_model("naflexvit_base_patch16_gap", **SMALL, rope=dict()))


@pytest.mark.slow
def test_onnx_takes_two_sequence_lengths_and_matches_pytorch(tmp_path):
    """ONNX export of a NaFlex model with dynamic batch and sequence: two batches of different length (16 and 15
    patches, 3 and 2 images) give PyTorch's logits within 1e-4."""
    from vit.deploy.export import ExportableNaFlexClassifier, export_model, load_exported

    _, model = _pair("naflexvit_base_patch16_gap", depth=1)
    first, second = _batch(_images(GRIDS)), _batch(_images([(3, 5), (1, 9)], seed=1))
    assert first["patches"].shape[1] != second["patches"].shape[1]
    run = load_exported(export_model(ExportableNaFlexClassifier(model, max_side=16), "onnx", tmp_path, first), "onnx")
    with torch.no_grad():
        for batch in (first, second):
            torch.testing.assert_close(run(batch), model(batch), rtol=0, atol=1e-4)


def test_positions_are_resampled_as_timm_says():
    """timm's NaFlexEmbeds call, written out: bicubic, align_corners=False, antialias=True, cropped top-left
    after an aspect-preserving resize (one grid, against F.interpolate directly)."""
    model = vit.create_model("naflexvit_base_patch16_par_gap", **SMALL)
    table = model.embeds.pos_embed  # (1, 16, 16, D)
    batch = _batch(_images([(2, 5)]))
    want = F.interpolate(table.permute(0, 3, 1, 2), size=(5, 5), mode="bicubic", antialias=True)[:, :, :2, :5]
    with torch.no_grad():
        got = model.embeds.positions(batch["patch_coord"], batch["patch_valid"])
    torch.testing.assert_close(got[0], want.flatten(2)[0].T, rtol=0, atol=1e-6)


def test_optimizer_groups_are_timms():
    """Weight decay and layer-wise lr groups name the NaFlex parameters as timm's NaFlexVit does."""
    ref, ours = _pair("naflexvit_base_patch16_gap")
    assert ours.group_matcher() == ref.group_matcher()
    assert ours.no_weight_decay() == ref.no_weight_decay() & {n for n, _ in ref.named_parameters()}


def test_timm_naflexvit_weights_load_by_name(tmp_path):
    """A timm hub folder of a NaFlexVit (config.json + safetensors, as timm's save_for_hf writes it, the format of
    timm/naflexvit_* on the hub) loads through create_model(pretrained=True): timm's logits on a 4:1 image."""
    from timm.models import save_for_hf

    ref, _ = _pair("naflexvit_base_patch16_gap")
    save_for_hf(ref, tmp_path, model_args=dict(SMALL))
    model = vit.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    x = torch.randn(1, 3, 2 * P, 8 * P)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_the_docs_picture_shows_a_padded_batch(tmp_path):
    """scripts/naflex_picture.py draws docs/naflex.png: a PNG under 100 KB of the batch it returns (64, 49 and 48
    valid patches of 64 for the 4:1 strip, the 7 x 7 and the 12 x 4 image)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "naflex_picture.py"
    spec = importlib.util.spec_from_file_location("naflex_picture", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    batch = script.write(tmp_path / "n.png")
    assert batch["patch_valid"].sum(1).tolist() == [64, 49, 48]
    assert batch["patch_coord"][0, 63].tolist() == [3, 15]  # the strip's last patch: row 3, column 15
    data = (tmp_path / "n.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 100_000


@pytest.mark.parametrize("arch", ["naflexvit_base_patch16_parfac_gap", "naflexvit_base_patch16_siglip"])
def test_every_parameter_learns_from_a_naflex_batch(arch):
    """Training on a padded batch: every parameter (the resampled position tables and the registers included)
    gets a finite, non-zero gradient."""
    model = vit.create_model(arch, **SMALL).train()
    model(_batch(_images(GRIDS))).square().sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_naflex_variants_have_timms_keys_and_shapes():
    """timm's 11 pretrained naflexvit_* architectures are in the table; the factorized one built by timm and by us
    on the meta device has the same state_dict names and shapes (tests/test_variants.py checks all, slowly)."""
    assert len([a for a in VARIANTS if a.startswith("naflexvit_")]) == 11
    with torch.device("meta"):
        for arch in ["naflexvit_base_patch16_parfac_gap"]:
            ref = {k: v.shape for k, v in timm.create_model(arch).state_dict().items()}
            assert {k: v.shape for k, v in vit.create_model(arch).state_dict().items()} == ref, arch


def test_a_patch_far_beyond_any_grid_is_refused_before_the_grid_is_allocated(monkeypatch):
    """One patch at (5000, 5000) once made a 5001 x 5001 position table (18 s, 3 GB); a grid may hold at most the
    batch's sequence length or MAX_GRID_PATCHES patches, which is said before any table is resampled. A sparse
    grid within the bound (patches dropped) still runs, with the positions of its grid."""
    from vit.layers.naflex import MAX_GRID_PATCHES, NaFlexEmbeds

    model = vit.create_model("naflexvit_base_patch16_gap", **SMALL).eval()
    tables = []
    real = NaFlexEmbeds._table
    monkeypatch.setattr(NaFlexEmbeds, "_table", lambda self, grid: tables.append(grid) or real(self, grid))
    side = math.isqrt(MAX_GRID_PATCHES)  # (side, side) is the first corner past the bound: (side + 1)^2 patches
    for corner in ((side, side), (0, MAX_GRID_PATCHES), (5000, 5000), (2**62, 3)):
        batch = dict(patches=torch.randn(1, 1, P * P * 3), patch_coord=torch.tensor([[corner]]),
                     patch_valid=torch.ones(1, 1, dtype=torch.bool))
        with pytest.raises(ValueError, match=rf"its grid would exceed {MAX_GRID_PATCHES} patches \(the batch's "
                                             r"sequence length, or \d+ when that is less\) with 1 valid; "
                                             r"coordinates count the image's patches from 0\.$"):
            model(batch)
    assert tables == []  # refused before any position table was made
    sparse = dict(patches=torch.randn(1, 2, P * P * 3), patch_coord=torch.tensor([[[0, 0], [side - 1, side - 1]]]),
                  patch_valid=torch.ones(1, 2, dtype=torch.bool))
    with torch.no_grad():
        assert torch.isfinite(model(sparse)).all() and tables == [(side, side)]
