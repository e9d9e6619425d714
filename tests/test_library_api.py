"""The commands' library functions called from Python, without argparse: each returns what its command prints
or writes on the same input (the command is the oracle: it is held by its own tests against timm and evaluate)."""

import csv

import pytest
import torch
from helpers import import_script, make_image_folder

from vit.config import load_config
from vit.models.build import build_model
from vit.models.checkpoint import save_checkpoint

TINY = ["--model.img_size=32", "--model.embed_dim=32", "--model.depth=2", "--model.num_heads=2", "--model.mlp_ratio=2"]


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(checkpoint folder, its ImageFolder): random weights, the head scaled so probabilities differ, one broken
    image among the validation ones."""
    tmp = tmp_path_factory.mktemp("api")
    data = make_image_folder(tmp / "data", classes=("a", "b", "c"), n_train=2, n_val=2, size=40)
    (data / "val/b/zz_broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    cfg = load_config(None, ["--data.dataset=imagefolder", f"--data.root={data}", *TINY])
    torch.manual_seed(0)
    model = build_model(cfg, 3)
    with torch.no_grad():
        model.head.weight.mul_(300.0)
    save_checkpoint(tmp / "ck", model, cfg, ["a", "b", "c"])
    return tmp / "ck", data


def test_load_model_and_config_takes_plain_arguments_and_prints_nothing(tiny, capsys):
    from vit.eval.inference import load_model_and_config

    model, cfg, classes, lines = load_model_and_config(checkpoint=tiny[0], overrides={"aug.eval_crop_pct": 1.0})
    assert classes == ["a", "b", "c"] and lines == [] and not model.training
    assert cfg.aug.eval_crop_pct == 1.0 and cfg.model.img_size == 32
    with pytest.raises(Exception, match="checkpoint folder .* or a model name"):
        load_model_and_config()
    assert capsys.readouterr().out == ""


def test_predict_images_returns_the_rows_predict_writes(tiny, tmp_path):
    from vit.cli.images import collect_images
    from vit.deploy.predict import predict_images
    from vit.eval.inference import load_model_and_config

    ck, data = tiny
    paths, _ = collect_images([str(data / "val")])
    model, cfg, classes, _ = load_model_and_config(checkpoint=ck)
    result = predict_images(model, cfg, classes, paths, topk=2)
    assert import_script("predict").main(["--checkpoint", str(ck), str(data / "val"), "--topk", "2",
                                          "--out", str(tmp_path / "p")]) == 0
    written = _read(tmp_path / "p/predictions.csv")
    assert len(result.rows) == len(written) == len(paths) - 1
    for ours, row in zip(result.rows, written):
        assert {k: str(v) if not k.startswith("prob") else f"{v:.6f}" for k, v in ours.items()} == row
    assert [p for p, _ in result.skipped] == [r["path"] for r in _read(tmp_path / "p/skipped.csv")]
    assert result.skipped[0][0].endswith("zz_broken.png")


@pytest.mark.slow
def test_evaluate_checkpoint_returns_the_metrics_evaluate_writes(tiny, tmp_path):
    import json

    from vit.eval.evaluate import evaluate_checkpoint

    ck, data = tiny
    metrics = evaluate_checkpoint(ck, topk=2, out_dir=tmp_path / "lib")
    assert import_script("evaluate").main(["--checkpoint", str(ck), "--topk", "2", "--out", str(tmp_path / "e")]) == 0
    written = json.loads((tmp_path / "e/metrics.json").read_text())
    assert metrics.pop("images_per_s") > 0 and written.pop("images_per_s") > 0
    assert json.loads(json.dumps(metrics)) == written and written["n"] == 6 and written["skipped"] == 1
    assert list(metrics) == list(written)  # metrics.json's order too
    assert _read(tmp_path / "lib/predictions.csv") == _read(tmp_path / "e/predictions.csv")


@pytest.mark.slow
def test_export_folder_and_predict_onnx_images_match_the_commands(tiny, tmp_path):
    """export_folder's verification.json equals export's on the same checkpoint; predict_onnx_images' rows equal
    predict --onnx's file on that export."""
    import json

    from vit.cli.images import collect_images
    from vit.deploy.export_folder import export_folder
    from vit.deploy.predictions import predict_onnx_images
    from vit.eval.inference import load_model_and_config

    pytest.importorskip("onnxruntime")
    ck, data = tiny
    model, cfg, classes, _ = load_model_and_config(checkpoint=ck)
    lines = []
    report = export_folder(model, cfg, classes, tmp_path / "lib", ["onnx"], checkpoint=ck, log=lines.append)
    assert import_script("export").main(["--checkpoint", str(ck), "--out", str(tmp_path / "cli")]) == 0
    written = json.loads((tmp_path / "cli/verification.json").read_text())
    assert report["model_fingerprint"] == written["model_fingerprint"] and report["images"] == written["images"]
    for ours, theirs in ((report["results"]["onnx"], written["results"]["onnx"]),):
        assert {k: v for k, v in ours.items() if k not in ("file", "export_seconds")} == \
            {k: v for k, v in theirs.items() if k not in ("file", "export_seconds")}
    assert lines[-1].startswith(f"wrote {tmp_path / 'lib'}/: model.onnx, preprocessing.json, verification.json")

    paths, _ = collect_images([str(data / "val")])
    result = predict_onnx_images(tmp_path / "lib/model.onnx", paths, topk=2)
    assert import_script("predict").main(["--onnx", str(tmp_path / "lib/model.onnx"), str(data / "val"), "--topk", "2",
                                          "--out", str(tmp_path / "p")]) == 0
    rows = _read(tmp_path / "p/predictions.csv")
    assert [{k: str(v) if not k.startswith("prob") else f"{v:.6f}" for k, v in r.items()} for r in result.rows] == rows
    assert [p for p, _ in result.skipped] == [r["path"] for r in _read(tmp_path / "p/skipped.csv")] != []


