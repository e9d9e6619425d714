"""Bad images and datasets: converted or skipped, counted and named, or refused in one sentence before training."""

# Bad images and bad datasets: converted or skipped, counted and named, or refused in one sentence before
# training starts.

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY, make_image_folder, run_script
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vit.config import load_config
from vit.data import DataError, build_datasets
from vit.data.decode import BadImageError, decode_image


def _bad_folder(root):
    make_image_folder(root, classes=("a", "b"), n_train=3, n_val=2, size=40)
    d = root / "train" / "a"
    rgb = (np.random.default_rng(0).random((40, 48, 3)) * 255).astype(np.uint8)
    (d / "zero.png").write_bytes(b"")
    (d / "text.jpg").write_text("this is not a jpeg")
    good = d / "000.png"
    (d / "truncated.png").write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    Image.fromarray(rgb).convert("CMYK").save(d / "cmyk.jpg")
    Image.fromarray(rgb[..., 0].astype(np.uint16) * 257).save(d / "sixteen.png")
    Image.fromarray(rgb).convert("P").save(d / "palette.png")
    Image.fromarray(np.dstack([rgb, rgb[..., :1]])).save(d / "rgba.png")
    Image.fromarray(rgb[..., 0]).save(d / "gray.png")
    rot = Image.fromarray(rgb[:, :20])
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees
    rot.save(d / "exif.jpg", exif=exif.tobytes())
    Image.fromarray(np.zeros((3000, 4000, 3), dtype=np.uint8)).save(d / "large.jpg", quality=50)
    return root


def test_convertible_images_convert_and_bad_ones_are_named(tmp_path):
    root = _bad_folder(tmp_path / "f")
    d = root / "train" / "a"
    for name in ("cmyk.jpg", "sixteen.png", "palette.png", "rgba.png", "gray.png", "exif.jpg", "large.jpg"):
        arr = decode_image(d / name)
        assert arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3, name
    assert decode_image(d / "exif.jpg").shape[:2] == (20, 40)  # EXIF orientation applied
    assert decode_image(d / "sixteen.png").max() > 200  # 16-bit scaled, not clipped to white
    assert decode_image(d / "large.jpg", max_side=224).shape[0] < 3000  # decoded at a reduced scale
    for name in ("zero.png", "text.jpg", "truncated.png"):
        with pytest.raises(BadImageError, match=name):
            decode_image(d / name)


def test_a_class_with_only_unreadable_images_is_refused_like_an_empty_one(tmp_path):
    from vit.config import load_config
    from vit.data import DataError, build_datasets
    from vit.data.shards import write_shards

    root = make_image_folder(tmp_path / "f", classes=("cat", "dog"), n_train=2, n_val=1, size=16)
    (root / "train/emu").mkdir()
    (root / "train/emu/only.png").write_bytes(b"not a png")
    cfg = load_config("configs/default.yaml", ["--data.dataset=imagefolder", f"--data.root={root}",
                                               "--model.img_size=16", "--model.patch_size=8"])
    with pytest.raises(DataError, match=r"every image of class folder .*emu is unreadable.*only.png"):
        build_datasets(cfg)
    with pytest.raises(DataError, match=r"every image of class folder .*emu is unreadable"):
        write_shards(root, tmp_path / "s", shard_size=4)
    assert not list((tmp_path / "s").glob("*.tar"))


def test_bad_images_are_named_by_file_and_listed_once(tmp_path, caplog):
    from vit.config import load_config
    from vit.data import FolderDataset
    from vit.data.decode import decode_bytes
    from vit.train.console import describe_data

    with pytest.raises(BadImageError) as e:
        decode_bytes(b"not an image", "shard.tar:x.png")
    assert "BytesIO" not in str(e.value) and str(e.value).startswith("cannot decode image shard.tar:x.png: ")
    root = make_image_folder(tmp_path / "f", classes=("cat",), n_train=2, n_val=0, size=16)
    (root / "train/cat/text.jpg").write_text("not a jpeg")
    ds = FolderDataset(root / "train", ["cat"], None)
    caplog.set_level("INFO")
    assert len(ds.check("skip")) == 1 and "text.jpg" not in caplog.text  # named once, by the data line
    line = describe_data(load_config("configs/default.yaml", []), ds, ds, ["cat"])
    assert line.count("text.jpg") == 2 and "skipped 1 unreadable train image(s)" in line  # once per split


@pytest.mark.slow
def test_training_skips_bad_images_or_stops_before_training(tmp_path):
    root = _bad_folder(tmp_path / "f")
    out = tmp_path / "runs"
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={root}", f"--run.output_dir={out}",
                   "--run.name=skip", "--run.epochs=1", *TINY)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "skipped 3 unreadable train image(s)" in r.stdout
    for name in ("zero.png", "text.jpg", "truncated.png"):
        assert name in r.stdout
    assert "13 train" in r.stdout  # 6 generated + 7 convertible
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={root}", f"--run.output_dir={out}",
                   "--run.name=err", "--run.epochs=1", "--data.on_bad_image=error", *TINY)
    assert r.returncode == 2 and "unreadable image" in r.stderr and "Traceback" not in r.stderr
    assert not (out / "err").exists()


