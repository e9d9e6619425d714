"""The optimizer: parameter groups, weight decay and layer decay as timm's, the warmup + cosine schedule."""

import math

import pytest
import torch

import vit
from vit.config import OptimConfig
from vit.train.optim import build_optimizer, lr_at, param_groups


def test_no_decay_on_norms_biases_positions_and_cls():
    m = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=2, num_classes=3)
    groups = param_groups(m, weight_decay=0.05)
    no_decay = {n for g in groups if g["weight_decay"] == 0 for n in g["names"]}
    decay = {n for g in groups if g["weight_decay"] > 0 for n in g["names"]}
    expected_no = {n for n, p in m.named_parameters() if p.ndim <= 1 or n in ("pos_embed", "cls_token")}
    assert no_decay == expected_no
    assert decay == {n for n, _ in m.named_parameters()} - expected_no
    assert "blocks.0.attn.qkv.weight" in decay and "blocks.0.norm1.weight" in no_decay
    assert all(g["weight_decay"] == 0.05 for g in groups if g["weight_decay"] > 0)


def test_layer_decay_scales():
    m = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=3, num_classes=3)
    groups = param_groups(m, 0.05, layer_decay=0.5)
    scale = {n: g["lr_scale"] for g in groups for n in g["names"]}
    assert scale["head.weight"] == 1.0
    assert scale["blocks.2.mlp.fc1.weight"] == 0.5
    assert scale["blocks.0.mlp.fc1.weight"] == 0.5**3
    assert scale["patch_embed.proj.weight"] == scale["pos_embed"] == 0.5**4


def test_build_optimizer_uses_timms_groups_and_the_final_norm_goes_with_the_last_block():
    m = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=3, num_classes=3)
    opt = build_optimizer(m, OptimConfig(weight_decay=0.05, layer_decay=0.5))
    names = {id(p): n for n, p in m.named_parameters()}
    got = sorted((g["weight_decay"], g["lr_scale"], sorted(names[id(p)] for p in g["params"]))
                 for g in opt.param_groups)
    want = sorted((g["weight_decay"], g["lr_scale"], sorted(g["names"])) for g in param_groups(m, 0.05, 0.5))
    assert got == want and len(got) == 10  # (decay, no decay) x (embeddings, 3 blocks, head)
    scale = {n: g["lr_scale"] for g in param_groups(m, 0.05, 0.5) for n in g["names"]}
    assert scale["norm.weight"] == scale["blocks.2.norm1.weight"] == 0.5  # timm's ViT grouping (BEiT: 1.0)


def test_schedule_warmup_then_cosine():
    lrs = [lr_at(s, 100, 10, 1.0, 0.0) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[55] == pytest.approx(0.5 * (1 + math.cos(math.pi * 45 / 90)))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_optimizer_steps_every_parameter():
    m = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=3)
    opt = build_optimizer(m, OptimConfig(lr=1e-2))
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    m(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    assert all(not torch.equal(before[n], p) for n, p in m.named_parameters())
