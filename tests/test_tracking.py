"""run.log_with: Accelerate's trackers get metrics.csv's numbers and the config, read back offline through each tool."""

import csv
import struct

import pytest
from helpers import TINY, run_script

from vit.config import ConfigError, load_config
from vit.train.tracking import check_trackers, flat_config, tracker_names

FIELDS = ["epoch", "lr", "train_loss", "val_loss", "val_acc1", "val_acc5", "images_per_s", "skipped_steps"]


def test_an_unknown_tracker_is_refused_naming_it_and_the_choices():
    with pytest.raises(ConfigError, match=r"unknown tracker 'tensorbord'; choose from tensorboard, csv, wandb"):
        load_config(None, ["--run.log_with=[csv, tensorbord]"])


def test_the_default_is_tensorboard_and_csv_and_each_tracker_is_started_once():
    assert tracker_names(load_config(None)) == ["tensorboard"]  # csv is our metrics.csv
    assert tracker_names(load_config(None, ["--run.log_with=[mlflow, csv, mlflow, wandb]"])) == ["mlflow", "wandb"]
    assert tracker_names(load_config(None, ["--run.log_with=[]"])) == []


def test_one_tracker_name_is_taken_as_trainer_report_to_takes_it(tmp_path):
    assert tracker_names(load_config(None, ["--run.log_with=mlflow"])) == ["mlflow"]
    (tmp_path / "c.yaml").write_text("run:\n  log_with: wandb\n")
    assert load_config(tmp_path / "c.yaml").run.log_with == ["wandb"]  # saved and resumed as a list
    with pytest.raises(ConfigError, match=r"names an unknown tracker 'mlfow'"):
        load_config(None, ["--run.log_with=mlfow"])


def _fresh_accelerator(**kwargs):
    from accelerate.state import AcceleratorState, GradientState

    from vit.cli.runtime import make_accelerator

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return make_accelerator(**kwargs)


def test_every_tracked_name_is_a_metrics_csv_column_or_its_step_value_once_per_step(tmp_path, monkeypatch):
    """A tiny epoch with a point every step: the names the trackers get are one scheme (metrics.csv's; a single
    step's value of a per-epoch column is <column>_step), and no name gets two points at one step."""
    import torch
    from accelerate.state import AcceleratorState, GradientState
    from helpers import ROOT

    from vit.data import build_datasets, build_loaders
    from vit.models.build import build_model
    from vit.train.console import Console
    from vit.train.engine import Run, evaluate_and_checkpoint, train_one_epoch
    from vit.train.records import METRIC_FIELDS

    cfg = load_config(ROOT / "configs/default.yaml", [
        "--data.dataset=synthetic", "--data.synthetic_train_size=16", "--data.synthetic_val_size=4", *TINY,
        "--run.log_every=1", "--run.epochs=1", "--model.in_chans=3", "--data.num_workers=0",
        f"--run.output_dir={tmp_path}"])
    try:
        acc = _fresh_accelerator()
        train_ds, val_ds, classes = build_datasets(cfg)
        model = build_model(cfg, len(classes))
        opt = torch.optim.AdamW(model.parameters())  # which optimizer does not matter here (timm's imports a lot)
        tl, vl = build_loaders(cfg, train_ds, val_ds)
        model, opt, tl, vl = acc.prepare(model, opt, tl, vl)
        (tmp_path / "r").mkdir()
        run = Run(acc, cfg, tmp_path / "r", model, opt, tl, vl, classes, Console(acc))
        points = []
        monkeypatch.setattr(acc, "log", lambda values, step: points.extend((step, k) for k in values))
        evaluate_and_checkpoint(run, train_one_epoch(run))
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    names = {k for _, k in points}
    assert {"train_loss_step", "lr", "train_loss", "val_loss", "val_acc1", "val_macro_f1"} <= names
    assert names <= set(METRIC_FIELDS) | {f"{k}_step" for k in METRIC_FIELDS}, names
    assert len(points) == len(set(points))  # lr at the epoch's last step: once, though both logs cover it


def test_mlflow_gets_the_best_card_the_config_the_curves_and_the_confusion_matrix(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason="mlflow-skinny is in the track extra")
    from accelerate.state import AcceleratorState, GradientState

    from vit.train.tracking import ARTIFACTS, log_artifacts

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "run"
    (run / "best").mkdir(parents=True)
    files = {path: f"contents of {path}".encode() for path, _ in ARTIFACTS}
    for path, data in files.items():
        (run / path).write_bytes(data)
    try:
        acc = _fresh_accelerator(log_with=["mlflow"], project_dir=str(run))
        acc.init_trackers("proj", init_kwargs={"mlflow": {"run_name": "t"}})
        assert log_artifacts(acc, run) == [p for p, _ in ARTIFACTS]
        acc.end_training()
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    client = mlflow.tracking.MlflowClient()
    (found,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    got = {}
    for path in ["config.yaml", "metrics.csv", "curves.png", "confusion.png", "best/README.md"]:
        local = client.download_artifacts(found.info.run_id, path, str(tmp_path / "down"))
        got[path] = open(local, "rb").read()
    assert got == files
    assert log_artifacts(_fresh_accelerator(), run) == []  # no MLflow tracker: nothing to give
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_a_missing_package_or_a_store_that_does_not_open_is_one_sentence(monkeypatch, tmp_path):
    import accelerate.tracking

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [])
    with pytest.raises(ConfigError, match=r"names wandb, but its package is not installed; install wandb"):
        check_trackers(["wandb"])
    monkeypatch.undo()
    pytest.importorskip("mlflow", reason="mlflow-skinny is in the track extra")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError, match=r"tracking store file:.* does not open .*MLFLOW_ALLOW_FILE_STORE=true"):
        check_trackers(["mlflow"])


