"""Tar shards: written from an ImageFolder, read back exactly, dealt to processes and workers, resumed."""

# Sharded data: shards written from an ImageFolder read back as the same images and labels (by us, by
# webdataset, by timm's own wds/ reader), epochs dealt exactly over processes x workers, evaluation once per
# sample, a mid-epoch SIGKILL + resume that reopens no finished shard, Hugging Face datasets on disk.

import contextlib
import io
import json
import logging
import re
import signal
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from helpers import TINY, make_image_folder, run_script
from PIL import Image
from safetensors.torch import load_file

from vit.config import ConfigError, load_config
from vit.data import DataError, FolderDataset
from vit.data.decode import decode_image
from vit.data.shard_loader import TRACE_ENV, ShardDataset, ShardLoader, worker_consumed
from vit.data.shards import plan_epoch, resolve_split, write_shards
from vit.data.transforms import build_transform

CLASSES = ["cat", "dog", "fox"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """24 train images (8 per class) and 15 val; one JPEG kept as JPEG, one BMP (to become PNG)."""
    root = make_image_folder(tmp_path_factory.mktemp("wds") / "f", n_train=8, n_val=5)
    Image.open(root / "train/dog/001.png").convert("RGB").save(root / "train/dog/001.jpg", quality=90)
    (root / "train/dog/001.png").unlink()
    Image.open(root / "train/fox/002.png").save(root / "train/fox/002.bmp")
    (root / "train/fox/002.png").unlink()
    return root


@pytest.fixture(scope="module")
def shards(folder):
    out = folder.parent / "s"
    write_shards(folder, out, shard_size=3)
    return out


def _tar_samples(path):
    import webdataset as wds

    return list(wds.tarfile_to_samples()(iter([{"url": str(path)}])))


def test_shards_hold_the_original_bytes_and_labels(folder, shards):
    info = json.loads((shards / "_info.json").read_text())
    assert info["classes"] == CLASSES
    tr, va = info["splits"]["train"], info["splits"]["val"]
    assert (tr["num_samples"], tr["shard_lengths"], va["shard_lengths"]) == (24, [3] * 8, [3] * 5)
    assert tr["filenames"][0] == "train-00000.tar" and va["filenames"][-1] == "val-00004.tar"
    seen = {}
    for split, s in (("train", tr), ("val", va)):
        for name, n in zip(s["filenames"], s["shard_lengths"]):
            samples = _tar_samples(shards / name)
            assert len(samples) == n
            for smp in samples:
                rel = json.loads(smp["json"])["filename"]
                ext = next(k for k in ("jpg", "png", "webp") if k in smp)
                seen[(split, rel)] = (ext, smp[ext], int(smp["cls"]))
    files = sorted(p for p in folder.rglob("*.*"))
    assert len(seen) == len(files) == 39  # every image once, nothing else
    for p in files:
        split, rel = p.relative_to(folder).parts[0], p.relative_to(folder / p.relative_to(folder).parts[0])
        ext, data, y = seen[(split, rel.as_posix())]
        assert y == CLASSES.index(rel.parts[0])
        if p.suffix == ".bmp":  # re-encoded losslessly: same pixels
            assert ext == "png" and np.array_equal(decode_image(p), np.asarray(Image.open(io.BytesIO(data))))
        else:  # original bytes, no re-encode
            assert ext == {".jpg": "jpg", ".png": "png"}[p.suffix] and data == p.read_bytes()
    with pytest.raises(DataError, match="already holds shards"):
        write_shards(folder, shards, shard_size=3)


def test_write_shards_checks_every_split_before_writing_and_overwrite_leaves_no_stale_shard(folder, tmp_path):
    import shutil

    noval = tmp_path / "noval"
    shutil.copytree(folder / "train", noval / "train")
    with pytest.raises(DataError, match="--splits train"):
        write_shards(noval, tmp_path / "a", shard_size=5)
    extra = tmp_path / "extra"
    shutil.copytree(folder, extra)
    (extra / "val/emu").mkdir()
    shutil.copy(folder / "val/cat/000.png", extra / "val/emu/000.png")
    with pytest.raises(DataError, match="class the train split does not have"):
        write_shards(extra, tmp_path / "b", shard_size=5)
    assert not any((tmp_path / d).exists() and any((tmp_path / d).iterdir()) for d in ("a", "b"))  # nothing written
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataError, match="is a file"):
        write_shards(folder, tmp_path / "afile", shard_size=5)
    out = tmp_path / "s"
    write_shards(folder, out, shard_size=3)  # 8 train + 5 val shards
    info = write_shards(folder, out, shard_size=10, overwrite=True)  # 3 + 2
    assert sorted(p.name for p in out.iterdir()) == sorted([*info["splits"]["train"]["filenames"],
                                                            *info["splits"]["val"]["filenames"], "_info.json"])
    assert len(list(out.glob("*.tar"))) == 5


