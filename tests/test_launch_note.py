"""`accelerate launch --num_processes 2` without --multi_gpu runs one process on a CPU: train.py says so in one line."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from helpers import TINY, run_script

from vit.cli.runtime import single_process_note

ONE = SimpleNamespace(num_processes=1)
SIMPLE = {"ACCELERATE_MIXED_PRECISION": "no", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_the_simple_launchers_signature_is_named_with_the_count():
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "3", "train.py"]
    note = single_process_note(ONE, SIMPLE, launcher)
    assert note.startswith("note: accelerate launch was asked for 3 processes, but without --multi_gpu it started "
                           "only this one") and "--multi_gpu --num_processes 3" in note
    assert "more than one process" in single_process_note(ONE, SIMPLE, ["accelerate", "launch", "train.py"])
    assert single_process_note(ONE, {**SIMPLE, "WORLD_SIZE": "2", "RANK": "0"}, launcher) is None  # torchrun: fine
    assert single_process_note(SimpleNamespace(num_processes=2), SIMPLE, launcher) is None
    assert single_process_note(ONE, {"ACCELERATE_MIXED_PRECISION": "no"}, launcher) is None  # one asked, one ran
    assert single_process_note(ONE, {}, []) is None  # python train.py


@pytest.mark.slow
def test_train_says_one_process_ran(tmp_path):
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no"]
    r = run_script("train.py", "--data.dataset=synthetic", "--data.synthetic_train_size=8",
                   "--data.synthetic_val_size=4", "--run.epochs=1", "--run.max_steps=1", f"--run.output_dir={tmp_path}",
                   *TINY, launcher=launcher, env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("was asked for 2 processes, but without --multi_gpu it started only this one") == 1
    assert "device cpu, 1 process" in r.stdout
