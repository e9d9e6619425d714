"""Every create_model option reachable from YAML and dotted overrides, under one name from the config to the layer:
the options objects made by one convention (`vit.config.options_from`), a model built from a config equal to
create_model with the same keywords (keys, shapes, weights, logits) and again after its checkpoint is reloaded,
and the config's choices the layers' registries."""

import dataclasses
import typing

import pytest
import torch

import vit
from vit.config import (
    CHOICES,
    ConfigError,
    ModelConfig,
    NaFlex,
    NaFlexOptions,
    OptionError,
    RelPos,
    Rope,
    SparseOptions,
    Stem,
    UnknownOption,
    choices,
    load_config,
    options_from,
)
from vit.models import build_model
from vit.models.checkpoint import load_checkpoint, save_checkpoint
from vit.models.vit_options import MAPPINGS, OPTIONS, PYTHON_ONLY, architecture_defaults

# each options class, a valid mapping of it, and one field with a value of the wrong type
OPTIONS_CLASSES = [
    (SparseOptions, dict(method="dsa"), ("block_size", "64")),
    (NaFlexOptions, dict(), ("max_num_patches", 1.5)),
    (Rope, dict(kind="dinov3"), ("temperature", "hot")),
    (RelPos, dict(kind="table"), ("shared", "sometimes")),
    (Stem, dict(kind="resnetv2"), ("layers", [3, "four"])),
    (NaFlex, dict(pos_grid=[4, 4]), ("antialias", 2)),
]


@pytest.mark.parametrize("cls,valid,wrong", OPTIONS_CLASSES, ids=lambda v: getattr(v, "__name__", ""))
def test_an_unknown_key_lists_the_valid_ones_and_a_wrong_type_names_its_key(cls, valid, wrong):
    fields = sorted(f.name for f in dataclasses.fields(cls))
    assert options_from(cls, valid) == cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in valid.items()})
    assert options_from(cls, None) is None
    with pytest.raises(UnknownOption) as e:
        options_from(cls, {**valid, "colour": 1})
    assert str(e.value) == f"{cls.__name__} option 'colour' is not one of its options; valid: {', '.join(fields)}."
    key, value = wrong
    with pytest.raises(OptionError, match=rf"^{cls.__name__} option '{key}(\[\d\])?' must be ") as e:
        options_from(cls, {**valid, key: value})
    assert "\n" not in str(e.value) and e.value.key.split("[")[0] == key
    with pytest.raises(ConfigError, match=rf"^{cls.__name__} takes a {cls.__name__}, a mapping of its options"):
        options_from(cls, 3)


@pytest.mark.parametrize("keyword,cls", sorted(MAPPINGS.items()))
def test_create_model_and_the_config_answer_a_bad_mapping_with_the_same_sentence(keyword, cls):
    """`create_model(rope=dict(foo=1))` gave Python's raw TypeError; every mapping keyword and its config key now
    answer with the valid keys (the config by dotted key)."""
    valid = next(v for c, v, _ in OPTIONS_CLASSES if c is cls)
    fields = ", ".join(sorted(f.name for f in dataclasses.fields(cls)))
    with pytest.raises(UnknownOption, match=rf"^{keyword} option 'foo' is not one of its options; valid: {fields}\.$"):
        vit.create_model("vit_tiny_patch16_224", depth=1, **{keyword: {**valid, "foo": 1}})
    overrides = [f"--model.{keyword}.{k}={v}" for k, v in valid.items()] + [f"--model.{keyword}.foo=1"]
    with pytest.raises(ConfigError, match=rf"^unknown config key 'model\.{keyword}\.foo'; valid keys here: "
                                          rf"{fields}\.$"):
        load_config(None, overrides)


def test_every_create_model_option_is_a_model_config_field_under_its_own_name():
    """The data's class count is the one option a config does not hold (build_model passes it); every mapping
    keyword is a field typed with its options class, so YAML reaches it and from_dict checks it."""
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    assert OPTIONS - set(fields) - PYTHON_ONLY == {"num_classes"}
    hints = typing.get_type_hints(ModelConfig)
    for keyword, cls in MAPPINGS.items():
        assert hints[keyword] == cls | None, keyword


TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
# (YAML model section beyond TINY, a dotted override, the same model's create_model keywords)
CASES = {
    "rope": ("rope: {kind: dinov3, rotate_half: true}\n  pos_embed: none", "--model.rope.temperature=100",
             dict(rope=dict(kind="dinov3", rotate_half=True, temperature=100.0), pos_embed="none")),
    "rope_mixed": ("rope: {kind: mixed, grid_indexing: xy}", "--model.rope.temperature=10",
                   dict(rope=dict(kind="mixed", grid_indexing="xy", temperature=10.0))),
    "rel_pos": ("rel_pos: {kind: table}\n  pos_embed: none\n  layer_scale_names: gamma\n  init_values: 0.1",
                "--model.qkv_bias=qv",
                dict(rel_pos=dict(kind="table"), pos_embed="none", layer_scale_names="gamma", init_values=0.1,
                     qkv_bias="qv")),
    "rel_pos_mlp": ("rel_pos: {kind: mlp, hidden_dim: 16}\n  class_token: false\n  global_pool: avg",
                    "--model.rel_pos.shared=true",
                    dict(rel_pos=dict(kind="mlp", hidden_dim=16, shared=True), class_token=False, global_pool="avg")),
    "stem": ("stem: {kind: resnetv2, layers: []}\n  norm_eps: 1e-5", "--model.patch_size=1",
             dict(stem=dict(kind="resnetv2", layers=()), patch_size=1, norm_eps=1e-5)),
    "block_parts": ("qkv_fused: false\n  scale_attn_norm: true\n  scale_mlp_norm: true\n  res_post_norm: true\n"
                    "  mlp_layer: swiglu\n  norm_layer: rmsnorm", "--model.proj_bias=false",
                    dict(qkv_fused=False, scale_attn_norm=True, scale_mlp_norm=True, res_post_norm=True,
                         mlp_layer="swiglu", norm_layer="rmsnorm", proj_bias=False)),
    "pooling": ("global_pool: map\n  class_token: false\n  attn_pool_num_heads: 1\n  embed_norm: true",
                "--model.mlp_layer=geglu",
                dict(global_pool="map", class_token=False, attn_pool_num_heads=1, embed_norm=True,
                     mlp_layer="geglu")),
    "naflex": ("naflex: {pos_grid: [4, 4]}\n  name: naflexvit_base_patch16_gap", "--model.naflex.interp_mode=bilinear",
               dict(naflex=dict(pos_grid=(4, 4), interp_mode="bilinear"))),
}


def _yaml(tmp_path, extra: str):
    section = "\n  ".join(f"{k}: {v}" for k, v in TINY.items())
    path = tmp_path / "model.yaml"
    path.write_text(f"model:\n  {section}\n  {extra}\n")
    return path


def _logits(model, naflex: bool) -> torch.Tensor:
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    if naflex:  # the NaFlex model takes timm's patch batch
        from vit.layers import patchify

        x = patchify(x, (8, 8))
    with torch.no_grad():
        return model.eval()(x)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_model_from_yaml_equals_create_model_with_the_same_keywords_and_reloads_from_its_checkpoint(
        case, tmp_path):
    extra, override, keywords = CASES[case]
    cfg = load_config(_yaml(tmp_path, extra), [override])
    name = cfg.model.name or "vit_tiny_patch16_224"
    torch.manual_seed(0)
    ours = build_model(cfg, 3)
    torch.manual_seed(0)
    ref = vit.create_model(name, num_classes=3, **{**TINY, **keywords}, drop_rate=0.0, attn_drop_rate=0.0,
                           drop_path_rate=0.0)  # the recipe's rates, which a config always passes
    assert ours._model_args == ref._model_args
    a, b = ours.state_dict(), ref.state_dict()
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
    assert all(torch.equal(a[k], b[k]) for k in a)  # same construction, same seed: the same weights
    naflex = "naflex" in ours._model_args and ours._model_args["naflex"] is not None
    torch.testing.assert_close(_logits(ours, naflex), _logits(ref, naflex), rtol=0, atol=0)

    folder = save_checkpoint(tmp_path / "ck", ours, cfg, ["a", "b", "c"])
    again, saved_cfg, _, _ = load_checkpoint(folder)
    # config.yaml's model section reads back to the same options objects (name and channels saved resolved)
    assert dataclasses.replace(saved_cfg.model, name=cfg.model.name, in_chans=cfg.model.in_chans) == cfg.model
    full = lambda args: {**architecture_defaults(name), "in_chans": 3, **args}  # noqa: E731 (config.json adds defaults)
    assert full(again._model_args) == full(ref._model_args)
    assert all(torch.equal(t, b[k]) for k, t in again.state_dict().items()) and again.state_dict().keys() == b.keys()
    torch.testing.assert_close(_logits(again, naflex), _logits(ref, naflex), rtol=0, atol=0)


