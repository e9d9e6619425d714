"""A segmentation run through train.py (data.dataset: segmentation, seg.*): the checkpoint is backbone + head and
reloads to the same logits; the seg: section's refusals; the task's losses against formulas."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import TINY, run_script
from PIL import Image

from vit.config import ConfigError, load_config, validate
from vit.config.seg_checks import validate_seg
from vit.train.tasks.segmentation import dice_loss, seg_loss


def _parts(root, n_train=6, n_val=3, size=32):
    """train/ and val/ with images/ + masks/: a bright square (class 1) or a dark disc (class 2) on noise; a third
    of the training images are good parts with no mask file."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:size, :size]
    for split, n in (("train", n_train), ("val", n_val)):
        (root / split / "images").mkdir(parents=True)
        (root / split / "masks").mkdir()
        for i in range(n):
            img = rng.normal(120, 10, (size, size, 3))
            mask = np.zeros((size, size), np.uint8)
            cy, cx = rng.integers(8, size - 8, 2)
            if i % 3 == 1:
                mask[cy - 5:cy + 5, cx - 5:cx + 5] = 1
            elif i % 3 == 2:
                mask[(yy - cy) ** 2 + (xx - cx) ** 2 <= 25] = 2
            img[mask == 1], img[mask == 2] = 230, 20
            Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(root / split / "images" / f"{i}.png")
            if i % 3 or split == "val":
                Image.fromarray(mask).save(root / split / "masks" / f"{i}.png")
    return root


