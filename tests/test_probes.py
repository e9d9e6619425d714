"""k-NN and linear probes on frozen features (vit/eval/probes.py) against scikit-learn on the same features."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vit.eval.probes import class_index, cv_folds, fit_logistic, knn_scores, linear_probe, probe


@pytest.fixture(autouse=True)
def one_thread():
    """L-BFGS on 60 samples is thousands of tiny operations: a second thread on a busy machine only waits."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _blobs(n=60, d=16, k=4, seed=0, spread=1.5):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d))
    y = rng.integers(0, k, n)
    return (centres[y] + spread * rng.normal(size=(n, d))).astype(np.float32), y


@pytest.mark.parametrize("k,T", [(1, 0.07), (5, 0.07), (20, 0.5)])
def test_knn_matches_sklearn_weighted_vote(k, T):
    from sklearn.neighbors import KNeighborsClassifier

    x, y = _blobs(seed=1)
    q, _ = _blobs(n=40, seed=2)
    # cosine distance d = 1 - s, so the DINO weight exp(s / T) is exp((1 - d) / T)
    ref = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute",
                               weights=lambda d: np.exp((1 - d) / T)).fit(x, y)
    scores = knn_scores(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(q), 4, k=k, temperature=T,
                        chunk=7)  # several chunks
    np.testing.assert_array_equal(scores.argmax(1).numpy(), ref.predict(q))
    np.testing.assert_allclose((scores / scores.sum(1, keepdim=True)).numpy(), ref.predict_proba(q), atol=1e-5)
    assert len(set(ref.predict(q))) > 1  # a vote that always said one class would match trivially


def _knn_float64(x, y, q, num_classes, k, T):
    """DINO's weighted vote, exp(s / T) as written, in float64 (finite while s / T < 709)."""
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    sim = qn.astype(np.float64) @ xn.astype(np.float64).T
    idx = np.argsort(-sim, axis=1)[:, :k]
    votes = np.zeros((len(q), num_classes))
    for i in range(len(q)):
        np.add.at(votes[i], y[idx[i]], np.exp(sim[i, idx[i]] / T))
    return votes


