"""`model.grad_checkpointing: true`: the same gradients, far less activation memory kept for backward."""

import torch

import vit.models.encoder
from vit.bench.sides import Side, checkpointed_activation_bytes, saved_activation_bytes
from vit.config import load_config
from vit.models.build import build_model

SMALL = ["--model.img_size=32", "--model.in_chans=3", "--model.embed_dim=32", "--model.depth=3", "--model.num_heads=2",
         "--model.mlp_ratio=2"]


def test_config_key_checkpoints_every_block_with_the_same_gradients(monkeypatch):
    calls = []
    real = vit.models.encoder.checkpoint
    monkeypatch.setattr(vit.models.encoder, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    plain = build_model(load_config("configs/default.yaml", SMALL), num_classes=5).train()
    ckpt = build_model(load_config("configs/default.yaml", [*SMALL, "--model.grad_checkpointing=true"]),
                       num_classes=5).train()
    assert not plain.blocks.grad_checkpointing and ckpt.blocks.grad_checkpointing
    torch.nn.init.normal_(plain.head.weight, std=0.1)  # a zero-initialised head would pass no gradient down
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(4, 3, 32, 32)
    grads = []
    for model in (plain, ckpt):
        model(x).log_softmax(-1)[:, 0].sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert len(calls) == 3  # every block of the second model, none of the first
    for name, g in grads[0].items():
        assert g.abs().sum() > 0, name  # every parameter received a gradient: the comparison is not trivial
        torch.testing.assert_close(grads[1][name], g, atol=1e-6, rtol=0, msg=name)
    ckpt.eval()
    with torch.no_grad():  # inference never recomputes: no checkpoint call
        ckpt(x)
    assert len(calls) == 3


def test_activation_memory_kept_for_backward_drops_over_3x():
    # vit_tiny's 12 blocks at 64 px (16 patches + [CLS]); vit_base at 224 px, batch 8 is in the note
    model = vit.create_model("vit_tiny_patch16_224", img_size=64)
    side = Side("ours", model, torch.optim.SGD(model.parameters(), lr=0.0), "cpu", "fp32")
    x, y = torch.randn(2, 3, 64, 64), torch.tensor([0, 1])
    full = saved_activation_bytes(side, x, y)
    kept = checkpointed_activation_bytes(side, x, y)
    assert full / kept >= 3, (full, kept)
    # guard against a measure that misses what the checkpoints hold: every block's input (B, N, D) in float32
    assert kept >= 12 * 2 * 17 * 192 * 4
    assert not model.blocks.grad_checkpointing  # the benchmark leaves the model as it found it
