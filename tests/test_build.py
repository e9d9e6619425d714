"""vit.models.build: the config's model section passed straight to create_model; single-channel models end to end."""

import dataclasses
import inspect

import numpy as np
import pytest
import torch
from helpers import TINY, run_script

import vit
from vit.config import CHOICES, ConfigError, ModelConfig, load_config
from vit.data.transforms import build_transform
from vit.models.build import build_model, check_model_config, model_kwargs
from vit.models.vit_options import OPTIONS


def test_every_model_key_is_a_create_model_option_and_reaches_the_model():
    """Each ModelConfig field is a create_model argument; set to a non-default value, it changes the model."""
    check_model_config(ModelConfig())  # passes: every field is an option
    options = OPTIONS | set(inspect.signature(vit.create_model).parameters)  # timm's keywords, objects' fields too
    setters = {n[len("set_"):] for n in dir(vit.VisionTransformer) if n.startswith("set_")}  # timm's switches
    assert {f.name for f in dataclasses.fields(ModelConfig)} <= options | setters
    cfg = load_config(None, ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=16",
                             "--model.depth=2", "--model.num_heads=2", "--model.mlp_ratio=2",
                             "--model.global_pool=avg", "--model.pos_embed=sincos", "--model.norm_layer=rmsnorm",
                             "--model.mlp_layer=swiglu", "--model.norm_first=false", "--model.init_values=0.1",
                             "--model.drop_path_rate=0.1", "--model.in_chans=1", "--model.token_reduction=merge:2",
                             "--model.grad_checkpointing=true"])
    m = build_model(cfg, 5)
    blk = m.blocks[0]
    assert (m.patch_embed.proj.weight.shape, m.global_pool, m.pos_embed_type) == ((16, 1, 8, 8), "avg", "sincos")
    assert isinstance(blk.norm1, torch.nn.RMSNorm) and isinstance(blk.mlp, vit.layers.SwiGLU)
    assert not blk.norm_first and torch.allclose(blk.ls1.gamma, torch.full((16,), 0.1))
    assert m.blocks[1].drop_path1.drop_prob == pytest.approx(0.1) and m.blocks.reduces_tokens
    assert m.head.out_features == 5 and len(m.blocks) == 2 and m.blocks[0].mlp.fc2.in_features == 32
    assert m.blocks.grad_checkpointing


def test_defaults_defer_to_the_variant_and_saved_model_args():
    cfg = load_config(None, ["--model.img_size=32", "--model.depth=1"])
    assert model_kwargs(cfg.model) == dict(img_size=32, drop_rate=0.0, attn_drop_rate=0.0,
                                           drop_path_rate=0.0, depth=1)
    # a checkpoint's config.json records an avg-pooled model: the config's default 'token' does not override it
    m = build_model(cfg, 3, saved=dict(architecture="vit_tiny_patch16_224", model_args=dict(global_pool="avg",
                                                                                           class_token=False)))
    assert m.global_pool == "avg" and m.cls_token is None and m.embed_dim == 192


def test_model_choices_live_in_the_field_type_and_the_models_package_exports_build_model():
    from vit.layers import MLP_LAYERS, POOL_KINDS

    assert CHOICES["model.global_pool"] == (*POOL_KINDS, None)  # the layers' registries, not copies of them
    assert CHOICES["model.mlp_layer"] == tuple(MLP_LAYERS)
    with pytest.raises(ConfigError, match=r"'model\.norm_layer' must be one of 'layernorm', 'rmsnorm'"):
        load_config(None, ["--model.norm_layer=batchnorm"])
    from vit.models import build_model as exported

    assert exported is build_model


def test_a_new_model_key_is_one_line_and_an_unknown_one_is_named():
    @dataclasses.dataclass
    class WithSetter(ModelConfig):  # what adding `grad_checkpointing: bool = False` to ModelConfig does
        grad_checkpointing: bool = False

    cfg = load_config(None, ["--model.img_size=32", "--model.depth=1"])
    cfg = dataclasses.replace(cfg, model=WithSetter(**{**dataclasses.asdict(cfg.model), "grad_checkpointing": True}))
    assert build_model(cfg, 3).blocks.grad_checkpointing is True  # reached model.set_grad_checkpointing(True)

    @dataclasses.dataclass
    class Extra(ModelConfig):
        frobnicate: bool = False

    with pytest.raises(ConfigError, match=r"'model\.frobnicate' is not an option of vit\.create_model"):
        check_model_config(Extra())


