"""Saves that fail half-way (a full disk, a kill between files) leave the previous save whole and nothing partial."""

import errno
import json
from pathlib import Path

import pytest
import torch
from helpers import TINY
from safetensors.torch import load_file

import vit
import vit.models.checkpoint as checkpoint
from vit.config import load_config
from vit.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from vit.train.state import save_state_atomic, verify_state


class _Accelerator:
    """One process; save_state writes a file and then, if `full`, finds the disk full."""
    is_main_process = True

    def __init__(self, full: bool):
        self.full = full

    def wait_for_everyone(self):
        pass

    def save_state(self, path, safe_serialization=True):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_bytes(b"\0" * 64)
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_during_a_state_save_gives_one_sentence_and_keeps_the_older_state(tmp_path):
    save_state_atomic(_Accelerator(full=False), tmp_path, 2)
    with pytest.raises(CheckpointError) as e:
        save_state_atomic(_Accelerator(full=True), tmp_path, 4)
    msg = str(e.value)
    assert "No space left on device" in msg and "step 4" in msg and "step-00000002" in msg and "\n" not in msg
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["step-00000002"]  # no .tmp-step-* left
    verify_state(tmp_path / "state/step-00000002")


def _model(seed):
    torch.manual_seed(seed)
    return vit.create_model("vit_tiny_patch16_224", img_size=32, embed_dim=32, depth=1, num_heads=2, mlp_ratio=2,
                            num_classes=2)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
def test_a_kill_between_a_checkpoints_files_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch, exchange):
    import vit.utils.atomic

    if not exchange:
        monkeypatch.setattr(vit.utils.atomic, "_exchange", lambda a, b: False)
    cfg = load_config(None, [*TINY, "--model.depth=1"])
    old = _model(0)
    save_checkpoint(tmp_path / "last", old, cfg, ["a", "b"], {"step": 5, "epoch": 1})
    (tmp_path / "last/eval").mkdir()  # evaluate.py's default --out: not ours, carried over by every save
    (tmp_path / "last/eval/metrics.json").write_text("{}")

    def die(point, n):  # the weights are written, config/classes/meta not yet: a kill here
        if point == "checkpoint":
            raise SystemExit("killed")

    with monkeypatch.context() as m:
        m.setattr(checkpoint, "fault_point", die)
        with pytest.raises(SystemExit):
            save_checkpoint(tmp_path / "last", _model(1), cfg, ["a", "b"], {"step": 10, "epoch": 2})
    weights = load_file(str(tmp_path / "last/model.safetensors"))
    assert all(torch.equal(weights[k], v) for k, v in old.state_dict().items())  # the old weights with the old meta
    assert json.loads((tmp_path / "last/meta.json").read_text())["step"] == 5
    load_checkpoint(tmp_path / "last")
    new = _model(1)
    save_checkpoint(tmp_path / "last", new, cfg, ["a", "b"], {"step": 10, "epoch": 2})
    assert json.loads((tmp_path / "last/meta.json").read_text())["step"] == 10
    weights = load_file(str(tmp_path / "last/model.safetensors"))
    assert all(torch.equal(weights[k], v) for k, v in new.state_dict().items())
    assert (tmp_path / "last/eval/metrics.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]  # the interrupted save's temporary folder is gone
