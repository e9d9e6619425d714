"""Token merging follows the model's dtype: a float64 model with ToMe computes what its float32 twin does, to
float32's precision, on the fused and the explicit attention path alike."""

import copy

import pytest
import torch

import vit
from vit.layers import parse_token_reduction


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
