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


def _arrays(n=6, tokens=4, width=8, seed=0):
    rng = np.random.default_rng(seed)
    return {"paths": np.array([f"c{i % 2}/{i}.png" for i in range(n)]), "labels": np.array([f"c{i % 2}" for i in
                                                                                          range(n)]),
            "embeddings": rng.normal(size=(n, width)).astype(np.float32),
            "patch_tokens": rng.normal(size=(n, tokens, width)).astype(np.float32), "grid": np.array([2, 2])}


@pytest.mark.parametrize("change,message", [
    (dict(patch_tokens=lambda a: a[:4]), r"holds arrays of different lengths \(paths 6, labels 6, embeddings 6, "
                                          r"patch_tokens 4\) where each holds one row per image; write it again"),
    (dict(labels=lambda a: a[:5]), r"\(paths 6, labels 5, embeddings 6, patch_tokens 6\)"),
    (dict(grid=lambda a: np.array([3, 2])), r"has a 3x2 grid but 4 patch tokens per image; write it again"),
    (dict(grid=lambda a: np.array([4])), r"has a grid of 1 numbers where features.py writes \(h, w\)"),
    (dict(grid=lambda a: np.array([-2, -2])), r"has a -2x-2 grid but 4 patch tokens per image; write it again"),
    (dict(embeddings=lambda a: a[:, :0], patch_tokens=lambda a: a[..., :0]), r"holds embeddings 0-wide \(no "
                                                                             r"numbers per image"),
    (dict(embeddings=lambda a: a.ravel()), r"its embeddings is a 1-d array of float32 where features.py writes 2-d "
                                           r"floats"),
    (dict(patch_tokens=lambda a: a.astype(np.int64)), r"its patch_tokens is a 3-d array of int64 where"),
    (dict(paths=lambda a: np.arange(len(a))), r"its paths is a 1-d array of int64 where features.py writes 1-d "
                                              r"strings"),
])
def test_every_array_of_a_features_file_is_checked_against_the_others(tmp_path, change, message):
    """Patch tokens shorter than the labels were probed over misaligned rows (row i's tokens under another image's
    label); each row array, the grid and each array's kind are checked, in one sentence, before a probe runs."""
    from helpers import import_script

    arrays = _arrays()
    arrays.update({k: f(arrays[k]) for k, f in change.items()})
    np.savez(tmp_path / "f.npz", **arrays)
    with pytest.raises(ValueError, match=message):
        load_features(tmp_path / "f.npz")
    np.savez(tmp_path / "good.npz", **_arrays())
    with pytest.raises(ValueError, match=message):  # probe.py: the same sentence
        import_script("probe").main(["--train", str(tmp_path / "good.npz"), "--test", str(tmp_path / "f.npz"),
                                     "--features", "patches", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_a_compressed_npz_is_refused_from_its_headers_before_it_unpacks(tmp_path, monkeypatch):
    """A small .npz of compressed zeros claims arrays far larger than itself (the attack's: 2.3 MB -> 2.9 GB,
    here 4 MiB from a few KiB under a 1 MiB floor): refused from the .npy headers, no array read. Real features
    compressed (random floats barely shrink) and features.py's own files load."""
    import vit.eval.features as features

    monkeypatch.setattr(features, "FLOOR_BYTES", 1 << 20)
    n = 2048
    bomb = {"paths": np.array(["a/0.png"] * n), "labels": np.array(["a"] * n),
            "embeddings": np.zeros((n, 512), np.float32)}
    np.savez_compressed(tmp_path / "bomb.npz", **bomb)
    assert (tmp_path / "bomb.npz").stat().st_size < 64 << 10
    read = []
    real_load = np.load
    monkeypatch.setattr(np, "load", lambda *a, **k: read.append(a) or real_load(*a, **k))
    with pytest.raises(ValueError, match=r"bomb\.npz would unpack to 4\.[0-9] MiB from [0-9]+ KiB \(over 1\.0 MiB\); "
                                         r"features.py stores its arrays uncompressed"):
        load_features(tmp_path / "bomb.npz")
    assert read == []  # refused from the headers alone
    real = {**bomb, "embeddings": np.random.default_rng(0).normal(size=(n, 512)).astype(np.float32)}
    np.savez_compressed(tmp_path / "real.npz", **real)
    np.testing.assert_array_equal(load_features(tmp_path / "real.npz")["embeddings"], real["embeddings"])
    save_features(tmp_path / "ours.npz", {**_arrays(n=3000, width=512), "grid": (2, 2)}, parquet=False)
    assert load_features(tmp_path / "ours.npz")["patch_tokens"].shape == (3000, 4, 512)  # 31 MiB, > the floor


@pytest.mark.parametrize("arrays,message", [
    (dict(embeddings=np.zeros((1, 70000), np.float32)), r"holds embeddings 70000-wide \(at most 4096 characters, "
                                                        r"65536 numbers per feature and 65536 tokens per image"),
    (dict(patch_tokens=np.zeros((1, 70000, 1), np.float32)), r"holds 70000 patch tokens per image"),
    (dict(paths=np.array(["x" * 5000])), r"holds paths of 5000 characters"),
])
def test_widths_over_the_bounds_are_refused_before_reading(tmp_path, arrays, message):
    base = {"paths": np.array(["a/0.png"]), "labels": np.array(["a"]), "embeddings": np.zeros((1, 8), np.float32)}
    np.savez(tmp_path / "f.npz", **{**base, **arrays})
    with pytest.raises(ValueError, match=message):
        load_features(tmp_path / "f.npz")


@pytest.mark.parametrize("content", [b"not a zip", b""])
def test_a_file_that_is_no_npz_is_one_sentence(tmp_path, content):
    (tmp_path / "f.npz").write_bytes(content)
    with pytest.raises(ValueError, match=r"f\.npz is not a features file \(.*\); pass a .npz written by features"):
        load_features(tmp_path / "f.npz")


@pytest.mark.parametrize("column,values,message", [
    ("label", ["a", None, "b"], r"its 'label' column holds nulls where features.py writes strings"),
    ("path", [None, "b/1.png", "a/2.png"], r"its 'path' column holds nulls"),
    ("embedding", ["1,2", "3,4", "5,6"], r"its 'embedding' column is string where features.py writes lists of "
                                         r"floats"),
    ("embedding", [[[1.0, 2.0]]] * 3, r"its 'embedding' column is list<\w+: list<\w+: double>>"),
])
def test_a_parquet_file_of_other_columns_is_one_sentence(tmp_path, column, values, message):
    """A null label became a class named 'None' (and counted in the top-1), a nested list a flattened width, a
    string column numpy's own message: each column is checked for what features.py writes, polars' large types
    included."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {"path": ["a/0.png", "b/1.png", "a/2.png"], "label": ["a", "b", "a"],
            "embedding": [[1.0, 0.0], [0.0, 1.0], [1.0, 0.5]]}
    pq.write_table(pa.table({**cols, column: values}), tmp_path / "f.parquet")
    with pytest.raises(ValueError, match=message):
        load_features(tmp_path / "f.parquet")
    pq.write_table(pa.table({k: pa.array(v, pa.large_string() if k != "embedding" else pa.large_list(pa.float32()))
                             for k, v in cols.items()}), tmp_path / "large.parquet")
    assert load_features(tmp_path / "large.parquet")["labels"].tolist() == ["a", "b", "a"]
    pq.write_table(pa.table({k: pa.array([], pa.string() if k != "embedding" else pa.list_(pa.float32()))
                             for k in cols}), tmp_path / "empty.parquet")
    with pytest.raises(ValueError, match=r"empty.parquet holds no rows"):
        load_features(tmp_path / "empty.parquet")
