"""Configs are read strictly: bad values, duplicate keys, alias bombs and fuzzed files give one ConfigError."""

# Configs are read strictly: non-finite or out-of-range values, duplicate keys, alias bombs and fuzzed
# files give a config or one clean ConfigError.


import pytest
from helpers import TINY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vit.config import ConfigError, from_dict, load_config
from vit.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=5),
                    st.lists(st.floats(-2, 2), max_size=4))


sections = st.sampled_from(["model", "data", "aug", "optim", "run", "bogus"])


keys = st.sampled_from(["lr", "img_size", "batch_size", "dataset", "epochs", "mean", "hflip", "name", "zzz",
                        "patch_size", "num_heads", "scale", "on_bad_image", "mixed_precision", "layer_decay"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(sections, st.one_of(scalars, st.dictionaries(keys, scalars, max_size=4)), max_size=4))
def test_fuzz_config_loading_gives_config_or_clean_error(data):
    try:
        from_dict(data)
    except ConfigError as e:
        assert str(e) and "\n" not in str(e)


@pytest.mark.parametrize("arg,key", [
    ("--optim.lr=inf", "optim.lr"), ("--optim.min_lr=.inf", "optim.min_lr"),
    ("--optim.weight_decay=nan", "optim.weight_decay"), ("--optim.clip_grad=nan", "optim.clip_grad"),
    ("--optim.warmup_epochs=inf", "optim.warmup_epochs"), ("--aug.std=[0.5,0.0,0.5]", "aug.std"),
    ("--aug.std=[0.5,1e-320,0.5]", "aug.std"),
    ("--aug.mean=[0.5,.nan,0.5]", "aug.mean[1]"), ("--aug.scale=[0.9,0.1]", "aug.scale"),
    ("--run.name=../escape", "run.name"), ("--run.name=/tmp/abs", "run.name"), ("--run.name=''", "run.name"),
    ("--run.name=..", "run.name"),
])
def test_non_finite_and_out_of_range_values_are_refused(arg, key):
    with pytest.raises(ConfigError, match=key.replace("[", "\\[")) as e:
        load_config(None, [arg])
    assert "\n" not in str(e.value)


def test_duplicate_keys_and_alias_bombs_are_refused_in_configs_and_checkpoints(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("run:\n  name: a\noptim:\n  lr: 0.1\nrun:\n  epochs: 3\n")
    with pytest.raises(ConfigError, match="'run' appears twice"):
        load_config(dup)
    levels = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    levels += [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\n")  # ~700 bytes, 9**9 strings once expanded
    with pytest.raises(ConfigError, match="aliases expand to more than"):
        load_config(bomb)
    import yaml

    from vit.config import StrictLoader

    # a merge key overriding a merged value is not a duplicate
    assert yaml.load("o: &b {lr: 0.5}\noptim:\n  <<: *b\n  lr: 0.1\n", Loader=StrictLoader)["optim"] == {"lr": 0.1}
    import vit

    ck = save_checkpoint(tmp_path / "ck", vit.create_model("vit_tiny_patch16_224", img_size=32, depth=1,
                                                           num_classes=2), load_config(None, TINY), ["a", "b"])
    (ck / "config.yaml").write_text((ck / "config.yaml").read_text() + "model:\n  depth: 1\n")
    with pytest.raises(CheckpointError, match="appears twice"):
        load_checkpoint(ck)
    (ck / "config.yaml").write_text(bomb.read_text())
    with pytest.raises(CheckpointError, match="aliases expand"):
        load_checkpoint(ck)
