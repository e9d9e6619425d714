"""Folder entries: a non-UTF-8 class folder is refused, predict names linked or unreadable subfolders."""

# Folder entries that cannot round-trip or be read: a class folder whose name is not UTF-8 is refused before
# training, and predict names a linked or unreadable subfolder in skipped.csv instead of passing over it.

import csv
import os
from pathlib import Path

import pytest
from helpers import TINY, import_script, make_image_folder
from PIL import Image

from vit.cli.images import collect_images
from vit.config import load_config
from vit.data import DataError, build_datasets
from vit.data.shards import write_shards
from vit.models.build import build_model
from vit.models.checkpoint import save_checkpoint


def test_a_class_folder_name_that_is_not_utf8_is_refused_at_start(tmp_path):
    root = make_image_folder(tmp_path / "f", classes=("a", "b"), n_train=2, n_val=1, size=16)
    for split in ("train", "val"):  # b'caf\xe9' (Latin-1): Python holds it as 'caf\udce9', which no JSON can save
        os.rename(root / split / "b", os.fsencode(root / split) + b"/caf\xe9")
    cfg = load_config(None, [*TINY, "--data.dataset=imagefolder", f"--data.root={root}"])
    with pytest.raises(DataError, match=r"class folder b'caf\\xe9' in .* is not UTF-8 text.*rename the folder"):
        build_datasets(cfg)
    with pytest.raises(DataError, match="is not UTF-8 text"):
        write_shards(root, tmp_path / "s", shard_size=2)


def _tiny_checkpoint(folder: Path) -> Path:
    cfg = load_config(None, TINY)
    return save_checkpoint(folder, build_model(cfg, 10), cfg, [str(i) for i in range(10)])


def test_linked_and_unreadable_subfolders_get_a_line_in_skipped_csv(tmp_path, monkeypatch):
    photos = tmp_path / "photos"
    (photos / "ok").mkdir(parents=True)
    Image.new("RGB", (16, 16), (10, 200, 30)).save(photos / "ok" / "a.png")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Image.new("RGB", (16, 16), (200, 20, 30)).save(elsewhere / "b.png")
    (photos / "linked").symlink_to(elsewhere, target_is_directory=True)
    (photos / "locked").mkdir()
    Image.new("RGB", (16, 16), (20, 20, 200)).save(photos / "locked" / "c.png")
    scandir = os.scandir

    def denied(path="."):  # chmod 000 does not stop root, so the refusal is simulated where it would happen
        if not isinstance(path, int) and os.fspath(path).endswith("locked"):  # rmtree scans by descriptor
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", denied)
    paths, skipped = collect_images([str(photos)])
    assert paths == [photos / "ok" / "a.png"]
    reasons = dict(skipped)
    assert "link to a folder" in reasons[str(photos / "linked")]
    assert "unreadable folder" in reasons[str(photos / "locked")]
    ck = _tiny_checkpoint(tmp_path / "ck")
    assert import_script("predict").main(["--checkpoint", str(ck), str(photos), "--out", str(tmp_path / "p")]) == 0
    with open(tmp_path / "p" / "skipped.csv") as f:
        rows = {r["path"]: r["reason"] for r in csv.DictReader(f)}
    assert set(rows) == {str(photos / "linked"), str(photos / "locked")}