def test_shard_reader_gives_the_folder_datasets_tensors(folder, shards):
    """Validation shards keep folder order: sample i is FolderDataset's sample i, pixel for pixel."""
    cfg = load_config("configs/default.yaml", ["--model.img_size=32"])
    t = build_transform(cfg.aug, 32, False)
    ref = FolderDataset(folder / "val", CLASSES, t)
    ds = ShardDataset(resolve_split(str(shards), "val"), CLASSES, t, train=False, img_size=32)
    got = list(ds)
    assert [i for _, _, i in got] == list(range(15))
    for (x, y, _), (x_ref, y_ref) in zip(got, (ref[i] for i in range(15))):
        assert y == y_ref and torch.equal(x, x_ref)
    piped = resolve_split(f"pipe:cat {shards}", "val")  # _info.json and shards through a shell command
    assert piped.urls[0] == f"pipe:cat {shards}/val-00000.tar" and piped.lengths == (3,) * 5
    via_pipe = list(ShardDataset(piped, CLASSES, t, train=False, img_size=32))
    assert all(torch.equal(a[0], b[0]) and a[1:] == b[1:] for a, b in zip(via_pipe, got, strict=True))


def _corrupt(shards, out, name, position):
    """A copy of `shards` in which the image of sample `position` of shard `name` is truncated."""
    import shutil
    import tarfile

    shutil.copytree(shards, out)
    with tarfile.open(shards / name) as src, tarfile.open(out / name, "w") as dst:
        keys = sorted({m.name.split(".")[0] for m in src.getmembers()})
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if m.name.split(".")[0] == keys[position] and m.name.endswith((".png", ".jpg")):
                data = data[: len(data) // 3]
            m.size = len(data)
            dst.addfile(m, io.BytesIO(data))
    return out


def test_unreadable_val_sample_is_dropped_and_counted_not_replaced(shards, tmp_path):
    """Validation must score each readable sample once: the bad one is dropped (index -2), not replaced by its
    neighbour (which would then be scored twice), and vit.eval.metrics.predict counts it as skipped."""
    from vit.eval.metrics import predict

    bad = _corrupt(shards, tmp_path / "bad", "val-00001.tar", 1)  # global sample 4
    cfg = load_config("configs/default.yaml", ["--model.img_size=32"])
    ds = ShardDataset(resolve_split(str(bad), "val"), CLASSES, build_transform(cfg.aug, 32, False), train=False,
                      img_size=32)
    loader = ShardLoader(ds, batch_size=4, num_workers=0, rank=0, world=1)

    class Acc:  # one process: gathering returns what it is given
        autocast = staticmethod(contextlib.nullcontext)
        gather_for_metrics = staticmethod(lambda t: t)

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(3))
    out = predict(model, loader, Acc())
    assert out["index"].tolist() == [i for i in range(15) if i != 4] and out["skipped"] == 1
    train = ShardDataset(resolve_split(str(bad), "val"), CLASSES, build_transform(cfg.aug, 32, True), train=True)
    assert len(list(train)) == 15  # training keeps its quota: the bad image is replaced by the next good one


