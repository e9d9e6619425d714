"""YAML 1.1 booleans do not eat documented strings: --run.mixed_precision=no means the string no."""

# YAML 1.1's booleans (yes/no/on/off) do not eat documented string values: `--run.mixed_precision=no` and
# `mixed_precision: no` in a file mean the string 'no'; keys typed bool still take yes/no/on/off.

import pytest
import yaml

from vit.config import Config, ConfigError, dump, from_dict, load_config, parse_overrides, read_yaml
from vit.train.runfolder import resume_changes


@pytest.mark.parametrize("value", ["no", "fp16", "bf16"])
def test_mixed_precision_spellings_from_overrides_and_files(tmp_path, value):
    assert load_config(None, [f"--run.mixed_precision={value}"]).run.mixed_precision == value
    assert load_config(None, ["--run.mixed_precision", value]).run.mixed_precision == value
    (tmp_path / "c.yaml").write_text(f"run:\n  mixed_precision: {value}\n")
    assert load_config(tmp_path / "c.yaml").run.mixed_precision == value


def test_yaml11_words_stay_strings_for_str_keys_and_are_booleans_for_bool_keys(tmp_path):
    assert parse_overrides(["--a.b=no", "--a.c=On", "--a.d=true", "--a.e=FALSE", "--a.f"]) == \
        {"a.b": "no", "a.c": "On", "a.d": True, "a.e": False, "a.f": True}
    (tmp_path / "c.yaml").write_text("run:\n  name: off\n  compile: yes\ndata:\n  download: no\n"
                                     "  on_bad_image: error\nmodel:\n  pretrained: no\n")
    cfg = load_config(tmp_path / "c.yaml", ["--run.overwrite=on", "--optim.ema=Off"])
    assert (cfg.run.name, cfg.run.compile, cfg.data.download, cfg.run.overwrite, cfg.optim.ema) == \
        ("off", True, False, True, False)
    assert cfg.model.pretrained is False  # bool | str: 'no' is the boolean, not a hub name 'no'
    with pytest.raises(ConfigError, match="'run.compile' must be bool, got str 'maybe'"):
        load_config(None, ["--run.compile=maybe"])
    with pytest.raises(ConfigError, match="'run.mixed_precision' must be one of 'no', 'bf16', 'fp16', 'auto', got"):
        load_config(None, ["--run.mixed_precision=fp8"])


def test_dump_round_trips_through_our_loader_and_plain_yaml(tmp_path):
    cfg = load_config(None, ["--run.mixed_precision=no", "--run.name=yes"])
    text = dump(cfg)
    assert "mixed_precision: 'no'" in text  # quoted: a YAML 1.1 reader (yaml.safe_load) also gets the string
    assert yaml.safe_load(text)["run"]["mixed_precision"] == "no"
    (tmp_path / "c.yaml").write_text(text)
    assert from_dict(read_yaml(tmp_path / "c.yaml")) == cfg


def test_resume_of_a_run_saved_with_null_precision_accepts_the_resolved_one():
    old, new = Config(), load_config(None, ["--run.mixed_precision=no"])
    assert resume_changes(old, new, "run") == {} and resume_changes(new, old, "run") == {}
    with pytest.raises(ValueError, match="run.mixed_precision"):  # a known precision must not change
        resume_changes(new, load_config(None, ["--run.mixed_precision=bf16"]), "run")
