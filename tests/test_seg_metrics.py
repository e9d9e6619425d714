"""Segmentation metrics against scikit-learn on the same predictions (ignore index included), pixel AUROC against
scikit-learn's roc_auc_score, and sliding-window inference against the whole-image model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import pixel_model
from sklearn.metrics import confusion_matrix, jaccard_score, roc_auc_score

from vit.eval.segmentation import IGNORE_INDEX, confusion, pixel_auroc, seg_scores, sliding_logits


def _preds(seed: int = 0, classes: int = 5):
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, classes, (3, 17, 19), generator=g)
    pred = torch.where(torch.rand(target.shape, generator=g) < 0.6, target,
                       torch.randint(0, classes, target.shape, generator=g))
    target[torch.rand(target.shape, generator=g) < 0.1] = IGNORE_INDEX
    target[target == 4] = 0  # class 4 never true ...
    pred[pred == 4] = 1  # ... nor predicted: no IoU, out of the mean
    return pred, target


def test_confusion_and_scores_match_scikit_learn():
    pred, target = _preds()
    conf = confusion(pred, target, 5)
    keep = (target != IGNORE_INDEX).numpy().ravel()
    t, p = target.numpy().ravel()[keep], pred.numpy().ravel()[keep]
    np.testing.assert_array_equal(conf.numpy(), confusion_matrix(t, p, labels=range(5)))
    s = seg_scores(conf)
    want_iou = jaccard_score(t, p, labels=range(4), average=None)
    np.testing.assert_allclose(s["iou"][:4], want_iou, rtol=1e-12)
    assert np.isnan(s["iou"][4])
    assert s["miou"] == pytest.approx(want_iou.mean(), rel=1e-12)
    assert s["pixel_acc"] == pytest.approx((t == p).mean(), rel=1e-12)
    dice = [2 * ((t == c) & (p == c)).sum() / ((t == c).sum() + (p == c).sum()) for c in range(4)]
    np.testing.assert_allclose(s["dice"][:4], dice, rtol=1e-12)
    assert s["pixels"] == keep.sum() < target.numel()  # the ignore index really left pixels out


def test_pixel_auroc_matches_scikit_learn_with_ties():
    rng = np.random.default_rng(0)
    y = rng.random(5000) < 0.1
    s = np.round(rng.normal(size=5000) + y, 1)  # many ties
    assert pixel_auroc(s, y) == pytest.approx(roc_auc_score(y, s), rel=1e-12)
    with pytest.raises(ValueError, match="both positive and negative"):
        pixel_auroc(s, np.zeros(5000, bool))



def test_sliding_window_covers_wide_strips_exactly():
    model = pixel_model(4)
    x = torch.randn(2, 3, 32, 100)  # a wide strip, the window 32
    with torch.no_grad():
        want = model(x)
    model.sizes.clear()
    got = sliding_logits(model, x, 32, 24)
    torch.testing.assert_close(got, want)
    assert set(model.sizes) == {(32, 32)} and len(model.sizes) == 4  # 0, 24, 48, 68: the last flush with the edge
    small = torch.randn(1, 3, 20, 20)  # smaller than a window: padded, cropped back
    torch.testing.assert_close(sliding_logits(model, small, 32)[..., :20, :20], model(small), rtol=0, atol=1e-6)


def test_the_int8_budget_scores_a_segmenter_by_miou_as_scikit_learn():
    """export.py --quantize int8 on a segmenter keeps an mIoU budget (vit/deploy/quantize.py, metric miou): the
    score is scikit-learn's mean Jaccard over the pixels not ignored, probabilities a softmax over each pixel's
    classes, the decisions each pixel's argmax."""
    from vit.deploy.quantize import decisions, probabilities, score

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 6, 5)).astype(np.float32)  # (N, C, H, W)
    y = rng.integers(0, 4, (3, 6, 5))
    y[0, :2] = IGNORE_INDEX
    pred, keep = logits.argmax(1), y != IGNORE_INDEX
    want = jaccard_score(y[keep], pred[keep], labels=range(4), average=None).mean()
    assert score(logits, y, "miou") == pytest.approx(want, rel=1e-12)
    p = probabilities(logits, "miou")
    np.testing.assert_allclose(p, torch.softmax(torch.from_numpy(logits).double(), 1).numpy(), atol=1e-12)
    assert (decisions(p, "miou") == pred).all()
