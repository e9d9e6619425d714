"""benchmark.py's modes (vit.bench) on tiny settings: both sides run, the results have their fields and their
ratios are the paired repeats' (no timing asserted); the script itself only for its parsing and messages."""

import json
import os
import statistics
import sys

import pytest
import torch
from helpers import import_script

import vit
from vit.config import load_config
from vit.models.checkpoint import save_checkpoint
from vit.utils.timing import interleaved, ratio_stats

CPU = torch.device("cpu")


# --- the shared interleaved timing


def test_interleaved_times_each_call_in_turn_after_its_warmup():
    log = []
    calls = {k: (lambda k=k: log.append(k)) for k in "abc"}
    t = interleaved(calls, warmup=2, repeats=3, iters=2)
    assert "".join(log) == "aabbcc" + "aabbcc" * 3  # warm-up per call, then A, B, C, A, B, C, ...
    assert {k: len(v) for k, v in t.wall.items()} == {k: len(v) for k, v in t.cpu.items()} == dict(a=3, b=3, c=3)
    assert all(s >= 0 for v in (*t.wall.values(), *t.cpu.values()) for s in v)


def test_the_timing_module_imports_nothing_heavy():
    """vit.utils.timing is standard library only: quantize's ONNX-only path and maintainer scripts use it."""
    import subprocess

    from helpers import ROOT

    code = ("import sys, vit.utils.timing; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""}).stdout
    assert out.strip() == "[]"


def test_ratio_stats_are_the_paired_repeats_ratios():
    a, b = [1.0, 2.0, 4.0, 0.5], [3.0, 3.0, 2.0, 2.0]  # ratios b/a: 3, 1.5, 0.5, 4
    assert ratio_stats(a, b) == dict(median=2.25, min=0.5, max=4.0)
    assert ratio_stats(a, b)["median"] == statistics.median([y / x for x, y in zip(a, b)])


# --- the modes, called as a Python user would


@pytest.mark.slow
def test_ours_against_timm_and_the_scaling_table(monkeypatch):
    from vit.bench.model import bench_model, bench_scaling, format_model_report

    # kineto reads its level when a process's first profiler starts (another test in this worker may have started
    # one already), so what is checked is that the benchmark sets it, not this process's stderr
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    res = bench_model("vit_tiny_patch16_224", CPU, batch_size=2, img_size=32, warmup=1, repeats=2, peak_size=256)
    for mode in ("inference", "train_step"):
        for side in ("ours", "timm"):
            assert res[mode][side]["images_per_s"] > 0 and len(res[mode][side]["seconds_all"]) == 2
        t = res[mode]
        assert res[mode]["ratio_ours_over_timm"] == ratio_stats(t["ours"]["seconds_all"], t["timm"]["seconds_all"])
    # counted FLOPs: at 32 px a tiny ViT has 5 tokens; the [CLS]-only last block makes ours smaller than timm's
    assert 0 < res["flops_per_image"]["inference"] < res["inference"]["timm"]["flops_per_image"]
    assert res["attention_kernels"]["ours"] == ["flash (CPU)"]
    assert res["memory"]["ours"]["saved_activation_mib"] > 0
    res["scaling"] = bench_scaling("vit_tiny_patch16_224", CPU, [32, 48], repeats=1)
    assert [row["tokens"] for row in res["scaling"]] == [5, 10]
    assert "ratio" in format_model_report(res)
    assert os.environ.get("KINETO_LOG_LEVEL") == "6"  # kineto's 'profiler_start' / 'gpuGetDeviceCount' lines off


@pytest.mark.slow
def test_the_input_pipeline_table():
    from vit.bench.data import bench_data, format_data_report

    res = bench_data(images=2, repeats=1, large=1)
    for size in ("500x375", "2000x1500"):
        assert {"decode_only", "ours", "torchvision_v2", "torchvision_v2_tensor"} <= set(res[size])
        assert res[size]["ours"]["vs_decode_only"]["median"] > 0
    assert "x decoding alone (PIL)" in format_data_report(res)


def _grey_checkpoint(tmp_path):
    over = {"model.img_size": 16, "model.patch_size": 8, "model.embed_dim": 32, "model.depth": 2,
            "model.num_heads": 2, "model.in_chans": 1, "aug.mean": [0.5], "aug.std": [0.5]}
    cfg = load_config(None, over)
    model = vit.create_model("vit_tiny_patch16_224", img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                             in_chans=1, num_classes=10)
    return save_checkpoint(tmp_path / "best", model, cfg, [str(i) for i in range(10)])


def test_a_grey_checkpoint_is_benchmarked(tmp_path):
    from vit.bench.token_reduction import bench_token_reduction, format_token_reduction_report

    res = bench_token_reduction(["merge:1"], CPU, checkpoint=str(_grey_checkpoint(tmp_path)), batch_size=2,
                                repeats=1, warmup=0)
    rows = {r["setting"]: r for r in res["rows"]}
    assert list(rows) == ["ours", "merge:1", "timm"] and res["img_size"] == 16
    assert rows["ours"]["speedup"]["median"] == 1.0 and rows["ours"]["top1"] is not None
    assert "merge:1" in format_token_reduction_report(res)


def test_a_bad_token_reduction_spec_is_refused_before_anything_runs():
    from vit.bench.token_reduction import bench_token_reduction

    with pytest.raises(ValueError, match="merge"):
        bench_token_reduction(["merge:x"], CPU, model="no-such-model")


@pytest.mark.slow
def test_benchmark_edge_table_on_a_checkpoint(tmp_path):
    """The edge table: every variant timed in one interleaved run, eager's own ratio 1, sizes of the files, top-1
    of every variant on the checkpoint's validation split (the same number for eager and ORT fp32)."""
    from vit.bench.edge import bench_edge, format_edge_rows
    from vit.models.build import build_model

    cfg = load_config("configs/default.yaml", ["--model.img_size=32", "--model.embed_dim=32", "--model.depth=1",
                                               "--model.num_heads=2", "--model.mlp_ratio=2"])
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "ck", build_model(cfg, 10), cfg, [str(i) for i in range(10)])
    seen = []
    res = bench_edge([], batches=[2], threads=[1], merge=["merge:2"], warmup=0, repeats=2,
                     checkpoint=str(tmp_path / "ck"), on_rows=seen.append)
    rows = {row["variant"]: row for row in json.loads(json.dumps(res))["rows"]}
    assert set(rows) == {"eager fp32", "ort fp32", "ort int8 dynamic", "ort int8 static", "eager fp32 merge:2",
                         "ort fp32 merge:2", "ort int8 dynamic merge:2"}
    assert rows["eager fp32"]["x_eager"]["median"] == 1.0 and all(v["images_per_s"] > 0 for v in rows.values())
    assert rows["eager fp32"]["cpu_x_eager"]["median"] == 1.0
    assert all(v["cpu_x_eager"]["median"] > 0 for v in rows.values())
    assert rows["ort int8 dynamic"]["mib"] < rows["ort fp32"]["mib"]
    assert rows["eager fp32"]["top1"] == rows["ort fp32"]["top1"] and rows["eager fp32 merge:2"]["top1"] is not None
    assert seen == [res["rows"]] and "ort int8 static" in format_edge_rows(res["rows"])


