"""Run folders and training states: exact resume after a crash, no silent overwrite, nothing unpickled."""

# Run folders and training states: exact resume after a crash, no silent overwrite, one training per
# folder, a resume that checks what it resumes, nothing unpickled, nothing non-finite saved.

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, TINY, run_script
from safetensors.torch import load_file

from vit.cli.runtime import make_accelerator
from vit.config import ConfigError, load_config
from vit.models.build import build_model
from vit.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from vit.train.engine import TrainState
from vit.train.optim import build_optimizer
from vit.train.runfolder import (
    RunFolderError,
    RunLock,
    check_new_run,
    clear_run,
    kept_note,
    resume_run,
    save_run_state,
    saved_checkpoints,
)
from vit.train.state import latest_state, verify_state
from vit.train.state import sha256 as _sha256

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


SMALL = ["--data.dataset=synthetic", "--data.synthetic_train_size=24", "--data.synthetic_val_size=8",
         "--run.epochs=2", "--run.save_state_every=1", *TINY]


class _Evil:
    """Unpickling this creates `path`: proof that a load ran code."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A run Ctrl-C'ed at step 3, after saving states at steps 1 and 2 (one tiny training, shared)."""
    out = tmp_path_factory.mktemp("runs")
    r = run_script("train.py", *SMALL, f"--run.output_dir={out}", "--run.name=r",
                   env={"VIT_FAULT_INJECT": "sigint@step:3"})
    return out / "r", r


def _copy_run(saved_run, tmp_path) -> Path:
    run = tmp_path / "r"
    shutil.copytree(saved_run[0], run, ignore=shutil.ignore_patterns(".lock"))
    return run


def _resume_in_process(run: Path, *overrides: str):
    """train.py's own resume path, on a freshly prepared tiny model and optimizer."""
    from vit.cli.runtime import make_accelerator
    from vit.data import resolve_data_config
    from vit.models.build import build_model
    from vit.train.optim import build_optimizer

    cfg = resolve_data_config(load_config(  # as train.py: the preprocessing filled in, as the saved config has it
        ROOT / "configs/default.yaml",
        [*SMALL, f"--run.output_dir={run.parent}", f"--run.name={run.name}", *overrides]))
    accelerator = make_accelerator()
    model = build_model(cfg, cfg.data.synthetic_num_classes)
    model, optimizer = accelerator.prepare(model, build_optimizer(model, cfg.optim))
    state = TrainState()
    resume_run(accelerator, cfg, run, state, None)
    return state


def test_ctrl_c_exits_cleanly_and_says_what_was_kept(saved_run):
    run, r = saved_run
    assert r.returncode == 130, r.stderr[-2000:]
    err = re.findall(r"interrupted \(Ctrl-C\).*", r.stderr)  # after tqdm's last \r, on its line
    assert len(err) == 1 and "Traceback" not in r.stderr and "Error" not in r.stderr
    assert "state/step-00000002" in err[0] and "--resume=auto" in err[0]
    assert sorted(p.name for p in (run / "state").iterdir()) == ["step-00000001", "step-00000002"]
    names = set(verify_state(run / "state/step-00000002")["files"])
    assert not [n for n in names if n.startswith("custom_checkpoint")]  # nothing Accelerate would unpickle
    assert {"train_state.json", "config.yaml", "model.safetensors", "optimizer.bin"} <= names
    saved = json.loads((run / "state/step-00000002/train_state.json").read_text())
    assert saved["step"] == 2 and saved["batch_in_epoch"] == 2 and saved["loss_n"] == 2 and saved["loss_sum"] > 0


def _forge_manifest(state: Path, name: str) -> None:
    """Rewrite COMPLETE so that a planted `name` passes the hash check: only the loaders stand in the way."""
    from vit.train.state import sha256 as _sha256

    manifest = json.loads((state / "COMPLETE").read_text())
    manifest["files"][name] = [(state / name).stat().st_size, _sha256(state / name)]
    (state / "COMPLETE").write_text(json.dumps(manifest))


