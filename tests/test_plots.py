"""Pictures through matplotlib's Figure (no global state), what they show, and the per-class metrics."""

# Pictures through matplotlib's Figure (no global state touched), what they show, and the per-class metrics
# scikit-learn computes for evaluate.py, against hand counts.

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT

from vit.eval.metrics import per_class_metrics, worst_mistakes
from vit.eval.plots import (
    attention_figure,
    confusion_figure,
    curves_figure,
    mistakes_figure,
    overlay_image,
    reliability_bars,
    reliability_figure,
)

PROBE = r"""
import json, sys
import matplotlib
before = (matplotlib.get_backend(), {k: repr(v) for k, v in matplotlib.rcParams.items()})
import vit.eval.plots
after = (matplotlib.get_backend(), {k: repr(v) for k, v in matplotlib.rcParams.items()})
changed = sorted(k for k in before[1] if before[1][k] != after[1][k])
print(json.dumps(dict(backend=[before[0], after[0]], changed=changed, pyplot="matplotlib.pyplot" in sys.modules)))
"""


def test_importing_vit_plots_changes_no_matplotlib_state():
    # svg, not Agg: the old import-time matplotlib.use("Agg") would show up as a switch
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "MPLBACKEND": "svg"})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.splitlines()[-1])
    assert res == dict(backend=["svg", "svg"], changed=[], pyplot=False)
    # and no module of ours (the plots of faithfulness.py and visualize_attention.py too) reaches for pyplot
    for path in [*ROOT.glob("*.py"), *ROOT.glob("vit/**/*.py"), *ROOT.glob("examples/*.py")]:
        text = path.read_text()
        assert "matplotlib.pyplot" not in text and "matplotlib.use(" not in text, path


def test_reliability_figure_leaves_out_empty_bins_and_shows_each_count():
    # 10 bins; three hold samples: 200 at 0.95 conf, 2 at 0.55 (one right), 1 at 0.15
    bins = [(b / 10, (b + 1) / 10, 0, 0.0, 0.0) for b in range(10)]
    bins[9] = (0.9, 1.0, 200, 0.9, 0.95)
    bins[5] = (0.5, 0.6, 2, 0.5, 0.55)
    bins[1] = (0.1, 0.2, 1, 0.0, 0.15)
    lo, width, n, acc, conf = reliability_bars(bins)
    np.testing.assert_allclose(lo, [0.1, 0.5, 0.9])
    np.testing.assert_allclose(width, [0.1, 0.1, 0.1])
    assert list(n) == [1, 2, 200] and list(acc) == [0.0, 0.5, 0.9]
    fig = reliability_figure(bins, 0.05)
    ax, hist = fig.axes
    assert len(ax.patches) == 2 * 3 and len(hist.patches) == 3  # accuracy + gap per non-empty bin, 3 counts
    assert sorted(t.get_text() for t in ax.texts) == ["1", "2", "200"]
    assert [p.get_height() for p in hist.patches] == [1, 2, 200] and hist.get_yscale() == "log"
    shades = [p.get_facecolor() for p in ax.patches[:3]]
    assert shades[0][2] > shades[2][2] or shades[0][0] > shades[2][0]  # the 1-sample bar is paler than the 200
    assert reliability_bars([(0.0, 1.0, 0, 0.0, 0.0)])[2].size == 0


@pytest.mark.parametrize("epochs,marker", [(2, "o"), (60, "None")])
def test_curves_have_whole_epoch_ticks_and_markers_for_short_runs(epochs, marker):
    rows = [dict(epoch=str(e), lr=str(1e-3 / e), train_loss=str(1 / e), val_loss=str(1.1 / e),
                 val_acc1=str(1 - 1 / (e + 1))) for e in range(1, epochs + 1)]
    fig = curves_figure(rows)
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if 1 <= t <= epochs]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        assert {line.get_marker() for line in ax.get_lines()} == {marker}


def test_curves_show_every_epochs_train_loss_and_the_learning_rate():
    # run.eval_every=2 over 5 epochs: val values at epochs 2, 4 and 5 (the last), train loss and lr at every one
    rows = [dict(epoch=str(e), lr=str(1e-3 * e), train_loss=str(1 / e), val_loss=str(1.1 / e) if e in (2, 4, 5) else "",
                 val_acc1=str(e / 10) if e in (2, 4, 5) else "") for e in range(1, 6)]
    loss, acc, lr = curves_figure(rows).axes
    train, val = loss.get_lines()
    assert list(train.get_xdata()) == [1, 2, 3, 4, 5] and list(train.get_ydata()) == pytest.approx([1 / e for e in
                                                                                                     range(1, 6)])
    assert list(val.get_xdata()) == [2, 4, 5]  # one line through the evaluated epochs, no gaps
    assert list(acc.get_lines()[0].get_ydata()) == pytest.approx([20, 40, 50])
    assert list(lr.get_lines()[0].get_ydata()) == pytest.approx([1e-3 * e for e in range(1, 6)])
    assert lr.get_ylabel() == "learning rate"


