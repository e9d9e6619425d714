"""Any folder layout: torchvision's flat root/<class>/* trains; evaluate.py scores any split or folder and says
which; a data key the chosen dataset ignores is refused."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import TINY, import_script, make_image_folder, run_script

from vit.config import ConfigError, check_dataset_keys, load_config
from vit.data import build_datasets, is_flat_folder


def _flat(tmp_path, n=10):
    """make_image_folder's train/ moved up: root/<class>/*."""
    split = make_image_folder(tmp_path / "split", n_train=n, n_val=3)
    shutil.copytree(split / "train", tmp_path / "flat")
    return tmp_path / "flat", split


def test_a_flat_class_folder_is_held_out_like_a_folder_without_val(tmp_path):
    flat, split = _flat(tmp_path)
    assert is_flat_folder(flat) and not is_flat_folder(split)
    base = {"data.dataset": "imagefolder", "model.img_size": 32, "data.val_fraction": 0.3}
    tr, va, classes = build_datasets(load_config(None, {**base, "data.root": str(flat)}))
    (split / "val").rename(tmp_path / "val-aside")  # the same images as train/ of a folder without val/
    tr2, va2, classes2 = build_datasets(load_config(None, {**base, "data.root": str(split)}))
    assert classes == classes2 == ["cat", "dog", "fox"]
    names = lambda ds: [(p.parent.name, p.name) for p, _ in ds.samples]  # noqa: E731
    assert names(tr) == names(tr2) and names(va) == names(va2)  # the same seeded, stratified split
    assert len(va) == 9 and sorted(y for _, y in va.samples) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("key, value", [("data.val_split", "test"), ("data.synthetic_train_size", 10),
                                        ("data.download", False), ("data.image_column", "img")])
def test_a_key_the_dataset_ignores_is_refused(key, value):
    cfg = load_config(None, {"data.dataset": "imagefolder", "data.root": "x", key: value})
    with pytest.raises(ConfigError, match=rf"'{key}' is read only with data.dataset .*'imagefolder', which would "
                                          "ignore it"):
        check_dataset_keys(cfg)
    check_dataset_keys(load_config(None, {"data.dataset": "imagefolder", "data.root": "x", "data.val_fraction": 0.3}))
    check_dataset_keys(load_config("configs/default.yaml", {"data.dataset": "synthetic"}))  # kept defaults pass


def test_train_refuses_an_ignored_key_in_one_sentence_before_writing(tmp_path):
    r = run_script("train.py", "--data.dataset=synthetic", "--data.val_split=test", f"--run.output_dir={tmp_path}")
    assert r.returncode == 2 and "'data.val_split' is read only with data.dataset wds / hf" in r.stderr
    assert "Traceback" not in r.stderr and not any(tmp_path.iterdir())


@pytest.mark.slow
def test_flat_folder_trains_and_evaluate_scores_any_split_or_folder(tmp_path, capsys):
    flat, split = _flat(tmp_path, n=6)
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={flat}", "--data.val_fraction=0.5",
                   f"--run.output_dir={tmp_path}", "--run.epochs=1", *TINY)
    assert r.returncode == 0, r.stderr
    assert "3 channels (RGB)" in r.stdout and "9 train / 9 val images" in r.stdout
    ckpt = str(tmp_path / "default" / "best")
    evaluate = import_script("evaluate")

    def score(*args):
        out = tmp_path / f"ev{len(list(tmp_path.glob('ev*')))}"
        assert evaluate.main(["--checkpoint", ckpt, "--out", str(out), *args]) == 0
        return json.loads((out / "metrics.json").read_text()), capsys.readouterr().out

    m, out = score()  # the held-out half training scored
    assert m["n"] == 9 and "split val (9 images)" in m["data"] and f"scoring {m['data']}" in out
    m, out = score("--data-dir", str(split / "val"))
    assert m["n"] == 9 and m["data"] == f"folder {split / 'val'} (9 images)" and m["data"] in out
    (split / "val").rename(split / "test")
    m, _ = score("--split", "test", f"--data.root={split}")
    assert m["n"] == 9 and m["data"] == f"folder {split / 'test'} (9 images)"
    m, _ = score("--split", "train")
    assert m["n"] == 9 and "split train" in m["data"]
    with pytest.raises(ConfigError, match="'data.val_split' is read only"):
        evaluate.main(["--checkpoint", ckpt, "--data.val_split=test"])