@pytest.mark.parametrize("forge", [False, True], ids=["planted", "planted-and-manifest-forged"])
def test_a_pickle_planted_in_any_state_file_runs_nothing(saved_run, tmp_path, forge):
    marker = tmp_path / "pwned.txt"
    source = saved_run[0] / "state/step-00000002"
    names = sorted(verify_state(source)["files"]) + ["custom_checkpoint_0.pkl"]  # + Accelerate's old pickle
    for name in names:
        run = tmp_path / f"r-{name}"
        shutil.copytree(saved_run[0], run, ignore=shutil.ignore_patterns(".lock"))
        state = run / "state/step-00000002"
        torch.save({"state": _Evil(str(marker))}, state / name)
        if not forge:
            with pytest.raises(CheckpointError, match="did not write|not the file that was saved"):
                verify_state(state)
            warnings = []
            assert latest_state(run, warn=warnings.append).name == "step-00000001"  # the older one instead
            assert name in warnings[0]
            continue
        _forge_manifest(state, name)  # each loader refuses it: safetensors, JSON, YAML, weights_only=True
        with pytest.raises((CheckpointError, ConfigError), match="unreadable|not an RNG state|not UTF-8"):
            _resume_in_process(run, f"--run.resume={state}")
        assert not marker.exists(), name
    assert not marker.exists()


