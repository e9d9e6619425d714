"""Preemption: SIGTERM at any point of an epoch saves a resumable state, and the resumed run ends bit-exact."""

import re

import pytest
import torch
from helpers import TINY, run_script
from safetensors.torch import load_file

# 40 images, batch 8: 5 steps an epoch; periodic states at every 2nd step
COMMON = ["--data.dataset=synthetic", "--data.synthetic_train_size=40", "--data.synthetic_val_size=8",
          "--run.epochs=2", "--run.save_state_every=2", *TINY]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    r = run_script("train.py", *COMMON, f"--run.output_dir={out}", "--run.name=ref")
    assert r.returncode == 0, r.stderr[-3000:]
    return load_file(str(out / "ref/last/model.safetensors"))


# mid-epoch between periodic saves (state 3 must be written for the signal); inside a periodic state save (it
# completes, and is the one resumed); inside the checkpoint save that ends epoch 0 (evaluated, then stopped)
@pytest.mark.slow
@pytest.mark.parametrize("point,step", [("step:3", 3), ("state:6", 6), ("checkpoint:5", 5)])
def test_sigterm_saves_a_state_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path, reference, point, step):
    args = [*COMMON, f"--run.output_dir={tmp_path}", "--run.name=p"]
    r = run_script("train.py", *args, env={"VIT_FAULT_INJECT": f"sigterm@{point}"})
    assert r.returncode == 143, r.stderr[-3000:]
    lines = re.findall(r"terminated \(SIGTERM\).*", r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    name = f"step-{step:08d}"
    assert name in lines[0] and "--resume=auto" in lines[0]
    run = tmp_path / "p"
    assert sorted(p.name for p in (run / "state").iterdir())[-1] == name  # the state at the signal, the newest
    assert not list((run / "state").glob(".tmp-*"))
    done = run_script("train.py", *args, "--resume=auto")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {name}" in (run / "resume.log").read_text()
    b = load_file(str(run / "last/model.safetensors"))
    assert reference.keys() == b.keys() and all(torch.equal(reference[k], b[k]) for k in reference)

