"""Crash safety, bad images, bad input, numerical faults, untrusted files, fuzzing."""

import csv
import json
import pickle
import signal

import numpy as np
import pytest
import torch
from helpers import TINY, make_image_folder, run_script
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from safetensors.torch import load_file

from vit.config import ConfigError, from_dict
from vit.data.decode import BadImageError, decode_image
from vit.models.checkpoint import load_checkpoint

SYN = ["--data.dataset=synthetic", "--data.synthetic_train_size=40", "--data.synthetic_val_size=12",
       "--run.epochs=3", "--model.drop_path_rate=0.1", "--aug.random_resized_crop=true", *TINY]


def _steps(run):
    with open(run / "metrics.csv") as f:
        return [int(r["step"]) for r in csv.DictReader(f)]


def _column(run, name):
    with open(run / "metrics.csv") as f:
        return [r[name] for r in csv.DictReader(f)]


@pytest.mark.slow
def test_sigkill_at_many_points_then_resume_equals_uninterrupted(tmp_path):
    common = [*SYN, f"--run.output_dir={tmp_path}", "--run.save_state_every=2"]
    ref = run_script("train.py", *common, "--run.name=ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    # between steps, inside a state save (files written, not renamed), inside a checkpoint save, late in a run
    kills = ["step:3", "state:6", "checkpoint:10", "step:13"]
    for point in kills:
        r = run_script("train.py", *common, "--run.name=k", "--resume=auto", env={"VIT_FAULT_INJECT": point})
        assert r.returncode == -signal.SIGKILL, (point, r.stderr[-2000:])
        if (tmp_path / "k/last").is_dir():  # whatever was complete before the kill still loads
            load_checkpoint(tmp_path / "k/last")
    done = run_script("train.py", *common, "--run.name=k", "--resume=auto")
    assert done.returncode == 0, done.stderr[-3000:]
    a = load_file(str(tmp_path / "ref/last/model.safetensors"))
    b = load_file(str(tmp_path / "k/last/model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _steps(tmp_path / "k") == _steps(tmp_path / "ref") == [5, 10, 15]  # none repeated, none skipped
    # killed mid-epoch 0 (step 3, state at 2): the epoch's train loss still covers all of its batches
    assert _column(tmp_path / "k", "train_loss") == _column(tmp_path / "ref", "train_loss")
    assert not list((tmp_path / "k/state").glob(".tmp-*"))


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
    from train import describe_data
    from vit.config import load_config
    from vit.data import FolderDataset
    from vit.data.decode import decode_bytes

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


@pytest.mark.parametrize("args,needle", [
    (["--data.dataset=imagefolder", "--data.root=/nonexistent/folder"], "does not exist"),
    (["--run.output_dir=/proc/forbidden"], "cannot write to the output folder"),
    (["--model.patch_size=7"], "model.patch_size"),
    (["--model.num_heads=5", "--model.embed_dim=32"], "model.num_heads"),
    (["--data.batch_size=0"], "data.batch_size"),
    (["--optim.lr=-0.1"], "optim.lr"),
    (["--optim.lrr=0.1"], "optim.lrr"),
    (["--run.epochs=many"], "run.epochs"),
])
def test_bad_arguments_give_one_sentence_and_write_nothing(tmp_path, args, needle):
    out = tmp_path / "runs"
    r = run_script("train.py", f"--run.output_dir={out}", *args, *(["--run.output_dir=/proc/forbidden"]
                   if "--run.output_dir=/proc/forbidden" in args else []))
    assert r.returncode == 2, r.stderr[-2000:]
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "Traceback" not in r.stderr
    assert not out.exists()


@pytest.mark.slow
def test_empty_class_and_missing_split(tmp_path):
    root = make_image_folder(tmp_path / "f", classes=("a", "b"), n_train=2, n_val=1)
    (root / "train" / "empty").mkdir()
    out = f"--run.output_dir={tmp_path / 'runs'}"  # never the checkout's runs/default (`make train` leaves one)
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={root}", out, *TINY)
    assert r.returncode == 2 and "holds no images" in r.stderr
    (root / "train" / "empty").rmdir()
    import shutil

    shutil.rmtree(root / "val")  # no val/: a held-out share of train/, which 2 images per class cannot give
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={root}", out, *TINY)
    assert r.returncode == 2 and "no val/ folder" in r.stderr and "class 'a' has 2" in r.stderr
    shutil.rmtree(root / "train")
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={root}", out, *TINY)
    assert r.returncode == 2 and "train" in r.stderr and "does not exist" in r.stderr


def test_checkpoint_from_another_architecture_for_fine_tuning(tmp_path):
    import timm
    from safetensors.torch import save_file

    save_file(timm.create_model("vit_small_patch16_224", depth=2).state_dict(), str(tmp_path / "w.safetensors"))
    r = run_script("train.py", f"--model.pretrained={tmp_path / 'w.safetensors'}", f"--run.output_dir={tmp_path}/r",
                   *TINY)
    assert r.returncode == 2 and "another architecture" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_non_finite_loss(tmp_path, mode):
    args = [*SYN, f"--run.output_dir={tmp_path}", "--run.name=n", f"--run.on_nonfinite={mode}"]
    r = run_script("train.py", *args, env={"VIT_FAULT_INJECT": "nan:7"})
    if mode == "stop":
        assert r.returncode == 2 and "non-finite at step 7" in r.stderr and "Traceback" not in r.stderr
        meta = json.loads((tmp_path / "n/last/meta.json").read_text())
        assert meta["step"] == 5  # the epoch-1 checkpoint is untouched and loads
        load_checkpoint(tmp_path / "n/last")
    else:
        assert r.returncode == 0, r.stderr[-2000:]
        with open(tmp_path / "n/metrics.csv") as f:
            assert [r["skipped_steps"] for r in csv.DictReader(f)] == ["0", "1", "1"]


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_crafted_pickle_is_refused_everywhere(tmp_path):
    import vit

    marker = tmp_path / "pwned.txt"
    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        pickle.dump({"state_dict": {"x": _Evil(str(marker))}}, f)
    model = vit.create_model("vit_tiny_patch16_224", depth=1, img_size=32)
    with pytest.raises(ValueError, match="refusing to load"):
        vit.load_pretrained(model, evil)
    assert not marker.exists()
    data = make_image_folder(tmp_path / "f", classes=("a", "b"), n_train=1, n_val=1)
    r = run_script("evaluate.py", "--model", "vit_tiny_patch16_224", "--weights", str(evil),
                   "--data.dataset=imagefolder", f"--data.root={data}")
    assert r.returncode == 2 and "refusing to load" in r.stderr and not marker.exists()
    # a checkpoint folder whose weights file is a pickle: the rollout script refuses it too
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(evil.read_bytes())
    (ck / "config.yaml").write_text("model:\n  img_size: 32\n  depth: 1\n")
    (ck / "classes.json").write_text('["a", "b"]')
    r = run_script("visualize_attention.py", "--checkpoint", str(ck), str(data / "val"), "--out",
                   str(tmp_path / "a"))
    assert r.returncode == 2 and "unreadable" in r.stderr and not marker.exists()


# --- fuzzing ------------------------------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=5),
                    st.lists(st.floats(-2, 2), max_size=4))
sections = st.sampled_from(["model", "data", "aug", "optim", "run", "bogus"])
keys = st.sampled_from(["lr", "img_size", "batch_size", "dataset", "epochs", "mean", "hflip", "name", "zzz",
                        "patch_size", "num_heads", "scale", "on_bad_image", "mixed_precision", "layer_decay"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(sections, st.one_of(scalars, st.dictionaries(keys, scalars, max_size=4)), max_size=4))
def test_fuzz_config_loading_gives_config_or_clean_error(data):
    try:
        from_dict(data)
    except ConfigError as e:
        assert str(e) and "\n" not in str(e)


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
