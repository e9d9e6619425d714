"""Our ViT against timm's, the numerical oracle: same keys, same shapes, same logits for the same weights."""

import pytest
import timm
import torch

import vit

CASES = [
    ("vit_tiny_patch16_224", {}),
    ("vit_small_patch16_224", dict(img_size=64, num_classes=10, depth=2)),
    ("vit_tiny_patch16_224", dict(img_size=96, patch_size=8, depth=2)),
    ("vit_tiny_patch16_224", dict(img_size=(64, 96), depth=2, global_pool="avg", num_classes=7)),
    ("vit_base_patch32_224", dict(depth=2, in_chans=1, num_classes=3)),
    ("vit_tiny_patch16_224", dict(img_size=48, depth=3, init_values=1e-3, mlp_ratio=2.0)),
]


def _pair(name, overrides):
    ours = vit.create_model(name, **overrides).eval()
    ref = timm.create_model(name, pretrained=False, **overrides).eval()
    return ours, ref


@pytest.mark.parametrize("name,overrides", CASES)
def test_state_dict_keys_and_logits_match_timm(name, overrides):
    ours, ref = _pair(name, overrides)
    ref_sd = ref.state_dict()
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == {k: tuple(v.shape) for k, v in ref_sd.items()}
    ours.load_state_dict(ref_sd, strict=True)
    h, w = ours.patch_embed.img_size
    x = torch.randn(2, ours.patch_embed.proj.in_channels, h, w)
    with torch.no_grad():
        a, b = ours(x), ref(x)
        fa, fb = ours.forward_features(x), ref.forward_features(x)
        pa, pb = ours.forward_head(fa, pre_logits=True), ref.forward_head(fb, pre_logits=True)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    torch.testing.assert_close(fa, fb, atol=1e-5, rtol=0)
    torch.testing.assert_close(pa, pb, atol=1e-5, rtol=0)
    assert a.abs().max() > 1e-3  # a head of zeros would make the comparison vacuous


def test_loaded_from_file_and_resampled_matches_timm(tmp_path):
    """A timm checkpoint at 224 saved to disk, loaded into a 160-px model, equals timm's own resampling."""
    from safetensors.torch import save_file

    ref224 = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2).eval()
    path = tmp_path / "model.safetensors"
    save_file(ref224.state_dict(), str(path))
    ours = vit.create_model("vit_tiny_patch16_224", depth=2, img_size=160, num_classes=5).eval()
    report = vit.load_pretrained(ours, path)
    assert any("resampled pos_embed" in a for a in report.actions)
    assert any("dropped the 1000-class head" in a for a in report.actions)
    # timm's oracle: its own loader of a checkpoint into a 160-px model with a new head.
    ref160 = timm.create_model(
        "vit_tiny_patch16_224", pretrained=True, depth=2, img_size=160, num_classes=5,
        pretrained_cfg_overlay=dict(file=str(path)),
    ).eval()
    ours.head.load_state_dict(ref160.head.state_dict())
    torch.testing.assert_close(ours.pos_embed, ref160.pos_embed, atol=1e-6, rtol=0)
    x = torch.randn(2, 3, 160, 160)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref160(x), atol=1e-5, rtol=0)


def test_pth_checkpoint_with_wrapper_and_dynamic_size(tmp_path):
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=64).eval()
    path = tmp_path / "ckpt.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in ref.state_dict().items()}}, path)
    ours = vit.create_model("vit_tiny_patch16_224", depth=2, img_size=64, pretrained=str(path)).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)
    # dynamic_img_size resamples on the fly exactly as timm does
    ours_d = vit.create_model("vit_tiny_patch16_224", depth=2, img_size=64, dynamic_img_size=True).eval()
    ref_d = timm.create_model("vit_tiny_patch16_224", depth=2, img_size=64, dynamic_img_size=True).eval()
    ours_d.load_state_dict(ref_d.state_dict())
    x = torch.randn(1, 3, 96, 80)
    with torch.no_grad():
        torch.testing.assert_close(ours_d(x), ref_d(x), atol=1e-5, rtol=0)


def test_wrong_architecture_checkpoint_is_refused(tmp_path):
    from safetensors.torch import save_file

    ref = timm.create_model("vit_small_patch16_224", pretrained=False, depth=2)
    path = tmp_path / "small.safetensors"
    save_file(ref.state_dict(), str(path))
    ours = vit.create_model("vit_tiny_patch16_224", depth=2)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(ValueError, match="another architecture"):
        vit.load_pretrained(ours, path)
    assert all(torch.equal(before[k], v) for k, v in ours.state_dict().items())  # nothing half-loaded


def test_unknown_name_and_option_are_named():
    with pytest.raises(ValueError, match="vit_tiny_patch99"):
        vit.create_model("vit_tiny_patch99_224")
    with pytest.raises(TypeError, match="embed_dimm"):
        vit.create_model("vit_tiny_patch16_224", embed_dimm=3)
    with pytest.raises(ValueError, match="not divisible by patch size"):
        vit.create_model("vit_tiny_patch16_224", img_size=100)
    with pytest.raises(ValueError, match=r"'model_args.num_heads' \(5\) must divide 'model_args.embed_dim' \(192\)"):
        vit.create_model("vit_tiny_patch16_224", num_heads=5)
    m = vit.create_model("vit_tiny_patch16_224", depth=1, img_size=32)
    with pytest.raises(ValueError, match="differs from the model's 32x32"):
        m(torch.randn(1, 3, 48, 48))


def test_param_counts_match_published_sizes():
    n = {name: sum(p.numel() for p in vit.create_model(name).parameters()) for name in
         ("vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224")}
    assert round(n["vit_tiny_patch16_224"] / 1e6, 1) == 5.7
    assert round(n["vit_small_patch16_224"] / 1e6, 1) == 22.1
    assert round(n["vit_base_patch16_224"] / 1e6, 1) == 86.6


def test_no_weight_decay_names_real_parameters():
    m = vit.create_model("vit_tiny_patch16_224", depth=1)
    names = dict(m.named_parameters())
    assert m.no_weight_decay() <= set(names)
    assert m.no_weight_decay() == timm.create_model("vit_tiny_patch16_224", depth=1).no_weight_decay() & set(names)
