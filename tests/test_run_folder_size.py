"""run.keep_states: how many resumable training states a run folder keeps (the rest deleted once a newer one is
complete), so that a laptop can hold the run."""

from __future__ import annotations

import pytest
from helpers import TINY, run_script

from vit.config import ConfigError, load_config

SYN = ["--data.dataset=synthetic", "--data.synthetic_train_size=24", "--data.synthetic_val_size=8",
       "--run.save_state_every=1", "--run.epochs=2", *TINY]


def _states(run):
    return sorted(p.name for p in (run / "state").iterdir() if (p / "COMPLETE").is_file())


@pytest.mark.slow
@pytest.mark.parametrize("keep", [1, 3])
def test_keep_states_bounds_the_saved_states_and_the_newest_resumes(tmp_path, keep):
    r = run_script("train.py", *SYN, f"--run.keep_states={keep}", "--run.max_steps=4", f"--run.output_dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    run = tmp_path / "default"
    assert _states(run) == [f"step-{s:08d}" for s in range(5 - keep, 5)]  # steps 1-4 saved; the newest `keep` kept
    assert not list((run / "state").glob(".tmp-*"))
    r = run_script("train.py", *SYN, f"--run.keep_states={keep}", "--resume=auto", f"--run.output_dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    assert _states(run) == [f"step-{s:08d}" for s in range(7 - keep, 7)]  # resumed at 4, on to 6


def test_keep_states_defaults_to_two_and_must_be_positive():
    assert load_config(None).run.keep_states == 2  # today's behaviour: the newest and one to fall back on
    with pytest.raises(ConfigError, match="'run.keep_states' must be positive"):
        load_config(None, {"run.keep_states": 0})
