"""Hugging Face datasets on disk: labels that are not class indices refused, bad image rows skipped."""

# Hugging Face datasets on disk: labels that are not class indices (floats, text, -1, past the classes) are
# refused at the start in one sentence, and an undecodable image row is skipped as a folder image is.

import io

import numpy as np
import pytest
from PIL import Image

from vit.config import load_config
from vit.data import DataError
from vit.data.transforms import build_transform

datasets = pytest.importorskip("datasets")


def _png(v: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((12, 12, 3), v, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _build(tmp_path, labels, images=None, label_feature=None, on_bad_image="skip"):
    from vit.data.hf_datasets import build_hf_datasets

    images = images or [_png(40 * i % 250) for i in range(len(labels))]
    feats = {"image": datasets.Image()}
    if label_feature is not None:
        feats["label"] = label_feature
    d = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images], "label": labels},
                                   features=datasets.Features(feats) if label_feature is not None else None)
    if label_feature is None:
        d = d.cast_column("image", datasets.Image())
    datasets.DatasetDict({"train": d, "validation": d}).save_to_disk(str(tmp_path / "hf"))
    cfg = load_config(None, ["--data.dataset=hf", f"--data.root={tmp_path / 'hf'}", "--data.val_split=validation",
                             "--data.num_classes=3", "--model.img_size=16", f"--data.on_bad_image={on_bad_image}"])
    t = build_transform(cfg.aug.resolved(), 16, False)
    return build_hf_datasets(cfg, t, t)


@pytest.mark.parametrize("labels, says", [
    ([0, 1.7, 2], "holds float labels"),
    (["cat", "dog", "cat"], "holds text labels"),
    ([0, -1, 2], "label -1 (the Hub's 'no label'"),
    ([0, 3, 2], "has label 3"),
    ([0, 10**12, 2], f"has label {10**12}"),
])
def test_labels_that_are_not_class_indices_are_refused_at_start(tmp_path, labels, says):
    with pytest.raises(DataError, match=r"^[^\n]*" + says.replace("(", r"\(")) as e:
        _build(tmp_path, labels)
    assert "\n" not in str(e.value) and ("label_column" in str(e.value) or "filter" in str(e.value))


def test_integer_labels_and_class_labels_still_load(tmp_path):
    tr, va, classes = _build(tmp_path, [0, 1, 2])
    assert classes == ["0", "1", "2"] and [va[i][1] for i in range(3)] == [0, 1, 2]
    tr, va, classes = _build(tmp_path / "c", [0, 1, 2], label_feature=datasets.ClassLabel(names=["a", "b", "c"]))
    assert classes == ["a", "b", "c"]


def test_an_undecodable_row_is_skipped_not_fatal(tmp_path, caplog):
    images = [_png(10), b"not an image at all", _png(200)]
    tr, va, _ = _build(tmp_path, [0, 1, 2], images=images)
    good = va[2]
    with caplog.at_level("WARNING"):
        x, y = va[1]  # replaced by the next good row, as FolderDataset replaces a file that went bad
    assert y == 2 and np.array_equal(x.numpy(), good[0].numpy())
    assert "validation[1]" in caplog.text and len(va.bad) == 1
    _, va, _ = _build(tmp_path / "e", [0, 1, 2], images=images, on_bad_image="error")
    with pytest.raises(DataError, match=r"validation\[1\] is not a readable image"):
        va[1]
