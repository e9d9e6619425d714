"""The linear probe (vit.eval.probes.linear_probe) against scikit-learn's LogisticRegression doing the same work on
the same features, interleaved: one fit at a given C, or the whole sweep of C by stratified k-fold
cross-validation then the refit. Features are Gaussian class blobs (a pooled width, 384, and a patch-token
width, 16 x 16 x 192 flattened), held-out top-1 reported beside the time.

    rows = bench_linear_probe(widths=(384, 49152), Cs=(1.0,))      # one fit each, C = 1
    rows = bench_linear_probe(widths=(384,), Cs=CS)                 # the sweep probe.py runs by default
"""

from __future__ import annotations

import statistics

import numpy as np
import torch

from ..eval.probes import CS, cv_folds, linear_probe
from ..utils.timing import interleaved, ratio_stats

__all__ = ["blobs", "sklearn_linear_probe", "bench_linear_probe", "format_probe_report"]


def blobs(n: int, width: int, classes: int, seed: int = 0, spread: float | None = None
          ) -> tuple[np.ndarray, np.ndarray]:
    """(features (n, width) float32, labels (n,)): unit-variance class centres plus noise of `spread` (default
    6 (width / 384)^(1/3): with 2,000 features of 10 classes, ~90% top-1 at 384 and at 49152 alike)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(12345).normal(size=(classes, width))  # the same classes for train and test
    y = rng.integers(0, classes, n)
    spread = 6 * (width / 384) ** (1 / 3) if spread is None else spread
    return (centres[y] + spread * rng.normal(size=(n, width))).astype(np.float32), y


def sklearn_linear_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, Cs=CS, seed: int = 0,
                         max_iter: int = 1000) -> tuple[np.ndarray, float]:
    """(test predictions, the chosen C) of linear_probe's protocol in scikit-learn: features L2-normalised in
    float64, C by top-1 over the same stratified folds (cv_folds) with the smallest C among equals, then the fit
    on all of them; LogisticRegression's own solver (lbfgs) and tolerance, each fit from zeros."""
    from sklearn.linear_model import LogisticRegression

    def norm(a):
        a = np.asarray(a, np.float64)
        return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)

    xs, xt = norm(train_x), norm(test_x)
    fold = cv_folds(train_y, seed=seed) if len(Cs) > 1 else None
    best = Cs[0] if len(Cs) == 1 else 1.0
    if fold is not None:
        top1 = {}
        for C in Cs:
            right = 0
            for f in range(int(fold.max()) + 1):
                m = LogisticRegression(C=C, max_iter=max_iter).fit(xs[fold != f], train_y[fold != f])
                right += int((m.predict(xs[fold == f]) == train_y[fold == f]).sum())
            top1[C] = right / len(train_y)
        best = max(Cs, key=lambda c: (top1[c], -c))
    return LogisticRegression(C=best, max_iter=max_iter).fit(xs, train_y).predict(xt), best


def bench_linear_probe(widths=(384, 16 * 16 * 192), n: int = 2000, n_test: int = 1000, classes: int = 10,
                       Cs=(1.0,), threads: int = 1, warmup: int = 0, repeats: int = 3) -> list[dict]:
    """One row per width: {width, n, classes, Cs, seconds {ours, sklearn} (medians; seconds_all: every repeat),
    ratio (ours / sklearn per paired repeat: median, min, max), top1 {ours, sklearn}, C {ours, sklearn}}. Both
    sides on `threads` CPU threads (torch's and scikit-learn's BLAS alike), timed in turn (ours, sklearn, ...)."""
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(threads):
            return [_one_width(width, n, n_test, classes, tuple(Cs), threads, warmup, repeats) for width in widths]
    finally:
        torch.set_num_threads(before)


def _one_width(width: int, n: int, n_test: int, classes: int, Cs: tuple, threads: int, warmup: int,
               repeats: int) -> dict:
    x, y = blobs(n, width, classes, seed=0)
    q, yq = blobs(n_test, width, classes, seed=1)
    xt, yt, qt = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(q)
    got: dict = {}

    def ours():
        scores, info = linear_probe(xt, yt, qt, classes, Cs)
        got["ours"] = (scores.argmax(1).numpy(), info["C"])

    def theirs():
        got["sklearn"] = sklearn_linear_probe(x, y, q, Cs)

    t = interleaved({"ours": ours, "sklearn": theirs}, warmup=warmup, repeats=repeats)
    return {"width": width, "n": n, "classes": classes, "Cs": list(Cs), "threads": threads,
            "seconds": {k: statistics.median(v) for k, v in t.wall.items()}, "seconds_all": t.wall,
            "ratio": ratio_stats(t.wall["sklearn"], t.wall["ours"]),
            "top1": {k: float((p == yq).mean()) for k, (p, _) in got.items()},
            "C": {k: c for k, (_, c) in got.items()}}


def format_probe_report(rows: list[dict]) -> str:
    lines = [f"{'width':>7s} {'Cs':>18s} {'ours s':>8s} {'sklearn s':>9s} {'ours/sklearn':>20s} "
             f"{'top-1 ours':>10s} {'sklearn':>8s} {'C':>10s}"]
    for r in rows:
        ratio = f"{r['ratio']['median']:.2f} ({r['ratio']['min']:.2f}-{r['ratio']['max']:.2f})"
        cs = " ".join(f"{c:g}" for c in r["Cs"])
        lines.append(f"{r['width']:>7d} {cs[:18]:>18s} {r['seconds']['ours']:8.2f} {r['seconds']['sklearn']:9.2f} "
                     f"{ratio:>20s} {100 * r['top1']['ours']:9.1f}% {100 * r['top1']['sklearn']:7.1f}% "
                     f"{r['C']['ours']:g}/{r['C']['sklearn']:g}")
    return "\n".join(lines) + f"\n{rows[0]['n']} training features, {rows[0]['classes']} classes, " \
        f"{rows[0]['threads']} thread(s) each; ratio: ours / scikit-learn over interleaved repeats (median, min-max)"