@pytest.mark.parametrize("T", [0.02, 0.01, 0.005, 0.002])
def test_knn_at_small_temperature_matches_a_float64_vote(T):
    """Below T = 0.0113 a cosine near 1 makes exp(s / T) overflow float32: every near neighbour weighs inf, the
    classes tie and the first wins. Tight clusters (cosines near 1) against the float64 vote: the same
    predictions and shares."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(3, 32))
    y, yq = np.repeat(np.arange(3), 20), np.repeat(np.arange(3), 10)
    x = (centres[y] + 0.05 * rng.normal(size=(60, 32))).astype(np.float32)
    q = (centres[yq] + 0.05 * rng.normal(size=(30, 32))).astype(np.float32)
    ref = _knn_float64(x, y, q, 3, 10, T)
    assert np.isfinite(ref).all() and (ref.argmax(1) == yq).all()  # the float64 vote: 100%
    scores = knn_scores(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(q), 3, k=10, temperature=T)
    assert torch.isfinite(scores).all()
    np.testing.assert_array_equal(scores.argmax(1).numpy(), ref.argmax(1))
    np.testing.assert_allclose((scores / scores.sum(1, keepdim=True)).numpy(), ref / ref.sum(1, keepdims=True),
                               atol=1e-3)


@pytest.mark.parametrize("T", [float("nan"), float("inf"), 0.0, -0.07])
def test_a_temperature_that_is_not_finite_and_positive_is_refused(T, tmp_path):
    from helpers import import_script

    from vit.config import ConfigError
    from vit.eval.features import save_features

    x, y = _blobs(seed=1)
    with pytest.raises(ValueError, match=r"k-NN needs k >= 1 and a finite temperature > 0, got k=5, T="):
        knn_scores(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(x), 4, k=5, temperature=T)
    save_features(tmp_path / "f.npz", _feats(x, y), parquet=False)
    with pytest.raises(ConfigError, match=r"--temperature must be a finite number above 0"):
        import_script("probe").main(["--train", str(tmp_path / "f.npz"), "--test", str(tmp_path / "f.npz"),
                                     "--temperature", str(T), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("C", [float("nan"), float("inf"), 0.0, -1.0, 1e-300, 1e-7, 1e7])
def test_a_C_no_fit_can_use_is_refused(C, tmp_path):
    """NaN passed `C <= 0`; C = 1e-300 made weights ~1e-297 that vanish beside the bias: a silent chance score."""
    from helpers import import_script

    from vit.config import ConfigError
    from vit.eval.features import save_features

    x, y = _blobs(seed=1)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    with pytest.raises(ValueError, match=r"C must be a number from 1e-06 to 1e\+06, got "):
        linear_probe(xt, yt, xt, 4, Cs=(1.0, C))
    with pytest.raises(ValueError, match=r"C must be a number from 1e-06 to 1e\+06"):
        fit_logistic(xt, yt, 4, C)
    save_features(tmp_path / "f.npz", _feats(x, y), parquet=False)
    with pytest.raises(ConfigError, match=r"--C must be a number from 1e-06 to 1e\+06, got "):
        import_script("probe").main(["--train", str(tmp_path / "f.npz"), "--test", str(tmp_path / "f.npz"),
                                     "--method", "linear", "--C", "1", str(C), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_the_smallest_C_still_tells_classes_apart_as_sklearn():
    """C = 1e-6, the bound: weights ~1e-5, yet on balanced classes (equal biases) they decide, as scikit-learn's."""
    from sklearn.linear_model import LogisticRegression

    x, _ = _blobs(seed=3)
    y = np.repeat(np.arange(4), 15)
    q, _ = _blobs(n=50, seed=4)
    scores, _ = linear_probe(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(q), 4, Cs=(1e-6,))
    xn, qn = (F.normalize(torch.from_numpy(a).double(), dim=1).numpy() for a in (x, q))
    ref = LogisticRegression(C=1e-6, tol=1e-12, max_iter=10000).fit(xn, y)
    assert len(set(ref.predict(qn))) > 1
    np.testing.assert_array_equal(scores.argmax(1).numpy(), ref.predict(qn))


@pytest.mark.parametrize("C", [0.1, 10.0])
def test_logistic_matches_sklearn(C):
    from sklearn.linear_model import LogisticRegression

    x, y = _blobs(seed=3)
    q, _ = _blobs(n=50, seed=4)
    xn = F.normalize(torch.from_numpy(x).double(), dim=1)
    ref = LogisticRegression(C=C, tol=1e-12, max_iter=10000).fit(xn.numpy(), y)
    W, b = fit_logistic(xn, torch.from_numpy(y), 4, C, tol=1e-10)
    np.testing.assert_allclose(W.numpy(), ref.coef_, atol=1e-4 * max(1.0, np.abs(ref.coef_).max()))
    np.testing.assert_allclose(b.numpy() - b.numpy().mean(), ref.intercept_ - ref.intercept_.mean(), atol=1e-3)
    scores, info = linear_probe(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(q), 4, Cs=(C,))
    qn = F.normalize(torch.from_numpy(q).double(), dim=1).numpy()
    np.testing.assert_array_equal(scores.argmax(1).numpy(), ref.predict(qn))
    assert info["C"] == C


def test_sweep_picks_c_by_cross_validated_top1_as_sklearn():
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    x, y = _blobs(n=24, seed=5, spread=3.0)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    _, info = linear_probe(xt, yt, xt[:3], 4, Cs=(0.01, 100.0), seed=2)
    xn = F.normalize(xt.double(), dim=1).numpy()
    k = min(5, np.bincount(y).min())
    for C, top1 in info["val_top1"].items():  # every sample predicted by the fit on the other folds
        pred = cross_val_predict(LogisticRegression(C=C, tol=1e-10, max_iter=10000), xn, y,
                                 cv=StratifiedKFold(k, shuffle=True, random_state=2))
        assert top1 == pytest.approx(float((pred == y).mean()))
    assert len(set(info["val_top1"].values())) > 1  # the sweep had a choice to make
    assert info["C"] == max(info["val_top1"], key=lambda c: (info["val_top1"][c], -c))


