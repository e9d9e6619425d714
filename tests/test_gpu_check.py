"""scripts/gpu_check.sh end to end on CPU (--tiny: 2 gloo processes, fp32), as CI runs it."""

# scripts/gpu_check.sh end to end on CPU (--tiny: 2 gloo processes, fp32), as CI runs it; on a GPU it is the
# ViT-B/16 bf16 check of the README's "Scaling up".

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT


@pytest.mark.slow
def test_gpu_check_runs_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "TQDM_DISABLE": "1",
           "TMPDIR": str(tmp_path), "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    r = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), "--tiny", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert r.stdout.rstrip().endswith("gpu_check: all passed")
    res = json.loads(out.read_text())
    assert res["world"] == 2 and res["tiny"] and res["dtype"] == "torch.float32"
    assert res["attention"] == "flash (CPU)"  # math was disallowed, and the profiler saw the flash kernel
    assert [(row["wrapper"], row["compile"]) for row in res["rows"]] == [
        ("ddp", "no"), ("ddp", "aot_eager"), ("fsdp", "no"), ("fsdp", "aot_eager")]
    first = res["rows"][0]["ours"]["loss"]
    for row in res["rows"]:
        # same weights, data and optimizer in fp32: ours and timm's model, DDP and FSDP, eager and compiled
        # compute the same training steps
        for who in ("ours", "timm"):
            assert row[who]["images_per_s"] > 0 and 0 < row[who]["mfu"] < 1
            assert abs(row[who]["loss"] - first) < 1e-5, (row, who)
        assert row["ratio"] == pytest.approx(row["ours"]["images_per_s"] / row["timm"]["images_per_s"])
    assert 0 < res["flops_per_image"] and res["peak_flops"] > 0
    assert not list(tmp_path.glob("gpu_check.*"))  # the script's temporary run folder is gone


def test_gpu_check_help_prints_once_and_runs_nothing(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp_path)}
    r = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), "--help"], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("usage: gpu_check.py") == 1 and "--tiny" in r.stdout
    assert "== 1/2" not in r.stdout and "gpu_check: all passed" not in r.stdout and "no CUDA device" not in r.stderr
    assert not list(tmp_path.glob("gpu_check.*"))  # no training run folder was made


def test_gpu_check_without_torch_says_which_python(tmp_path):
    fake = tmp_path / "python"  # a python that has no torch
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; sys.exit(1)'\n")
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake)}
    r = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), "--tiny"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert str(fake) in r.stderr and "PYTHON=" in r.stderr and "Traceback" not in r.stderr
    assert "no CUDA device" not in r.stderr