def test_a_damaged_newest_state_falls_back_to_the_older_one(saved_run, tmp_path):
    run = _copy_run(saved_run, tmp_path)
    opt = run / "state/step-00000002/optimizer.bin"
    opt.write_bytes(opt.read_bytes()[: opt.stat().st_size // 2])  # truncated, COMPLETE still there
    state = _resume_in_process(run, "--run.resume=auto")
    assert state.step == 1 and state.batch_in_epoch == 1
    assert "resumed from step-00000001" in (run / "resume.log").read_text()
    rng = run / "state/step-00000001/random_states_0.pkl"
    rng.write_bytes(b"\0" * rng.stat().st_size)  # same size, other bytes
    with pytest.raises(CheckpointError, match="no saved state .* is intact"):
        latest_state(run)


def test_a_state_file_changed_in_place_at_the_same_size_is_refused(tmp_path):
    """verify_state reads every file's SHA-256, not only its size: one byte flipped in the weights is found
    (the fallback test above corrupts an RNG file, which the RNG load check would refuse anyway)."""
    state = tmp_path / "step-00000001"
    state.mkdir()
    (state / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    (state / "train_state.json").write_text(json.dumps({"step": 1}))
    files = {f.name: [f.stat().st_size, _sha256(f)] for f in sorted(state.iterdir())}
    (state / "COMPLETE").write_text(json.dumps({"step": 1, "files": files}))
    assert set(verify_state(state)["files"]) == {"model.safetensors", "train_state.json"}
    data = bytearray((state / "model.safetensors").read_bytes())
    data[100] ^= 1  # the same size, one bit different
    (state / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors is not the file that was saved"):
        verify_state(state)


def test_resume_refuses_a_changed_config_and_records_a_safe_change(saved_run, tmp_path):
    run = _copy_run(saved_run, tmp_path)
    with pytest.raises(RunFolderError) as e:
        _resume_in_process(run, "--run.resume=auto", "--data.batch_size=4", "--model.embed_dim=64",
                           "--optim.lr=0.01")
    msg = str(e.value)
    assert "data.batch_size (8 -> 4)" in msg and "model.embed_dim (32 -> 64)" in msg and "optim.lr" in msg
    assert "\n" not in msg and not (run / "resume.log").exists()
    state = _resume_in_process(run, "--run.resume=auto", "--run.epochs=5")
    assert state.step == 2
    assert "changed run.epochs 2 -> 5" in (run / "resume.log").read_text()


def test_an_existing_run_is_never_silently_overwritten(saved_run, tmp_path):
    run = _copy_run(saved_run, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    r = run_script("train.py", *SMALL, f"--run.output_dir={tmp_path}", "--run.name=r")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "already holds a run" in err[0] and "--resume=auto" in err[0]
    assert "--run.overwrite=true" in err[0] and "--run.name" in err[0]
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing touched
    other = tmp_path / "other"
    (other / "state").mkdir(parents=True)
    with pytest.raises(RunFolderError, match="not a state of run"):  # another run's state into this one
        check_new_run(run, str(other / "state/step-00000002"), False)
    check_new_run(run, "auto", False)
    check_new_run(run, None, True)
    (run / ".lock").write_text("1\n")
    (run / "notes.txt").write_text("mine")
    clear_run(run)  # what run.overwrite=true does, under the lock
    assert sorted(p.name for p in run.iterdir()) == [".lock", "notes.txt"]


def test_a_folder_without_checkpoints_is_not_a_run_to_protect(tmp_path):
    run = tmp_path / "r"
    (run / "tensorboard").mkdir(parents=True)
    (run / "config.yaml").write_text("run:\n  name: r\n")
    (run / "state/step-00000003").mkdir(parents=True)  # killed while saving: no COMPLETE marker
    check_new_run(run, None, False)
    assert "no checkpoint had been saved" in kept_note(run)
    (run / "last").mkdir()
    with pytest.raises(RunFolderError, match="already holds a run"):
        check_new_run(run, None, False)
    assert "(last/) is untouched" in kept_note(run)


@pytest.mark.slow
def test_a_run_that_saved_nothing_does_not_block_its_name(tmp_path):
    args = [*SMALL, f"--run.output_dir={tmp_path}", "--run.name=r", "--run.epochs=1"]
    r = run_script("train.py", *args, env={"VIT_FAULT_INJECT": "nan:0"})  # stopped before any checkpoint
    assert r.returncode == 2 and "non-finite at step" in r.stderr and "Traceback" not in r.stderr
    assert "no checkpoint had been saved" in r.stderr and "last good checkpoint" not in r.stderr
    assert (tmp_path / "r/config.yaml").is_file() and not saved_checkpoints(tmp_path / "r")
    check_new_run(tmp_path / "r", None, False)  # a plain rerun is not refused
    # --resume=auto has no state to continue: it starts afresh with the NEW config (another data size)
    r = run_script("train.py", *args, "--run.resume=auto", "--run.max_steps=1", "--data.synthetic_train_size=16")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "reusing" in r.stdout and "starting fresh" in r.stdout
    assert "synthetic_train_size: 16" in (tmp_path / "r/config.yaml").read_text()
    assert not (tmp_path / "r/resume.log").exists()
    assert "last/" in kept_note(tmp_path / "r")


def test_a_run_folder_is_locked_and_a_stale_lock_is_taken_over(tmp_path):
    run = tmp_path / "r"
    lock = RunLock(run)
    with pytest.raises(RunFolderError, match=f"in use by another training \\(pid {os.getpid()}\\)"):
        RunLock(run)
    lock.release()
    # a training SIGKILLed while holding the lock: the kernel released it, the next one takes it
    code = ("import fcntl, os, signal, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'99999'); os.kill(os.getpid(), signal.SIGKILL)")
    assert subprocess.run([sys.executable, "-c", code, str(run / ".lock")]).returncode == -signal.SIGKILL
    RunLock(run).release()


def test_a_second_training_into_a_locked_run_folder_is_refused(tmp_path):
    lock = RunLock(tmp_path / "r")  # as a running training holds it
    r = run_script("train.py", *SMALL, f"--run.output_dir={tmp_path}", "--run.name=r")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "in use by another training" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [".lock"]
    lock.release()


def test_no_checkpoint_with_non_finite_weights_and_classes_must_be_a_list(tmp_path):
    import vit

    cfg = load_config(None, [*TINY, "--model.depth=1"])
    model = vit.create_model("vit_tiny_patch16_224", img_size=32, embed_dim=32, depth=1, num_heads=2,
                             mlp_ratio=2, num_classes=2)
    ck = save_checkpoint(tmp_path / "ck", model, cfg, ["a", "b"])
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="head.weight holds non-finite"):
        save_checkpoint(tmp_path / "nan", model, cfg, ["a", "b"])
    assert not (tmp_path / "nan").exists()
    (ck / "classes.json").write_text('{"a": 0, "b": 1}')
    with pytest.raises(CheckpointError, match="classes.json must hold a non-empty list"):
        load_checkpoint(ck)


def test_ema_weights_and_the_running_loss_round_trip_through_a_state(tmp_path):
    from timm.utils import ModelEmaV3

    from vit.cli.runtime import make_accelerator
    from vit.models.build import build_model
    from vit.train.optim import build_optimizer
    from vit.train.runfolder import save_run_state

    cfg = load_config(ROOT / "configs/default.yaml", [*SMALL, f"--run.output_dir={tmp_path}", "--run.name=e",
                                                      "--optim.ema=true"])
    accelerator = make_accelerator()
    model = build_model(cfg, 4)
    model, optimizer = accelerator.prepare(model, build_optimizer(model, cfg.optim))
    ema = ModelEmaV3(model, decay=0.5)
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(1.0)  # EMA differs from the model, so a mix-up would show
    saved = {k: v.clone() for k, v in ema.state_dict().items()}
    state = TrainState(step=3, epoch=1, batch_in_epoch=2, best=[[0.5, 0]])
    save_run_state(accelerator, cfg, tmp_path / "e", state, model, ema, torch.tensor(2.5), 2)
    names = sorted(p.name for p in (tmp_path / "e/state/step-00000003").iterdir())
    assert "ema.safetensors" in names and [n for n in names if n.endswith(".pkl")] == ["random_states_0.pkl"]
    with torch.no_grad():
        for p in ema.parameters():
            p.zero_()
    back = TrainState()
    resume_run(accelerator, load_config(ROOT / "configs/default.yaml", [
        *SMALL, f"--run.output_dir={tmp_path}", "--run.name=e", "--optim.ema=true", "--run.resume=auto"]),
        tmp_path / "e", back, ema)
    assert all(torch.equal(saved[k], v) for k, v in ema.state_dict().items())
    assert (back.step, back.epoch, back.batch_in_epoch, back.best, back.loss_sum, back.loss_n) == (3, 1, 2, [[0.5, 0]],
                                                                                                     2.5, 2)


# --- A training state records its process count; resuming it with another count (another global batch) is refused


def test_resuming_a_state_saved_by_another_process_count_is_refused(tmp_path):
    args = [*TINY, "--model.depth=1", "--data.dataset=synthetic", f"--run.output_dir={tmp_path}", "--run.name=r"]
    cfg = load_config(None, args)
    accelerator = make_accelerator()
    model = build_model(cfg, 10)
    model, optimizer = accelerator.prepare(model, build_optimizer(model, cfg.optim))
    save_run_state(accelerator, cfg, tmp_path / "r", TrainState(step=2, batch_in_epoch=2), model, None, 1.5, 2)
    state = latest_state(tmp_path / "r")
    saved = json.loads((state / "train_state.json").read_text())
    assert saved["num_processes"] == 1
    resume_run(accelerator, load_config(None, [*args, "--run.resume=auto"]), tmp_path / "r", TrainState(), None)

    # the same state as two processes would have written it (its manifest rewritten to match)
    saved.update(num_processes=2, loss_sums=[1.5, 1.5])
    (state / "train_state.json").write_text(json.dumps(saved))
    manifest = json.loads((state / "COMPLETE").read_text())
    manifest["files"]["train_state.json"] = [(state / "train_state.json").stat().st_size,
                                             _sha256(state / "train_state.json")]
    (state / "COMPLETE").write_text(json.dumps(manifest))
    with pytest.raises(RunFolderError, match=r"with 1 process: it was saved by 2 processes.*--num_processes 2"):
        resume_run(accelerator, load_config(None, [*args, "--run.resume=auto"]), tmp_path / "r", TrainState(), None)