def test_shard_samples_are_described_by_their_original_file_name(shards):
    ds = ShardDataset(resolve_split(str(shards), "val"), CLASSES, None, train=False)
    assert ds.describe(4) == f"{shards}/val-00001.tar#1 (cat/004.png)"  # predictions.csv's sample column
    far = ShardDataset(resolve_split("https://host/d", "val-{0..1}.tar|6", info={}), CLASSES, None, train=False)
    assert far.describe(4) == "https://host/d/val-1.tar#1"  # remote: not read again just for a name


def test_timm_wds_reader_reads_our_shards(folder, shards):
    import timm.data

    for split in ("train", "val"):
        ds = timm.data.create_dataset("wds/", root=str(shards), split=split, is_training=False)
        got = Counter((np.asarray(img).tobytes(), int(y)) for img, y in ds)
        want = Counter((decode_image(p).tobytes(), CLASSES.index(p.parent.name))
                       for p in (folder / split).rglob("*.*"))
        assert len(ds) == sum(want.values()) and got == want


def test_plan_deals_every_shard_once_with_one_quota():
    for lengths, readers in (([3] * 8, 4), ([3] * 8, 8), ([1252, 1251, 1251, 1251], 2), ([5, 5, 4], 2)):
        quotas = set()
        for epoch in range(4):
            plan = plan_epoch(lengths, readers, epoch, seed=1)
            flat = [i for s in plan.shards for i in s]
            assert sorted(flat) == list(range(len(lengths)))  # each shard to exactly one reader
            assert all(sum(lengths[i] for i in s) >= plan.quota for s in plan.shards)
            quotas.add(plan.quota)
        assert len(quotas) == 1  # the same number of steps every epoch
        if len(lengths) % readers == 0 and len(set(lengths)) == 1:  # divides evenly: the whole split, once
            assert plan.quota * readers == sum(lengths)
    assert plan_epoch([3] * 8, 4, 0, 1).shards != plan_epoch([3] * 8, 4, 1, 1).shards  # reshuffled per epoch
    ev = plan_epoch([3, 3, 3, 3, 3], 4, 0, 1, shuffle=False)
    assert ev.shards == ((0, 4), (1,), (2,), (3,)) and ev.quota == 6  # padded to the longest reader


def test_worker_consumed_counts_round_robin_batches():
    # batches 0, 2, 4 came from worker 0, batches 1, 3 from worker 1
    assert [worker_consumed(5, w, 2, 8, 100) for w in (0, 1)] == [24, 16]
    assert worker_consumed(0, 0, 2, 8, 100) == 0 and worker_consumed(40, 1, 2, 8, 100) == 100


def test_resume_skips_finished_shards_and_yields_the_rest_exactly(shards, tmp_path, monkeypatch):
    """A reader resumed after b batches opens none of the blocks it had finished and yields exactly the tail
    of the uninterrupted stream, with the same augmentation."""
    cfg = load_config("configs/default.yaml", ["--model.img_size=32"])
    t = build_transform(cfg.aug, 32, True)
    ds = ShardDataset(resolve_split(str(shards), "train"), CLASSES, t, train=True, seed=3, shuffle_buffer=3,
                      batch_size=2)
    ds.num_workers = 2
    full = list(ds._samples(epoch=1, start_batch=0, worker=1))
    assert len(full) == 12  # 8 shards of 3 over 2 readers
    trace = tmp_path / "trace"
    monkeypatch.setenv(TRACE_ENV, str(trace))
    tail = list(ds._samples(epoch=1, start_batch=7, worker=1))  # worker 1 gave batches 1, 3, 5: 6 samples
    assert len(tail) == 6 and all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(tail, full[6:]))
    opened = [ln.split()[-1] for ln in trace.read_text().splitlines() if " open " in ln]
    mine = [ds.split.urls[i] for i in ds.plan(1).shards[1]]
    assert opened == mine[2:]  # the two shards it had finished are not opened again


