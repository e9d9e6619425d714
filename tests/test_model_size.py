"""The model-size bound (vit.models.model_size): the count before building equals the built model's, over every
option that makes tensors, and a huge value of each is one sentence before any real tensor is made."""

import json
import re
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import vit
import vit.models.build as build_module
import vit.models.clip as clip_module
from vit.models.build import estimated_params
from vit.models.clip import new_clip_model
from vit.models.model_size import entries, text_size
from vit.models.text_encoder import TextEncoder
from vit.models.variants import VARIANTS

SMALL = dict(embed_dim=48, depth=3, num_heads=3, img_size=32, num_classes=5)
ARCHITECTURES = [  # (variant, overrides): plain, registers + attention pooling, relative positions, stems, rope
    ("vit_tiny_patch16_224", dict(SMALL, mlp_ratio=2.5, in_chans=1)),
    ("vit_tiny_patch16_224", dict(SMALL, reg_tokens=4, global_pool="map", attn_pool_mlp_ratio=3.0, depth=18)),
    ("vit_tiny_patch16_224", dict(SMALL, class_token=False, global_pool="avg", rel_pos=dict(kind="mlp", hidden_dim=40),
                                  depth=17)),
    ("vit_tiny_patch16_224", dict(SMALL, rel_pos=dict(kind="table"), dist_token=False)),
    ("vit_srelpos_small_patch16_224", dict(SMALL)),
    ("vit_tiny_patch16_224", dict(SMALL, stem=dict(kind="resnetv2", layers=(1, 18)), patch_size=1, img_size=64)),
    ("vit_tiny_r_s16_p8_224", dict(SMALL, img_size=64)),
    ("vit_base_mci_224", dict(SMALL, embed_dim=32, num_heads=2, img_size=64)),
    ("vit_tiny_patch16_224", dict(SMALL, rope=dict(kind="mixed"), pos_embed="none")),
    ("vit_tiny_patch16_224", dict(SMALL, dist_token=True, pos_embed="sincos")),
]


def _real(name, kw):
    torch.manual_seed(0)
    return vit.create_model(name, **kw)


@pytest.mark.parametrize("name, kw", ARCHITECTURES)
def test_the_count_before_building_equals_the_built_models(name, kw):
    """Counted on the meta device, the stacks whole (keep=16) and extrapolated from one and two copies (keep=1):
    the same number as the parameters and buffers the built model holds."""
    model = _real(name, kw)
    args = {**VARIANTS[name], **kw}
    assert estimated_params(args) == entries(model)
    assert estimated_params(args, keep=1) == entries(model)  # every stack, the depth and stem stages, extrapolated


def test_the_text_tower_count_equals_the_built_tower():
    kw = dict(vocab_size=500, embed_dim=32, depth=19, num_heads=4, max_len=20, global_pool="eos", causal=True,
              mlp_ratio=3.0)
    assert text_size(kw) == entries(TextEncoder(**kw))


def test_the_lora_count_is_what_peft_adds():
    pytest.importorskip("peft")
    from vit.train.lora import add_lora

    model = vit.create_model("vit_tiny_patch16_224", **SMALL)
    before = entries(model)
    add_lora(model, rank=5)
    d, hidden = 48, 192
    assert entries(model) - before == 3 * 5 * ((d + 3 * d) + (d + d) + (d + hidden) + (hidden + d))


def _no_real_model(monkeypatch, module, attr):
    """Replace module.attr (a model class) by one that refuses to be built outside the meta device: a refusal
    that comes after a real build fails the test instead of passing it."""
    real = getattr(module, attr)

    def guarded(*args, **kwargs):
        if torch.empty(0).device.type != "meta":
            raise AssertionError(f"{attr} was built for real before the size was refused")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, attr, guarded)


@pytest.mark.parametrize("kw, shown", [
    (dict(reg_tokens=10**9), "reg_tokens=1000000000"),
    (dict(rel_pos=dict(kind="mlp", hidden_dim=10**12)), "rel_pos=RelPos(kind='mlp', hidden_dim=1000000000"),
    (dict(rel_pos=dict(kind="mlp"), class_token=False, global_pool="avg", img_size=4096, patch_size=4), "img_size"),
    (dict(stem=dict(kind="resnetv2", layers=(10**6,)), patch_size=1, img_size=64),
     "stem=Stem(kind='resnetv2', layers=(1000000,)"),
    (dict(global_pool="map", attn_pool_mlp_ratio=1e9), "attn_pool_mlp_ratio=1000000000.0"),
    (dict(depth=10**7, embed_dim=192), "depth=10000000"),
    (dict(mlp_ratio=1e308), "mlp_ratio=1e+308"),
])
def test_a_huge_vision_option_is_refused_before_the_model_is_built(monkeypatch, kw, shown):
    _no_real_model(monkeypatch, build_module, "VisionTransformer")
    with pytest.raises(ValueError, match=r"vit_tiny_patch16_224 would have (about \S+|over 1e\+308) parameters "
                                         r"\(buffers included\), more than 1e\+10 \(.*") as e:
        vit.create_model("vit_tiny_patch16_224", **kw)
    assert shown in str(e.value) and "\n" not in str(e.value)


