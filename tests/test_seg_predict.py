"""predict.py's segmentation files: the mask PNG is the model's argmax (sliding windows on a wide strip, a resize on
a small image), the overlay tints only predicted defects, the CSV's areas count the mask's pixels."""

from __future__ import annotations

import csv
import types

import numpy as np
import torch
import torch.nn.functional as F
from helpers import pixel_model
from PIL import Image

from vit.data.mask_colours import class_palette
from vit.deploy.seg_predict import predict_seg_images


def _cfg(size=16):
    return types.SimpleNamespace(aug=types.SimpleNamespace(mean=[0.5] * 3, std=[0.25] * 3),
                                 model=types.SimpleNamespace(img_size=size), seg=types.SimpleNamespace(window=None))


def _want(model, image, size=None):
    x = (torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255 - 0.5) / 0.25
    with torch.no_grad():
        if size is None:
            return model(x).argmax(1)[0].numpy()
        small = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        return F.interpolate(model(small), size=image.shape[:2], mode="bilinear", align_corners=False).argmax(1)[0]


def test_masks_overlays_and_areas(tmp_path):
    rng = np.random.default_rng(0)
    strip = rng.integers(0, 255, (16, 50, 3), dtype=np.uint8)  # wider than the 16-pixel input: sliding windows
    small = rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)  # smaller: resized to 16 and back
    for name, img in (("strip", strip), ("small", small)):
        Image.fromarray(img).save(tmp_path / f"{name}.png")
    (tmp_path / "broken.png").write_bytes(b"not a png")
    model, classes = pixel_model(3), ["background", "scratch", "dent"]
    paths = [tmp_path / "strip.png", tmp_path / "broken.png", tmp_path / "small.png"]
    rows, skipped = predict_seg_images(model, _cfg(), classes, paths, tmp_path / "out")
    assert [s[0] for s in skipped] == [str(tmp_path / "broken.png")]
    assert all(s == (16, 16) for s in model.sizes)  # every forward pass at the model's input size
    wants = [_want(pixel_model(3), strip), _want(pixel_model(3), small, 16).numpy()]
    with open(tmp_path / "out" / "segmentation.csv") as f:
        table = list(csv.DictReader(f))
    for row, want, img, index in zip(table, wants, (strip, small), ("0000_strip", "0002_small")):
        mask = np.array(Image.open(tmp_path / "out" / "masks" / f"{index}.png"))
        np.testing.assert_array_equal(mask, want)
        assert len(np.unique(want)) > 1  # not a trivial all-one-class mask
        for c, name in enumerate(classes[1:], start=1):
            assert int(row[f"area_px_{name}"]) == (want == c).sum()
        overlay = np.array(Image.open(tmp_path / "out" / "overlays" / f"{index}.png")).astype(int)
        np.testing.assert_array_equal(overlay[want == 0], img[want == 0])  # background untouched
        tint = 0.5 * img[want == 1] + 0.5 * class_palette(3)[1]
        assert np.abs(overlay[want == 1] - tint).max() <= 1


