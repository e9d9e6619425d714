"""Training part of a model: model.freeze (the head alone) and LoRA through peft, merged on save (vit/train/lora.py)."""

from __future__ import annotations

import pytest
import torch

from vit import create_model
from vit.config import ConfigError, load_config
from vit.models.build import build_model
from vit.train.lora import add_lora, merged_state_dict, trainable_share
from vit.train.optim import build_optimizer

pytest.importorskip("peft")

SMALL = ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=2",
         "--model.num_heads=2", "--model.mlp_ratio=2"]


def _step(model, optimizer):
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def test_freeze_trains_the_head_only():
    cfg = load_config(None, [*SMALL, "--model.freeze=true"])
    model = build_model(cfg, 3)
    optimizer = build_optimizer(model, cfg.optim)
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.head.parameters()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _step(model, optimizer)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"head.weight", "head.bias"}


def test_freeze_and_lora_together_are_refused():
    with pytest.raises(ConfigError, match="both choose what trains"):
        load_config(None, ["--model.freeze=true", "--optim.lora_rank=4"])


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_merged_equals_unmerged(pool):
    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=5, global_pool=pool)
    plain_keys = set(model.state_dict())
    add_lora(model, rank=4, alpha=8)
    for name, p in model.named_parameters():  # B starts at 0 (no change): give the update something to merge
        if ".lora_B." in name:
            p.data.normal_(0, 0.2)
    model.eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        unmerged = model(x)
    merged = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=5, global_pool=pool)
    state = merged_state_dict(model)
    assert set(state) == plain_keys  # no adapter tensor, timm's names
    merged.load_state_dict(state, strict=True)
    with torch.no_grad():
        out = merged.eval()(x)
        base = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=5,
                            global_pool=pool).eval()
        base.load_state_dict({k: v for k, v in state.items() if "blocks" not in k}, strict=False)
    torch.testing.assert_close(out, unmerged, atol=1e-5, rtol=1e-5)
    assert (out - merged.__class__.forward(base, x)).abs().max() > 1e-2  # the adapters changed the outputs


def test_lora_trains_adapters_and_head_only():
    torch.manual_seed(0)
    cfg = load_config(None, SMALL)
    model = add_lora(build_model(cfg, 3), rank=2)
    optimizer = build_optimizer(model, cfg.optim)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.named_parameters() if ".lora_" in n or n.startswith("head.")}
    assert len([n for n in trainable if ".lora_A." in n]) == 2 * 4  # qkv, proj, fc1, fc2 in each of 2 blocks
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(trainable)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _step(model, optimizer)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == trainable  # A too: AdamW's decoupled weight decay, though its gradient is 0 while B = 0
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g.abs().sum() > 0 for n, g in grads.items() if ".lora_A." not in n)


def test_trainable_share_of_a_small_vit_is_under_five_percent():
    model = add_lora(create_model("vit_small_patch16_224", num_classes=10), rank=8)
    trained, total = trainable_share(model)
    # 12 blocks x 8 x (384 + 1152 + 384 + 384 + 384 + 1536 + 1536 + 384) adapters, and the head
    assert trained == 12 * 8 * (384 + 1152 + 384 + 384 + 384 + 1536 + 1536 + 384) + 384 * 10 + 10
    assert trained / total <= 0.05


@pytest.mark.slow
def test_a_lora_run_saves_a_plain_model(tmp_path):
    from helpers import TINY, make_image_folder, run_script

    from vit.models.checkpoint import load_checkpoint

    data = make_image_folder(tmp_path / "d", classes=("a", "b"), n_train=4, n_val=2, size=32)
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={data}", f"--run.output_dir={tmp_path}",
                   "--run.name=l", "--run.epochs=1", "--optim.lora_rank=2", *TINY)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "training " in r.stdout and "parameters (" in r.stdout
    model, *_ = load_checkpoint(tmp_path / "l" / "best")  # strict: timm's names, no adapter
    assert not any("lora" in k or "base_layer" in k for k in model.state_dict())