def test_a_resnetv2_stem_of_more_than_four_stages_is_refused():
    """timm's ResNetV2 has four stage widths and zips the layers with them: a fifth stage was dropped silently
    while the stride counted it."""
    with pytest.raises(ValueError, match=r"^Stem option 'layers' has at most 4 stages in a resnetv2 stem \(timm's "
                                         r"ResNetV2\), got \(1, 1, 1, 1, 1\)\.$"):
        vit.create_model("vit_tiny_patch16_224", stem=dict(kind="resnetv2", layers=(1,) * 5), patch_size=1)


def _tokenizer(vocab, context=16):
    return SimpleNamespace(tokenizer=SimpleNamespace(vocab_size=vocab), context_length=context)


@pytest.mark.parametrize("vocab, width, depth, context", [
    (10**12, 64, 2, 16),  # a tokenizer's vocabulary
    (1000, 2**20, 2, 16),  # contrastive.text_width
    (1000, 64, 10**7, 16),  # contrastive.text_depth
    (1000, 64, 2, 10**10),  # contrastive.context_length
])
def test_a_huge_contrastive_text_tower_is_refused_before_it_is_built(monkeypatch, vocab, width, depth, context):
    _no_real_model(monkeypatch, clip_module, "TextEncoder")
    visual = vit.create_model("vit_tiny_patch16_224", **dict(SMALL, num_classes=16))
    with pytest.raises(ValueError, match=r"the contrastive model would have about \S+ parameters \(buffers "
                                         r"included\), more than 1e\+10 \(text tower: width .*; lower contrastive\."
                                         r"text_width") as e:
        new_clip_model(visual, _tokenizer(vocab, context), 16, width, depth, 4, 2.0)
    assert "\n" not in str(e.value)


def test_a_small_contrastive_model_is_still_built():
    visual = vit.create_model("vit_tiny_patch16_224", **dict(SMALL, num_classes=16))
    model = new_clip_model(visual, _tokenizer(100), 16, 32, 2, 4, 2.0)
    assert entries(model.text) == text_size(dict(vocab_size=100, embed_dim=32, depth=2, num_heads=4, max_len=16,
                                                 global_pool="eos", causal=True, norm_eps=1e-5))


@pytest.mark.parametrize("field, value", [("intermediate_size", 10**12), ("num_hidden_layers", 10**7),
                                          ("vocab_size", 10**10)])
def test_a_huge_siglip_text_tower_is_refused_before_it_is_built(monkeypatch, tmp_path, field, value):
    """A transformers SigLIP config: the old bound counted 13 D^2 per layer, whatever its intermediate_size."""
    _no_real_model(monkeypatch, clip_module, "TextEncoder")
    text = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, vocab_size=100)
    config = dict(model_type="siglip", text_config={**text, field: value},
                  vision_config=dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=1,
                                     intermediate_size=64, image_size=32, patch_size=16))
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"logit_scale": torch.tensor(1.0)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"its text tower would have about \S+ parameters \(buffers included\), "
                                         r"more than 1e\+10") as e:
        vit.create_clip_model(f"local-dir:{tmp_path}")
    assert "\n" not in str(e.value)


def test_a_huge_lora_rank_is_refused_before_any_adapter_is_made(monkeypatch):
    peft = pytest.importorskip("peft")

    def refuse(*args, **kwargs):
        raise AssertionError("adapters were injected before the size was refused")

    monkeypatch.setattr(peft, "inject_adapter_in_model", refuse)
    from vit.train.lora import add_lora

    model = vit.create_model("vit_tiny_patch16_224", **SMALL)
    with pytest.raises(ValueError, match=re.escape("the model with LoRA adapters of rank 1000000000 would have "
                                                   "about 2.3e+12 parameters (buffers included), more than 1e+10 "
                                                   "(about 2.3e+12 of them in the adapters of 12 layers); set "
                                                   "optim.lora_rank")):
        add_lora(model, rank=10**9)
    assert not any(isinstance(m, nn.Linear) and hasattr(m, "lora_A") for m in model.modules())