def test_draw_attention_writes_what_visualize_attention_writes(tiny, tmp_path, capsys):
    import json

    import numpy as np

    from vit.eval.inference import load_model_and_config
    from vit.explain.attention_figures import MapOptions, draw_attention
    from vit.explain.attention_inputs import collect_inputs

    ck, data = tiny
    model, cfg, classes, _ = load_model_and_config(checkpoint=ck)
    items = collect_inputs([str(data / "val/a"), str(data / "val/b")], cfg, classes)
    done = draw_attention(model, cfg, classes, items, tmp_path / "lib", MapOptions(discard_ratio=0.5),
                          about={"checkpoint": str(ck)})
    assert import_script("visualize_attention").main(["--checkpoint", str(ck), str(data / "val/a"),
                                                      str(data / "val/b"), "--discard-ratio", "0.5",
                                                      "--out", str(tmp_path / "cli")]) == 0
    assert f"wrote {len(done.sidecars)} map(s) to {tmp_path / 'cli'}/; skipped 1" in capsys.readouterr().out
    assert len(done.skipped) == 1 and "zz_broken.png" in done.skipped[0]
    for sidecar in done.sidecars:
        stem = f"{sidecar['image']}_rollout"
        assert json.loads((tmp_path / "cli" / f"{stem}.json").read_text()) == sidecar
        np.testing.assert_array_equal(np.load(tmp_path / "lib" / f"{stem}.npy"),
                                      np.load(tmp_path / "cli" / f"{stem}.npy"))


def test_eval_data_refuses_a_dataset_with_other_classes_before_reading_an_image(tiny, tmp_path):
    from vit.data import DataError
    from vit.eval.evaluate import eval_data
    from vit.eval.inference import load_model_and_config

    model, cfg, classes, _ = load_model_and_config(checkpoint=tiny[0])
    two = make_image_folder(tmp_path / "two", classes=("a", "b"), n_train=1, n_val=1)
    val_ds, found, scored = eval_data(model, cfg, classes, data_dir=str(tiny[1] / "val"))
    assert found == classes and len(val_ds) == 6 and str(tiny[1] / "val") in scored
    with pytest.raises(DataError, match="the weights classify 3 classes but the dataset has 2"):
        eval_data(model, cfg, None, data_dir=str(two / "val"))