@pytest.mark.slow
def test_benchmark_onnxruntime_row(monkeypatch):
    """ONNX Runtime against PyTorch eager on a one-block model (create_model narrowed here to keep the export
    short): both sides timed, the ratio is PyTorch's seconds over ONNX Runtime's for each paired repeat."""
    import vit.bench.runtime as runtime

    real = runtime.create_model
    monkeypatch.setattr(runtime, "create_model",
                        lambda name, **kw: real(name, depth=1, embed_dim=32, num_heads=2, **kw))
    res = runtime.bench_onnxruntime("vit_tiny_patch16_224", batch_size=2, img_size=32, warmup=1, repeats=3)
    assert "ratio onnxruntime/pytorch" in runtime.format_onnxruntime_report(res)
    ratios = [p / o for p, o in zip(res["pytorch"]["seconds_all"], res["onnxruntime"]["seconds_all"])]
    assert len(ratios) == 3 and res["ratio_onnxruntime_over_pytorch"]["median"] == pytest.approx(sorted(ratios)[1])


# --- benchmark.py itself: its options, its messages, its tables and --out


@pytest.mark.parametrize("flag", ["--repeats", "--scaling", "--batch-size", "--iters", "--img-size"])
def test_counts_below_one_are_refused(flag, capsys):
    bench = import_script("benchmark")
    with pytest.raises(SystemExit) as e:
        bench.build_parser().parse_args([flag, "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in err and "at least 1" in err


def test_an_unknown_model_or_spec_is_one_sentence(capsys):
    bench = import_script("benchmark")
    assert bench.main(["--model", "vit_nope"]) == 2
    assert "unknown model 'vit_nope'" in capsys.readouterr().err
    assert bench.main(["--token-reduction", "merge:x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_model_kwargs_reach_both_models_as_literals(capsys):
    from vit.bench.model import build_sides

    bench = import_script("benchmark")
    args = bench.build_parser().parse_args(["--model-kwargs", "depth=2", "num_kv_heads=(2, 1)", "embed_dim=32",
                                            "num_heads=2", "pos_embed=none"])
    kw = dict(args.model_kwargs)
    assert kw == {"depth": 2, "num_kv_heads": (2, 1), "embed_dim": 32, "num_heads": 2, "pos_embed": "none"}
    kw.pop("pos_embed")  # text, as read; not an option of this model
    ours, timm_side = build_sides("vit_base_patch16_sapiens2", 32, CPU, model_kwargs=kw)
    assert len(ours.model.blocks) == len(timm_side.model.blocks) == 2
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():  # grouped-query heads (2 then 1 k/v head) built alike, the same weights in both
        torch.testing.assert_close(ours.model.eval()(x), timm_side.model.eval()(x), rtol=1e-5, atol=1e-5)
    assert bench.main(["--model", "vit_tiny_patch16_224", "--model-kwargs", "depthh=1"]) == 2
    err = capsys.readouterr().err
    assert "'depthh'" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--model-kwargs", "depth"])
    assert "expected KEY=VALUE" in capsys.readouterr().err
    for kwargs, words in ((["num_kv_heads=1"], "timm's vit_tiny_patch16_224 does not build with them"),
                          (["img_size=64"], "img_size is set by --img-size"),
                          (["num_classes=10"], "num_classes is set by the benchmark's 1000-way head")):
        assert bench.main(["--model", "vit_tiny_patch16_224", "--model-kwargs", "depth=1", *kwargs]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_an_out_path_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys):
    bench = import_script("benchmark")
    assert bench.main(["--model", "vit_tiny_patch16_224", "--out", str(tmp_path)]) == 2
    assert "is a folder; pass a file name" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert bench.main(["--model", "vit_tiny_patch16_224", "--out", str(tmp_path / "file" / "b.json")]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_benchmark_onnxruntime_without_the_extra(monkeypatch, capsys):
    bench = import_script("benchmark")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert bench.main(["--model", "vit_tiny_patch16_224", "--img-size", "32", "--batch-size", "2", "--no-model",
                       "--runtime", "onnxruntime", "--warmup", "1", "--repeats", "3"]) == 2
    assert "pip install -e '.[export]'" in capsys.readouterr().err


def test_the_script_prints_the_table_and_writes_its_json(tmp_path, capsys):
    bench = import_script("benchmark")
    out = tmp_path / "b.json"
    assert bench.main(["--token-reduction", "merge:1", "--checkpoint", str(_grey_checkpoint(tmp_path)),
                       "--batch-size", "2", "--repeats", "1", "--warmup", "0", "--device", "cpu",
                       "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())["token_reduction"]
    assert "token reduction:" in printed and [r["setting"] for r in res["rows"]] == ["ours", "merge:1", "timm"]


def test_dense_against_sparse_attention_rows_and_crossover():
    from vit.bench.sparse import bench_sparse

    lines = []
    res = bench_sparse(["moba:0.5:block"], CPU, tokens=[128, 256], img_sizes=[], rows=["kernel", "attention"],
                       block_size=64, warmup=0, repeats=2, log=lines.append)
    assert [(r["what"], r["tokens"]) for r in res["rows"]] == [("kernel", 128), ("attention", 128),
                                                               ("kernel", 256), ("attention", 256)]
    faster = [r["tokens"] for r in res["rows"] if r["what"] == "attention" and r["moba:0.5:block"]["median"] > 1]
    assert res["crossover_tokens"] == (min(faster) if faster else None) and res["crossover_spec"] == "moba:0.5:block"
    assert len(lines) == 5 and "moba:0.5:block" in lines[0]  # the header, then one line per row
    with pytest.raises(ValueError):
        bench_sparse(["nope:0.5"], CPU)


@pytest.mark.parametrize("config", ["tiny", "tiny-siglip"])
def test_clip_against_open_clip_prints_a_ratio(tmp_path, capsys, config):
    """benchmark.py --clip: both sides built from one folder (their zero-shot logits agree: the same weights; for
    SigLIP with its bias), the ratios are the paired repeats'; an unknown config is one sentence."""
    pytest.importorskip("open_clip")
    bench = import_script("benchmark")
    out = tmp_path / "clip.json"
    assert bench.main(["--clip", config, "--clip-classes", "3", "--batch-size", "2", "--repeats", "1", "--warmup",
                       "0", "--device", "cpu", "--out", str(out)]) == 0
    assert f"CLIP against open_clip: {config}" in capsys.readouterr().out
    res = json.loads(out.read_text())["clip"]
    assert res["max_abs_logit_difference"] < 1e-4
    for mode in ("zero_shot", "train_step"):
        t = res[mode]
        assert t["ratio_ours_over_open_clip"] == ratio_stats(t["ours"]["seconds_all"], t["open_clip"]["seconds_all"])
    assert bench.main(["--clip", "ViT-Q-99", "--device", "cpu"]) == 2
    assert "unknown open_clip config 'ViT-Q-99'" in capsys.readouterr().err


def test_linear_probe_against_sklearn_prints_a_ratio(tmp_path, capsys):
    """benchmark.py --probe: our linear probe and scikit-learn's LogisticRegression doing the same sweep of C on the
    same features choose the same C, score within a point, and the ratio is the paired repeats'; a C no fit takes
    is one sentence."""
    bench = import_script("benchmark")
    out = tmp_path / "probe.json"
    assert bench.main(["--probe", "--probe-widths", "16", "--probe-n", "120", "--probe-classes", "3", "--probe-C",
                       "0.1", "1", "10", "--repeats", "2", "--warmup", "0", "--out", str(out)]) == 0
    assert "ours / scikit-learn over interleaved repeats" in capsys.readouterr().out
    (r,) = json.loads(out.read_text())["probe"]
    assert r["ratio"] == ratio_stats(r["seconds_all"]["sklearn"], r["seconds_all"]["ours"])
    assert r["C"]["ours"] == r["C"]["sklearn"] and abs(r["top1"]["ours"] - r["top1"]["sklearn"]) <= 0.01
    assert 0.4 < r["top1"]["ours"] < 1  # neither chance nor trivial: the comparison means something
    assert bench.main(["--probe", "--probe-C", "nan"]) == 2
    assert "C must be a number from 1e-06 to 1e+06, got nan" in capsys.readouterr().err
