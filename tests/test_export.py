"""export.py and vit.deploy.export: every format reloaded and compared with PyTorch and timm."""

# export.py and vit.deploy.export: each format reloaded and compared with PyTorch (and timm) at batch sizes 1 and 5,
# at a second image size for a dynamic_img_size model; a mismatch and a missing extra are one sentence.

import importlib.util
import json
import sys

import pytest
import torch
from helpers import ROOT

import vit
from vit.config import load_config
from vit.deploy.export import (
    FORMATS,
    ExportableClassifier,
    ExportError,
    export_model,
    load_exported,
    require_onnx,
    verify,
)
from vit.models.build import build_model
from vit.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def _peaked(model):
    """Scale the head so that softmax probabilities are far from uniform: a 1e-4 check on near-uniform
    probabilities of a freshly initialized model would hardly test anything."""
    with torch.no_grad():
        model.head.weight.mul_(200.0)
    return model


@pytest.mark.slow
def test_export_script_default_digits_checkpoint_every_format(tmp_path, capsys):
    # digits, 64 px, 4 blocks of width 128; grey, as train.py resolves the channels of the digits
    cfg = load_config(ROOT / "configs/default.yaml", ["--model.in_chans=1"])
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "ck", _peaked(build_model(cfg, 10)), cfg, [str(i) for i in range(10)])
    out = tmp_path / "exp"
    # in this process (the exporters' imports and warm-up are then shared with the tests below)
    assert _load_script("export.py").main(["--checkpoint", str(tmp_path / "ck"), "--format", "all", "--out",
                                            str(out)]) == 0
    stdout = capsys.readouterr().out
    assert stdout.count(": ok") == len(FORMATS) and "digits validation split" in stdout
    pre = json.loads((out / "preprocessing.json").read_text())
    assert pre["input_size"] == [1, 64, 64] and pre["interpolation"] == "bicubic" and pre["crop_pct"] == 1.0
    assert pre["mean"] == [0.5] and pre["label_names"] == [str(i) for i in range(10)]
    ver = json.loads((out / "verification.json").read_text())["results"]
    assert set(ver) == set(FORMATS) and all(v["input_shapes"] == [[1, 1, 64, 64], [5, 1, 64, 64]] for v in ver.values())
    import onnx

    ops = {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
    assert "Attention" in ops and "Softmax" not in ops  # SDPA exported as opset 23's one Attention node
    # independently of the script's own check: reload each file here and compare with the checkpoint's model
    model = load_checkpoint(tmp_path / "ck")[0]
    g = torch.Generator().manual_seed(1)
    for n in (1, 5):
        x = torch.randn(n, 1, 64, 64, generator=g)
        with torch.no_grad():
            ref = model(x).softmax(-1)
        assert ref.max() > 0.5  # peaked, so the comparison below means something
        for fmt, name in FORMATS.items():
            got = load_exported(out / name, fmt)(x).softmax(-1)
            assert (got - ref).abs().max() <= 1e-4, fmt
            assert torch.equal(got.argmax(-1), ref.argmax(-1)), fmt


@pytest.mark.slow
@pytest.mark.parametrize("pos_embed", ["learn", "sincos"])
def test_dynamic_img_size_model_every_format_against_timm(tmp_path, pos_embed):
    import timm

    kw = dict(img_size=32, embed_dim=32, depth=2, num_heads=2, num_classes=7, dynamic_img_size=True)
    torch.manual_seed(0)
    model = _peaked(vit.create_model("vit_tiny_patch16_224", pos_embed=pos_embed, **kw)).eval()
    if pos_embed == "learn":
        with torch.no_grad():
            model.pos_embed.normal_()  # a position table far from zero, so resampling it matters
    oracle = None
    if pos_embed == "learn":  # timm's own model with the same weights: the oracle at every size
        oracle = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kw).eval()
        oracle.load_state_dict(model.state_dict())
    wrapper = ExportableClassifier(model)
    g = torch.Generator().manual_seed(2)
    batches = [torch.randn(n, 3, h, w, generator=g) for n in (1, 5) for h, w in ((32, 32), (48, 64))]
    # the fixed sine-cosine table takes another branch of the wrapper; one exporter suffices to cover it
    for fmt in FORMATS if pos_embed == "learn" else ("exported-program",):
        run = load_exported(export_model(wrapper, fmt, tmp_path / fmt, batches[1]), fmt)
        for x in batches:
            got = run(x).softmax(-1)
            with torch.no_grad():
                ref = (oracle or model)(x).softmax(-1)
            assert (got - ref).abs().max() <= 1e-4, (fmt, tuple(x.shape))
            assert torch.equal(got.argmax(-1), ref.argmax(-1)), (fmt, tuple(x.shape))
        check = verify(model, run, batches)
        assert check["images"] == 12 and check["top1_disagreements"] == 0


