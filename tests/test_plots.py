"""Pictures through matplotlib's Figure (no global state), what they show, and the per-class metrics."""

# Pictures through matplotlib's Figure (no global state touched), what they show, and the per-class metrics
# scikit-learn computes for evaluate.py, against hand counts.

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT

from vit.eval.metrics import per_class_metrics
from vit.eval.plots import attention_figure, curves_figure, reliability_bars, reliability_figure

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
    rows = [dict(epoch=str(e), train_loss=str(1 / e), val_loss=str(1.1 / e), val_acc1=str(1 - 1 / (e + 1)))
            for e in range(1, epochs + 1)]
    fig = curves_figure(rows)
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if 1 <= t <= epochs]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        assert {line.get_marker() for line in ax.get_lines()} == {marker}


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
