"""Configs: typed dataclasses, strict YAML loading, dotted overrides, every shipped config loads."""

import re

import pytest

from vit.config import Config, ConfigError, load_config, parse_overrides


def test_default_yaml_loads_and_overrides_are_typed():
    cfg = load_config("configs/default.yaml", ["--optim.lr=3e-4", "--run.epochs", "7", "--run.compile",
                                               "--aug.mean=[0.1, 0.2, 0.3]", "--model.init_values=null",
                                               "--model.in_chans=3"])
    assert isinstance(cfg, Config)
    assert cfg.optim.lr == pytest.approx(3e-4) and isinstance(cfg.optim.lr, float)
    assert cfg.run.epochs == 7 and cfg.run.compile is True
    assert cfg.aug.mean == [0.1, 0.2, 0.3]
    assert cfg.model.init_values is None
    assert cfg.data.dataset == "digits"


@pytest.mark.parametrize("override,key", [
    ("--optim.lrr=1", "optim.lrr"),
    ("--foo.bar=1", "foo.bar"),
    ("--run.epochs=ten", "run.epochs"),
    ("--run.epochs=2.5", "run.epochs"),
    ("--run.compile=3", "run.compile"),
    ("--optim.lr=-1", "optim.lr"),
    ("--data.batch_size=0", "data.batch_size"),
    ("--model.patch_size=7", "model.patch_size"),
    ("--model.num_heads=5", "model.num_heads"),
    ("--data.dataset=imagenet", "data.dataset"),
    ("--aug.hflip=2", "aug.hflip"),
])
def test_bad_values_name_their_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("configs/default.yaml", [override])


def test_unknown_yaml_key_and_bad_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("optim:\n  lr: 1.0e-3\n  wieght_decay: 0.1\n")
    with pytest.raises(ConfigError, match="optim.wieght_decay"):
        load_config(p)
    p.write_text("optim: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_parse_overrides_forms():
    assert parse_overrides(["--a.b=1", "--c.d", "x", "--e.f"]) == {"a.b": 1, "c.d": "x", "e.f": True}
    with pytest.raises(ConfigError, match="unexpected argument"):
        parse_overrides(["oops"])


def test_every_shipped_config_loads():
    from pathlib import Path

    files = sorted(Path("configs").glob("*.yaml"))
    assert len(files) >= 4
    for f in files:
        load_config(f)


@pytest.mark.parametrize("override, hint", [
    ("--data.naflex={max_num_patches:16}", "write {max_num_patches: 16}"),
    ("--model.rope={kind:axial}", "write {kind: axial}"),
])
def test_a_flow_mapping_without_a_space_after_the_colon_says_so(override, hint):
    """YAML reads {max_num_patches:16} as the one key 'max_num_patches:16'; the unknown-key sentence said only that."""
    with pytest.raises(ConfigError, match=r"; valid keys here: .* \(YAML needs a space after the colon: "
                                          + re.escape(hint) + r"\)\.$"):
        load_config(None, [override])
    with pytest.raises(ConfigError, match=r"valid keys here: [a-z_, ]+\.$"):  # a plain misspelling: no hint
        load_config(None, ["--data.naflex={max_patches: 16}"])
