"""predict.py: one row per readable image in input order, equal to evaluate.py's and timm's outputs."""

# predict.py: one row per readable image in input order, equal to evaluate.py's predictions and to timm's
# outputs; broken and non-image files listed in skipped.csv; two processes give the same rows.

import csv
import importlib.util
import json
import sys

import numpy as np
import pytest
import torch
from helpers import ROOT, make_image_folder, run_script

from vit.config import ConfigError, load_config
from vit.data import DataError
from vit.models.build import build_model
from vit.models.checkpoint import CheckpointError, save_checkpoint

SMALL = ["--model.img_size=32", "--model.embed_dim=32", "--model.depth=2", "--model.num_heads=2",
         "--model.mlp_ratio=2", "--aug.eval_crop_pct=0.875", "--aug.interpolation=bicubic"]


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name[:-3] + "_script", ROOT / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


predict = _load_script("predict.py")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A checkpoint (random weights, head scaled so probabilities are far from uniform) and its ImageFolder,
    whose val/b holds a broken PNG and a text file; a list file names one image again and a missing one."""
    tmp = tmp_path_factory.mktemp("pred")
    data = make_image_folder(tmp / "data", classes=("a", "b", "c"), n_train=1, n_val=3, size=40)
    (data / "val/b/001_broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    (data / "val/b/notes.txt").write_text("not an image")
    (data / "list.txt").write_text("# one more\nval/c/000.png\n\nmissing.png\n")
    cfg = load_config(None, ["--data.dataset=imagefolder", f"--data.root={data}", *SMALL])
    torch.manual_seed(0)
    model = build_model(cfg, 3)
    with torch.no_grad():
        model.head.weight.mul_(300.0)
    save_checkpoint(tmp / "ck", model, cfg, ["a", "b", "c"])
    return tmp, data


@pytest.mark.slow
def test_rows_in_order_skipped_listed_and_equal_to_evaluate(setup, tmp_path):
    tmp, data = setup
    assert predict.main(["--checkpoint", str(tmp / "ck"), str(data / "val"), str(data / "list.txt"),
                         "--topk", "3", "--out", str(tmp_path / "p")]) == 0
    rows = _read(tmp_path / "p/predictions.csv")
    good = sorted(str(p) for p in (data / "val").rglob("*.png") if "broken" not in p.name)
    assert [r["path"] for r in rows] == good + [str(data / "val/c/000.png")]  # input order, list after folder
    skipped = {r["path"]: r["reason"] for r in _read(tmp_path / "p/skipped.csv")}
    assert set(skipped) == {str(data / "val/b/001_broken.png"), str(data / "val/b/notes.txt"),
                            str(data / "missing.png")}
    reason = skipped[str(data / "val/b/001_broken.png")]
    assert "cannot identify image file" in reason and "001_broken.png" in reason
    assert "not an image" in skipped[str(data / "val/b/notes.txt")]
    # evaluate.py on the same checkpoint and images is the oracle: same classes, same printed probabilities
    r = run_script("evaluate.py", "--checkpoint", str(tmp / "ck"), "--topk", "3", "--out", str(tmp_path / "e"))
    assert r.returncode == 0, r.stderr[-3000:]
    ev = {e["sample"]: e for e in _read(tmp_path / "e/predictions.csv")}
    assert len(ev) == 9
    for row in rows:
        e = ev[row["path"]]
        for k in ("pred1", "pred1_name", "pred2", "pred2_name", "pred3"):
            assert row[k] == e[k], (row["path"], k)
        for k in ("prob1", "prob2", "prob3"):  # batches differ in size: allow the last printed digit
            assert abs(float(row[k]) - float(e[k])) <= 2e-6, (row["path"], k)
    assert max(float(r["prob1"]) for r in rows) > 0.6  # not near-uniform: the comparison above means something


@pytest.mark.slow
def test_timm_named_weights_imagenet_names_and_timm_oracle(tmp_path):
    import timm
    from safetensors.torch import save_file

    from vit.data import resolve_data_config
    from vit.data.transforms import build_transform

    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32).eval()
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    imgs = make_image_folder(tmp_path / "img", classes=("x",), n_train=0, n_val=3, size=50) / "val"
    assert predict.main(["--model", "vit_tiny_patch16_224", "--weights", str(tmp_path / "w.safetensors"),
                         "--img-size", "32", str(imgs), "--format", "json", "--out", str(tmp_path / "p")]) == 0
    out = json.loads((tmp_path / "p/predictions.json").read_text())
    assert [o["path"] for o in out] == [str(p) for p in sorted(imgs.rglob("*.png"))]
    cfg = resolve_data_config(load_config(None, ["--model.img_size=32"]), ref.pretrained_cfg)  # timm's own cfg
    t = build_transform(cfg.aug, 32, train=False)
    with torch.no_grad():
        p = ref(torch.stack([t.load(o["path"]) for o in out])).softmax(-1)
    top_p, top_i = p.topk(5, dim=1)
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    for o, ps, idx in zip(out, top_p, top_i):
        assert [k["index"] for k in o["topk"]] == idx.tolist()
        np.testing.assert_allclose([k["prob"] for k in o["topk"]], ps.numpy(), atol=1e-6)
        assert o["topk"][0]["class"] == info.index_to_description(int(idx[0]))  # ImageNet names, not indices


def test_jsonl_and_cam_overlays(setup, tmp_path):
    tmp, data = setup
    args = ["--checkpoint", str(tmp / "ck"), str(data / "val/a"), "--topk", "2", "--out", str(tmp_path / "p")]
    assert predict.main(args + ["--format", "jsonl", "--cam"]) == 0
    lines = [json.loads(s) for s in (tmp_path / "p/predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(len(x["topk"]) == 2 for x in lines)
    for x in lines:
        png = open(x["cam"], "rb").read()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    assert predict.main(args) == 0  # csv: the same probabilities, 6 decimals
    for x, row in zip(lines, _read(tmp_path / "p/predictions.csv")):
        assert x["path"] == row["path"] and abs(x["topk"][0]["prob"] - float(row["prob1"])) < 1e-6


def test_empty_and_unreadable_inputs_are_one_sentence(setup, tmp_path):
    tmp, data = setup
    ck = ["--checkpoint", str(tmp / "ck"), "--out", str(tmp_path / "p")]
    with pytest.raises(DataError, match="no images given"):
        predict.main(ck)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty/readme.md").write_text("x")
    with pytest.raises(DataError, match="no image files found"):
        predict.main(ck + [str(tmp_path / "empty")])
    with pytest.raises(DataError, match=r"none of the 1 input file\(s\) could be read"):
        predict.main(ck + [str(data / "val/b/001_broken.png")])
    assert len(_read(tmp_path / "p/skipped.csv")) == 1
    with pytest.raises(ConfigError, match="--weights"):
        predict.main(["--model", "vit_tiny_patch16_224", str(data / "val")])
    with pytest.raises(CheckpointError, match="does not exist"):
        predict.main(["--checkpoint", str(tmp_path / "nope"), str(data / "val")])


@pytest.mark.slow
def test_two_processes_give_the_same_rows(setup, tmp_path):
    tmp, data = setup
    args = ["--checkpoint", str(tmp / "ck"), str(data / "val"), str(data / "list.txt"), "--batch-size", "2"]
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(_free_port())]
    r = run_script("predict.py", *args, "--out", str(tmp_path / "two"), launcher=launcher,
                   env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 process(es)" in r.stdout
    assert predict.main(args + ["--out", str(tmp_path / "one")]) == 0
    two, one = _read(tmp_path / "two/predictions.csv"), _read(tmp_path / "one/predictions.csv")
    assert len(two) == len(one) == 10  # 11 inputs, 1 unreadable: padding or a lost row would show
    for a, b in zip(two, one):  # the launcher runs one thread per process: allow the last printed digit
        assert {k: v for k, v in a.items() if "prob" not in k} == {k: v for k, v in b.items() if "prob" not in k}
        assert all(abs(float(a[k]) - float(b[k])) <= 2e-6 for k in a if k.startswith("prob"))
    assert _read(tmp_path / "two/skipped.csv") == _read(tmp_path / "one/skipped.csv")


def test_bad_counts_and_an_output_file_are_one_sentence_before_anything_is_written(tmp_path):
    """predict.py and export.py check the options every front-end shares as evaluate.py does (vit.cli.runtime)."""
    taken = tmp_path / "taken.png"
    taken.write_bytes(b"not a folder")
    cases = [(["--batch-size", "0"], "--batch-size must be at least 1"),
             (["--img-size", "-3"], "--img-size must be at least 1"),
             (["--out", str(taken)], "is an existing file")]
    for extra, message in cases:
        with pytest.raises(ValueError, match=message):
            predict.main(["--checkpoint", str(tmp_path / "none"), str(tmp_path), *extra])
    export = _load_script("export.py")
    with pytest.raises(ValueError, match="is an existing file"):
        export.main(["--checkpoint", str(tmp_path / "none"), "--out", str(taken)])
    assert taken.read_bytes() == b"not a folder" and sorted(p.name for p in tmp_path.iterdir()) == ["taken.png"]


def test_pipes_devices_and_empty_folders_are_listed_not_dropped(tmp_path):
    import os

    from vit.cli.images import collect_images

    d = tmp_path / "in"
    (d / "empty").mkdir(parents=True)
    os.mkfifo(d / "fifo.png")
    (d / "rand.png").symlink_to("/dev/urandom")
    (d / "ok.png").write_bytes(b"x")
    paths, skipped = collect_images([str(d), str(d / "fifo.png"), str(d / "empty")])
    reasons = {(p, r.split(" (")[0]) for p, r in skipped}
    assert paths == [d / "ok.png"]
    assert reasons == {(str(d / "empty"), "an empty folder"), (str(d / "fifo.png"), "not a regular file"),
                       (str(d / "rand.png"), "not a regular file")}
    assert len(skipped) == 4  # the FIFO once from the folder and once named