def _wandb_records(path):
    """The protobuf records of a .wandb file: wandb's LevelDB-style log (a 7-byte ':W&B' header, then 32 KiB blocks
    of chunks, each with a 7-byte header: crc32, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, parts = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        parts, pos = parts + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def _same(got, want, rel, name):
    """(step, value) pairs: the same steps, values equal to `rel` (a tool that stores float32 rounds them). `lr`
    also has a point every run.log_every steps: those at the rows' steps are compared."""
    if name == "lr":
        got = [(s, v) for s, v in got if s in {s for s, _ in want}]
    assert [s for s, _ in got] == [s for s, _ in want], name
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=rel), name


@pytest.mark.slow
def test_tensorboard_mlflow_and_wandb_get_the_metrics_csv_numbers_and_the_config(tmp_path):
    mlflow = pytest.importorskip("mlflow", reason="mlflow-skinny is in the track extra")
    pytest.importorskip("wandb", reason="wandb is in the track extra")
    import json

    env = {"MLFLOW_TRACKING_URI": f"file:{tmp_path / 'mlruns'}", "MLFLOW_ALLOW_FILE_STORE": "true",
           "WANDB_MODE": "offline", "WANDB_SILENT": "true"}  # WANDB_DIR unset: wandb writes into the run folder
    r = run_script("train.py", "--data.dataset=synthetic", "--data.synthetic_train_size=24",
                   "--data.synthetic_val_size=12", "--data.synthetic_num_classes=6", "--run.epochs=3",
                   f"--run.output_dir={tmp_path}", "--run.name=t",
                   "--run.log_with=[tensorboard, csv, mlflow, wandb]", "--run.project=proj", *TINY,
                   "--run.eval_every=2", env=env)  # epoch 1 not evaluated: its row has no val_* values
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "t"
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows] == ["1", "2", "3"] and rows[0]["val_acc1"] == "" and rows[1]["val_acc1"]
    expected = {k: [(int(row["step"]), float(row[k])) for row in rows if row[k] != ""] for k in FIELDS}
    assert len(expected["train_loss"]) == 3 and len(expected["val_acc1"]) == 2
    config = flat_config(load_config(run / "config.yaml"))

    # MLflow, through its own client: experiment run.project, run run.name, every field at its step, the config
    monkey = {"MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"], "MLFLOW_ALLOW_FILE_STORE": "true"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in monkey.items():
            mp.setenv(k, v)
        client = mlflow.tracking.MlflowClient()
        (found,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
        assert found.info.run_name == "t" and found.info.status == "FINISHED"
        for k in FIELDS:
            history = sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, k))
            _same(history, expected[k], 1e-12, k)
        assert found.data.params["optim.lr"] == str(config["optim.lr"])
        assert found.data.params["model.depth"] == "2"
        assert found.data.params["run.log_with"] == str(config["run.log_with"])
        logged = {a.path for a in client.list_artifacts(found.info.run_id)}
        assert logged == {"best", "config.yaml", "metrics.csv", "curves.png", "confusion.png"}, logged
        card = client.download_artifacts(found.info.run_id, "best/README.md", str(tmp_path / "down"))
        assert open(card).read() == (run / "best" / "README.md").read_text()

    # wandb offline: the run folder inside the run, its .wandb log holds the config and each history row
    (folder,) = (run / "wandb").glob("offline-run-*")
    records = list(_wandb_records(next(folder.glob("run-*.wandb"))))
    (start,) = [rec.run for rec in records if rec.WhichOneof("record_type") == "run"]
    assert start.project == "proj" and start.display_name == "t"
    updates = [u for rec in records if rec.WhichOneof("record_type") == "config" for u in rec.config.update]
    cfg = {u.key: json.loads(u.value_json) for u in [*start.config.update, *updates]}
    assert {k: cfg[k] for k in config} == config  # the whole resolved config, flat
    assert cfg["optim.lr"] == config["optim.lr"] and cfg["model.depth"] == 2
    history = [{i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json) for i in rec.history.item}
               for rec in records if rec.WhichOneof("record_type") == "history"]
    rows_logged = [h for h in history if "epoch" in h]
    for k in FIELDS:
        _same([(h["_step"], h[k]) for h in rows_logged if k in h], expected[k], 1e-12, k)
    assert any("train_loss_step" in h for h in history) and not any("/" in k for h in history for k in h)

    # TensorBoard, where it always was: the same numbers (stored as float32)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard")).Reload()
    for k in FIELDS:
        _same([(e.step, e.value) for e in acc.Scalars(k)], expected[k], 1e-6, k)