def test_loader_resumed_at_an_odd_batch_gives_the_uninterrupted_batches(shards):
    """With 2 worker processes the batch after an odd resume point is worker 1's: the roles rotate."""
    cfg = load_config("configs/default.yaml", ["--model.img_size=32"])
    ds = ShardDataset(resolve_split(str(shards), "train"), CLASSES, build_transform(cfg.aug, 32, True),
                      train=True, seed=3, shuffle_buffer=3)
    loader = ShardLoader(ds, batch_size=2, num_workers=2, rank=0, world=1)
    loader.set_epoch(2)
    full = list(loader)
    labels = sorted(int(s["cls"]) for u in ds.split.urls for s in _tar_samples(u))
    assert len(full) == len(loader) == 12 and sorted(torch.cat([b[1] for b in full]).tolist()) == labels
    tail = list(loader.skip_first_batches(3))
    assert len(tail) == 9 and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(tail, full[3:]))


def test_wds_config_errors_are_one_sentence(shards):
    with pytest.raises(ConfigError, match="data.root"):
        load_config("configs/default.yaml", ["--data.dataset=wds"])
    with pytest.raises(DataError, match="split 'test' is not in"):
        resolve_split(str(shards), "test")
    with pytest.raises(DataError, match=r"\|<num_samples>"):
        resolve_split(str(shards.parent), "other-{0..3}.tar")
    assert resolve_split(str(shards), "train-{00000..00001}.tar").lengths == (3, 3)  # lengths from _info.json
    far = resolve_split("pipe:curl -s https://host/d", "x-{0..3}.tar|10", info={})  # no _info.json: count spread
    assert far.lengths == (3, 3, 2, 2) and far.urls[0] == "pipe:curl -s https://host/d/x-0.tar"
    ds = ShardDataset(resolve_split(str(shards), "train"), CLASSES, None, train=True)
    with pytest.raises(DataError, match="9 shard readers, but the train split has only 8"):
        ShardLoader(ds, batch_size=2, num_workers=3, rank=0, world=3)


def test_wds_bad_inputs_are_one_sentence_or_a_warning(shards, caplog):
    cfg = load_config("configs/default.yaml", ["--model.img_size=32"])
    t = build_transform(cfg.aug, 32, False)
    with pytest.raises(DataError, match="2 of the 10 shards of 'train-.*' do not exist, first: .*train-00008.tar"):
        resolve_split(str(shards), "train-{00000..00009}.tar|30")  # found at start, not mid-epoch
    two = ShardDataset(resolve_split(str(shards), "val"), CLASSES[:2], t, train=False, img_size=32)
    with pytest.raises(DataError, match=r"has label 2, but there are 2 classes .* data.num_classes to at least 3"):
        list(two)
    with pytest.raises(DataError) as e:  # through a loader worker: our sentence, not the worker's traceback
        list(ShardLoader(two, batch_size=4, num_workers=1, rank=0, world=1))
    assert "Traceback" not in str(e.value) and str(e.value).startswith("sample val_")
    caplog.set_level(logging.WARNING, logger="vit")
    wrong = ShardDataset(resolve_split(str(shards), "val-{00000..00004}.tar|50", info={}), CLASSES, t,
                         train=False, img_size=32)
    assert sum(1 for *_, i in wrong if i >= 0) == 15
    wrong.check_seen(15)
    assert "held 15 samples, not the 50" in caplog.text


def _trace_lines(path, split, kind):
    return [ln.split() for ln in path.read_text().splitlines() if ln.startswith(f"{split} ") and f" {kind} " in ln]