def test_the_config_choices_are_the_layers_registries():
    """ModelConfig's choices are vit/config/choices.py's tuples, and those are the layers' registries, so a kind
    added to a layer is a choice of the config at once (2 of 6 MLP kinds were before)."""
    from vit.layers import MLP_LAYERS, POOL_KINDS
    from vit.layers.norm import NORM_LAYERS
    from vit.models.vision_transformer import VisionTransformer

    assert choices.MLP_LAYERS == tuple(MLP_LAYERS) and CHOICES["model.mlp_layer"] == tuple(MLP_LAYERS)
    assert choices.NORM_LAYERS == tuple(NORM_LAYERS) and CHOICES["model.norm_layer"] == tuple(NORM_LAYERS)
    assert choices.POOL_KINDS == POOL_KINDS and CHOICES["model.global_pool"] == (*POOL_KINDS, None)
    pos = typing.get_args(typing.get_type_hints(VisionTransformer.__init__)["pos_embed"])
    assert choices.POS_EMBEDS == pos and CHOICES["model.pos_embed"] == pos
    assert CHOICES["model.layer_scale_names"] == (*choices.LAYER_SCALE_NAMES, None)
    for cls, field, names in ((Rope, "kind", choices.ROPE_KINDS), (RelPos, "kind", choices.REL_POS_KINDS),
                              (Stem, "kind", choices.STEM_KINDS), (NaFlex, "interp_mode", choices.INTERP_MODES)):
        assert typing.get_args(typing.get_type_hints(cls)[field]) == names


# every name of a choice builds: a choice the layers do not implement fails here by name
KIND_MODELS = [dict(mlp_layer=k) for k in choices.MLP_LAYERS] + [dict(norm_layer=k) for k in choices.NORM_LAYERS] + [
    dict(pos_embed=k) for k in choices.POS_EMBEDS] + [dict(layer_scale_names=k, init_values=0.1)
                                                      for k in choices.LAYER_SCALE_NAMES] + [
    dict(rope=dict(kind=k), pos_embed="none") for k in choices.ROPE_KINDS] + [
    dict(rel_pos=dict(kind=k), pos_embed="none") for k in choices.REL_POS_KINDS] + [
    dict(global_pool=k, class_token=k == "token") for k in choices.POOL_KINDS if k]


@pytest.mark.parametrize("keywords", KIND_MODELS, ids=str)
def test_every_choice_builds_a_model_that_runs(keywords):
    model = vit.create_model("vit_tiny_patch16_224", num_classes=2, **{**TINY, "depth": 1}, **keywords)
    assert torch.isfinite(_logits(model, False)).all()


@pytest.mark.parametrize("kind,stem", [("resnetv2", dict(layers=())), ("mci", {}),
                                       ("vitamin", dict(widths=(16, 32)))])
def test_every_stem_kind_builds(kind, stem):
    model = vit.create_model("vit_tiny_patch16_224", num_classes=2, **{**TINY, "depth": 1, "patch_size": 1},
                             stem=dict(kind=kind, **stem)) if kind == "resnetv2" else None
    if kind != "resnetv2":  # MobileCLIP's and ViTamin's stems stride 16 and end at the token width
        model = vit.create_model("vit_tiny_patch16_224", num_classes=2, **{**TINY, "depth": 1, "patch_size": 1,
                                                                         "img_size": 64}, stem=dict(kind=kind, **stem))
    x = torch.randn(1, 3, *model.patch_embed.img_size)
    assert torch.isfinite(model.eval()(x)).all()
