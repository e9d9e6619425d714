"""A shard sample's .cls label outside 0..n-1 gets a sentence that points the right way (a negative one is the
shard's fault, not data.num_classes')."""

import io
import tarfile

import pytest
from helpers import make_image_folder

from vit.config import load_config
from vit.data import DataError
from vit.shards import resolve_split, write_shards
from vit.transforms import build_transform
from vit.wds import ShardDataset


def test_a_negative_label_blames_the_shard(tmp_path):
    folder = make_image_folder(tmp_path / "f", classes=("a", "b"), n_train=2, n_val=1, size=16)
    out = tmp_path / "s"
    write_shards(folder, out, shard_size=4)
    shard = out / "val-00000.tar"
    members = []
    with tarfile.open(shard) as t:
        for m in t.getmembers():
            data = t.extractfile(m).read()
            if m.name.endswith(".cls") and not any(n.endswith(".cls") for n, _, _ in members):
                data = b"-1"
                m.size = len(data)
            members.append((m.name, m, data))
    with tarfile.open(shard, "w") as t:
        for _, m, data in members:
            t.addfile(m, io.BytesIO(data))
    t = build_transform(load_config(None, {"model.img_size": 16}).aug, 16, False)
    ds = ShardDataset(resolve_split(str(out), "val"), ["a", "b"], t, train=False, img_size=16)
    with pytest.raises(DataError, match=r"has label -1.*negative.*fix the shard's \.cls") as e:
        list(ds)
    assert "at least 0" not in str(e.value)