@pytest.mark.slow
def test_empty_class_and_missing_split(tmp_path):
    root = make_image_folder(tmp_path / "f", classes=("a", "b"), n_train=2, n_val=1)
    (root / "train" / "empty").mkdir()
    out = f"--run.output_dir={tmp_path / 'runs'}"  # never the checkout's runs/default (`make train` leaves one)
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={root}", out, *TINY)
    assert r.returncode == 2 and "holds no images" in r.stderr
    (root / "train" / "empty").rmdir()

    shutil.rmtree(root / "val")  # no val/: a held-out share of train/, which 2 images per class cannot give
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={root}", out, *TINY)
    assert r.returncode == 2 and "no val/ folder" in r.stderr and "class 'a' has 2" in r.stderr
    shutil.rmtree(root / "train")
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={root}", out, *TINY)
    assert r.returncode == 2 and "train" in r.stderr and "does not exist" in r.stderr


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xe0", b"GIF89a", b"BM", b"RIFF", b""]),
       st.binary(max_size=300))
def test_fuzz_image_decoding_gives_image_or_clean_error(tmp_path_factory, header, body):
    p = tmp_path_factory.mktemp("fz") / "x.png"
    p.write_bytes(header + body)
    try:
        arr = decode_image(p)
        assert arr.ndim == 3 and arr.shape[2] == 3
    except BadImageError:
        pass


def _png_bomb(w: int, h: int) -> bytes:
    """A valid 16-bit grayscale PNG of zeros, w x h, in ~500 KB for 16000 x 16000 (2 bytes a pixel, 512 MB raw):
    one compressed block of 100 rows, full-flushed so that it can be repeated."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"\0" * ((1 + 2 * w) * 100)
    c = zlib.compressobj(9, wbits=-15)
    block = c.compress(rows) + c.flush(zlib.Z_FULL_FLUSH)
    adler = 1
    for _ in range(h // 100):
        adler = zlib.adler32(rows, adler)
    stream = b"\x78\xda" + block * (h // 100) + zlib.compressobj(9, wbits=-15).flush() + struct.pack(">I", adler)
    header = struct.pack(">IIBBBBB", w, h, 16, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", stream) + chunk(b"IEND", b"")


def test_bombs_fifos_devices_and_hidden_entries(tmp_path):
    root = make_image_folder(tmp_path / "f", classes=("a", "b"), n_train=2, n_val=1, size=16)
    d = root / "train" / "a"
    (d / "bomb.png").write_bytes(_png_bomb(16000, 16000))
    small = tmp_path / "small.png"
    small.write_bytes(_png_bomb(300, 200))  # the same construction decodes when small: the bomb is real
    assert decode_image(small).shape == (200, 300, 3)
    with pytest.raises(BadImageError, match="MAX_SAMPLE_BYTES"):
        decode_image(d / "bomb.png")
    os.mkfifo(d / "fifo.png")
    os.symlink("/dev/zero", d / "zero.png")
    result = {}
    t = threading.Thread(target=lambda: result.update(
        {n: pytest.raises(BadImageError, decode_image, d / n) for n in ("fifo.png", "zero.png")}), daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "reading a FIFO or a device file hung"
    assert all("not a regular file" in str(e.value) for e in result.values())
    hidden = root / "train" / ".ipynb_checkpoints"
    hidden.mkdir()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(hidden / "x.png")
    (root / "val" / ".ipynb_checkpoints").mkdir()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(root / "val" / "b" / "._x.png")
    cfg = load_config(None, ["--data.dataset=imagefolder", f"--data.root={root}", *TINY])
    train, val, classes = build_datasets(cfg)
    assert classes == ["a", "b"] and len(val) == 2  # neither the hidden folder nor the hidden file
    assert len(train) == 4 and sorted(Path(b.split(": ")[0].split()[-1]).name for b in train.bad) == \
        ["bomb.png", "fifo.png", "zero.png"]  # counted and named


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_split_without_one_usable_image_is_refused_before_training(tmp_path, split):
    root = make_image_folder(tmp_path / "f", classes=("a", "b"), n_train=2, n_val=1, size=16)
    for p in (root / split).rglob("*.png"):
        p.write_bytes(b"not an image")
    cfg = load_config(None, ["--data.dataset=imagefolder", f"--data.root={root}", *TINY])
    with pytest.raises(DataError, match=f"no usable image in {root / split}: all .* are unreadable"):
        build_datasets(cfg)


class _Refusing(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        raise DataError("mask /data/m.png holds the values [7]; fix the mask or the class list.")


def test_an_error_raised_in_a_loader_worker_is_said_in_its_own_words(capsys):
    """torch re-raises a worker's DataError with the worker's traceback as its message; run_cli prints the sentence
    alone (exit 2), as when it is raised in the main process."""
    from vit.cli.runtime import run_cli, worker_message

    def main():
        next(iter(torch.utils.data.DataLoader(_Refusing(), num_workers=1)))

    with pytest.raises(DataError) as caught:
        main()
    assert "Original Traceback" in str(caught.value)  # what torch gives
    assert worker_message(caught.value) == "mask /data/m.png holds the values [7]; fix the mask or the class list."
    assert worker_message(ValueError("a plain one")) == "a plain one"
    with pytest.raises(SystemExit) as code:
        run_cli(main)
    assert code.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: mask /data/m.png holds the values [7]; fix the mask or the class list.\n"
