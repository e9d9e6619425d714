"""Attention: fused (SDPA) and explicit paths agree, masks do what they say, and the flash kernel runs."""

import math

import pytest
import torch
import torch.nn.functional as F

import vit
from vit.layers import Attention
from vit.utils.perf import count_flops


def _reference(x, attn, mask=None, causal=False):
    """float64 attention written from the paper's formula, independent of the module's code."""
    B, N, D = x.shape
    H, d = attn.num_heads, attn.head_dim
    W, b = attn.qkv.weight.double(), attn.qkv.bias.double()
    qkv = (x.double() @ W.T + b).reshape(B, N, 3, H, d)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, N, d)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    p = s.softmax(-1)
    o = (p @ v).transpose(1, 2).reshape(B, N, D)
    return o @ attn.proj.weight.double().T + attn.proj.bias.double(), p


def _masks(B, N):
    pad = torch.ones(B, N, dtype=torch.bool)
    pad[0, -3:] = False  # sample 0 has 3 padding tokens
    return {
        "none": None,
        "padding (B, N)": pad,
        "bool (B, H, N, N)": (torch.rand(B, 1, N, N) > 0.3) | torch.eye(N, dtype=torch.bool),
        "additive (N, N)": torch.randn(N, N),
    }


@pytest.mark.parametrize("name", list(_masks(2, 9)))
@pytest.mark.parametrize("causal", [False, True])
def test_fused_and_explicit_paths_match_float64_formula(name, causal):
    B, N, D = 2, 9, 32
    attn = Attention(D, num_heads=4).eval()
    x = torch.randn(B, N, D)
    mask = _masks(B, N)[name]
    with torch.no_grad():
        fused, none = attn(x, mask, is_causal=causal)
        explicit, probs = attn(x, mask, is_causal=causal, return_attention=True)
    assert none is None
    from vit.layers import expand_mask

    ref, ref_p = _reference(x, attn, expand_mask(mask, N), causal)
    torch.testing.assert_close(fused.double(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(explicit.double(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(probs.double(), ref_p, atol=1e-6, rtol=0)
    assert probs.shape == (B, 4, N, N)


def test_masked_positions_receive_no_attention():
    attn = Attention(16, num_heads=2).eval()
    pad = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    _, p = attn(torch.randn(2, 5, 16), pad, return_attention=True)
    assert torch.all(p[0, :, :, 3:] == 0)
    assert torch.all(p[1] > 0)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 2, 5))
    _, p = attn(torch.randn(2, 5, 16), is_causal=True, return_attention=True)
    lower = torch.ones(5, 5, dtype=torch.bool).tril()
    assert torch.all(p[..., ~lower] == 0) and torch.all(p[..., lower] > 0)


def test_bad_mask_shape_is_explained():
    with pytest.raises(ValueError, match="does not match the 5 tokens"):
        Attention(16, 2)(torch.randn(2, 5, 16), torch.ones(2, 4))


def test_model_attention_maps_fused_equal_explicit_and_gradients_everywhere():
    m = vit.create_model("vit_tiny_patch16_224", img_size=64, depth=3, num_classes=4, init_values=0.1,
                         global_pool="avg")
    x = torch.randn(2, 3, 64, 64)
    logits_f = m(x)
    logits_e, attns = m.forward_with_attention(x)
    torch.testing.assert_close(logits_f, logits_e, atol=1e-5, rtol=0)
    assert len(attns) == 3 and all(a.shape == (2, 3, 17, 17) for a in attns)
    torch.testing.assert_close(attns[0].sum(-1), torch.ones(2, 3, 17))
    # every parameter receives a non-zero gradient
    F.cross_entropy(logits_f, torch.tensor([0, 3])).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_explicit_only_model_matches_fused_model():
    m = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=2).eval()
    e = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=2, fused_attn=False).eval()
    e.load_state_dict(m.state_dict())
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(m(x), e(x), atol=1e-5, rtol=0)


def _profiled_ops(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def test_flash_kernel_runs_forward_and_backward():
    m = vit.create_model("vit_tiny_patch16_224", img_size=64, depth=2, num_classes=3).train()
    x = torch.randn(4, 3, 64, 64)

    def step():
        m(x).sum().backward()

    ops = _profiled_ops(step)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in ops
    assert not any("softmax" in op for op in ops), sorted(o for o in ops if "softmax" in o)
    # the explicit path really is a different computation: it shows a softmax and no flash kernel
    ops_explicit = _profiled_ops(lambda: m.forward_with_attention(x))
    assert any("softmax" in op for op in ops_explicit)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" not in ops_explicit


def test_flash_kernel_runs_with_padding_mask():
    attn = Attention(32, 4).eval()
    pad = torch.ones(2, 7, dtype=torch.bool)
    pad[1, 5:] = False
    ops = _profiled_ops(lambda: attn(torch.randn(2, 7, 32), pad))
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops


def test_cls_only_last_block_equals_full_stack_and_trains_every_parameter():
    m = vit.create_model("vit_tiny_patch16_224", img_size=64, depth=3, num_classes=4, drop_path_rate=0.0)
    x = torch.randn(3, 3, 64, 64)
    pruned = m(x)  # token pooling: the last block runs for [CLS] only
    full = m.forward_head(m.forward_features(x))
    torch.testing.assert_close(pruned, full, atol=1e-5, rtol=0)
    with torch.no_grad():  # and it really is pruned: the 16 patch rows of the last block are not computed
        assert count_flops(lambda: m(x)) < count_flops(lambda: m.forward_head(m.forward_features(x)))
    F.cross_entropy(pruned, torch.tensor([0, 1, 3])).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # and the attention it computes is the [CLS] row of the full attention
    blk = m.blocks[-1]
    tokens = torch.randn(2, 17, 192)
    q1, _ = blk.attn(tokens, num_queries=1)
    all_rows, _ = blk.attn(tokens)
    torch.testing.assert_close(q1, all_rows[:, :1], atol=1e-6, rtol=0)