def test_the_onnx_segmenter_path_imports_no_torch():
    """predict.py --onnx on a segmenter (vit.cli.predict_outputs, vit.deploy.onnx_segment and seg_outputs) runs
    where only numpy, Pillow, OpenCV and onnxruntime are installed."""
    import subprocess
    import sys

    code = ("import sys; import vit.cli.predict_outputs, vit.deploy.onnx_segment, vit.deploy.seg_outputs; "
            "print(sorted(m for m in ('torch', 'timm', 'accelerate', 'yaml') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)


def test_evaluate_scores_the_files_as_predict_writes_them(tmp_path):
    """evaluate.py's confusion over a folder whose images are not the input size (a wide strip, a large and a small
    square) is scikit-learn's over predict.py's mask PNGs against the mask files, pixel for pixel at the files'
    size; --split names any folder the data has (test/), and a missing one is one sentence."""
    import pytest
    from sklearn.metrics import confusion_matrix

    from vit.config import load_config
    from vit.data import DataError
    from vit.eval.segmentation import evaluate_segmentation

    rng = np.random.default_rng(3)
    root = tmp_path / "data"
    (root / "test" / "images").mkdir(parents=True)
    (root / "test" / "masks").mkdir()
    for name, shape in (("strip", (16, 50)), ("large", (40, 40)), ("small", (12, 10))):
        image = rng.integers(0, 255, (*shape, 3), dtype=np.uint8)
        Image.fromarray(image).save(root / "test" / "images" / f"{name}.png")
        mask = rng.integers(0, 3, shape).astype(np.uint8)
        mask[0] = 255  # the ignore index: not scored
        Image.fromarray(mask).save(root / "test" / "masks" / f"{name}.png")
    cfg = load_config("configs/default.yaml", ["--data.dataset=segmentation", f"--data.root={root}",
                                               "--model.img_size=16", "--aug.mean=[0.5,0.5,0.5]",
                                               "--aug.std=[0.25,0.25,0.25]"])
    classes = ["background", "scratch", "dent"]
    m = evaluate_segmentation(pixel_model(3), cfg, classes, "test", tmp_path / "eval")
    paths = sorted((root / "test" / "images").iterdir())
    predict_seg_images(pixel_model(3), _cfg(), classes, paths, tmp_path / "pred")
    truth, pred = [], []
    for i, p in enumerate(paths):
        truth.append(np.array(Image.open(root / "test" / "masks" / p.name)).ravel())
        pred.append(np.array(Image.open(tmp_path / "pred" / "masks" / f"{i:04d}_{p.stem}.png")).ravel())
    truth, pred = np.concatenate(truth), np.concatenate(pred)
    keep = truth != 255
    want = confusion_matrix(truth[keep], pred[keep], labels=[0, 1, 2])
    np.testing.assert_array_equal(np.array(m["confusion"]), want)
    # and against the inference written out here (_want: the whole image for the 1x1 model, whose windows are
    # the whole image's; the small one resized to 16 and back), independent of segment_image
    own = []
    for p in paths:
        image = np.array(Image.open(p))
        own.append(np.asarray(_want(pixel_model(3), image, 16 if max(image.shape[:2]) <= 16 else None)).ravel())
    own = np.concatenate(own)
    np.testing.assert_array_equal(np.array(m["confusion"]), confusion_matrix(truth[keep], own[keep], labels=[0, 1, 2]))
    assert m["pixels"] == keep.sum() == 15 * 50 + 39 * 40 + 11 * 10 and m["images"] == 3  # the first rows ignored
    (root / "test" / "images" / "zbroken.png").write_bytes(b"not a png")  # unreadable: skipped (the default)
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(root / "test" / "masks" / "zbroken.png")
    again = evaluate_segmentation(pixel_model(3), cfg, classes, "test")
    assert again["confusion"] == m["confusion"] and again["images"] == 3 and "zbroken.png" in again["skipped"][0]
    cfg.data.on_bad_image = "error"
    with pytest.raises(DataError, match=r"zbroken\.png.*; remove it or set --data\.on_bad_image=skip"):
        evaluate_segmentation(pixel_model(3), cfg, classes, "test")
    with pytest.raises(DataError, match=r"the holdout split is missing: .* has neither holdout/ .* nor holdout.csv"):
        evaluate_segmentation(pixel_model(3), cfg, classes, "holdout")
    with pytest.raises(DataError, match=r"--data-dir: .*elsewhere does not exist"):
        evaluate_segmentation(pixel_model(3), cfg, classes, folder=str(tmp_path / "elsewhere"))


def test_trainings_val_scores_the_files_as_evaluate_does(tmp_path):
    """train.py's val loader reads images and masks at the files' sizes (a strip wider than the input, a smaller
    and an input-size image) and its evaluation gives evaluate.py's confusion, pixel for pixel."""
    import contextlib
    from types import SimpleNamespace

    from torch.utils.data import DataLoader

    from vit.config import load_config
    from vit.data import build_datasets
    from vit.eval.segmentation import evaluate_segmentation
    from vit.train.tasks.segmentation import SegmentationTask

    rng = np.random.default_rng(4)
    root = tmp_path / "data"
    for split in ("train", "val"):
        (root / split / "images").mkdir(parents=True)
        (root / split / "masks").mkdir()
        for name, shape in (("strip", (16, 50)), ("small", (12, 10)), ("input", (16, 16))):
            image, mask = rng.integers(0, 255, (*shape, 3), dtype=np.uint8), rng.integers(0, 3, shape).astype(np.uint8)
            Image.fromarray(image).save(root / split / "images" / f"{name}.png")
            Image.fromarray(mask).save(root / split / "masks" / f"{name}.png")
    cfg = load_config("configs/default.yaml", ["--data.dataset=segmentation", f"--data.root={root}",
                                               "--model.img_size=16", "--aug.mean=[0.5,0.5,0.5]",
                                               "--aug.std=[0.25,0.25,0.25]", "--seg.classes=[bg, a, b]"])
    _, val, classes = build_datasets(cfg)
    acc = SimpleNamespace(autocast=contextlib.nullcontext, device=torch.device("cpu"), num_processes=1)
    for batch_size in (1, 3):
        loader = DataLoader(val, batch_size=batch_size, collate_fn=val.collate)
        run = SimpleNamespace(accelerator=acc, val_loader=loader)
        got = SegmentationTask(cfg, classes, "ce").evaluate(run, pixel_model(3)).outputs["confusion"]
        want = evaluate_segmentation(pixel_model(3), cfg, classes, "val")["confusion"]
        np.testing.assert_array_equal(got.numpy(), np.array(want))
    assert got.sum() == 16 * 50 + 12 * 10 + 16 * 16
