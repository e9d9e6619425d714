"""Hybrid ViTs (vit/layers/hybrid_embed.py): a convolutional stem before the tokens, built from timm's own modules
under timm's names; logits equal timm's from timm's weights (ResNetV2, MobileCLIP's and ViTamin's stems, ViTamin's
GeGLU MLP), with timm's feature reductions, and sizes the stem cannot tile are refused with a sentence. The R26 / R50
trunks are timm's ResNetV2 itself; tests/test_variants.py holds their keys, shapes and token grids against timm's."""

import pytest
import timm
import torch

import vit
from vit.layers import Stem


def _perturbed(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


# MobileCLIP's and ViTamin's stems end at the token width, so timm builds them at their entry point's width only
CASES = {
    "vit_tiny_r_s16_p8_224": dict(embed_dim=48, num_heads=3),  # ResNetV2 stem alone (stride 4), 8x8 patches
    "vit_base_mci_224": dict(),  # MobileCLIP: three convolutions, no projection, positions on patches only
    "vitamin_small_224": dict(),  # MBConv stages + GeGLU MLPs, mean pooling
}


SLOW = pytest.mark.slow  # the 768-wide stems take seconds to build twice on a CPU


@pytest.mark.parametrize("arch", [pytest.param(a, marks=SLOW) if "tiny" not in a else a for a in sorted(CASES)])
def test_hybrid_models_give_timms_logits(arch):
    """Built with dynamic_img_size=True (same keys): timm's logits on the default size and on a non-square one that
    the stem's stride times the patch size tiles; another size is refused with that number."""
    torch.manual_seed(0)
    kw = dict(img_size=64, depth=1, num_classes=5, dynamic_img_size=True, **CASES[arch])
    ref = _perturbed(timm.create_model(arch, pretrained=False, **kw))
    ours = vit.create_model(arch, **kw).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    assert set(ours.state_dict()) == set(ref.state_dict())
    assert ours.feature_info == ref.feature_info
    for shape in [(2, 3, 64, 64), (1, 3, 64, 96)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-5)
            assert ref(x).abs().max() > 1e-2
    step = ours.patch_embed.reduction
    with pytest.raises(ValueError, match=f"not divisible by {step}x{step} \\(the .* stem's stride"):
        ours(torch.randn(1, 3, 64, 64 + step // 2))


@pytest.mark.parametrize("make,message", [
    (lambda: Stem(kind="convnext"), "Stem option 'kind' must be one of"),
    (lambda: Stem(kind="vitamin", widths=(64,)), "give widths=\\(w1, w2\\)"),
    (lambda: vit.create_model("vit_base_mci_224", depth=1, patch_size=2), "build it with patch_size=1"),
    (lambda: vit.create_model("vit_tiny_r_s16_p8_224", depth=1, img_size=64, embed_dim=48, num_heads=3)
     .set_input_size(patch_size=2),
     "patch size groups the stem's feature cells"),
])
def test_bad_stem_settings_say_what_to_do(make, message):
    with pytest.raises(ValueError, match=message):
        make()
