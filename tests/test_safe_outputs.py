"""What predict, evaluate and visualize write: checked, spreadsheet-safe, escaped, one run per --out."""

# What predict, evaluate and visualize write: checked writable before inference, spreadsheet-safe CSV cells,
# undecodable file names as escapes, no control characters on the console, one run at a time per --out, and no
# stale output of an earlier run beside the new one.

import csv
import os

import pytest
import torch
from helpers import TINY, import_script, make_image_folder

from vit.cli.outputs import OutputError
from vit.config import load_config
from vit.models.build import build_model
from vit.models.checkpoint import save_checkpoint
from vit.utils.atomic import atomic_write_csv

NASTY = ["=cmd|' /C calc'!A0", "\x1b[2J\x1b[31mred", "a\x00b"]


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("safe")
    cfg = load_config(None, [*TINY, "--model.depth=1"])
    torch.manual_seed(0)
    model = build_model(cfg, 3)
    save_checkpoint(tmp / "ck", model, cfg, NASTY)
    images = make_image_folder(tmp / "img", classes=("x",), n_train=0, n_val=3, size=32) / "val/x"
    for name in ("=1+1.png", "@SUM(A1).png", os.fsdecode(b"caf\xe9.png")):
        os.link(images / "000.png", images / name)
    return tmp / "ck", images


def _cells(path):
    with open(path, encoding="utf-8", newline="") as f:  # valid UTF-8, or this raises
        return list(csv.reader(f))


def test_the_csv_writer_neutralises_formulas_and_escapes_nul_and_undecodable_names(tmp_path):
    rows = [{"v": v} for v in ("=1+1", "+1+cmd", "-1+cmd", "@A1", "\tx", "\rx", "\nx", "a\x00b",
                               os.fsdecode(b"\xe9.png"), "ok")]
    rows += [{"v": -1.5}, {"v": 3}, {"v": "-2.5"}]  # numbers (and text that is one) are no formula: kept
    atomic_write_csv(tmp_path / "t.csv", ["v"], rows)
    assert [c[0] for c in _cells(tmp_path / "t.csv")[1:]] == [
        "'=1+1", "'+1+cmd", "'-1+cmd", "'@A1", "'\tx", "'\rx", "'\nx", "a\\x00b", "\\xe9.png", "ok",
        "-1.5", "3", "-2.5"]


def test_predict_writes_one_safe_row_per_image_and_prints_no_escape_sequences(ck, tmp_path, monkeypatch, capsys):
    checkpoint, images = ck
    predict = import_script("predict")
    monkeypatch.chdir(images)  # relative names: the path cell starts with the file name's own first character
    names = sorted(os.listdir("."))
    assert predict.main(["--checkpoint", str(checkpoint), *names, "--out", str(tmp_path / "p"), "--topk", "3"]) == 0
    rows = _cells(tmp_path / "p/predictions.csv")
    header, body = rows[0], rows[1:]
    paths = [r[header.index("path")] for r in body]
    assert len(body) == len(names) == 6
    assert "'=1+1.png" in paths and "'@SUM(A1).png" in paths and "caf\\xe9.png" in paths
    shown = {r[header.index(f"pred{k}_name")] for r in body for k in (1, 2, 3)}
    assert shown == {"'=cmd|' /C calc'!A0", "\x1b[2J\x1b[31mred", "a\\x00b"}
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x00" not in out and "a\\x00b" in out


def test_evaluate_csvs_are_spreadsheet_safe_and_its_table_prints_no_escape_sequences(tmp_path, capsys):
    classes = ["=cmd", "@z", "\x1b[2Jclear"]
    data = make_image_folder(tmp_path / "data", classes=classes, n_train=1, n_val=1, size=32)
    cfg = load_config(None, [*TINY, "--model.depth=1", "--data.dataset=imagefolder", f"--data.root={data}"])
    save_checkpoint(tmp_path / "ck", build_model(cfg, 3), cfg, sorted(classes))
    evaluate = import_script("evaluate")
    assert evaluate.main(["--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "e")]) == 0
    per_class = [r[0] for r in _cells(tmp_path / "e/per_class.csv")[1:]]
    assert per_class == ["\x1b[2Jclear", "'=cmd", "'@z"]
    preds = _cells(tmp_path / "e/predictions.csv")
    assert {r[preds[0].index("label_name")] for r in preds[1:]} == {"\x1b[2Jclear", "'=cmd", "'@z"}
    assert "\x1b" not in capsys.readouterr().out


@pytest.mark.parametrize("script", ["predict", "evaluate", "visualize_attention"])
def test_an_out_folder_below_a_file_is_refused_before_any_inference(ck, tmp_path, script, monkeypatch):
    checkpoint, images = ck
    module = import_script(script)
    for name in ("predict_files", "predict", "attention_maps"):  # the inference each script runs
        if hasattr(module, name):
            monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("inference ran before the check"))
    (tmp_path / "file").write_text("x")
    bad = str(tmp_path / "file/below")
    args = {"predict": [str(images)], "evaluate": [], "visualize_attention": [str(images / "000.png")]}[script]
    if script == "evaluate":
        args = ["--data.dataset=imagefolder", f"--data.root={images.parent.parent}"]
    with pytest.raises(OutputError, match=r"cannot write to --out .*below.*Not a directory"):
        module.main(["--checkpoint", str(checkpoint), *args, "--out", bad])


def test_a_second_predict_into_a_busy_out_is_refused_and_a_stale_lock_is_taken_over(ck, tmp_path):
    import subprocess
    import sys

    checkpoint, images = ck
    predict = import_script("predict")
    out = tmp_path / "p"
    out.mkdir()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / ".vit-out.lock").write_text(f"{alive.pid}\n")
        with pytest.raises(OutputError, match=rf"in use by another run \(pid {alive.pid}\)"):
            predict.main(["--checkpoint", str(checkpoint), str(images), "--out", str(out)])
    finally:
        alive.kill()
        alive.wait()
    # the holder is gone: its lock is stale
    assert predict.main(["--checkpoint", str(checkpoint), str(images), "--out", str(out)]) == 0
    assert not (out / ".vit-out.lock").exists()


def test_a_new_predict_leaves_no_output_of_the_previous_one(ck, tmp_path):
    checkpoint, images = ck
    predict = import_script("predict")
    out = tmp_path / "p"
    assert predict.main(["--checkpoint", str(checkpoint), str(images / "000.png"), "--out", str(out),
                         "--format", "json", "--cam"]) == 0
    assert (out / "predictions.json").is_file() and list((out / "cam").iterdir())
    (out / "mine.txt").write_text("not predict's")
    assert predict.main(["--checkpoint", str(checkpoint), str(images / "000.png"), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt", "predictions.csv", "skipped.csv"]


def test_printable_escapes_terminal_controls_bidi_overrides_and_undecodable_bytes():
    from vit.utils.untrusted_text import printable

    assert printable("\x1b[2J\x1b]0;title\x07ok") == "\\x1b[2J\\x1b]0;title\\x07ok"
    assert printable("a\u202eb\x00" + os.fsdecode(b"\xff")) == "a\\u202eb\\x00\\xff"
    assert printable("café ☕") == "café ☕"