def test_folds_hold_out_each_sample_once_and_every_class_in_each():
    assert cv_folds(np.array([0, 1, 2, 2])) is None  # one image of a class: nothing can be held out
    y = np.array([0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    fold = cv_folds(y)
    assert sorted(set(fold)) == [0, 1]  # the smallest class has 2: two folds
    assert all(set(y[fold == f]) == {0, 1} for f in (0, 1))
    assert cv_folds(np.repeat([0, 1, 2], 9)).max() == 4  # at most 5


def test_an_unseen_test_class_is_named():
    with pytest.raises(ValueError, match="class 'dog', which no training feature has"):
        class_index(["cat", "cat"], ["cat", "dog"])


def _feats(x, y, names=("ant", "bee", "cat", "dog")):
    return {"paths": np.array([f"{names[c]}/{i}.png" for i, c in enumerate(y)]),
            "labels": np.array([names[c] for c in y]), "embeddings": x}


def test_probe_reports_as_sklearn_scores(tmp_path):
    from sklearn.metrics import f1_score
    from sklearn.neighbors import KNeighborsClassifier

    x, y = _blobs(seed=6)
    q, yq = _blobs(n=30, seed=7)
    ref = KNeighborsClassifier(n_neighbors=5, metric="cosine", algorithm="brute",
                               weights=lambda d: np.exp((1 - d) / 0.1)).fit(x, y).predict(q)
    r = probe(_feats(x, y), _feats(q, yq), "knn", k=5, temperature=0.1)
    assert r["top1"] == pytest.approx(float((ref == yq).mean()))
    np.testing.assert_allclose([row["f1"] for row in r["per_class"]], f1_score(yq, ref, average=None, labels=range(4)))


def test_probe_script_writes_the_report(tmp_path):
    from helpers import run_script

    from vit.eval.features import save_features

    x, y = _blobs(seed=8)
    q, yq = _blobs(n=20, seed=9)
    save_features(tmp_path / "tr.npz", _feats(x, y), parquet=False)
    save_features(tmp_path / "te.npz", _feats(q, yq))
    r = run_script("probe.py", "--train", str(tmp_path / "tr.npz"), "--test", str(tmp_path / "te.parquet"),
                   "--method", "linear", "--C", "1", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["settings"]["C"] == 1.0 and m["n"] == 20 and f"top-1 {100 * m['top1']:.2f}%" in r.stdout
    bad = run_script("probe.py", "--train", str(tmp_path / "tr.npz"), "--test", str(tmp_path / "missing.npz"))
    assert bad.returncode == 2 and "no features file" in bad.stderr


def test_probe_script_reads_patch_tokens_flattened(tmp_path):
    """--features patches: the k-NN votes on each image's (h*w, D) patch tokens flattened in grid order, as
    scikit-learn on the same flattened arrays; a file without patch tokens is one sentence."""
    from helpers import import_script
    from sklearn.neighbors import KNeighborsClassifier

    from vit.config import ConfigError
    from vit.eval.features import save_features

    x, y = _blobs(n=60, d=24, seed=10)
    q, yq = _blobs(n=30, d=24, seed=11)
    tok = lambda a: a.reshape(len(a), 4, 6)  # noqa: E731  four 6-d "patch tokens" per image
    pooled = lambda a: tok(a).mean(1)  # noqa: E731  a pooled embedding that tells the classes apart worse
    for name, a, labels in (("tr", x, y), ("te", q, yq)):
        f = {**_feats(pooled(a), labels), "patch_tokens": tok(a), "grid": np.array([2, 2])}
        save_features(tmp_path / f"{name}.npz", f, parquet=False)
    ref = KNeighborsClassifier(n_neighbors=5, metric="cosine", algorithm="brute",
                               weights=lambda d: np.exp((1 - d) / 0.1)).fit(x, y).predict(q)
    main = import_script("probe").main  # in-process: a subprocess would spend seconds importing torch
    assert main(["--train", str(tmp_path / "tr.npz"), "--test", str(tmp_path / "te.npz"), "--k", "5",
                 "--temperature", "0.1", "--features", "patches", "--out", str(tmp_path / "o")]) == 0
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["features"] == "patches" and m["top1"] == pytest.approx(float((ref == yq).mean()))
    save_features(tmp_path / "plain.npz", _feats(x, y), parquet=False)
    with pytest.raises(ConfigError, match="holds no patch tokens; pass the .npz that features.py --patch-tokens "
                                          "writes"):
        main(["--train", str(tmp_path / "plain.npz"), "--test", str(tmp_path / "te.npz"), "--features", "patches",
              "--out", str(tmp_path / "o2")])
    assert not (tmp_path / "o2").exists()


def test_probe_patches_refuses_another_grid_of_the_same_flattened_size(tmp_path):
    """Patch tokens from another model or image size: a 4x2 grid of 4-d tokens flattens to as many numbers as a
    2x2 grid of 8-d ones, so only their shapes tell; one sentence, nothing written, for --test and --val."""
    from helpers import import_script

    from vit.config import ConfigError
    from vit.eval.features import save_features

    x, y = _blobs(n=40, d=32, seed=12)
    for name, grid, shape in (("tr", (2, 2), (4, 8)), ("te", (4, 2), (8, 4)), ("same", (2, 2), (4, 8))):
        f = {**_feats(x[:, :8], y), "patch_tokens": x.reshape(len(x), *shape), "grid": np.array(grid)}
        save_features(tmp_path / f"{name}.npz", f, parquet=False)
    main = import_script("probe").main
    for args in (["--test", "te.npz"], ["--test", "same.npz", "--val", "te.npz", "--method", "linear"]):
        with pytest.raises(ConfigError, match=r"te.npz holds patch tokens on a 4x2 grid of 4-d tokens but --train "
                                              r".*tr.npz on a 2x2 grid of 8-d tokens; extract every file"):
            main(["--train", str(tmp_path / "tr.npz"), *[str(tmp_path / a) if a.endswith(".npz") else a for a in args],
                  "--features", "patches", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("case,message", [
    ("one class", r"the training features hold one class \('ant'\); a probe chooses between classes"),
    ("empty train", r"the training features are empty; extract them from a folder that holds images\."),
    ("empty test", r"the test features are empty"),
    ("test dim", r"the test features are 8-d but the training features 16-d; extract every file with the same"),
    ("val dim", r"the validation features are 8-d but the training features 16-d"),
    ("nan train", r"the training features hold NaN or infinite values in 1 row\(s\) \(the first: dog/3\.png\)"),
    ("inf test", r"the test features hold NaN or infinite values in 2 row\(s\) \(the first: ant/0\.png\)"),
])
@pytest.mark.parametrize("method", ["knn", "linear"])
def test_features_no_probe_can_use_are_one_sentence(case, message, method):
    x, y = _blobs(n=8, seed=10)
    y = np.array([0, 1, 2, 3, 1, 0, 2, 3]) if case != "one class" else np.zeros(8, int)
    train, test, val = _feats(x, y), _feats(x.copy(), y), None
    if case == "empty train":
        train = _feats(x[:0], y[:0])
    elif case == "empty test":
        test = _feats(x[:0], y[:0])
    elif case == "test dim":
        test = _feats(x[:, :8], y)
    elif case == "val dim":
        val = _feats(x[:, :8], y)
    elif case == "nan train":
        train["embeddings"][3, 5] = np.nan
    elif case == "inf test":
        test["embeddings"][[0, 4], 1] = np.inf
    with pytest.raises(ValueError, match=message):
        probe(train, test, method, val=val)
