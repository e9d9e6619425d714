"""config.json's model_args are checked like config keys, and the model's size is bounded, before anything is built."""

import json

import pytest
from test_untrusted_weights import make_folder

import vit
from vit.config import ConfigError


@pytest.mark.parametrize("key,value,match", [
    ("depth", 0, r"'model_args\.depth' must be positive, got 0"),
    ("num_heads", -2, r"'model_args\.num_heads' must be positive"),
    ("embed_dim", "32", r"'model_args\.embed_dim' must be int, got str"),
    ("depth", [2], r"'model_args\.depth' must be int, got list"),
    ("embed_dim", 32.5, r"'model_args\.embed_dim' must be int, got float 32\.5"),
    ("mlp_ratio", "NaN", r"'model_args\.mlp_ratio' must be a finite number"),
    ("num_classes", -5, r"'model_args\.num_classes' must not be negative"),
    ("num_heads", 3, r"'model_args\.num_heads' \(3\) must divide 'model_args\.embed_dim' \(32\)"),
    ("img_size", [32, "x"], r"'model_args\.img_size\[1\]' must be int"),
    ("qkv_bias", "yes please", r"'model_args\.qkv_bias' must be bool or one of 'qv'"),
    ("embed_dim", 10**9, r"parameters.*more than"),
    ("depth", 10**7, r"parameters.*more than"),
    ("img_size", [10**6, 10**6], r"parameters.*more than"),
    ("mlp_ratio", 1e308, r"over 1e\+308 parameters"),
])
def test_bad_model_args_get_one_sentence(tmp_path, key, value, match):
    folder, _ = make_folder(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_args"][key] = value
    text = json.dumps(cfg).replace('"NaN"', "NaN")
    (folder / "config.json").write_text(text)
    with pytest.raises((ValueError, ConfigError), match=match) as e:
        vit.create_model(f"local-dir:{folder}", pretrained=True)
    assert "\n" not in str(e.value) and "config.json" in str(e.value)


def test_good_model_args_still_build_the_model_they_describe(tmp_path):
    folder, ref = make_folder(tmp_path / "m")
    model = vit.create_model(f"local-dir:{folder}", pretrained=False)
    assert (model.embed_dim, len(model.blocks), model.patch_embed.img_size) == (32, 2, (32, 32))


def test_the_size_bound_applies_to_overrides_too():
    with pytest.raises(ValueError, match=r"parameters.*more than"):
        vit.create_model("vit_tiny_patch16_224", embed_dim=2**20, num_heads=1)


def test_a_wrong_type_in_the_top_level_num_classes_is_named(tmp_path):
    folder, _ = make_folder(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_classes"] = "5"
    del cfg["model_args"]["num_classes"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"'model_args\.num_classes' must be int, got str"):
        vit.create_model(f"local-dir:{folder}", pretrained=True)


@pytest.mark.parametrize("kw", [dict(), dict(img_size=64, patch_size=8, embed_dim=48, depth=3, num_heads=3,
                                             mlp_ratio=2.5, num_classes=7, in_chans=1)])
def test_the_parameter_estimate_counts_what_the_model_allocates(kw):
    from vit.models.build import estimated_params
    from vit.models.variants import VARIANTS

    args = {**VARIANTS["vit_tiny_patch16_224"], **kw}
    model = vit.create_model("vit_tiny_patch16_224", **kw)
    real = sum(p.numel() for p in model.parameters())
    assert abs(estimated_params(args) - real) / real < 0.01


@pytest.mark.parametrize("key,value,match", [
    ("init_values", float("nan"), r"'model_args\.init_values' must be a finite number"),
    ("drop_path_rate", 2.0, r"'model_args\.drop_path_rate' must be between 0 and 1"),
    ("drop_rate", float("nan"), r"'model_args\.drop_rate' must be between 0 and 1, got nan"),
    ("depth", -1, r"'model_args\.depth' must be positive"),
    ("num_heads", 0, r"'model_args\.num_heads' must be positive"),
    ("mlp_ratio", 0, r"'model_args\.mlp_ratio' must be positive"),
    ("num_classes", -1, r"'model_args\.num_classes' must not be negative"),
    ("embed_dim", "192", r"'model_args\.embed_dim' must be int"),
    ("patch_size", -16, r"'model_args\.patch_size' must be positive"),
    ("embed_dim", 10**8, r"'model_args\.num_heads' \(3\) must divide 'model_args\.embed_dim' \(100000000\)"),
])
def test_keyword_values_get_the_sentence_a_config_gets(key, value, match):
    """vit.create_model's keywords were not checked: NaN init_values gave NaN logits, depth -1 a model of no blocks,
    drop_path_rate 2 trained silently, num_heads 0 a ZeroDivisionError, embed_dim 10**8 beside the variant's 3 heads
    allocated a 300 GB patch embedding. They get the config.json checks, named by the call, against the variant's
    values too; good values still build the model."""
    with pytest.raises(ConfigError, match=r"create_model\('vit_tiny_patch16_224'\): config key " + match) as e:
        vit.create_model("vit_tiny_patch16_224", img_size=32, **{key: value})
    assert "\n" not in str(e.value)
    m = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, init_values=1e-5, drop_path_rate=0.1)
    assert len(m.blocks) == 1 and m.blocks[0].ls1.gamma.eq(1e-5).all()


@pytest.mark.parametrize("key,value,match", [
    ("init_values", 1e30, r"'model_args\.init_values' \(the LayerScale start.*\) must be between 0 and 10, got 1e\+30"),
    ("init_values", -1.0, r"'model_args\.init_values' .* must be between 0 and 10, got -1\.0"),
    ("mlp_ratio", 1e-9, r"'model_args\.mlp_ratio' \(1e-09\) gives an MLP of width int\(192 \* 1e-09\) = 0"),
    ("attn_pool_mlp_ratio", 1e-3, r"'model_args\.attn_pool_mlp_ratio' \(0\.001\) gives an MLP of width"),
])
def test_values_that_build_a_broken_model_are_refused(key, value, match):
    """init_values 1e30 overflowed float32 within two blocks (NaN logits); mlp_ratio 1e-9 built 0-wide MLPs."""
    with pytest.raises(ConfigError, match=r"create_model\('vit_tiny_patch16_224'\): config key " + match) as e:
        vit.create_model("vit_tiny_patch16_224", img_size=32, **{key: value})
    assert "\n" not in str(e.value)
    m = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, init_values=1.0, mlp_ratio=1 / 192)
    assert m.blocks[0].mlp.fc1.out_features == 1 and m.blocks[0].ls1.gamma.eq(1.0).all()


def test_a_number_given_as_text_builds_with_the_number():
    """drop_rate='0.1' passed the check (YAML 1.1 reads '3e-4' as text, so text is read as a float) but the text
    reached the model: a TypeError comparing str with int. The model is built with the number the check read."""
    m = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, drop_rate="0.1", drop_path_rate="0.2")
    assert m.head_drop.p == 0.1 and m._model_args["drop_rate"] == 0.1 and m._model_args["drop_path_rate"] == 0.2


@pytest.mark.parametrize("name", [None, 5, ["vit_tiny_patch16_224"]])
def test_a_name_that_is_not_text_is_one_sentence(name):
    with pytest.raises(TypeError, match=r"create_model takes a model name \(a str .*\), got ") as e:
        vit.create_model(name)
    assert "\n" not in str(e.value)
