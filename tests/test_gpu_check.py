"""scripts/gpu_check.sh end to end on CPU (--tiny: 2 gloo processes, fp32), as CI runs it; on a GPU it is the
ViT-B/16 bf16 check of the README's "Scaling up"."""

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
