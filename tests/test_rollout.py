"""Attention rollout and gradient rollout against an independent float64 oracle written here."""

import numpy as np
import pytest
import torch

import vit
from vit.explain.rollout import attention_maps, attention_rollout, gradient_rollout, to_grid


def _random_attn(B, H, N, gen):
    a = torch.rand(B, H, N, N, generator=gen, dtype=torch.float64) ** 3
    return a / a.sum(-1, keepdim=True)  # row-stochastic


def _oracle(attns, fusion, discard, alpha, start, prefix):
    """Abnar & Zuidema with numpy loops, one sample at a time."""
    B = attns[0].shape[0]
    out = []
    for b in range(B):
        N = attns[0].shape[-1]
        R = np.eye(N)
        for A in attns[start:]:
            a = A[b].numpy()
            f = {"mean": a.mean(0), "max": a.max(0), "min": a.min(0)}[fusion].copy()
            if discard:
                patch = f[prefix:, prefix:].copy()
                flat = patch.flatten()
                k = int(flat.size * discard)
                if k:
                    order = np.argsort(flat, kind="stable")[:k]
                    flat[order] = 0
                f[prefix:, prefix:] = flat.reshape(patch.shape)
            m = alpha * f + (1 - alpha) * np.eye(N)
            for i in range(N):
                m[i] = m[i] / m[i].sum()
            R = m @ R
        out.append(R)
    return np.stack(out)


@pytest.mark.parametrize("depth,H,prefix,grid", [(1, 1, 1, (2, 2)), (4, 3, 1, (3, 5)), (6, 4, 2, (2, 3)),
                                                 (3, 2, 0, (4, 4))])
@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard,alpha,start", [(0.0, 0.5, 0), (0.3, 0.5, 0), (0.0, 0.8, 1), (0.5, 0.3, 2)])
def test_rollout_matches_oracle_and_rows_sum_to_one(depth, H, prefix, grid, fusion, discard, alpha, start):
    gen = torch.Generator().manual_seed(depth * 100 + H)
    N = prefix + grid[0] * grid[1]
    attns = [_random_attn(3, H, N, gen) for _ in range(depth)]
    start = min(start, depth - 1)
    got = attention_rollout(attns, fusion, discard, alpha, start, prefix)
    ref = _oracle(attns, fusion, discard, alpha, start, prefix)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-6)
    np.testing.assert_allclose(got.sum(-1).numpy(), np.ones((3, N)), atol=1e-9)
    # a batch equals its images one by one
    for b in range(3):
        one = attention_rollout([a[b : b + 1] for a in attns], fusion, discard, alpha, start, prefix)
        torch.testing.assert_close(one[0], got[b])
    # the grid readout keeps the rectangular shape
    pool = "token" if prefix else "avg"
    g = to_grid(got, grid, prefix, pool)
    assert g.shape == (3, *grid)
    if prefix:
        torch.testing.assert_close(g[1].flatten(), got[1, 0, prefix:])


def test_identity_attention_gives_identity():
    eye = torch.eye(5).expand(2, 3, 5, 5)
    torch.testing.assert_close(attention_rollout([eye] * 4), torch.eye(5).expand(2, 5, 5))


def test_gradient_rollout_matches_formula_and_pairs_layers():
    gen = torch.Generator().manual_seed(1)
    attns = [_random_attn(2, 3, 5, gen) for _ in range(3)]
    grads = [torch.randn(2, 3, 5, 5, generator=gen, dtype=torch.float64) for _ in range(3)]
    got = gradient_rollout(attns, grads)
    R = torch.eye(5, dtype=torch.float64).expand(2, 5, 5)
    for a, g in zip(attns, grads):  # layer l with its own gradient l
        R = R + (a * g).clamp(min=0).mean(1) @ R
    torch.testing.assert_close(got, R)
    swapped = gradient_rollout(attns, grads[::-1])
    assert not torch.allclose(got, swapped)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = vit.create_model("vit_tiny_patch16_224", img_size=(32, 48), depth=3, num_classes=5).eval()
    for blk in m.blocks:  # make attention non-uniform
        torch.nn.init.normal_(blk.attn.qkv.weight, std=0.3)
    return m


def test_fused_model_maps_equal_explicit_model_maps(model):
    explicit = vit.create_model("vit_tiny_patch16_224", img_size=(32, 48), depth=3, num_classes=5,
                                fused_attn=False).eval()
    explicit.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 48)
    for method in ("rollout", "grad_rollout", "attention"):
        a, la = attention_maps(model, x, method)
        b, lb = attention_maps(explicit, x, method)
        assert a.shape == (2, 2, 3)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert not any(m._forward_hooks for m in model.modules())  # nothing left behind


def test_grad_rollout_depends_on_target_class_rollout_does_not(model):
    x = torch.randn(2, 3, 32, 48)
    g0, _ = attention_maps(model, x, "grad_rollout", target_class=torch.tensor([0, 0]))
    g1, _ = attention_maps(model, x, "grad_rollout", target_class=torch.tensor([3, 3]))
    assert not torch.allclose(g0, g1)
    r, _ = attention_maps(model, x, "rollout")
    r2, _ = attention_maps(model, x, "rollout")
    torch.testing.assert_close(r, r2)
    # batched gradient rollout equals per-image gradient rollout
    one, _ = attention_maps(model, x[1:], "grad_rollout", target_class=torch.tensor([3]))
    torch.testing.assert_close(one[0], g1[1], atol=1e-6, rtol=1e-5)