def test_confusion_cells_show_the_rate_and_the_count():
    m = np.array([[2, 1, 0], [0, 4, 0], [3, 0, 0]])  # class c: 3 images, none right
    fig = confusion_figure(m, ["a", "b", "c"])
    ax = fig.axes[0]
    cells = sorted(t.get_text() for t in ax.texts)
    assert cells == sorted(["0.67\n(2)", "0.33\n(1)", "1.00\n(4)", "1.00\n(3)", "0.00\n(0)"])  # diagonal kept
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a (3)", "b (4)", "c (3)"]
    np.testing.assert_allclose(ax.images[0].get_array(), m / m.sum(1, keepdims=True))


def test_worst_mistakes_are_the_most_confident_wrong_predictions_first():
    import torch

    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.4, 0.6], [0.3, 0.7], [0.95, 0.05], [0.3, 0.7]])
    labels = torch.tensor([0, 0, 0, 0, 1, 0])  # wrong: rows 1 (0.8), 2 (0.6), 3 (0.7), 4 (0.95), 5 (0.7)
    assert worst_mistakes(probs, labels) == [4, 1, 3, 5, 2]  # ties (3, 5) in dataset order
    assert worst_mistakes(probs, labels, 2) == [4, 1]
    assert worst_mistakes(probs, torch.tensor([0, 1, 1, 1, 0, 1])) == []


def test_mistakes_figure_titles_each_image_and_says_when_there_are_none():
    imgs = [np.full((8, 8, 3), v) for v in (0.1, 0.5, 0.9, 0.2, 0.3)]
    fig = mistakes_figure(imgs, [f"true a\npredicted b {90 - i}%" for i in range(5)])
    shown = [a for a in fig.axes if a.images]
    assert len(shown) == 5 and len(fig.axes) == 8  # a 2x4 grid, three cells blank
    assert [a.get_title() for a in shown] == [f"true a\npredicted b {90 - i}%" for i in range(5)]
    np.testing.assert_allclose(shown[2].images[0].get_array(), imgs[2])
    assert [t.get_text() for t in mistakes_figure([], []).texts] == ["no misclassified images"]


def test_reliability_labels_are_readable():
    bins = [(b / 10, (b + 1) / 10, 5 * b, b / 12, b / 10 + 0.05) for b in range(10)]
    ax, hist = reliability_figure(bins, 0.05).axes
    assert min(t.get_fontsize() for t in ax.texts) >= 8
    assert ax.get_ylabel().startswith("accuracy") and hist.get_xlabel() == "confidence (top-1 probability)"
    assert "ECE 0.050 over 225 images" in ax.get_title()
    assert len(ax.get_xticks()) == 11


def test_overlay_is_the_figures_overlay_panel_as_pixels():
    # jet at alpha 0.5 over the image: the map's hottest patch red, its coldest blue
    img = np.full((32, 32, 3), 0.5)
    grid = np.zeros((4, 4))
    grid[0, 3] = 1.0
    over = overlay_image(img, grid).astype(int)
    assert over.shape == (32, 32, 3) and over.dtype.kind == "i"
    hot, cold = over[2, 29], over[29, 2]
    assert hot[0] > hot[2] + 50 and cold[2] > cold[0] + 50


def test_attention_figure_has_a_colour_bar_and_the_title():
    img = np.random.default_rng(0).random((32, 48, 3))
    fig = attention_figure(img, np.arange(6.0).reshape(2, 3), "x: true cat, predicted cat\nrollout, heads: mean")
    assert len(fig.axes) == 4  # input, map, overlay, colour bar
    assert fig.axes[3].get_ylabel() == "relevance (min-max scaled)"
    assert fig.get_suptitle().startswith("x: true cat")


def test_per_class_metrics_against_a_hand_count():
    # classes 0-3; class 3 never occurs and is predicted once; class 2 is never predicted
    y = np.array([0, 0, 0, 1, 1, 2, 2, 2])
    p = np.array([0, 0, 1, 1, 1, 0, 3, 1])
    conf, rows, avgs = per_class_metrics(y, p, 4)
    np.testing.assert_array_equal(conf, [[2, 1, 0, 0], [0, 2, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0]])
    # class 0: tp 2 of 3 predicted, of 3 true; class 1: tp 2 of 4 predicted, of 2 true; class 2: 0
    assert [r["precision"] for r in rows] == pytest.approx([2 / 3, 2 / 4, 0, 0])
    assert [r["recall"] for r in rows] == pytest.approx([2 / 3, 1, 0, 0])
    assert [r["f1"] for r in rows] == pytest.approx([2 / 3, 2 / 3, 0, 0])
    assert [r["support"] for r in rows] == [3, 2, 3, 0]
    # macro over the three classes that occur; weighted by support 3, 2, 3
    assert avgs["macro"]["recall"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert avgs["macro"]["precision"] == pytest.approx((2 / 3 + 1 / 2 + 0) / 3)
    assert avgs["weighted"]["f1"] == pytest.approx((3 * 2 / 3 + 2 * 2 / 3 + 0) / 8)
