"""The k-NN monitor of a pretraining run (vit/train/knn_monitor.py, pretrain.knn_root): its top-1 equals
scikit-learn's KNeighborsClassifier (cosine distance d, weights exp(-d / T), which are DINO's exp(s / T) up to a
factor per query) on the model's pooled features of the folder's images; a folder that cannot serve is one
sentence before the first step."""

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import make_image_folder, perturb
from PIL import Image
from sklearn.neighbors import KNeighborsClassifier

from vit.config import ConfigError, load_config
from vit.data import DataError
from vit.data.transforms import build_transform
from vit.models import create_model
from vit.train.knn_monitor import TEMPERATURE, KnnMonitor, with_knn
from vit.train.tasks.base import Evaluation

ACC = SimpleNamespace(autocast=contextlib.nullcontext, device=torch.device("cpu"))


def _cfg(root, *over):
    return load_config("configs/default.yaml", ["--pretrain.method=dino", f"--pretrain.knn_root={root}",
                                                "--model.img_size=32", *over])


def _model():
    torch.manual_seed(0)
    return perturb(create_model("vit_tiny_patch16_224", img_size=32, embed_dim=16, depth=1, num_heads=2,
                                num_classes=0)).eval()


def test_the_monitor_scores_as_scikit_learn_k_nn(tmp_path):
    root = make_image_folder(tmp_path / "few", classes=("a", "b", "c", "d"), n_train=12, n_val=10, size=40)
    cfg = _cfg(root)
    model, monitor = _model(), KnnMonitor(cfg)
    t = build_transform(cfg.aug, 32, train=False)

    def feats(split):
        xs, ys = [], []
        for y, c in enumerate(("a", "b", "c", "d")):
            for p in sorted((root / split / c).iterdir()):
                with torch.no_grad():
                    xs.append(model(t(np.asarray(Image.open(p).convert("RGB")))[None]).numpy()[0])
                ys.append(y)
        return np.array(xs), np.array(ys)

    (tx, ty), (vx, vy) = feats("train"), feats("val")
    knn = KNeighborsClassifier(n_neighbors=20, metric="cosine", weights=lambda d: np.exp(-d / TEMPERATURE))
    knn.fit(tx, ty)
    scores, labels = monitor.scores(model, ACC)
    assert labels.tolist() == vy.tolist()
    shares = (scores / scores.sum(1, keepdim=True)).double().numpy()  # each image's vote shares
    np.testing.assert_allclose(shares, knn.predict_proba(vx), atol=1e-5)
    want = (knn.predict(vx) == vy).mean()
    got = monitor(model, ACC)
    assert got == pytest.approx(want, abs=1e-9)
    assert 0.25 < got < 1.0  # neither chance nor perfect: the check can tell a wrong vote
    ev = with_knn(Evaluation("val spread 0.1", {"val_spread": 0.1}, {"val_spread": 0.1}), monitor, model, ACC)
    assert ev.row["val_knn"] == ev.meta["val_knn"] == got and f"val k-NN top-1 {100 * got:.1f}%" in ev.line


def test_a_folder_that_cannot_serve_is_one_sentence(tmp_path):
    with pytest.raises(DataError, match="does not exist; point it at a few labelled images"):
        KnnMonitor(_cfg(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="is a file, not a folder"):
        KnnMonitor(_cfg(tmp_path / "file"))
    root = make_image_folder(tmp_path / "few", classes=("a", "b"))
    (root / "val" / "b").rename(root / "val" / "z")
    with pytest.raises(DataError, match="give both the same class folders"):
        KnnMonitor(_cfg(root))
    with pytest.raises(ConfigError, match="'pretrain.knn_root' names a folder"):
        _cfg("''")
    with pytest.raises(ConfigError, match="'pretrain.knn_root' is read only with pretrain.method set"):
        load_config("configs/default.yaml", [f"--pretrain.knn_root={root}"])
    _cfg(root, "--pretrain.method=mae")  # both methods read it
