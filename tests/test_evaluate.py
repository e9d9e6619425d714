"""evaluate.py: its numbers against scikit-learn and a manual count; errors before compute; two processes."""

import csv
import json
import re
import sys

import numpy as np
import pytest
import torch
from helpers import make_image_folder, run_script


@pytest.fixture
def trained(tiny_run):
    run, data = tiny_run  # the session's one tiny training (conftest.py): 7 classes, 21 val images
    return run.parent, data


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_metrics_match_sklearn_and_manual_count(trained, tmp_path):
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support

    run, data = trained
    r = run_script("evaluate.py", "--checkpoint", str(run / "t/best"), "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    preds = _read(tmp_path / "predictions.csv")
    assert len(preds) == m["n"] == 21
    y = np.array([int(p["label"]) for p in preds])
    yhat = np.array([int(p["pred1"]) for p in preds])
    assert m["top1"] == pytest.approx(accuracy_score(y, yhat))
    assert m["top1"] == pytest.approx(sum(p["correct"] == "1" for p in preds) / 21)  # manual count
    top5 = np.mean([str(yy) in {p[f"pred{k}"] for k in range(1, 6)} for yy, p in zip(y, preds)])
    assert m["top5"] == pytest.approx(top5)
    pr, rc, f1, sup = precision_recall_fscore_support(y, yhat, labels=range(7), zero_division=0)
    per = _read(tmp_path / "per_class.csv")
    assert [r["class"] for r in per] == list("abcdefg")
    np.testing.assert_allclose([float(r["precision"]) for r in per], pr, atol=1e-9)
    np.testing.assert_allclose([float(r["recall"]) for r in per], rc, atol=1e-9)
    np.testing.assert_allclose([float(r["f1"]) for r in per], f1, atol=1e-9)
    assert [int(r["support"]) for r in per] == list(sup)
    mp, mr, mf, _ = precision_recall_fscore_support(y, yhat, average="weighted", zero_division=0)
    assert m["weighted"]["f1"] == pytest.approx(mf) and m["weighted"]["precision"] == pytest.approx(mp)
    assert preds[0]["sample"].endswith(".png")
    table = [ln for ln in r.stdout.splitlines() if ln.startswith(("class", "a ", "macro avg", "weighted avg"))]
    assert len(table) == 4 and len({len(ln) for ln in table}) == 1, table  # every column right-aligned alike
    for f in ("confusion.png", "reliability.png", "mistakes.png"):
        assert (tmp_path / f).stat().st_size > 1000
    assert "mistakes.png" in r.stdout.splitlines()[-1]
    # the reported top-1 is the training run's own final validation accuracy
    meta = json.loads((run / "t/best/meta.json").read_text())
    assert m["top1"] == pytest.approx(meta["val_acc1"])


def test_ece_against_an_independent_per_sample_formula():
    """ECE = sum over bins |sum_i (correct_i - conf_i)| / N, bins found with np.digitize (right-closed, the first
    also holding 0), summed with np.bincount: no loop over bins, nothing shared with the implementation."""
    from vit.eval.metrics import expected_calibration_error

    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(500, 4, generator=g, dtype=torch.float64) * 2, 1).float()
    labels = torch.randint(0, 4, (500,), generator=g)
    ece, bins = expected_calibration_error(probs, labels, n_bins=10)
    p = probs.double().numpy()
    conf, correct = p.max(1), (p.argmax(1) == labels.numpy()).astype(float)
    which = np.digitize(conf, np.linspace(0, 1, 11)[1:-1], right=True)  # (lo, hi] -> bin index 0..9
    gap = np.bincount(which, weights=correct - conf, minlength=10)
    assert ece == pytest.approx(np.abs(gap).sum() / len(conf), abs=1e-6)
    assert [b[2] for b in bins] == list(np.bincount(which, minlength=10))
    # a case by hand: 8 classes; confidences 0.95 (right), 0.95 (wrong), 0.55 (right), 0.15 (wrong)
    rows = []
    for c in (0.95, 0.95, 0.55, 0.15):
        rows.append([c] + [(1 - c) / 7] * 7)
    ece, bins = expected_calibration_error(torch.tensor(rows), torch.tensor([0, 1, 0, 1]), n_bins=10)
    # bin (0.9, 1]: |0.5 - 0.95| * 2/4; bin (0.5, 0.6]: |1 - 0.55| / 4; bin (0.1, 0.2]: |0 - 0.15| / 4
    assert ece == pytest.approx(0.45 * 0.5 + 0.45 / 4 + 0.15 / 4, abs=1e-6)
    assert [b[2] for b in bins] == [0, 1, 0, 0, 0, 1, 0, 0, 0, 2]