@pytest.mark.slow
def test_train_py_segmentation_run_saves_backbone_and_head(tmp_path):
    data = _parts(tmp_path / "data")
    out = tmp_path / "runs"
    r = run_script("train.py", *TINY, "--data.dataset=segmentation", f"--data.root={data}", f"--run.output_dir={out}",
                   "--run.name=seg", "--run.epochs=1", "--model.patch_size=8", "--model.depth=4",
                   "--seg.head=dpt", "--seg.dpt_width=8", "--seg.missing_masks=background", "--seg.loss=ce+dice",
                   "--seg.classes=[background, square, disc]", "--optim.class_weights=auto")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "val mIoU" in r.stdout and "best val mIoU" in r.stdout  # never "top-1" for a segmenter's score
    from vit.data.segmentation import build_seg_datasets
    from vit.models.checkpoint import load_checkpoint
    from vit.models.segmenter import Segmenter

    model, cfg, classes, meta = load_checkpoint(out / "seg" / "best")
    assert isinstance(model, Segmenter) and classes == ["background", "square", "disc"]
    assert 0 <= meta["val_acc1"] <= 1 and len(meta["iou"]) == 3
    names = set(json.loads((out / "seg" / "best" / "classes.json").read_text()))
    assert names == set(classes)
    _, val, _ = build_seg_datasets(cfg, ("val",), classes)
    x = torch.stack([val[i][0] for i in range(len(val))])
    with torch.no_grad():
        assert model(x).shape == (3, 3, 32, 32)
    # evaluate.py on the checkpoint: the same held-out pixels, the same mIoU as training's evaluation
    r = run_script("evaluate.py", "--checkpoint", str(out / "seg" / "best"), "--out", str(tmp_path / "eval"))
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["miou"] == pytest.approx(meta["val_acc1"], abs=1e-9)
    assert "mIoU" in r.stdout and (tmp_path / "eval" / "per_class.csv").is_file()
    # predict.py: a mask, an overlay and a row of areas per image; export.py: the ONNX model, checked
    r = run_script("predict.py", "--checkpoint", str(out / "seg" / "best"), str(data / "val" / "images"),
                   "--out", str(tmp_path / "pred"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(list((tmp_path / "pred" / "masks").glob("*.png"))) == 3
    assert "area_pct_square" in (tmp_path / "pred" / "segmentation.csv").read_text()
    _demo_shows_predict_pys_masks(out / "seg" / "best", tmp_path / "pred")
    pytest.importorskip("onnxruntime")
    r = run_script("export.py", "--checkpoint", str(out / "seg" / "best"), "--format", "onnx", "--out",
                   str(tmp_path / "onnx"), "--quantize", "int8", "--int8-method", "dynamic", "--max-drop", "100")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "onnx" / "segmenter.onnx").is_file() and "0 pixel(s) of another class" in r.stdout
    int8 = json.loads((tmp_path / "onnx" / "segmentation.json").read_text())["int8"]
    assert "mIoU" in r.stdout and int8["method"] == "dynamic" and int8["images"] == 3
    assert int8["miou_fp32"] == pytest.approx(meta["val_acc1"], abs=1e-6)  # the same held-out pixels as training's
    # predict.py --onnx on the export: the same masks (every pixel), areas and skipped file, torch-free
    (tmp_path / "images").mkdir()
    for p in (data / "val" / "images").iterdir():
        (tmp_path / "images" / p.name).write_bytes(p.read_bytes())
    wide = np.random.default_rng(2).integers(0, 255, (32, 80, 3), dtype=np.uint8)  # read in sliding windows
    Image.fromarray(wide).save(tmp_path / "images" / "wide.png")
    (tmp_path / "images" / "broken.png").write_bytes(b"not a png")
    outs = {}
    for how, source in (("pt", ["--checkpoint", str(out / "seg" / "best")]),
                        ("ort", ["--onnx", str(tmp_path / "onnx" / "segmenter.onnx")]),
                        ("int8", ["--onnx", str(tmp_path / "onnx" / "segmenter.int8.onnx")])):
        r = run_script("predict.py", *source, str(tmp_path / "images"), "--out", str(tmp_path / how))
        assert r.returncode == 0, r.stderr[-2000:]
        outs[how] = r.stdout
    assert "4 image(s) segmented with ONNX Runtime, 1 skipped" in outs["ort"]
    assert len(list((tmp_path / "int8" / "masks").glob("*.png"))) == 4  # the INT8 file reads the same way
    tables = [(tmp_path / how / "segmentation.csv").read_text() for how in ("pt", "ort")]
    assert tables[0] == tables[1]
    masks = sorted(p.name for p in (tmp_path / "pt" / "masks").iterdir())
    assert len(masks) == 4 and masks == sorted(p.name for p in (tmp_path / "ort" / "masks").iterdir())
    for name in masks:
        np.testing.assert_array_equal(*(np.array(Image.open(tmp_path / how / "masks" / name)) for how in ("pt", "ort")))
    r = run_script("predict.py", "--onnx", str(tmp_path / "onnx"), str(tmp_path / "images"), "--out",
                   str(tmp_path / "x"), "--threshold", "0.5")
    assert r.returncode == 2 and "is a segmenter (a class per pixel)" in r.stderr


def test_seg_section_refusals():
    with pytest.raises(ConfigError, match="'seg.head' is read only with data.dataset segmentation"):
        validate(load_config("configs/default.yaml", ["--seg.head=dpt"]))
    seg = ["--data.dataset=segmentation", "--data.root=/nowhere"]
    with pytest.raises(ConfigError, match="'aug.mixup' mixes labels, not masks"):
        validate(load_config("configs/default.yaml", [*seg, "--aug.mixup=0.8"]))
    with pytest.raises(ConfigError, match="'seg.dpt_factors' must list four"):
        validate(load_config("configs/default.yaml", [*seg, "--seg.dpt_factors=[4, 2, 1, 0.3]"]))
    with pytest.raises(ConfigError, match="'seg.head' must be one of 'linear', 'dpt'"):
        validate(load_config("configs/default.yaml", [*seg, "--seg.head=upernet"]))
    with pytest.raises(ConfigError, match="'seg.classes' and 'seg.classes_file' both"):
        validate(load_config("configs/default.yaml", [*seg, "--seg.classes=[a, b]", "--seg.classes_file=c.txt"]))
    with pytest.raises(ConfigError, match="'seg.dpt_sizes' must list four positive widths"):
        validate_seg(load_config("configs/default.yaml", [*seg, "--seg.dpt_sizes=[8, 16]"]))
    with pytest.raises(ConfigError, match="'seg.window' slides square windows"):
        validate(load_config("configs/default.yaml", [*seg, "--seg.window=64", "--data.naflex={max_num_patches: 64}"]))
    with pytest.raises(ConfigError, match="'data.naflex.max_num_patches' is 3, which leaves"):
        validate(load_config("configs/default.yaml", [*seg, "--data.naflex={max_num_patches: 3}"]))
    validate(load_config("configs/default.yaml", [*seg, "--seg.head=dpt"]))  # a good one passes


def test_losses_against_formulas():
    torch.manual_seed(0)
    logits, target = torch.randn(2, 3, 5, 6, dtype=torch.float64), torch.randint(0, 3, (2, 5, 6))
    target[0, 0, :3] = 255
    w = torch.tensor([0.5, 1.0, 2.0])
    keep = target != 255
    logp = logits.log_softmax(1).permute(0, 2, 3, 1)[keep]  # (n, C)
    t = target[keep]
    want_ce = -(w[t] * logp[torch.arange(len(t)), t]).sum() / w[t].sum()
    assert seg_loss(logits, target, "ce", w).item() == pytest.approx(want_ce.item(), rel=1e-6)
    p = logits.softmax(1).permute(0, 2, 3, 1)[keep]
    onehot = F.one_hot(t, 3).double()
    dice = (2 * (p * onehot).sum(0) + 1) / (p.sum(0) + onehot.sum(0) + 1)
    assert dice_loss(logits, target).item() == pytest.approx(1 - dice.mean().item(), rel=1e-6)
    both = seg_loss(logits, target, "ce+dice", w).item()
    assert both == pytest.approx(want_ce.item() + 1 - dice.mean().item(), rel=1e-6)
    with pytest.raises(ValueError, match="unknown segmentation loss"):
        seg_loss(logits, target, "focal")


def _demo_shows_predict_pys_masks(checkpoint, pred):
    """demo.py's page for a segmentation checkpoint: each class's share and the tinted picture of an upload are
    predict.py's areas and overlay of the same file (the picture enlarged by whole pixels)."""
    import base64
    import csv
    import io

    from vit.cli.commands.demo import _is_segmentation
    from vit.explain.demo import make_server
    from vit.explain.seg_demo import SegDemo

    assert _is_segmentation(str(checkpoint))
    demo = SegDemo(checkpoint)
    rows = list(csv.DictReader((pred / "segmentation.csv").open()))
    for row in rows:
        answer = demo.predict(Path(row["path"]).read_bytes(), row["path"])
        shares = {t["label"]: 100 * t["prob"] for t in answer["top"]}
        assert shares == pytest.approx({c: float(row[f"area_pct_{c}"]) for c in ("square", "disc")}, abs=1e-3)
        picture = np.array(Image.open(io.BytesIO(base64.b64decode(answer["overlay"].split(",", 1)[1]))))
        k = picture.shape[1] // 32
        assert k >= 7 and answer["size"] == [32 * k, 32 * k]
        want = np.array(Image.open(pred / "overlays" / Path(row["mask"]).name))
        np.testing.assert_array_equal(picture[::k, ::k], want)
    server = make_server(demo, "127.0.0.1", 0)
    server.server_close()
    assert b"share of the image" in server.RequestHandlerClass.page and b"classes, tinted" in \
        server.RequestHandlerClass.page


def test_an_evaluation_with_no_scored_pixel_says_why_its_miou_is_nan():
    """Every held-out mask pixel is the ignore index: the line says so instead of a bare 'mIoU nan%'."""
    import contextlib
    from types import SimpleNamespace

    from vit.train.tasks.segmentation import SegmentationTask

    acc = SimpleNamespace(autocast=contextlib.nullcontext, device=torch.device("cpu"), num_processes=1)
    batches = [(torch.randn(2, 3, 8, 8), torch.full((2, 8, 8), 255))]
    run = SimpleNamespace(accelerator=acc, val_loader=batches)
    model = torch.nn.Conv2d(3, 3, 1)
    task = SegmentationTask(load_config("configs/default.yaml"), ["bg", "a", "b"], "ce")
    line = task.evaluate(run, model).line
    assert "no val pixel is scored" in line and "the ignore index" in line
    batches[0] = (batches[0][0], torch.zeros(2, 8, 8, dtype=torch.long))  # one scored class: no such words
    assert "no val pixel" not in task.evaluate(run, model).line


def test_int8_calibration_reads_training_images_as_evaluation_does(tmp_path, monkeypatch):
    """export.py --quantize calibrates a segmenter's activations on training images without augmentation (random
    crops, flips and jitter would calibrate ranges the exported model never sees)."""
    from types import SimpleNamespace

    import vit.deploy.onnx_segment as onnx_segment
    from vit.cli.commands import export
    from vit.data.segmentation import build_seg_datasets

    data = _parts(tmp_path / "data")
    cfg = load_config("configs/default.yaml", ["--data.dataset=segmentation", f"--data.root={data}",
                                               "--model.img_size=32", "--seg.missing_masks=background"])
    seen = {}
    monkeypatch.setattr(onnx_segment, "export_segmenter", lambda *a: {"max_abs_logit_diff": 0.0,
                                                                      "pixels_differing": 0})
    monkeypatch.setattr(export, "_quantize_segmenter", lambda args, model, train, val, out: seen.update(train=train))
    args = SimpleNamespace(format=["onnx"], eval_images=None, images=None, int8_metric=None, quantize="int8")
    export._export_segmenter(args, None, cfg, ["background", "square", "disc"], tmp_path / "out")
    plain, _, _ = build_seg_datasets(cfg, ("train",), ["background", "square", "disc"], augment=False)
    for i in range(len(plain)):
        for k in (0, 1):  # image and mask as evaluation reads them
            np.testing.assert_array_equal(seen["train"][i][k], plain[i][k])


def test_seg_geometry_reaches_the_training_split_only(tmp_path):
    from vit.data.segmentation import build_seg_datasets

    data = _parts(tmp_path / "data")
    steps = {}
    for geometry in ("resample", "exact", "none"):
        cfg = load_config("configs/default.yaml", ["--data.dataset=segmentation", f"--data.root={data}",
                                                   "--seg.missing_masks=background", f"--seg.geometry={geometry}"])
        validate(cfg)
        train, val, _ = build_seg_datasets(cfg, ("train", "val"), ["background", "square", "disc"])
        steps[geometry] = [type(t).__name__ for t in train.transform.transforms]
        assert [type(t).__name__ for t in val.transform.transforms] == ["Resize", "Normalize"]
    assert "RandomResizedCrop" in steps["resample"] and "RandomRotate90" not in steps["resample"]
    assert "RandomRotate90" in steps["exact"] and "RandomResizedCrop" not in steps["exact"]
    assert steps["none"] == ["Resize", "ColorJitter", "Normalize"]
    with pytest.raises(ConfigError, match="seg.geometry"):
        validate(load_config("configs/default.yaml", ["--data.dataset=segmentation", f"--data.root={data}",
                                                      "--seg.geometry=crop"]))


def test_bad_pairs_are_refused_before_training(tmp_path):
    """train.py builds its datasets with check_images: a val mask with a value outside the classes or of another
    size than its image is named then, not at the end of the first epoch; an unreadable training image is refused
    or, with data.on_bad_image=skip, its pair dropped and named. A camera JPEG turned by its EXIF orientation is
    compared with its mask as decoded (turned)."""
    from vit.data import DataError, build_datasets

    data = _parts(tmp_path / "data")
    Image.fromarray(np.full((32, 32), 7, np.uint8)).save(data / "val" / "masks" / "1.png")
    cfg = load_config("configs/default.yaml", ["--data.dataset=segmentation", f"--data.root={data}",
                                               "--model.img_size=32", "--seg.missing_masks=background",
                                               "--seg.classes=[background, square, disc]"])
    with pytest.raises(DataError, match=r"mask .*val/masks/1.png holds the values \[7\]"):
        build_datasets(cfg)
    train, val, _ = build_datasets(cfg, check_images=False)  # export's and evaluate's reads are unchanged
    assert len(val) == 3
    Image.fromarray(np.zeros((32, 30), np.uint8)).save(data / "val" / "masks" / "1.png")
    with pytest.raises(DataError, match=r"mask .*val/masks/1.png is 30x32 but its image .*val/images/1.png is 32x32"):
        build_datasets(cfg)
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(data / "val" / "masks" / "1.png")
    (data / "train" / "images" / "2.png").write_bytes(b"not a png")
    train, val, _ = build_datasets(cfg)  # data.on_bad_image: skip by default
    assert len(train) == 5 and len(train.bad) == 1 and "2.png" in train.bad[0] and not val.bad
    cfg.data.on_bad_image = "error"
    with pytest.raises(DataError, match=r"1 unreadable image\(s\) .*train/images/2.png.*data.on_bad_image=skip"):
        build_datasets(cfg)


def test_the_model_line_describes_backbone_and_head():
    """train.py's model line for a segmenter: the backbone as built (its patch, not the name's) and the head."""
    from vit.models.segmenter import build_segmenter
    from vit.train.console import describe_model

    cfg = load_config("configs/default.yaml", ["--data.dataset=segmentation", "--data.root=/x", "--model.img_size=32",
                                               "--model.patch_size=4", "--model.depth=4", "--seg.head=dpt",
                                               "--seg.dpt_width=8"])
    model = build_segmenter(cfg, 3)
    head = sum(p.numel() for p in model.head.parameters()) / 1e6
    line = describe_model(model, "vit_tiny_patch16_224")
    assert "patch 4, 65 tokens (8x8 + 1)" in line and f"DPTHead {head:.2f}M params on blocks 0, 1, 2, 3" in line
    total = sum(p.numel() for p in model.parameters()) / 1e6
    assert line.endswith(f"; {total:.2f}M params")


def test_evaluate_takes_the_seg_keys_its_messages_name():
    """evaluate.py's refusal of a mask-less image names seg.missing_masks=background: it takes that key (and
    seg.window), not the ones that would rebuild another model."""
    from vit.cli.commands.evaluate import parse_args

    _, overrides = parse_args(["--checkpoint", "x", "--seg.missing_masks=background", "--seg.window=64"])
    assert overrides == {"seg.missing_masks": "background", "seg.window": 64}
    with pytest.raises(ConfigError, match=r"takes only --data\.\* and --aug\.\* and --seg\.missing_masks and "
                                          r"--seg\.window overrides, not --seg\.head"):
        parse_args(["--checkpoint", "x", "--seg.head=dpt"])


def test_the_size_check_reads_exif_orientation_as_decoding_does(tmp_path):
    from vit.data.segmentation import SegmentationDataset, find_pairs, image_size

    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 32 wide and 16 high, shown turned: 16 wide, 32 high
    Image.fromarray(np.zeros((16, 32, 3), np.uint8)).save(tmp_path / "images" / "a.jpg", exif=exif.tobytes())
    Image.fromarray(np.zeros((32, 16), np.uint8)).save(tmp_path / "masks" / "a.png")
    assert image_size(tmp_path / "images" / "a.jpg") == (32, 16)
    ds = SegmentationDataset(find_pairs(tmp_path), ["bg", "x"], None)
    assert ds.check() == [] and ds.load(0)[1].shape == (32, 16)
