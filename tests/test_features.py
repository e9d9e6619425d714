"""Frozen features out (vit/eval/features.py, features.py): the embedding is what the head reads, files round-trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import make_image_folder, run_script

from vit import create_model
from vit.cli.images import collect_images
from vit.config import AugConfig
from vit.data.transforms import build_transform
from vit.eval.features import extract_features, load_features, save_features
from vit.eval.inference import ImageFiles


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("feat"), classes=("a", "b"), n_train=3, n_val=2, size=32)


def _extract(model, folder, patch_tokens):
    from accelerate import Accelerator

    paths, _ = collect_images([str(folder / "train")])
    transform = build_transform(AugConfig(), 32, train=False)
    ds = ImageFiles(paths, transform)
    return ds, extract_features(model, ds, 4, 0, Accelerator(cpu=True), patch_tokens=patch_tokens)


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_embedding_is_what_the_head_reads(folder, pool):
    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=3, global_pool=pool)
    ds, feats = _extract(model, folder, patch_tokens=True)
    x = torch.stack([ds[i][0] for i in range(len(ds))])
    with torch.no_grad():
        logits = model(x)
        tokens = model.forward_features(x)
    emb = torch.from_numpy(feats["embeddings"])
    # the oracle: the head applied to our embedding gives the model's own logits
    torch.testing.assert_close(model.head(emb), logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.from_numpy(feats["patch_tokens"]), tokens[:, 1:], atol=1e-6, rtol=1e-6)
    assert feats["grid"] == (4, 4) and feats["labels"] == ["a"] * 3 + ["b"] * 3 and feats["ok"].all()


def test_files_round_trip_and_skip_unreadable(folder, tmp_path):
    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=2)
    ds, feats = _extract(model, folder, patch_tokens=True)
    feats["ok"][1] = False  # as an unreadable file: left out of the files
    written = save_features(tmp_path / "f.npz", feats)
    assert [w.name for w in written] == ["f.npz", "f.parquet"]
    keep = [0, 2, 3, 4, 5]
    for path in written:
        back = load_features(path)
        np.testing.assert_array_equal(back["embeddings"], feats["embeddings"][keep])
        assert back["paths"].tolist() == [feats["paths"][i] for i in keep]
        assert back["labels"].tolist() == [feats["labels"][i] for i in keep]
    np.testing.assert_array_equal(load_features(tmp_path / "f.npz")["patch_tokens"], feats["patch_tokens"][keep])


def test_a_pickled_npz_is_refused(tmp_path):
    np.savez(tmp_path / "bad.npz", paths=np.array([{"a": 1}], dtype=object), labels=np.array(["x"]),
             embeddings=np.zeros((1, 2)))
    with pytest.raises(ValueError, match="not a features file"):
        load_features(tmp_path / "bad.npz")


def test_script_writes_what_the_library_reads(tiny_run, tmp_path):
    run, data = tiny_run
    r = run_script("features.py", "--checkpoint", str(run / "best"), str(data / "val"), "--out",
                   str(tmp_path / "v.npz"), "--patch-tokens")
    assert r.returncode == 0, r.stderr[-2000:]
    back = load_features(tmp_path / "v.npz")
    assert back["embeddings"].shape == (21, 32) and sorted(set(back["labels"])) == list("abcdefg")
    assert back["patch_tokens"].shape[1] == int(np.prod(back["grid"]))
    bad = run_script("features.py", "--checkpoint", str(run / "best"), str(data / "val"), "--out", str(tmp_path))
    assert bad.returncode == 2 and "must name a .npz file" in bad.stderr
