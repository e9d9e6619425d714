"""FSDP2 through Accelerate on 2 gloo processes, against DDP as the oracle."""

# FSDP2 through Accelerate (configs/accelerate/fsdp.yaml), trained by the unchanged train.py on 2 gloo processes.
#
# DDP is the oracle: both average the same per-process gradients (all-reduce vs reduce-scatter), and AdamW is
# elementwise, so three steps must agree to float32 rounding. Exactness of resume is checked against an
# uninterrupted FSDP run, bit for bit; the consolidated best/last weights against the sharded state, read back
# from its torch.distributed.checkpoint files in this (single, non-distributed) process.

import csv
import sys

import pytest
import torch
from helpers import ROOT, TINY, run_script
from safetensors.torch import load_file

from vit.models.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow

# 48 images / (batch 8 x 2 processes) = 3 steps in the one epoch; a state every 2 steps and at the epoch's end
COMMON = ["--data.dataset=synthetic", "--data.synthetic_train_size=48", "--data.synthetic_val_size=8",
          "--run.epochs=1", "--run.save_state_every=2", "--optim.warmup_epochs=0", *TINY]


def _train(tmp_path, name: str, fsdp: bool, port: int, *extra: str, env: dict | None = None):
    launch = ["--config_file", str(ROOT / "configs/accelerate/fsdp.yaml")] if fsdp else ["--multi_gpu"]
    launcher = [sys.executable, "-m", "accelerate.commands.launch", *launch, "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(port)]
    return run_script("train.py", *COMMON, f"--run.output_dir={tmp_path}", f"--run.name={name}", *extra,
                      launcher=launcher, env={"CUDA_VISIBLE_DEVICES": "", **(env or {})})


def _metrics(run) -> list[dict]:
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _sharded_model(state_dir, tmp_path) -> dict[str, torch.Tensor]:
    """The model weights of an Accelerate FSDP state (one DCP shard file per process), gathered into one dict."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{state_dir.parent.parent.name}-{state_dir.name}.pt"
    dcp_to_torch_save(str(state_dir / "pytorch_model_fsdp_0"), str(out))
    return torch.load(out, weights_only=True)["model"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    r = _train(tmp, "ddp", False, 29641)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _train(tmp, "fsdp", True, 29642)
    assert r.returncode == 0, r.stderr[-3000:]
    # killed between steps 3 and the epoch's end: the state at step 2 is the newest one
    r = _train(tmp, "killed", True, 29643, env={"VIT_FAULT_INJECT": "step:3"})
    assert r.returncode != 0 and not (tmp / "killed/last").exists(), r.stderr[-3000:]
    assert sorted(p.name for p in (tmp / "killed/state").glob("step-*")) == ["step-00000002"]
    r = _train(tmp, "killed", True, 29644, "--resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step-00000002" in r.stdout + r.stderr
    return tmp


def test_fsdp_state_is_sharded_one_file_per_process(runs):
    state = runs / "fsdp/state/step-00000003"
    assert sorted(p.name for p in (state / "pytorch_model_fsdp_0").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert sorted(p.name for p in (state / "optimizer_0").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not (runs / "ddp/state/step-00000003/pytorch_model_fsdp_0").exists()  # the oracle ran plain DDP


def test_three_fsdp_steps_equal_ddp(runs):
    ddp, fsdp = _metrics(runs / "ddp"), _metrics(runs / "fsdp")
    assert [r["step"] for r in fsdp] == [r["step"] for r in ddp] == ["3"]
    for key in ("train_loss", "val_loss"):
        assert abs(float(fsdp[0][key]) - float(ddp[0][key])) < 1e-5, key
    a = load_file(str(runs / "ddp/last/model.safetensors"))
    b = load_file(str(runs / "fsdp/last/model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=0, msg=k)
    # guard: one step alone moves the weights well past the tolerance, so the comparison is not trivial
    before = _sharded_model(runs / "fsdp/state/step-00000002", runs)
    assert max((before[k] - b[k]).abs().max().item() for k in b) > 1e-4


def test_killed_fsdp_run_resumes_exactly(runs):
    a = load_file(str(runs / "fsdp/last/model.safetensors"))
    b = load_file(str(runs / "killed/last/model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the epoch's train loss covers the batches before the kill too, and no step was repeated
    def drop_speed(rows):
        return [{k: v for k, v in r.items() if k != "images_per_s"} for r in rows]

    assert drop_speed(_metrics(runs / "killed")) == drop_speed(_metrics(runs / "fsdp"))
    s = _sharded_model(runs / "killed/state/step-00000003", runs)
    assert all(torch.equal(s[k], a[k]) for k in a)


def test_consolidated_checkpoint_equals_sharded_weights(runs):
    sharded = _sharded_model(runs / "fsdp/state/step-00000003", runs)
    last = load_file(str(runs / "fsdp/last/model.safetensors"))
    best = load_file(str(runs / "fsdp/best/model.safetensors"))
    assert sharded.keys() == last.keys() == best.keys()
    for k in sharded:
        assert torch.equal(last[k], sharded[k]) and torch.equal(best[k], sharded[k]), k
    model, _, classes, meta = load_checkpoint(runs / "fsdp/last")  # what evaluate.py reads
    assert meta["step"] == 3 and len(classes) == 4
    assert all(torch.equal(v, last[k]) for k, v in model.state_dict().items())

