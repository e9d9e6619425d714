"""Damaged or hostile shards give one sentence or a skipped sample, never a tarfile traceback."""

# Damaged or hostile shards give one sentence or a skipped sample, never a tarfile traceback, a memory blow-up
# or an evaluation padded forever: truncated, empty and non-tar shards, oversized, linked and device members,
# and sample counts a shard cannot hold.

import io
import json
import tarfile

import numpy as np
import pytest
from helpers import make_image_folder
from PIL import Image

from vit.config import AugConfig, load_config
from vit.data import DataError
from vit.data.shard_loader import SKIPPED, ShardDataset
from vit.data.shards import ShardSplit, resolve_split, write_shards
from vit.data.transforms import build_transform


def _png(colour=(200, 40, 40)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((12, 12, 3), colour, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _member(tar, name: str, data: bytes = b"", kind=tarfile.REGTYPE, **extra) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
    for k, v in extra.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


SPECIAL = (tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE)


def _shard(path, samples, mode="w") -> str:
    """samples: [(key, image member kind or bytes, label)]; a kind other than bytes makes the image member a
    link (SYMTYPE, LNKTYPE) or a device (CHRTYPE, BLKTYPE, FIFOTYPE)."""
    with tarfile.open(path, mode) as tar:
        for key, image, y in samples:
            if image in SPECIAL:  # (tarfile's type codes are one-byte bytes themselves)
                _member(tar, f"{key}.png", kind=image, linkname="/etc/passwd")
            else:
                _member(tar, f"{key}.png", image)
            _member(tar, f"{key}.cls", str(y).encode())
    return str(path)


def _dataset(urls, lengths, train=False) -> ShardDataset:
    t = build_transform(AugConfig().resolved(), 16, train)
    return ShardDataset(ShardSplit(tuple(urls), tuple(lengths)), ["a", "b"], t, train, img_size=16)


def _eval_indices(ds) -> list[int]:
    return [int(i) for _, _, i in ds._samples(0, 0, 0)]


@pytest.mark.parametrize("damage", ["empty", "truncated", "not-a-tar", "truncated-gzip"])
def test_a_damaged_shard_gives_one_sentence(tmp_path, damage):
    good = _shard(tmp_path / "good.tar", [(f"k{i}", _png(), i % 2) for i in range(3)])
    data = open(good, "rb").read()
    bad = tmp_path / "bad.tar"
    if damage == "empty":
        bad.write_bytes(b"")
    elif damage == "truncated":
        bad.write_bytes(data[:700])  # inside the first member's data
    elif damage == "not-a-tar":
        bad.write_bytes(b"this is a text file, not a tar\n" * 40)
    else:
        gz = _shard(tmp_path / "g.tar.gz", [(f"k{i}", _png(), 0) for i in range(3)], mode="w:gz")
        packed = open(gz, "rb").read()
        bad.write_bytes(packed[:len(packed) // 2])  # inside the compressed members
    ds = _dataset([str(bad)], [0 if damage == "empty" else 1])
    with pytest.raises(DataError, match="is not a readable tar file") as e:
        _eval_indices(ds)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)


def test_a_shard_cut_at_a_member_boundary_is_named(tmp_path, caplog):
    """tarfile reads a tar cut between members as a shorter archive: the count the shard falls short of says so."""
    good = _shard(tmp_path / "good.tar", [(f"k{i}", _png(), 0) for i in range(3)])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(open(good, "rb").read()[:2048])  # exactly the first sample (two members of 1024 bytes)
    with caplog.at_level("WARNING"):
        assert _eval_indices(_dataset([str(cut)], [3])) == [0, -1, -1]
    assert f"shard {cut} holds 1 samples, not the 3 listed: it is truncated" in caplog.text


def test_members_over_the_limit_are_skipped_unread(tmp_path, monkeypatch):
    """A gzip shard whose member would inflate past the limit: that sample is skipped (counted), never read."""
    monkeypatch.setattr("vit.data.shard_samples.MAX_MEMBER_BYTES", 4096, raising=False)
    big = _png() + bytes(20_000)  # a PNG with 20 kB of trailing zeros: decodable, but over the (patched) limit
    url = _shard(tmp_path / "s.tar.gz", [("k0", _png(), 0), ("k1", big, 1), ("k2", _png(), 1)], mode="w:gz")
    assert _eval_indices(_dataset([url], [3])) == [0, SKIPPED, 2]
    train = [y for _, y in _dataset([url], [3], train=True)._samples(0, 0, 0)]
    assert len(train) == 3  # the bad one replaced by a good one of its block, as an unreadable image is


@pytest.mark.parametrize("kind", SPECIAL)
def test_link_and_device_members_are_bad_samples(tmp_path, kind):
    url = _shard(tmp_path / "s.tar", [("k0", _png(), 0), ("k1", kind, 1), ("k2", _png(), 1)])
    assert _eval_indices(_dataset([url], [3])) == [0, SKIPPED, 2]
    assert len(list(_dataset([url], [3], train=True)._samples(0, 0, 0))) == 3


def _info_folder(tmp_path, lengths) -> str:
    url = _shard(tmp_path / "val-00000.tar", [(f"k{i}", _png(), 0) for i in range(3)])
    info = {"splits": {"val": {"name": "val", "filenames": ["val-00000.tar"], "shard_lengths": lengths}},
            "classes": ["a", "b"]}
    (tmp_path / "_info.json").write_text(json.dumps(info))
    return url


@pytest.mark.parametrize("length", [10**9, -3, 2.5, "3", True, None])
def test_impossible_or_malformed_shard_lengths_are_refused(tmp_path, length):
    _info_folder(tmp_path, [length])
    with pytest.raises(DataError, match="holds at most|shard length of"):
        resolve_split(str(tmp_path), "val")


def test_a_count_after_the_pattern_that_the_files_cannot_hold_is_refused(tmp_path):
    _shard(tmp_path / "x-0.tar", [("k0", _png(), 0)])
    with pytest.raises(DataError, match="holds at most"):
        resolve_split(str(tmp_path), "x-{0..0}.tar|1000000000")
    assert resolve_split(str(tmp_path), "x-{0..0}.tar|1").num_samples == 1


def test_an_honest_count_still_pads_a_short_reader(tmp_path):
    """The bound leaves the counts a shard can hold alone: a count of 4 for a 3-sample shard pads one."""
    url = _info_folder(tmp_path, [4])
    s = resolve_split(str(tmp_path), "val")
    assert s.urls == (url,) and _eval_indices(_dataset(s.urls, s.lengths)) == [0, 1, 2, -1]


@pytest.mark.parametrize("text", ["[]", '{"splits": {}, "classes": 5}', '{"splits": {}, "classes": [1, 2]}'])
def test_an_info_file_that_is_not_an_index_is_one_sentence(tmp_path, text):
    from vit.data.shards import read_info

    (tmp_path / "_info.json").write_text(text)
    with pytest.raises(DataError, match="is not a shard index"):
        read_info(str(tmp_path))


def test_an_oversized_info_file_is_refused_unread(tmp_path, monkeypatch):
    from vit.data.shards import read_info

    monkeypatch.setattr("vit.data.shards.MAX_INFO_BYTES", 100, raising=False)
    (tmp_path / "_info.json").write_text(json.dumps({"splits": {}, "pad": "x" * 200}))
    with pytest.raises(DataError, match="larger than 100 bytes"):
        read_info(str(tmp_path))


# --- A shard sample's .cls label outside 0..n-1 gets a sentence that points the right way (a negative one is the


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
