"""Segmentation on a NaFlex backbone (data.naflex): each image at its own aspect ratio. A padded batch gives every
image the logits it gets alone; the loss and the confusion count each pixel once (against float64 formulas); image
and mask stay aligned through the NaFlex pipeline; a train.py run's evaluate.py confusion equals the one rebuilt
from predict.py's masks at the files' own sizes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import TINY, run_script
from PIL import Image

from vit.data.naflex import collate_naflex, grid_for_budget, patchify, sequence_lengths
from vit.data.segmentation import SegmentationDataset, SegPair, collate_naflex_seg, fit_to_budget, seg_transform
from vit.eval.segmentation import confusion, flat_pixels
from vit.models import create_model
from vit.models.segmenter import create_segmenter
from vit.train.tasks.segmentation import seg_loss


def _segmenter(head: str, **kw):
    torch.manual_seed(0)
    backbone = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2,
                            naflex={})
    return create_segmenter(backbone, 3, head, **kw).eval()


@pytest.mark.parametrize("head,kw", [("linear", {"blocks": 2}), ("dpt", {"sizes": (8, 16, 16, 32), "width": 8})])
def test_each_image_of_a_padded_batch_gets_the_logits_it_gets_alone(head, kw):
    model = _segmenter(head, **kw)
    images = [torch.randn(3, 16, 40), torch.randn(3, 32, 24), torch.randn(3, 8, 8)]  # 2x5, 4x3, 1x1 patches
    with torch.no_grad():
        batch = model(collate_naflex([(patchify(x, 8), 0) for x in images])[0])
        for x, logits in zip(images, batch):
            alone = model(x[None])  # the tensor path: no padding, one grid
            assert logits.shape == (3, *x.shape[-2:])
            torch.testing.assert_close(logits, alone[0], atol=1e-5, rtol=1e-5)
            # and the head on that image's own grid, through forward_head: the same logits before the resize
            torch.testing.assert_close(logits, F.interpolate(model.forward_head(x[None]), size=x.shape[-2:],
                                                             mode="bilinear", align_corners=False)[0],
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head,kw", [("linear", {"blocks": 2}), ("dpt", {"sizes": (8, 16, 16, 32), "width": 8,
                                                                         "dropout": 0.0})])
def test_the_heads_batchnorm_trains_on_every_pixel_of_the_batch(head, kw):
    """Training mode: a NaFlex batch of images of one size gives the logits of the same images as one tensor batch
    and moves BatchNorm's running statistics as it does: the linear head's over all their patches, DPT's classifier
    over all their pixels (its neck runs on each image's grid alone), not per image."""
    images = torch.randn(3, 3, 16, 24)
    naflex_model, tensor_model = _segmenter(head, **kw).train(), _segmenter(head, **kw).train()
    with torch.no_grad():
        naflex = naflex_model(collate_naflex([(patchify(x, 8), 0) for x in images])[0])
        torch.testing.assert_close(torch.stack(naflex), tensor_model(images), atol=1e-5, rtol=1e-5)
    bns = [[m for m in model.head.modules() if isinstance(m, torch.nn.BatchNorm2d)]
           for model in (naflex_model, tensor_model)]
    assert len(bns[0]) == 1
    torch.testing.assert_close(bns[0][0].running_mean, bns[1][0].running_mean, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(bns[0][0].running_var, bns[1][0].running_var, atol=1e-6, rtol=1e-5)


def test_loss_and_confusion_count_every_pixel_of_every_image_once():
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(3, 4, 6, generator=g), torch.randn(3, 8, 8, generator=g)]
    masks = [torch.randint(0, 3, (4, 6), generator=g), torch.randint(0, 3, (16, 16), generator=g)]
    masks[1][0, :5] = 255  # ignored pixels
    weights = torch.tensor([0.5, 2.0, 1.5])
    flat, target = flat_pixels(logits, masks)
    assert flat.shape == (1, 3, 1, 24 + 256) and target.shape == (1, 1, 280)
    # float64 oracle: the second image's logits resized to its mask, then weighted cross-entropy over all pixels
    big = F.interpolate(logits[1][None].double(), size=(16, 16), mode="bilinear", align_corners=False)[0]
    z = torch.cat([logits[0].double().flatten(1), big.flatten(1)], 1).T  # (N, C)
    y = torch.cat([m.flatten() for m in masks])
    keep = y != 255
    logp = z[keep] - z[keep].logsumexp(1, keepdim=True)
    w = weights.double()[y[keep]]
    want = -(w * logp[torch.arange(int(keep.sum())), y[keep]]).sum() / w.sum()
    assert seg_loss(flat, target, "ce", weights).item() == pytest.approx(want.item(), rel=1e-6)
    pred = z.argmax(1)
    want_conf = torch.zeros(3, 3, dtype=torch.int64)
    for t, p in zip(y[keep].tolist(), pred[keep].tolist()):
        want_conf[t, p] += 1
    assert torch.equal(confusion(flat.argmax(1), target, 3), want_conf)


def _pair(tmp_path, h=32, w=48):
    """An image whose mask is its own bright pixels (class 1) and dark pixels (class 2), the regions on even
    coordinates (the budget below halves the image, so no pixel blends two classes)."""
    rng = np.random.default_rng(0)
    img = np.full((h, w, 3), 120, np.uint8)
    mask = np.zeros((h, w), np.uint8)
    mask[4:14, 8:30], mask[18:26, 34:44] = 1, 2
    img[mask == 1], img[mask == 2] = 250, 5
    img = np.clip(img + rng.integers(-5, 6, img.shape), 0, 255).astype(np.uint8)
    Image.fromarray(img).save(tmp_path / "a.png")
    Image.fromarray(mask).save(tmp_path / "a_mask.png")
    return SegPair(tmp_path / "a.png", tmp_path / "a_mask.png")


def test_image_and_mask_stay_aligned_through_the_naflex_pipeline(tmp_path):
    pair = _pair(tmp_path)
    train = SegmentationDataset([pair] * 6, ["bg", "bright", "dark"], seg_transform(None, True, None, None, rotate=0,
                                jitter=0), seed=3, naflex=(4, 24, True))
    assert sequence_lengths(train, 4, 24) == [len(train[i][0]["patches"]) for i in range(6)]
    h, w = grid_for_budget(32, 48, 4, 24)
    assert (h, w) == (4, 6)  # half the image's size
    batch, masks = collate_naflex_seg([train[i] for i in range(6)])
    assert batch["patches"].shape[:2] == (6, h * w) and all(m.shape == (h * 4, w * 4) for m in masks)
    for i in range(6):  # flips move both; the resized mask still marks the resized image's bright and dark pixels
        picture = batch["patches"][i].reshape(h, w, 4, 4, 3).permute(0, 2, 1, 3, 4).reshape(h * 4, w * 4, 3)
        grey, m = picture.mean(-1), masks[i]
        assert (grey[m == 1] > 200).all() and (grey[m == 2] < 60).all() and (m == 1).any() and (m == 2).any()
        assert ((grey[m == 0] > 60) & (grey[m == 0] < 200)).all()
    val = SegmentationDataset([pair], ["bg", "bright", "dark"], seg_transform(None, False, None, None),
                              naflex=(4, 24, False))
    sample, mask = val[0]
    assert mask.shape == (32, 48)  # scored on the file's pixels
    want = fit_to_budget(np.array(Image.open(pair.image)), 4, 24).astype(np.float32)  # uint8 in, as read
    torch.testing.assert_close(sample["patches"], patchify(torch.from_numpy(want).permute(2, 0, 1), 4)["patches"])


def _wide_parts(root):
    """train/ and val/ of parts of three shapes (square, wide, tall): a bright square (class 1) or a dark disc (2)."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 9), ("val", 4)):
        (root / split / "images").mkdir(parents=True)
        (root / split / "masks").mkdir()
        for i in range(n):
            h, w = [(32, 32), (24, 64), (48, 32)][i % 3]
            yy, xx = np.mgrid[:h, :w]
            img, mask = rng.normal(120, 10, (h, w, 3)), np.zeros((h, w), np.uint8)
            cy, cx = rng.integers(6, h - 6), rng.integers(6, w - 6)
            if i % 2 == 0:
                mask[cy - 4:cy + 4, cx - 4:cx + 4] = 1
            else:
                mask[(yy - cy) ** 2 + (xx - cx) ** 2 <= 16] = 2
            img[mask == 1], img[mask == 2] = 230, 20
            Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(root / split / "images" / f"{i}.png")
            Image.fromarray(mask).save(root / split / "masks" / f"{i}.png")
    return root


@pytest.mark.slow
def test_a_naflex_segmentation_run_evaluates_and_predicts_at_the_files_sizes(tmp_path):
    data, out = _wide_parts(tmp_path / "data"), tmp_path / "runs"
    r = run_script("train.py", *TINY, "--data.dataset=segmentation", f"--data.root={data}", f"--run.output_dir={out}",
                   "--run.name=seg", "--run.epochs=2", "--model.patch_size=8", "--model.depth=4", "--seg.head=dpt",
                   "--seg.dpt_width=8", "--seg.classes=[background, square, disc]",
                   "--data.naflex={max_num_patches: 16}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "NaFlex" in r.stdout and "val mIoU" in r.stdout
    ckpt = out / "seg" / "best"
    r = run_script("evaluate.py", "--checkpoint", str(ckpt), "--out", str(tmp_path / "eval"))
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["miou"] == pytest.approx(json.loads((ckpt / "meta.json").read_text())["val_acc1"], abs=1e-9)
    for split, n in (("val", 4), ("train", 9)):  # predict.py's masks, at each file's size, against the files' masks
        out_eval, out_pred = tmp_path / f"eval-{split}", tmp_path / f"p-{split}"
        if split == "train":  # scored as val is: on the mask files' pixels, not on the grid training resizes them to
            r = run_script("evaluate.py", "--checkpoint", str(ckpt), "--split", "train", "--out", str(out_eval))
            assert r.returncode == 0, r.stderr[-2000:]
            metrics = json.loads((out_eval / "metrics.json").read_text())
        images = tmp_path / f"images-{split}"
        images.mkdir()
        for p in (data / split / "images").iterdir():
            (images / p.name).write_bytes(p.read_bytes())
        (images / "broken.png").write_bytes(b"not a png")
        (images / "readme.txt").write_text("not an image")
        r = run_script("predict.py", "--checkpoint", str(ckpt), str(images), "--out", str(out_pred))
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"{n} image(s) segmented, 2 skipped" in r.stdout  # both listed in skipped.csv
        assert len((out_pred / "skipped.csv").read_text().strip().splitlines()) == 3
        conf = np.zeros((3, 3), np.int64)
        for i in range(n):
            (mask,) = (out_pred / "masks").glob(f"*_{i}.png")
            pred, truth = np.array(Image.open(mask)), np.array(Image.open(data / split / "masks" / f"{i}.png"))
            assert pred.shape == truth.shape
            np.add.at(conf, (truth.ravel(), pred.ravel()), 1)
        assert conf.tolist() == metrics["confusion"]
    from vit.explain.seg_demo import SegDemo

    demo = SegDemo(ckpt)  # the demo page's shares are predict.py's areas
    assert "own aspect ratio (at most 16 patches)" in demo.title()
    for row in csv.DictReader((tmp_path / "p-val" / "segmentation.csv").open()):
        shares = {t["label"]: 100 * t["prob"] for t in demo.predict(Path(row["path"]).read_bytes(), row["path"])["top"]}
        assert shares == pytest.approx({c: float(row[f"area_pct_{c}"]) for c in ("square", "disc")}, abs=1e-3)
    r = run_script("export.py", "--checkpoint", str(ckpt), "--format", "onnx", "--out", str(tmp_path / "onnx"))
    assert r.returncode == 2 and "NaFlex segmentation checkpoint" in r.stderr and not (tmp_path / "onnx").exists()
