"""The segmentation model in ONNX: ONNX Runtime's logits within 1e-4 of PyTorch's, and the torch-free predictor's
masks equal to PyTorch's on an image of the input size and on a wide strip read in sliding windows."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from vit.deploy.seg_predict import segment_image
from vit.models import create_model
from vit.models.segmenter import create_segmenter

pytest.importorskip("onnxruntime")


@pytest.mark.slow
def test_onnx_segmenter_gives_pytorch_masks(tmp_path):
    from vit.deploy.onnx_segment import OnnxSegmenter, export_segmenter

    torch.manual_seed(0)
    backbone = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=4, num_classes=0)
    model = create_segmenter(backbone, 3, "dpt", sizes=(8, 16, 24, 32), width=8, dropout=0.0).eval()
    with torch.no_grad():  # a head whose classes vary over the image, its logits of order 1
        for p in model.head.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    cfg = types.SimpleNamespace(model=types.SimpleNamespace(img_size=32), seg=types.SimpleNamespace(window=None),
                                aug=types.SimpleNamespace(mean=[0.5] * 3, std=[0.25] * 3))
    check = export_segmenter(model, tmp_path, cfg, ["bg", "a", "b"], [torch.randn(2, 3, 32, 32)])
    assert check["max_abs_logit_diff"] <= 1e-4 and check["pixels_differing"] == 0
    onnx = OnnxSegmenter(tmp_path)
    rng = np.random.default_rng(0)
    for shape in ((32, 32, 3), (32, 80, 3)):  # the input size; a wide strip (sliding windows)
        image = rng.integers(0, 255, shape, dtype=np.uint8)
        want = segment_image(model, image, 32, [0.5] * 3, [0.25] * 3).numpy()
        assert len(np.unique(want)) > 1
        np.testing.assert_array_equal(onnx.segment(image), want)

