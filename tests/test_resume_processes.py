"""A training state records its process count; resuming it with another count (another global batch) is refused."""

import json

import pytest
from helpers import TINY

from vit.checkpoint import _sha256, build_model, latest_state
from vit.config import load_config
from vit.engine import TrainState
from vit.optim import build_optimizer
from vit.runfolder import RunFolderError, resume_run, save_run_state
from vit.runtime import make_accelerator


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
