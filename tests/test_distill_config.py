"""The `distill:` config section: strict keys and types, each bad setting one sentence naming its key, timm's
weight modes, and every field described in train.py --help."""

import pytest

from vit.config import ConfigError, DistillConfig, from_dict
from vit.config.distill_checks import distill_weights

T = {"teacher": "local-dir:/teachers/vit_s"}
FOLDER = {"dataset": "imagefolder", "root": "/data"}

BAD = [
    ({"distill": {"kind": "feature"}}, "config key 'distill.kind' is read only with distill.teacher set"),
    ({"distill": {"temperature": 2.0}}, "config key 'distill.temperature' is read only with distill.teacher set"),
    ({"distill": {"teacher": " "}}, "config key 'distill.teacher' is empty"),
    ({"distill": {**T, "tau": 2}}, "unknown config key 'distill.tau'"),
    ({"distill": {**T, "temperature": 0}}, "config key 'distill.temperature' divides the logits"),
    ({"distill": {**T, "temperature": -1.0}}, "must be a finite number > 0"),
    ({"distill": {**T, "temperature": "hot"}}, "config key 'distill.temperature' must be float"),
    ({"distill": {**T, "kind": "attention"}}, "config key 'distill.kind' must be one of 'logit', 'feature', 'token'"),
    ({"distill": {**T, "token_mode": "medium"}}, "config key 'distill.token_mode' must be one of 'soft', 'hard'"),
    ({"distill": {**T, "feature_loss": "l1"}}, "config key 'distill.feature_loss' must be one of 'mse', 'cosine'"),
    ({"distill": {**T, "features": "maps"}}, "config key 'distill.features' must be one of 'pooled', 'patch'"),
    ({"distill": {**T, "task_weight": 1.2}}, "the complementary mode (distillation weighs 1 - task_weight)"),
    ({"distill": {**T, "distill_weight": -1.0}}, "config key 'distill.distill_weight' must be a finite number >= 0"),
    ({"distill": {**T, "task_weight": 0, "distill_weight": 0}}, "are both 0, so the loss is 0"),
    ({"distill": {**T, "task_weight": 1}}, "task_weight 1 alone leaves distillation 1 - 1 = 0"),
    ({"distill": {**T, "task_weight": 1, "distill_weight": 0}}, "distill.distill_weight is 0, so the teacher teaches"),
    ({"distill": {**T, "kind": "feature", "temperature": 4}}, "'distill.temperature' is read by logit kd and soft"),
    ({"distill": {**T, "features": "patch"}}, "'distill.features' is read by feature kd only"),
    ({"distill": {**T, "token_mode": "hard"}}, "'distill.token_mode' is read by token kd only"),
    ({"distill": {**T, "kind": "token", "token_mode": "hard", "temperature": 3}}, "distill.kind=token (hard)"),
    ({"distill": T, "data": {**FOLDER, "labels_file": "/data/labels.csv"}}, "use distill.kind=feature"),
    ({"distill": {**T, "kind": "token"}, "data": {**FOLDER, "labels_file": "/data/labels.csv"}}, "multi-label"),
    ({"distill": T, "data": {"dataset": "captions", "root": "/data"}}, "trains a CLIP model"),
    ({"distill": {**T, "kind": "token"}, "data": {"naflex": {}}}, "data.naflex gives each image its own"),
]


@pytest.mark.parametrize("data,message", BAD)
def test_a_bad_distill_setting_is_one_sentence_naming_its_key(data, message):
    with pytest.raises(ConfigError) as err:
        from_dict(data)
    text = str(err.value)
    assert message in text and "\n" not in text and text.endswith(".")


def test_good_sections_load_and_a_run_without_a_teacher_is_unchanged():
    assert from_dict({}).distill == DistillConfig()
    d = from_dict({"distill": {**T, "kind": "feature", "features": "patch", "feature_loss": "cosine",
                               "task_weight": 1, "distill_weight": 5}}).distill
    assert (d.kind, d.features, d.task_weight, d.distill_weight) == ("feature", "patch", 1.0, 5.0)
    # feature distillation never reads the targets: a multi-label run may use it
    from_dict({"distill": {**T, "kind": "feature"}, "data": {**FOLDER, "labels_file": "/data/labels.csv"}})


@pytest.mark.parametrize("task,distill,want", [(None, None, (1.0, 1.0)), (0.3, None, (0.3, 0.7)),
                                               (None, 2.0, (1.0, 2.0)), (0.5, 4.0, (0.5, 4.0)), (0, None, (0, 1))])
def test_the_weights_follow_timms_three_modes(task, distill, want):
    assert distill_weights(task, distill) == pytest.approx(want)


def test_every_distill_key_is_described_in_train_help():
    from vit.cli.help import config_schema

    rows = {r["key"]: r for r in config_schema() if r["section"] == "distill"}
    assert set(rows) == {f"distill.{k}" for k in DistillConfig.__dataclass_fields__}
    assert all(len(r["meaning"]) > 20 for r in rows.values()), [k for k, r in rows.items() if len(r["meaning"]) < 20]


def test_train_config_keeps_a_teacher_folder_absolute(tmp_path, monkeypatch):
    """A teacher given as a relative checkpoint folder is saved absolute (a resume from elsewhere finds it); a tag
    stays as written."""
    from vit.cli.training import train_config

    (tmp_path / "teacher").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg, _ = train_config(None, ["--distill.teacher=teacher"])
    assert cfg.distill.teacher == str(tmp_path / "teacher")
    assert train_config(None, ["--distill.teacher=hf-hub:org/t"])[0].distill.teacher == "hf-hub:org/t"
