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
    import json

    settings = json.loads((tmp_path / "segmentation.json").read_text())
    for edit, words in (({"classes": ["bg", "a"]}, "names 2 classes, and segmenter.onnx scores 3"),
                        ({"img_size": 48, "window": 48}, "says img_size 48, and segmenter.onnx takes 32x32")):
        (tmp_path / "segmentation.json").write_text(json.dumps({**settings, **edit}))
        with pytest.raises(ValueError, match=words):
            OnnxSegmenter(tmp_path)
    (tmp_path / "segmentation.json").write_text("{truncated")
    with pytest.raises(ValueError, match=r"segmentation.json is not readable JSON .*export the segmenter again"):
        OnnxSegmenter(tmp_path)
    (tmp_path / "segmentation.json").unlink()
    with pytest.raises(ValueError, match=r"has no segmentation.json beside segmenter.onnx"):
        OnnxSegmenter(tmp_path)



GOOD = {"img_size": 32, "mean": [0.5] * 3, "std": [0.25] * 3, "classes": ["bg", "a", "b"], "window": 32}


@pytest.mark.parametrize("edit, words", [
    ([1, 2], "expected a JSON object, got list"),
    ({"classes": None}, "classes must be a list of distinct, non-empty names"),
    ({"classes": "bg,a"}, "classes must be a list"),
    ({"classes": ["bg", "bg"]}, "distinct"),
    ({"img_size": 0}, "img_size must be a positive integer"),
    ({"img_size": "32"}, "img_size must be a positive integer"),
    ({"window": 8}, "window must be the input size 32"),
    ({"std": [0, 0, 0]}, "std must be positive"),
    ({"mean": [0.5]}, "mean must be a list of 3 finite numbers"),
    ({"std": [float("nan")] * 3}, "std must be a list of 3 finite numbers"),
    ("drop:window", "the key 'window' is missing"),
])
def test_a_bad_segmentation_json_is_named(edit, words):
    """The torch-free predictor reads segmentation.json through settings_problem (vit/deploy/onnx_segment.py):
    each bad value is one phrase, never a KeyError, a padded image or a CSV column per letter."""
    from vit.deploy.onnx_segment import settings_problem

    assert settings_problem(GOOD) is None
    if isinstance(edit, str):
        bad = {k: v for k, v in GOOD.items() if k != edit.split(":")[1]}
    else:
        bad = edit if isinstance(edit, list) else {**GOOD, **edit}
    assert words in settings_problem(bad)