def test_class_mismatch_fails_before_compute(trained, tmp_path):
    run, _ = trained
    other = make_image_folder(tmp_path / "other", classes=("a", "b", "zebra"), n_train=1, n_val=1)
    r = run_script("evaluate.py", "--checkpoint", str(run / "t/best"), "--data.dataset=imagefolder",
                   f"--data.root={other}", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "zebra" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_missing_and_foreign_checkpoints(trained, tmp_path):
    r = run_script("evaluate.py", "--checkpoint", str(tmp_path / "nope"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    run, _ = trained
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(run / "t/best", bad)
    (bad / "config.yaml").write_text(re.sub(r"(?m)^(\s+)depth: 2$", r"\1depth: 3", (bad / "config.yaml").read_text()))
    r = run_script("evaluate.py", "--checkpoint", str(bad))
    assert r.returncode == 2 and "another architecture" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_timm_weights_directly(tmp_path):
    import timm
    from safetensors.torch import save_file

    data = make_image_folder(tmp_path / "f", classes=("x", "y"), n_train=1, n_val=3, size=48)
    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=2, img_size=48)
    save_file(m.state_dict(), str(tmp_path / "w.safetensors"))
    args = ["--weights", str(tmp_path / "w.safetensors"), "--img-size", "32", "--data.dataset=imagefolder",
            f"--data.root={data}", "--out", str(tmp_path / "o")]
    r = run_script("evaluate.py", "--model", "vit_tiny_patch16_224", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resampled pos_embed from a 3x3 grid to 2x2" in r.stdout
    assert json.loads((tmp_path / "o/metrics.json").read_text())["n"] == 6
    # the same file under another architecture's name is refused in one sentence
    r = run_script("evaluate.py", "--model", "vit_small_patch16_224", *args)
    assert r.returncode == 2 and "another architecture" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_two_processes_one_prediction_per_sample(trained, tmp_path):
    run, _ = trained
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", "29533"]
    r = run_script("evaluate.py", "--checkpoint", str(run / "t/best"), "--out", str(tmp_path / "two"),
                   "--batch-size", "4", launcher=launcher, env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    one = run_script("evaluate.py", "--checkpoint", str(run / "t/best"), "--out", str(tmp_path / "one"))
    assert one.returncode == 0
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("two", "one"))
    assert a["num_processes"] == 2 and a["n"] == b["n"] == 21  # 21 is odd: padding would show as 22
    assert a["top1"] == b["top1"] and a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    rows = _read(tmp_path / "two/predictions.csv")
    assert len({r["sample"] for r in rows}) == 21


def test_macro_f1_and_balanced_accuracy_match_scikit_learn():
    from sklearn.metrics import balanced_accuracy_score, f1_score

    from vit.eval.metrics import class_balanced_scores, per_class_metrics

    rng = np.random.default_rng(0)
    for trial in range(20):  # 5 classes, one absent from the labels in some trials, one never predicted in others
        labels = rng.choice(5, size=40, p=[0.4, 0.3, 0.2, 0.1, 0.0] if trial % 2 else [0.3, 0.3, 0.2, 0.15, 0.05])
        preds = np.where(rng.random(40) < 0.6, labels, rng.choice(4, size=40))
        got = class_balanced_scores(torch.as_tensor(preds), torch.as_tensor(labels), 5)
        present = np.unique(labels)
        want_f1 = f1_score(labels, preds, labels=present, average="macro", zero_division=0)
        assert got["macro_f1"] == pytest.approx(want_f1, abs=1e-12)
        assert got["macro_f1"] == pytest.approx(per_class_metrics(labels, preds, 5)[2]["macro"]["f1"], abs=1e-12)
        assert got["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, preds), abs=1e-12)
    assert class_balanced_scores(torch.tensor([1, 1]), torch.tensor([0, 0]), 3) == dict(macro_f1=0.0,
                                                                                        balanced_accuracy=0.0)