@pytest.mark.parametrize("in_chans", [2, 4])
def test_in_chans_other_than_grey_or_rgb_is_refused_at_config_time(in_chans):
    with pytest.raises(ConfigError, match=r"'model\.in_chans' must be 3 \(RGB\) or 1 \(grey\)"):
        load_config(None, [f"--model.in_chans={in_chans}"])


def test_grey_pipeline_is_the_luma_of_the_rgb_one():
    """The 1-channel pipeline gives one plane: for a grey image exactly the RGB pipeline's plane (digits), for a
    colour image the ITU-R 601 luma (float64 formula here), with the same random draws (crop, flip, erasing)."""
    cfg3 = load_config(None, ["--aug.random_erasing=1", "--aug.mean=[0.4, 0.4, 0.4]", "--aug.std=[0.2, 0.2, 0.2]"])
    cfg1 = load_config(None, ["--aug.random_erasing=1", "--aug.mean=[0.4]", "--aug.std=[0.2]", "--model.in_chans=1"])
    rgb, grey = build_transform(cfg3.aug, 24, train=True), build_transform(cfg1.aug, 24, train=True)
    rng = np.random.default_rng(0)
    flat = np.repeat(rng.integers(0, 256, (40, 36, 1), dtype=np.uint8), 3, axis=2)
    a, b = rgb(flat, seed=3), grey(flat, seed=3)
    assert a.shape == (3, 24, 24) and b.shape == (1, 24, 24)
    torch.testing.assert_close(b[0], a[0], atol=0, rtol=0)
    assert (b == 0).any()  # random erasing filled with the mean: 0 after normalization
    colour = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
    val1 = build_transform(cfg1.aug, 24, train=False)
    luma = colour.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    ref = (np.round(luma) / 255 - 0.4) / 0.2
    np.testing.assert_allclose(val1(colour)[0].numpy(), ref, atol=1 / 255 / 0.2 + 1e-6)  # within one grey level


@pytest.mark.slow
def test_one_epoch_on_grey_digits_end_to_end(tmp_path):
    """model.in_chans=1 on digits: the pipeline gives 1 channel, the run trains, saves and reloads."""
    r = run_script("train.py", "--model.in_chans=1", "--run.epochs=1", "--data.val_fraction=0.9",
                   f"--run.output_dir={tmp_path}", "--run.name=g", *TINY, "--model.img_size=16",
                   "--model.patch_size=8", "--data.batch_size=32")
    assert r.returncode == 0, r.stderr[-3000:]
    from vit.data import build_datasets
    from vit.models.checkpoint import load_checkpoint

    model, cfg, classes, _ = load_checkpoint(tmp_path / "g/best")
    assert model.patch_embed.proj.weight.shape[1] == 1 and cfg.aug.mean == [0.5] and cfg.aug.std == [0.5]
    _, val, _ = build_datasets(cfg, splits=("val",), classes=classes)
    x, _ = val[0]
    assert x.shape == (1, 16, 16)
    with torch.no_grad():
        assert model(x[None]).shape == (1, 10)


def test_a_sincos_checkpoint_without_the_big_vision_mark_warns_on_load(tmp_path, caplog):
    """sincos_2d changed to big_vision's table; a checkpoint saved before (no mark in its safetensors metadata)
    loads with a warning, one saved now loads silently."""
    from safetensors.torch import load_file, save_file

    from vit.models.checkpoint import load_checkpoint, save_checkpoint

    cfg = load_config(None, ["--model.img_size=32", "--model.embed_dim=16", "--model.depth=1",
                             "--model.num_heads=2", "--model.pos_embed=sincos"])
    folder = save_checkpoint(tmp_path / "new", build_model(cfg, 3), cfg, ["a", "b", "c"])
    with caplog.at_level("WARNING", logger="vit.models.checkpoint"):
        load_checkpoint(folder)
    assert not caplog.records
    save_file(load_file(folder / "model.safetensors"), folder / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level("WARNING", logger="vit.models.checkpoint"):
        load_checkpoint(folder)
    assert any("earlier sin-cos position table" in r.getMessage() for r in caplog.records)
