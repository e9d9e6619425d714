"""DINO, iBOT and KoLeo losses, Sinkhorn-Knopp, the DINO head and the schedules against lightly's implementations."""

from __future__ import annotations

import math

import pytest
import torch

from vit.layers.dino_head import DINOHead
from vit.train.ssl_losses import (
    DINOLoss,
    IBOTPatchLoss,
    dino_targets,
    feature_spread,
    koleo_loss,
    sinkhorn_knopp,
    teacher_momentum,
    teacher_temperature,
)

lightly_loss = pytest.importorskip("lightly.loss")
K, B = 32, 8


def _views(n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, K, generator=g, dtype=torch.float64) * 3 for _ in range(n)]


def test_dino_loss_and_centre_match_lightly_over_batches():
    ours = DINOLoss(K, student_temp=0.1, centre_momentum=0.9, centering="centre")
    ref = lightly_loss.DINOLoss(output_dim=K, student_temp=0.1, center_momentum=0.9)
    for step in range(3):  # the centre moves: the second and third batches use a non-zero one
        teacher, student = _views(2, step), _views(2, 10 + step) + _views(4, 20 + step)
        got = ours(teacher, student, teacher_temp=0.04 + 0.01 * step)
        want = ref(teacher, student, teacher_temp=0.04 + 0.01 * step)
        assert abs(got.item() - want.item()) < 1e-6
        assert torch.allclose(ours.centre.double(), ref.center.view(1, K).double(), atol=1e-6)
    assert ours.centre.abs().max() > 0.01  # not trivially equal


def test_sinkhorn_matches_lightly_swav_sinkhorn():
    logits = _views(1, 3)[0]
    got = sinkhorn_knopp(logits, temperature=0.5, iterations=3)
    want = lightly_loss.swav_loss.sinkhorn(logits, iterations=3, epsilon=0.5)
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(got.sum(dim=1), torch.ones(B, dtype=torch.float64), atol=1e-5)  # one distribution per image
    assert torch.allclose(dino_targets(logits, None, 0.5, "sinkhorn"), want, atol=1e-6)


def test_ibot_patch_loss_matches_lightly():
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(B, 4, 4, generator=g) < 0.4
    mask[0] = False  # an image with nothing masked weighs nothing
    m = int(mask.sum())
    ours = IBOTPatchLoss(K, student_temp=0.1, centre_momentum=0.9, centering="centre")
    ref = lightly_loss.IBOTPatchLoss(output_dim=K, student_temp=0.1, center_momentum=0.9)
    for _ in range(2):  # the second batch uses a moved centre
        t, s = (torch.randn(m, K, generator=g, dtype=torch.float64) * 2 for _ in range(2))
        got = ours(t, s, mask.flatten(1), teacher_temp=0.07)
        want = ref(t, s, mask, teacher_temp=0.07)
        assert abs(got.item() - want.item()) < 1e-6
        assert torch.allclose(ours.centre.double(), ref.center.value.view(1, K).double(), atol=1e-6)


def test_koleo_matches_lightly_and_its_gradient():
    x = torch.randn(16, 24, generator=torch.Generator().manual_seed(2), dtype=torch.float64, requires_grad=True)
    got, want = koleo_loss(x), lightly_loss.KoLeoLoss()(x)
    assert abs(got.item() - want.item()) < 1e-6
    (ga,) = torch.autograd.grad(got, x)
    (gb,) = torch.autograd.grad(lightly_loss.KoLeoLoss()(x), x)
    assert torch.allclose(ga, gb, atol=1e-6)


def test_dino_head_matches_lightly_with_the_same_weights():
    from lightly.models.modules.heads import DINOProjectionHead

    torch.manual_seed(0)
    ref = DINOProjectionHead(input_dim=16, hidden_dim=32, bottleneck_dim=8, output_dim=K)
    ours = DINOHead(16, K, hidden_dim=32, bottleneck_dim=8, nlayers=3)
    sd = {k.replace("layers.", "mlp."): v for k, v in ref.state_dict().items() if not k.startswith("last_layer")}
    sd["last_layer.weight_v"] = ref.last_layer.weight_v.detach().clone()
    ours.load_state_dict(sd, strict=True)
    x = torch.randn(5, 16)
    assert torch.allclose(ours(x), ref(x), atol=1e-6)
    assert not torch.allclose(ours(x), torch.zeros(5, K))


def test_schedules_are_dinos():
    ref = lightly_loss.DINOLoss(output_dim=K, warmup_teacher_temp=0.04, teacher_temp=0.07,
                                warmup_teacher_temp_epochs=10)
    for step in range(14):  # lightly's per-epoch schedule, read per step
        want = ref.teacher_temp_schedule[step].item() if step < 10 else 0.07
        assert abs(teacher_temperature(step, 10, 0.04, 0.07) - want) < 1e-7
    assert teacher_momentum(0, 100, 0.996) == pytest.approx(0.996)
    assert teacher_momentum(100, 100, 0.996) == pytest.approx(1.0)
    assert teacher_momentum(30, 100, 0.996) == pytest.approx(1 - 0.004 * (math.cos(math.pi * 0.3) + 1) / 2)


def test_feature_spread_is_zero_when_outputs_are_constant():
    assert feature_spread(torch.ones(6, 4) * 3) == 0.0
    assert feature_spread(torch.randn(64, 4)) > 0.1