@pytest.mark.slow
def test_a_lora_checkpoint_exports_a_plain_onnx_and_int8(tmp_path):
    """A LoRA model saved as train.py saves it (merged) and exported by export.py to ONNX and INT8: no adapter in
    either file, as many weights as the plain model, and the ONNX logits are the unmerged PyTorch model's."""
    import numpy as np
    import onnx
    from helpers import import_script, make_image_folder

    from vit.deploy.quantize import OnnxModel
    from vit.models.checkpoint import save_checkpoint

    data = make_image_folder(tmp_path / "d", classes=("a", "b", "c"), n_train=2, n_val=2, size=32)
    cfg = load_config(None, [*SMALL, "--data.dataset=imagefolder", f"--data.root={data}", "--optim.lora_rank=4",
                             "--optim.lora_alpha=8"])
    torch.manual_seed(0)
    model = build_model(cfg, 3)
    plain = sum(p.numel() for p in model.parameters())
    with torch.no_grad():  # distinct values everywhere: the exporter shares equal constants (ones, zeros) otherwise
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        model.head.weight.mul_(20.0)  # peaked probabilities, so that agreeing on them means something
        base = model.eval()(torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(1))).numpy()
    add_lora(model, 4, 8)
    with torch.no_grad():
        for name, p in model.named_parameters():  # B starts at 0 (no change): give the update something to merge
            if ".lora_B." in name:
                p.normal_(0, 0.2)
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        unmerged = model.eval()(x)
    save_checkpoint(tmp_path / "ck", model, cfg, ["a", "b", "c"], state_dict=merged_state_dict(model))  # as engine
    out = tmp_path / "exp"
    assert import_script("export").main(["--checkpoint", str(tmp_path / "ck"), "--quantize", "int8", "--int8-method",
                                         "dynamic", "--max-drop", "100", "--out", str(out)]) == 0
    for name in ("model.onnx", "model.int8.onnx"):
        graph = onnx.load(str(out / name)).graph
        names = {t.name for t in graph.initializer} | {v for n in graph.node for v in (n.name, *n.input, *n.output)}
        assert not [v for v in names if "lora" in v.lower() or "base_layer" in v], name
        # weights: every initializer but INT8's scalar scales and zero points and the graph's int64 shape constants
        weights = sum(int(np.prod(t.dims)) for t in graph.initializer if t.data_type != onnx.TensorProto.INT64
                      and not t.name.endswith(("_scale", "_zero_point")))
        assert weights == plain, name
    got = OnnxModel(out / "model.onnx")(x.numpy())
    np.testing.assert_allclose(got, unmerged.numpy(), atol=1e-4, rtol=0)
    assert np.abs(got - base).max() > 1e-2  # the adapters changed the logits: the merge is in the file


@pytest.mark.parametrize("extra,match", [
    (["--optim.lora_alpha=8"], r"'optim\.lora_alpha' is read only with optim\.lora_rank, which is 0"),
    (["--optim.lora_rank=4", "--optim.lora_alpha=0"], r"scales the LoRA update by 0, which must be above 0 \(0 "
                                                      r"trains the head alone\)"),
    (["--optim.lora_rank=4", "--optim.lora_alpha=-4"], r"scales the LoRA update by -1, which must be above 0"),
    (["--optim.lora_rank=4", "--optim.lora_alpha=1e30"], r"scales the LoRA update by 2\.5e\+29.*at most 100"),
    (["--optim.lora_rank=4", "--data.dataset=text_csv", "--data.root=t.csv", "--model.pretrained=hf-hub:a/b"],
     r"'optim\.lora_rank' adapts the image ViT's projections; a text run .* remove optim\.lora_rank"),
])
def test_lora_settings_that_would_train_something_else_are_refused(extra, match):
    """Each of these loaded and trained: alpha 0 the head alone, alpha 1e30 to NaN, a text run with no adapters,
    lora_alpha without a rank nothing at all, with no word."""
    with pytest.raises(ConfigError, match=match):
        load_config(None, extra)
    assert load_config(None, ["--optim.lora_rank=4", "--optim.lora_alpha=400"]).optim.lora_alpha == 400
