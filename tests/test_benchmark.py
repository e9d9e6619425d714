"""benchmark.py plumbing on a tiny setting: both sides run, the JSON has its fields (no timing asserted)."""

import json

import pytest
from helpers import import_script, run_script

import vit
from vit.config import load_config
from vit.models.checkpoint import save_checkpoint


@pytest.mark.slow
def test_benchmark_runs_both_sides_and_writes_json(tmp_path):
    out = tmp_path / "b.json"
    r = run_script("benchmark.py", "--model", "vit_tiny_patch16_224", "--img-size", "32", "--batch-size", "2",
                   "--warmup", "1", "--repeats", "2", "--peak-size", "256", "--scaling", "32", "48",
                   "--scaling-repeats", "1", "--data", "--data-images", "2", "--data-repeats", "1",
                   "--data-large", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    for mode in ("inference", "train_step"):
        for side in ("ours", "timm"):
            assert res[mode][side]["images_per_s"] > 0 and len(res[mode][side]["seconds_all"]) == 2
        assert set(res[mode]["ratio_ours_over_timm"]) == {"median", "min", "max"}
    # counted FLOPs: at 32 px a tiny ViT has 5 tokens; the [CLS]-only last block makes ours smaller than timm's
    assert 0 < res["flops_per_image"]["inference"] < res["inference"]["timm"]["flops_per_image"]
    assert res["attention_kernels"]["ours"] == ["flash (CPU)"]
    assert res["memory"]["ours"]["saved_activation_mib"] > 0
    assert [row["tokens"] for row in res["scaling"]] == [5, 10]
    for size in ("500x375", "2000x1500"):
        assert {"decode_only", "ours", "torchvision_v2", "torchvision_v2_tensor"} <= set(res["data"][size])
        assert res["data"][size]["ours"]["vs_decode_only"]["median"] > 0
    assert "ratio" in r.stdout
    assert "gpuGetDeviceCount" not in r.stderr and "profiler_start" not in r.stderr  # kineto silenced


# --- benchmark.py's options: counts below 1 get one sentence, and a grey checkpoint is benchmarked on grey images


@pytest.mark.parametrize("flag", ["--repeats", "--scaling", "--batch-size", "--iters", "--img-size"])
def test_counts_below_one_are_refused(flag, capsys):
    bench = import_script("benchmark")
    with pytest.raises(SystemExit) as e:
        bench.build_parser().parse_args([flag, "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in err and "at least 1" in err


def test_a_grey_checkpoint_is_benchmarked(tmp_path, capsys):
    bench = import_script("benchmark")
    over = {"model.img_size": 16, "model.patch_size": 8, "model.embed_dim": 32, "model.depth": 2,
            "model.num_heads": 2, "model.in_chans": 1, "aug.mean": [0.5], "aug.std": [0.5]}
    cfg = load_config(None, over)
    model = vit.create_model("vit_tiny_patch16_224", img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                             in_chans=1, num_classes=10)
    ck = save_checkpoint(tmp_path / "best", model, cfg, [str(i) for i in range(10)])
    assert bench.main(["--token-reduction", "merge:1", "--checkpoint", str(ck), "--batch-size", "2", "--repeats",
                       "1", "--warmup", "0", "--device", "cpu", "--out", str(tmp_path / "b.json")]) == 0


@pytest.mark.slow
def test_benchmark_edge_table_on_a_checkpoint(tmp_path):
    """--edge: every variant timed in one interleaved run, eager's own ratio 1, sizes of the files, top-1 of
    every variant on the checkpoint's validation split (the same number for eager and ORT fp32)."""
    import torch

    from vit.models.build import build_model

    cfg = load_config("configs/default.yaml", ["--model.img_size=32", "--model.embed_dim=32", "--model.depth=1",
                                               "--model.num_heads=2", "--model.mlp_ratio=2"])
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "ck", build_model(cfg, 10), cfg, [str(i) for i in range(10)])
    out = tmp_path / "e.json"
    r = run_script("benchmark.py", "--edge", "--checkpoint", str(tmp_path / "ck"), "--edge-batches", "2",
                   "--edge-threads", "1", "--edge-merge", "merge:2", "--warmup", "0", "--repeats", "2",
                   "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["variant"]: row for row in json.loads(out.read_text())["edge"]["rows"]}
    assert set(rows) == {"eager fp32", "ort fp32", "ort int8 dynamic", "ort int8 static", "eager fp32 merge:2",
                         "ort fp32 merge:2", "ort int8 dynamic merge:2"}
    assert rows["eager fp32"]["x_eager"]["median"] == 1.0 and all(v["images_per_s"] > 0 for v in rows.values())
    assert rows["eager fp32"]["cpu_x_eager"]["median"] == 1.0
    assert all(v["cpu_x_eager"]["median"] > 0 for v in rows.values())
    assert rows["ort int8 dynamic"]["mib"] < rows["ort fp32"]["mib"]
    assert rows["eager fp32"]["top1"] == rows["ort fp32"]["top1"] and rows["eager fp32 merge:2"]["top1"] is not None
