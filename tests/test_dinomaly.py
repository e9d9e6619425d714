"""Dinomaly (vit/eval/dinomaly.py, vit/layers/linear_attention.py): the linear attention, the hard-mining loss and
the map against float64 formulas from the paper; the same parts against anomalib's Dinomaly (the dev oracle,
anomalib 2.7.0) on random weights and tensors, weights copied across; a short fit lowers the loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vit import create_model
from vit.eval.dinomaly import Dinomaly, NoisyBottleneck, dinomaly_layers, fit_dinomaly, hard_mining_loss
from vit.layers.linear_attention import LinearAttention


def _linear_attention64(x, qkv_w, qkv_b, proj_w, proj_b, heads):
    """Katharopoulos et al. eq. 4-6 by loops over heads and tokens, float64."""
    B, N, D = x.shape
    d = D // heads
    qkv = x @ qkv_w.T + qkv_b  # (B, N, 3D)
    out = np.zeros((B, N, D))
    phi = lambda t: np.where(t > 0, t + 1, np.exp(t))  # noqa: E731 (elu + 1)
    for b in range(B):
        for h in range(heads):
            q, k, v = (phi(qkv[b, :, i * D + h * d:i * D + (h + 1) * d]) if i < 2 else
                       qkv[b, :, i * D + h * d:i * D + (h + 1) * d] for i in range(3))
            for n in range(N):
                w = k @ q[n]  # (N,) phi(q_n) . phi(k_j)
                out[b, n, h * d:(h + 1) * d] = (w[:, None] * v).sum(0) / w.sum()
    return out @ proj_w.T + proj_b


def test_linear_attention_equals_its_formula():
    torch.manual_seed(0)
    layer = LinearAttention(16, num_heads=4).eval()
    x = torch.randn(2, 5, 16)
    got, _ = layer(x)
    p = {k: v.double().numpy() for k, v in layer.state_dict().items()}
    want = _linear_attention64(x.double().numpy(), p["qkv.weight"], p["qkv.bias"], p["proj.weight"], p["proj.bias"], 4)
    np.testing.assert_allclose(got.detach().numpy(), want, atol=1e-5)
    with pytest.raises(ValueError, match="linear attention takes no mask"):
        layer(x, mask=torch.ones(2, 5, dtype=torch.bool))


def test_hard_mining_loss_value_and_gradient_equal_the_formula():
    """Value: mean over groups of mean over images of 1 - cos of the flattened (N * D) vectors. Gradient: the
    plain loss's, times 0.1 at the points whose own 1 - cos is below the top (1 - p) share's smallest."""
    torch.manual_seed(1)
    en = [torch.randn(3, 10, 8, dtype=torch.float64) for _ in range(2)]
    de = [torch.randn(3, 10, 8, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    loss = hard_mining_loss(en, de, p=0.7)
    plain = sum((1 - F.cosine_similarity(a.flatten(1), b.flatten(1), dim=1)).mean() for a, b in zip(en, de)) / 2
    assert loss.item() == pytest.approx(plain.item(), abs=1e-12)
    loss.backward()
    grads = [b.grad.clone() for b in de]
    ref = torch.autograd.grad(plain, de)
    for a, b, g, r in zip(en, de, grads, ref):
        d = (1 - F.cosine_similarity(a, b.detach(), dim=-1)).flatten()
        cut = d.sort(descending=True).values[int(30 * 0.3) - 1]  # the 9th largest of 30 points
        easy = (d < cut).reshape(3, 10, 1)
        assert 0 < easy.sum() < 30
        torch.testing.assert_close(g, torch.where(easy, 0.1 * r, r), atol=1e-12, rtol=0)


def test_the_map_is_one_minus_cosine_averaged_over_groups_and_layers_are_the_middle():
    assert dinomaly_layers(12) == tuple(range(2, 10)) and dinomaly_layers(24) == tuple(range(4, 20))
    assert dinomaly_layers(4) == (0, 1, 2, 3)
    en = [torch.randn(2, 6, 4, dtype=torch.float64) for _ in range(2)]
    de = [torch.randn(2, 6, 4, dtype=torch.float64) for _ in range(2)]
    cos = lambda a, b: (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)  # noqa: E731
    want = np.mean([1 - cos(a.numpy(), b.numpy()) for a, b in zip(en, de)], axis=0)
    np.testing.assert_allclose(Dinomaly.anomaly_map(en, de).numpy(), want, atol=1e-12)


@pytest.mark.slow
def test_a_short_fit_lowers_the_reconstruction_loss():
    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=4, embed_dim=32, num_heads=2,
                         num_classes=2).eval()
    data = [(x, 1, i) for i, x in enumerate(torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0)))]
    x = torch.stack([d[0] for d in data])

    def loss(det):
        det.eval()
        with torch.no_grad():
            return hard_mining_loss(*det(det.encode(model, x)[0]), p=0.0).item()

    before = loss(fit_dinomaly(model, data, steps=1, lr=0.0))
    after = loss(fit_dinomaly(model, data, steps=25, batch_size=8))
    assert after < 0.5 * before
    assert all(not p.requires_grad for p in model.parameters())  # the encoder stays frozen


@pytest.mark.slow
def test_parts_equal_anomalibs_dinomaly_on_random_weights():
    """anomalib 2.7.0's LinearAttention, bottleneck MLP, decoder block, CosineHardMiningLoss and
    calculate_anomaly_maps against ours, weights copied (anomalib's MLPs have no biases: ours are zeroed),
    within 1e-5; the loss's gradient too."""
    from anomalib.models.image.dinomaly.components.layers import DinomalyMLP
    from anomalib.models.image.dinomaly.components.layers import LinearAttention as TheirAttention
    from anomalib.models.image.dinomaly.components.loss import CosineHardMiningLoss
    from anomalib.models.image.dinomaly.torch_model import DecoderViTBlock, DinomalyModel

    torch.manual_seed(0)
    ours = LinearAttention(32, num_heads=4).eval()
    theirs = TheirAttention(32, num_heads=4, qkv_bias=True).eval()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(ours(x)[0], theirs(x)[0], atol=1e-5, rtol=0)

    det = Dinomaly(32, 4, (0, 1, 2, 3)).eval()
    for name, p in det.named_parameters():  # random weights, MLP biases zero (anomalib's MLPs have none)
        with torch.no_grad():
            p.copy_(torch.zeros_like(p) if ("mlp.fc" in name or "bottleneck.fc" in name) and name.endswith("bias")
                    else torch.randn_like(p) * 0.2 + (1 if "norm" in name and name.endswith("weight") else 0))
    bott = DinomalyMLP(32, 128, 32, drop=0.2, bias=False, apply_input_dropout=True).eval()
    bott.load_state_dict({k: v for k, v in det.bottleneck.state_dict().items() if k.endswith("weight")})
    torch.testing.assert_close(det.bottleneck(x), bott(x), atol=1e-5, rtol=0)
    block = DecoderViTBlock(32, 4, mlp_ratio=4.0, qkv_bias=True, norm_layer=lambda d: torch.nn.LayerNorm(d, eps=1e-8))
    block.load_state_dict({k: v for k, v in det.decoder[0].state_dict().items() if not k.startswith("mlp.fc")
                           or k.endswith("weight")})
    torch.testing.assert_close(det.decoder[0](x)[0], block.eval()(x), atol=1e-5, rtol=0)

    en = [torch.randn(2, 16, 32) for _ in range(2)]
    de = [torch.randn(2, 16, 32, requires_grad=True) for _ in range(2)]
    grid = lambda t: t.transpose(1, 2).reshape(2, 32, 4, 4)  # noqa: E731 (anomalib's (B, C, h, w))
    theirs_map = DinomalyModel.calculate_anomaly_maps([grid(e) for e in en], [grid(d.detach()) for d in de],
                                                      out_size=(4, 4))[0]
    torch.testing.assert_close(Dinomaly.anomaly_map(en, [d.detach() for d in de]).reshape(2, 1, 4, 4), theirs_map,
                               atol=1e-5, rtol=0)
    mine = hard_mining_loss(en, de, p=0.6)
    mine.backward()
    g_mine = [d.grad.clone() for d in de]
    de2 = [d.detach().clone().requires_grad_(True) for d in de]
    fn = CosineHardMiningLoss(p_final=0.9, p_schedule_steps=3)
    their = fn([grid(e) for e in en], [grid(d) for d in de2], global_step=2)  # p = 0.9 * 2 / 3 = 0.6
    their.backward()
    assert mine.item() == pytest.approx(their.item(), abs=1e-5)
    for a, b in zip(g_mine, de2):
        torch.testing.assert_close(a, b.grad, atol=1e-5, rtol=0)


def test_bottleneck_drops_only_in_training():
    torch.manual_seed(0)
    b = NoisyBottleneck(8, 32, 0.5)
    x = torch.randn(4, 3, 8)
    b.eval()
    torch.testing.assert_close(b(x), b.fc2(F.gelu(b.fc1(x))))
    b.train()
    assert not torch.allclose(b(x), b.fc2(F.gelu(b.fc1(x))))