@pytest.mark.slow
def test_two_processes_two_workers_see_each_sample_once(shards, tmp_path):
    trace = tmp_path / "trace"
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", "29541"]
    r = run_script("train.py", "--data.dataset=wds", f"--data.root={shards}", *TINY, "--data.batch_size=2",
                   "--data.num_workers=2", "--data.shuffle_buffer=3", "--run.epochs=1",
                   f"--run.output_dir={tmp_path}", "--run.name=two", launcher=launcher,
                   env={"CUDA_VISIBLE_DEVICES": "", TRACE_ENV: str(trace)})
    assert r.returncode == 0, r.stderr[-3000:]
    seen = Counter(int(f[-1]) for f in _trace_lines(trace, "train", "sample"))
    assert seen == Counter(range(24))  # 8 shards over 4 readers: each of the 24 samples once
    val = Counter(int(f[-1]) for f in _trace_lines(trace, "val", "sample"))
    assert val == Counter(range(15))  # 5 shards over 4 readers: padded to 6 each, the padding not counted
    assert len(re.findall(r"\(15 images\)", r.stdout)) == 1


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_repeats_no_finished_shard(shards, tmp_path):
    common = ["--data.dataset=wds", f"--data.root={shards}", *TINY, "--data.batch_size=2", "--data.num_workers=2",
              "--data.shuffle_buffer=3", "--run.epochs=1", "--run.save_state_every=2", f"--run.output_dir={tmp_path}"]
    ref = run_script("train.py", *common, "--run.name=ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    trace = tmp_path / "trace"
    r = run_script("train.py", *common, "--run.name=k", env={"VIT_FAULT_INJECT": "step:5", TRACE_ENV: str(trace)})
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    before = trace.read_text().splitlines()
    done = run_script("train.py", *common, "--run.name=k", "--resume=auto", env={TRACE_ENV: str(trace)})
    assert done.returncode == 0, done.stderr[-3000:]
    after = trace.read_text().splitlines()[len(before):]
    # 12 steps per epoch; the state saved at step 4 is 4 batches in: each of the two workers had given 2
    # batches (4 samples), so it had finished the first of its one-shard blocks and was inside the second
    ds = ShardDataset(resolve_split(str(shards), "train"), CLASSES, None, train=True, seed=0, shuffle_buffer=3)
    ds.num_workers = 2
    plan = ds.plan(0)
    finished = {ds.split.urls[plan.shards[w][0]] for w in range(2)}
    reopened = [ln.split()[-1] for ln in after if ln.startswith("train 0 open")]
    assert finished <= {ln.split()[-1] for ln in before if ln.startswith("train 0 open")}
    assert len(reopened) == 6 and not finished & set(reopened)  # the 6 unfinished shards, the 2 finished not
    resumed = Counter(int(ln.split()[-1]) for ln in after if ln.startswith("train 0 sample"))
    assert len(resumed) == sum(resumed.values()) == 16  # the 24 - 8 samples not yet trained on, once each
    a = load_file(str(tmp_path / "ref/last/model.safetensors"))
    b = load_file(str(tmp_path / "k/last/model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # and the weights of the uninterrupted run, bit for bit


def test_hf_rows_give_the_folder_datasets_tensors(folder):
    """The hf reader over rows as `datasets` gives them with Image(decode=False): {"bytes", "path"} + label."""
    from vit.data.hf_datasets import HFImageDataset

    cfg = load_config("configs/default.yaml", ["--model.img_size=32"])
    t = build_transform(cfg.aug, 32, True)
    ref = FolderDataset(folder / "train", CLASSES, t, seed=5)
    rows = [{"img": {"bytes": p.read_bytes(), "path": None}, "y": y} if i % 2 else {"img": {"bytes": None,
            "path": str(p)}, "y": y} for i, (p, y) in enumerate(ref.samples)]
    ds = HFImageDataset(rows, "img", "y", CLASSES, t, seed=5)
    ds.set_epoch(1), ref.set_epoch(1)
    for i in range(len(ref)):
        (x, y), (x_ref, y_ref) = ds[i], ref[i]
        assert y == y_ref and torch.equal(x, x_ref)
    with pytest.raises(DataError, match="not encoded images"):
        HFImageDataset([{"img": 3, "y": 0}], "img", "y", CLASSES, t)[0]


def test_hf_without_datasets_says_what_to_install(folder, monkeypatch):
    from vit.data.hf_datasets import load_split

    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(DataError, match="pip install"):
        load_split(folder, "train")


@pytest.mark.slow
def test_hf_save_to_disk_and_parquet_round_trip(folder, tmp_path):
    datasets = pytest.importorskip("datasets")
    from vit.data.hf_datasets import build_hf_datasets

    files = sorted((folder / "val").rglob("*.*"))
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    d = datasets.Dataset.from_dict({"image": [str(p) for p in files],
                                    "label": [CLASSES.index(p.parent.name) for p in files]}, features=feats)
    datasets.DatasetDict({"validation": d}).save_to_disk(str(tmp_path / "hf"))
    (tmp_path / "pq/data").mkdir(parents=True)  # the Hub's parquet layout
    d.to_parquet(str(tmp_path / "pq/data/validation-00000-of-00001.parquet"))
    for root in ("hf", "pq"):
        cfg = load_config("configs/default.yaml", ["--data.dataset=hf", f"--data.root={tmp_path / root}",
                                                   "--data.val_split=validation", "--model.img_size=32"])
        t = build_transform(cfg.aug, 32, False)
        _, val, classes = build_hf_datasets(cfg, None, t, splits=("val",))
        ref = FolderDataset(folder / "val", CLASSES, t)
        assert classes == CLASSES and len(val) == len(ref) == 15, root
        assert all(torch.equal(val[i][0], ref[i][0]) and val[i][1] == ref[i][1] for i in range(15)), root
    with pytest.raises(DataError, match="has no column 'img'"):
        build_hf_datasets(load_config("configs/default.yaml", ["--data.dataset=hf", f"--data.root={tmp_path / 'hf'}",
                          "--data.val_split=validation", "--data.image_column=img"]), None, t, splits=("val",))


def test_hf_single_dataset_holds_out_a_stratified_val_share(folder, tmp_path):
    """A Dataset.save_to_disk folder has no splits: train and val must not be the same rows."""
    datasets = pytest.importorskip("datasets")
    from vit.data.hf_datasets import build_hf_datasets

    files = sorted((folder / "train").rglob("*.*"))
    labels = [CLASSES.index(p.parent.name) for p in files]
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    datasets.Dataset.from_dict({"image": [str(p) for p in files], "label": labels},
                               features=feats).save_to_disk(str(tmp_path / "one"))
    cfg = load_config("configs/default.yaml", ["--data.dataset=hf", f"--data.root={tmp_path / 'one'}",
                                               "--data.val_fraction=0.25", "--model.img_size=32"])
    tr, va, _ = build_hf_datasets(cfg, None, None)
    assert (len(tr), len(va)) == (18, 6)
    rows = lambda ds: [r["image"]["bytes"] for r in ds.table]  # noqa: E731
    assert not set(rows(tr)) & set(rows(va)) and sorted(va.table["label"]) == [0, 0, 1, 1, 2, 2]
    _, again, _ = build_hf_datasets(cfg, None, None, splits=("val",))  # evaluate.py: the same held-out rows
    assert rows(again) == rows(va)
    cfg = load_config("configs/default.yaml", ["--data.dataset=hf", f"--data.root={tmp_path / 'one'}",
                                               "--data.val_fraction=0"])
    with pytest.raises(DataError, match="single Dataset"):
        build_hf_datasets(cfg, None, None)


@pytest.mark.slow
def test_cli_writes_shards_and_refuses_bad_input_in_one_line(folder, tmp_path):
    r = run_script("shards.py", "--from", str(folder), "--out", str(tmp_path / "s"), "--shard-size", "10")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "train: 24 samples in 3 shards" in r.stdout and (tmp_path / "s/train-00002.tar").is_file()
    for args, msg in ((["--from", str(tmp_path / "nope")], "does not exist"),
                      (["--from", str(folder)], "already holds shards")):
        bad = run_script("shards.py", *args, "--out", str(tmp_path / "s"))
        assert bad.returncode == 2 and msg in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


@pytest.mark.slow
def test_bench_shards_script_runs_both_readers(capsys):
    """scripts/bench_shards.py (a maintainer tool) times the folder and the shard reader on the same images."""
    import importlib.util

    from helpers import ROOT

    spec = importlib.util.spec_from_file_location("_bench_shards", ROOT / "scripts" / "bench_shards.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--images", "16", "--repeats", "1", "--batch-size", "8", "--shard-size", "8",
                           "--width", "64", "--height", "48"]) == 0
    finally:
        torch.set_num_threads(threads)  # the script pins one thread for its timing
    out = capsys.readouterr().out
    assert "16 JPEGs of 64x48" in out and "2 shards" in out and "shards / folder:" in out
