"""Token merging (ToMe) at a fixed r exports to ONNX: every token count is static; the exported merged model
equals PyTorch's merged model at batch 1 and 5, and quantizes to INT8."""

import numpy as np
import pytest
import torch

import vit
from vit.deploy.export import ExportableClassifier, export_model, load_exported, verify
from vit.deploy.quantize import OnnxModel, quantize


@pytest.mark.slow
def test_exported_merged_model_equals_pytorch_merged_model(tmp_path):
    import onnx

    torch.manual_seed(0)
    model = vit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=32, depth=3, num_heads=2,
                             num_classes=5).eval()
    with torch.no_grad():
        model.head.weight.mul_(30.0)  # peaked probabilities
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, 32, 32, generator=g)
    with torch.no_grad():
        plain = model(x)
        model.set_token_reduction("merge:12")  # 64 patches -> 52 -> 40; block 1 attends with log-size biases
        merged = model(x)
    assert (plain - merged).abs().max() > 1e-2  # merging changes the logits: the comparison below is not trivial
    assert merged.softmax(-1).max() > 0.5
    path = export_model(ExportableClassifier(model), "onnx", tmp_path, x)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert "TopK" in ops and "ScatterElements" in ops  # the matching and the merge are in the graph
    run = load_exported(path, "onnx")
    for b in (x[:1], x):
        with torch.no_grad():
            ref = model(b).softmax(-1)
        got = run(b).softmax(-1)
        assert (got - ref).abs().max() <= 1e-4 and torch.equal(got.argmax(-1), ref.argmax(-1))
    assert verify(model, run, [x[:1], x])["top1_disagreements"] == 0
    q = quantize(path, tmp_path / "int8.onnx", "dynamic")
    p8, p32 = OnnxModel(q)(x.numpy()), OnnxModel(path)(x.numpy())
    assert np.isfinite(p8).all() and (p8.argmax(-1) == p32.argmax(-1)).mean() >= 0.8