def test_verify_rejects_an_export_that_differs():
    torch.manual_seed(0)
    model = _peaked(vit.create_model("vit_tiny_patch16_224", img_size=16, embed_dim=16, depth=1, num_heads=2,
                                     num_classes=3)).eval()
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        logits = model(x)
    assert verify(model, lambda t: logits.clone(), [x])["max_abs_prob_diff"] == 0.0
    shifted = logits.clone()
    shifted[:, 0] += 1e-2  # a small drift: probabilities move by ~1e-3, past the 1e-4 bound
    with pytest.raises(ExportError, match="differs from the PyTorch model"):
        verify(model, lambda t: shifted, [x])


def test_missing_export_extra_is_one_sentence(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    with pytest.raises(ExportError, match=r"onnxruntime, which is not installed; run pip install -e '\.\[export\]'"):
        require_onnx()
    script = _load_script("export.py")
    with pytest.raises(ExportError, match=r"pip install -e '\.\[export\]'"):  # before the checkpoint is read
        script.main(["--checkpoint", str(tmp_path / "nope"), "--format", "onnx"])
    monkeypatch.delitem(sys.modules, "onnxruntime")
    with pytest.raises(CheckpointError, match="does not exist"):
        script.main(["--checkpoint", str(tmp_path / "nope"), "--format", "torchscript"])


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name[:-3] + "_script", ROOT / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hybrid():
    torch.manual_seed(0)
    return _peaked(vit.create_model("vit_tiny_r_s16_p8_224", img_size=64, embed_dim=32, depth=2, num_heads=2,
                                    num_classes=5, dynamic_img_size=True)).eval()


def test_a_hybrid_model_refuses_a_dynamic_exported_program_in_one_sentence(tmp_path):
    """torch.export.save fails deep in its serializer on the stem's math.ceil padding: one sentence instead."""
    with pytest.raises(ExportError, match=r"a resnetv2 stem's 'same' padding .* export onnx or torchscript"):
        export_model(ExportableClassifier(_hybrid()), "exported-program", tmp_path, torch.randn(2, 3, 64, 64))
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_hybrid_model_exports_at_its_token_step(tmp_path, fmt):
    """A hybrid's token covers its stem's stride times the patch size (here 4 x 8 = 32 pixels): the dynamic sides
    were declared as multiples of the patch size (8) alone, which the stem's grid does not follow."""
    model = _hybrid()
    assert model.patch_embed.token_step == (32, 32)
    g = torch.Generator().manual_seed(3)
    batches = [torch.randn(n, 3, h, w, generator=g) for n in (1, 3) for h, w in ((64, 64), (96, 128))]
    run = load_exported(export_model(ExportableClassifier(model), fmt, tmp_path, batches[1]), fmt)
    for x in batches:
        with torch.no_grad():
            ref = model(x).softmax(-1)
        got = run(x).softmax(-1)
        assert (got - ref).abs().max() <= 1e-4 and torch.equal(got.argmax(-1), ref.argmax(-1)), tuple(x.shape)
