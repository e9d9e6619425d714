"""Frozen-backbone evaluation: classify images from their features alone (vit.eval.features), as the DINO and
DINOv2 papers evaluate a backbone.

Weighted k-NN (Wu et al. 2018; DINO, Caron et al. 2021, sec. 4.1): features L2-normalised, the k training
samples of highest cosine similarity s_j vote for their class with weight exp(s_j / T):

    score(c) = sum_{j in top-k} exp(s_j / T) [y_j = c]          prediction: argmax_c score(c)

Linear probe: multinomial logistic regression on the normalised features, the objective scikit-learn's
LogisticRegression minimises (an unpenalised bias):

    C * sum_i CE(W x_i + b, y_i) + ||W||^2 / 2

solved in float64 by L-BFGS (on the features' device: a GPU takes a large feature set), its C chosen from a small
sweep by top-1 on a validation set, else by stratified k-fold cross-validation on the labelled features.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["probe", "knn_scores", "fit_logistic", "check_C", "linear_probe", "cv_folds", "class_index", "CS", "C_RANGE",
           "TOL"]

CS = (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0)  # linear_probe's sweep of C (inverse strength, as scikit-learn)
C_RANGE = (1e-6, 1e6)  # the Cs a fit takes (check_C)
TOL = 1e-4  # fit_logistic stops when the scaled objective's largest gradient entry is below this (scikit-learn's)


def class_index(train_labels, test_labels=None) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """(sorted class names, train label indices, test label indices) from string labels. A test label that no
    training sample has cannot be predicted: a ValueError that names it."""
    classes = sorted(set(np.asarray(train_labels).tolist()))
    lookup = {c: i for i, c in enumerate(classes)}
    y_train = np.array([lookup[c] for c in np.asarray(train_labels).tolist()], dtype=np.int64)
    if test_labels is None:
        return classes, y_train, None
    unseen = sorted(set(np.asarray(test_labels).tolist()) - set(classes))
    if unseen:
        raise ValueError(f"the test features have class {unseen[0]!r}, which no training feature has; extract the "
                         "training features from a folder with every class.")
    return classes, y_train, np.array([lookup[c] for c in np.asarray(test_labels).tolist()], dtype=np.int64)


@torch.no_grad()
def knn_scores(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, num_classes: int, k: int = 20,
               temperature: float = 0.07, chunk: int = 1024) -> torch.Tensor:
    """Class scores (N_test, num_classes) of the weighted k-NN vote above, each row divided by its largest weight
    exp(s_1 / T) (the same argmax and shares, finite at any T > 0). train_x (N, D), train_y (N,) int, test_x
    (M, D); queries in chunks of `chunk` so that memory stays (chunk, N)."""
    if k < 1 or not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"k-NN needs k >= 1 and a finite temperature > 0, got k={k}, T={temperature}.")
    k = min(k, len(train_x))
    train_x, test_x = F.normalize(train_x.float(), dim=1), F.normalize(test_x.float(), dim=1)
    out = []
    for start in range(0, len(test_x), chunk):
        sim = test_x[start:start + chunk] @ train_x.T  # (m, N) cosine similarities
        top, idx = sim.topk(k, dim=1)  # (m, k), the nearest first
        # exp((s_j - s_1) / T): the row's weights times exp(-s_1 / T), which neither the argmax nor the shares
        # see; the largest is 1, so a small T cannot overflow float32 (exp(s / T) is inf for s / T > 88.7)
        weights = ((top - top[:, :1]) / temperature).exp()
        votes = torch.zeros(len(sim), num_classes, dtype=sim.dtype, device=sim.device)
        out.append(votes.scatter_add_(1, train_y[idx], weights))
    return torch.cat(out)


def check_C(Cs, name: str = "C") -> None:
    """One sentence (ValueError) for a C no fit can use: none given, NaN or infinite, or outside C_RANGE. Below
    it the weights are ~C * n (the penalty's optimum) and vanish in float64 rounding beside the bias, so every
    image gets one class; above it the penalty is under the solver's tolerance: the unregularised fit of 1e6."""
    Cs = list(Cs)
    bad = [c for c in Cs if not (math.isfinite(c) and C_RANGE[0] <= c <= C_RANGE[1])]
    if not Cs or bad:
        raise ValueError(f"{name} must be a number from {C_RANGE[0]:g} to {C_RANGE[1]:g}, got "
                         f"{bad[0] if bad else 'none'}: below, the weights vanish in float64 rounding beside the "
                         "bias (every image gets one class); above, the fit is the unregularised one.")


def fit_logistic(x: torch.Tensor, y: torch.Tensor, num_classes: int, C: float, max_iter: int = 1000,
                 tol: float = TOL, start: tuple[torch.Tensor, torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(W (K, D), b (K,)) minimising C * sum_i CE(W x_i + b, y_i) + ||W||^2 / 2 in float64 (L-BFGS with a strong
    Wolfe line search): scikit-learn's multinomial LogisticRegression(C=C) optimum. The objective is divided by
    C * n (the same minimiser; scikit-learn's scaling) so that its gradient has one scale whatever C and n, and
    the fit stops, as scikit-learn's lbfgs does at its `tol`, when the gradient's largest entry is below `tol`
    (1e-4, scikit-learn's default: predictions settle long before; 1e-10 gives the optimum to ~1e-6, at ten times
    the steps). `start`: (W, b) to start from (a neighbouring C's solution), else zeros."""
    check_C([C])
    x = x.double()
    W0, b0 = start if start is not None else (None, None)
    W = torch.zeros(num_classes, x.shape[1], dtype=torch.float64, device=x.device) if W0 is None else W0.double()
    b = torch.zeros(num_classes, dtype=torch.float64, device=x.device) if b0 is None else b0.double()
    W, b = W.clone().requires_grad_(True), b.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([W, b], lr=1, max_iter=max_iter, tolerance_grad=tol, tolerance_change=0,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(x @ W.T + b, y) + 0.5 * (W * W).sum() / (C * len(x))
        loss.backward()
        return loss

    opt.step(closure)
    return W.detach(), b.detach()


def cv_folds(y: np.ndarray, folds: int = 5, seed: int = 0) -> np.ndarray | None:
    """Fold index (N,) of scikit-learn's shuffled StratifiedKFold with min(folds, the smallest class's count)
    folds, so that every sample is held out once and every fold holds every class; None when some class has fewer
    than 2 samples (nothing can be held out: the sweep keeps C = 1)."""
    from sklearn.model_selection import StratifiedKFold

    counts = np.bincount(y)
    k = min(folds, int(counts[counts > 0].min()))
    if k < 2:
        return None
    out = np.empty(len(y), np.int64)
    for i, (_, held) in enumerate(StratifiedKFold(k, shuffle=True, random_state=seed).split(np.zeros(len(y)), y)):
        out[held] = i
    return out


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, num_classes: int,
                 Cs: tuple[float, ...] = CS, val: tuple[torch.Tensor, torch.Tensor] | None = None,
                 seed: int = 0) -> tuple[torch.Tensor, dict]:
    """Class scores (M, K) of the linear probe on L2-normalised features, and {C, val_top1: {C: top-1}}. C is
    chosen by top-1 on `val` (features, labels), else by stratified k-fold cross-validation on the training
    features (cv_folds: top-1 over every held-out sample; with a few labels per class a single held-out split is
    a handful of images), then the final fit uses them all; the smallest C among equals (the strongest
    regularisation). Each split's fits run from the smallest C up, each starting from the last one's solution."""
    check_C(Cs)
    xs, xt = F.normalize(train_x.double(), dim=1), F.normalize(test_x.double(), dim=1)
    if val is not None:
        splits = [(torch.ones(len(xs), dtype=torch.bool, device=xs.device), F.normalize(val[0].double(), dim=1),
                   val[1])]
    else:
        fold = cv_folds(train_y.cpu().numpy(), seed=seed) if len(Cs) > 1 else None
        splits = []
        if fold is not None:
            fold = torch.from_numpy(fold).to(xs.device)
            splits = [(fold != f, xs[fold == f], train_y[fold == f]) for f in range(int(fold.max()) + 1)]
    scores: dict[float, float] = {}
    if splits:
        starts = [None] * len(splits)  # each split's fit at the previous (smaller) C: where the next one starts
        for C in sorted(set(Cs)):
            right = 0
            for i, (keep, val_x, val_y) in enumerate(splits):
                W, b = starts[i] = fit_logistic(xs[keep], train_y[keep], num_classes, C, start=starts[i])
                right += int(((val_x @ W.T + b).argmax(1) == val_y).sum())
            scores[C] = right / sum(len(v) for _, _, v in splits)
        best = max(Cs, key=lambda c: (scores[c], -c))
    else:
        best = 1.0 if 1.0 in Cs or len(Cs) != 1 else Cs[0]
    W, b = fit_logistic(xs, train_y, num_classes, best)
    return (xt @ W.T + b).float(), {"C": best, "val_top1": scores}


def _check_features(feats: dict, role: str, dim: int) -> None:
    """One sentence for features no probe can use: none, a dimension other than the training features' `dim`, or
    a NaN or infinite value (a diverged model's; it would win or lose every vote)."""
    x = feats["embeddings"]
    if len(x) == 0:
        raise ValueError(f"the {role} features are empty; extract them from a folder that holds images.")
    if x.ndim != 2 or x.shape[1] != dim:
        raise ValueError(f"the {role} features are {x.shape[-1]}-d but the training features {dim}-d; extract "
                         "every file with the same model.")
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise ValueError(f"the {role} features hold NaN or infinite values in {int(bad.sum())} row(s) (the first: "
                         f"{feats['paths'][np.argmax(bad)]}); the model that extracted them has diverged, so extract "
                         "them again from a finite checkpoint.")


def probe(train: dict, test: dict, method: str = "knn", k: int = 20, temperature: float = 0.07,
          Cs: tuple[float, ...] = CS, val: dict | None = None) -> dict:
    """Evaluate features files (`vit.eval.features.load_features` dicts) as evaluate.py reports a model: {method,
    classes, top1, macro, weighted, per_class (rows: precision, recall, f1, support), pred (M,) int, labels (M,)
    int, scores (M, K), settings}. `method`: knn or linear; `val` (linear): the features that choose C."""
    from .metrics import per_class_metrics

    if method not in ("knn", "linear"):
        raise ValueError(f"unknown probe {method!r}; choose knn or linear.")
    named = {"training": train, "test": test, **({"validation": val} if val is not None else {})}
    for role, feats in named.items():
        _check_features(feats, role, train["embeddings"].shape[-1])
    classes, y_train, y_test = class_index(train["labels"], test["labels"])
    if len(classes) < 2:
        raise ValueError(f"the training features hold one class ({classes[0]!r}); a probe chooses between classes, "
                         "so extract them from a folder of two or more <class>/ folders.")
    x_train, x_test = torch.from_numpy(train["embeddings"]), torch.from_numpy(test["embeddings"])
    yt = torch.from_numpy(y_train)
    if method == "knn":
        scores = knn_scores(x_train, yt, x_test, len(classes), k, temperature)
        settings = {"k": min(k, len(x_train)), "temperature": temperature}
    else:
        held = None
        if val is not None:
            y_val = class_index(train["labels"], val["labels"])[2]
            held = (torch.from_numpy(val["embeddings"]), torch.from_numpy(y_val))
        scores, settings = linear_probe(x_train, yt, x_test, len(classes), tuple(Cs), held)
    pred = scores.argmax(1).numpy()
    conf, rows, avgs = per_class_metrics(y_test, pred, len(classes))
    return {"method": method, "classes": classes, "n_train": len(y_train), "n": len(y_test),
            "top1": float((pred == y_test).mean()), "macro": avgs["macro"], "weighted": avgs["weighted"],
            "per_class": rows, "confusion": conf, "pred": pred, "labels": y_test, "scores": scores.numpy(),
            "settings": settings}
