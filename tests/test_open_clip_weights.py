"""open_clip checkpoints' image tower by name (vit.hub.open_clip_weights) against open_clip's own `encode_image`.

Tiny open_clip CLIP models (native `visual.*` towers and timm trunks under `visual.trunk.*`) are built from a
config dict with random (then perturbed) weights, nothing downloaded, and saved in open_clip's repository layout
(open_clip_config.json + open_clip_model.safetensors) into a hub cache built in a temporary folder; read by
`hf-hub:org/name` with HF_HUB_OFFLINE=1, they load strictly into timm's ViT (the stand-in for ours, see
`vit_class`) and give open_clip's image features before normalisation within 1e-5.
"""

import json

import pytest
import torch
from helpers import hub_snapshot, perturb
from safetensors.torch import save_file

import vit
from vit.hub import LoadReport, converted_state_dict
from vit.hub.weights import timm_weights

open_clip = pytest.importorskip("open_clip")
timm = pytest.importorskip("timm")

TEXT = dict(context_length=8, vocab_size=50, width=16, heads=2, layers=1)
PREPROCESS = dict(mean=[0.1, 0.2, 0.3], std=[0.5, 0.6, 0.7], interpolation="bilinear", resize_mode="shortest")
CONFIGS = {  # name -> open_clip model_cfg
    "clip": dict(embed_dim=24, quick_gelu=True,
                 vision_cfg=dict(image_size=32, layers=2, width=32, head_width=8, patch_size=8)),
    "clip_avg_ls": dict(embed_dim=20, vision_cfg=dict(image_size=32, layers=2, width=32, head_width=16, patch_size=8,
                                                       mlp_ratio=3.0, ls_init_value=0.5, pool_type="avg")),
    "clip_avg_final_ln": dict(embed_dim=20, vision_cfg=dict(image_size=32, layers=2, width=32, head_width=16,
                                                             patch_size=8, pool_type="avg", final_ln_after_pool=True)),
    "trunk_map": dict(embed_dim=64, vision_cfg=dict(image_size=32, timm_model_name="test_vit", timm_pool="map",
                                                    timm_proj="none")),
    "trunk_linear": dict(embed_dim=24, vision_cfg=dict(image_size=32, timm_model_name="test_vit", timm_pool="avg",
                                                       timm_proj="linear")),
}


@pytest.fixture
def vit_class():
    """What the converted weights load into: our VisionTransformer, from the converter's options (timm's keywords)
    over the trunk's architecture where open_clip names one."""
    return lambda arch, kw: vit.create_model(arch if "embed_dim" not in kw else "vit_base_patch16_224", **kw)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("open_clip")
    refs = {}
    torch.manual_seed(0)
    for name, cfg in CONFIGS.items():
        cfg = dict(cfg, text_cfg=TEXT)
        model = perturb(open_clip.model.CLIP(**cfg))
        folder = hub_snapshot(root / "hub", f"org/{name}")
        (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": PREPROCESS}))
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
        refs[name] = model
    return root, refs


@pytest.fixture
def hub(cache, offline_hub):
    offline_hub(cache[0] / "hub")
    return cache[1]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_image_tower_equals_encode_image(hub, vit_class, name):
    kwargs, state, cfg = timm_weights(f"hf-hub:org/{name}")
    arch = vit.hub.resolve(f"hf-hub:org/{name}").architecture
    model = vit_class(arch, kwargs).eval()
    model.load_state_dict(state, strict=True)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hub[name].encode_image(x)
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=0)
    assert expected.std(0).mean() > 0.05  # not vacuous: features vary by image
    assert (cfg["mean"], cfg["std"], cfg["interpolation"], cfg["crop_pct"]) == (
        tuple(PREPROCESS["mean"]), tuple(PREPROCESS["std"]), "bilinear", 1.0)


def test_a_plain_checkpoint_is_recognised_by_its_keys(hub):
    """A whole open_clip state dict given as a file (no config) is cut to its image tower, as timm's filter does."""
    whole = hub["clip"].state_dict()
    report = LoadReport("open_clip.pt")
    state = converted_state_dict(whole, None, report)
    assert set(state) == set(timm_weights("hf-hub:org/clip")[1])
    torch.testing.assert_close(state["head.weight"], whole["visual.proj"].T)
    assert "dropped" in report.actions[0] and "transformer" in report.actions[0]



def test_a_config_without_preprocess_cfg_gets_open_clips_own_defaults():
    """open_clip's PreprocessCfg is the oracle for what a config leaves out (OpenAI's mean and std, bicubic,
    shortest side then centre crop); the tests above give every field, so they cannot see a wrong default."""
    from open_clip.transform import PreprocessCfg

    from vit.hub.open_clip_weights import open_clip_pretrained_cfg

    ref = PreprocessCfg()
    cfg = open_clip_pretrained_cfg({"model_cfg": {"vision_cfg": {"image_size": ref.size}}}, num_classes=4)
    assert (cfg["mean"], cfg["std"], cfg["interpolation"], cfg["crop_mode"], cfg["crop_pct"]) == (
        tuple(ref.mean), tuple(ref.std), ref.interpolation, "center", 1.0)
    assert cfg["input_size"] == (3, ref.size, ref.size) and cfg["num_classes"] == 4

@pytest.mark.parametrize("name", ["clip", "trunk_map"])
def test_a_tower_by_name_equals_encode_image(hub, name):
    """create_model by hub name: a visual.* CLIP tower and a timm trunk with map pooling (SigLIP's layout)."""
    model = vit.create_model(f"hf-hub:org/{name}", pretrained=True).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(model(x), hub[name].encode_image(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("vision, match", [
    (dict(attentional_pool=True), "an attentional pooler .* load it with open_clip instead"),
    (dict(layers=[1, 1, 1, 1]), "ResNet stages"),
    (dict(pool_type="none"), "pool_type 'none'"),
    (dict(no_ln_pre=True), "no ln_pre"),
    (dict(head_width=0), "a positive multiple of head_width"),
    (dict(mlp_ratio="4"), "mlp_ratio to '4', which is not a number"),
    (dict(timm_model_name="vit_base_patch16_224", timm_proj="mlp"), "an MLP projection"),
])
def test_unsupported_tower_options_are_refused(tmp_path, vision, match):
    base = dict(image_size=32, layers=1, width=16, head_width=8, patch_size=8)
    cfg = dict(embed_dim=8, vision_cfg=dict(base, **vision))
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    with pytest.raises(ValueError, match=match) as e:
        vit.create_model(f"local-dir:{tmp_path}")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("model_cfg", [[1], dict(embed_dim=8, vision_cfg="x"),
                                       dict(embed_dim=8, vision_cfg=dict(width=16, norm_kwargs="x"))])
def test_a_config_whose_sections_are_not_objects_is_one_sentence(tmp_path, model_cfg):
    """A list or string where open_clip writes an object was an AttributeError ('list' object has no attribute)."""
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg}))
    with pytest.raises(ValueError, match="model_cfg, vision_cfg or norm_kwargs is not an object") as e:
        vit.create_model(f"local-dir:{tmp_path}")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("section,key", [("vision_cfg", "global_average_pool"), ("vision_cfg", "input_patchnorm"),
                                         ("text_cfg", "evil")])
def test_a_key_open_clip_does_not_have_is_refused_as_open_clip_refuses_it(tmp_path, section, key):
    """A key outside open_clip's CLIPVisionCfg / CLIPTextCfg (an older version's global_average_pool, which pooled
    otherwise) was skipped without a word, the tower loaded with another pooling; open_clip itself refuses such
    a config, and so does this reader, naming the key. Every field open_clip has is still read."""
    import dataclasses

    import open_clip.model as oc

    cfg = dict(embed_dim=8, vision_cfg=dict(image_size=32, layers=1, width=16, head_width=8, patch_size=8),
               text_cfg=dict(context_length=8, vocab_size=100, width=16, heads=2, layers=1))
    cfg[section][key] = True
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{key}'"):  # the oracle
        (oc.CLIPVisionCfg if section == "vision_cfg" else oc.CLIPTextCfg)(**cfg[section])
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    with pytest.raises(ValueError, match=f"its open_clip {section} sets '{key}', which open_clip's own config does "
                                         "not have") as e:
        (vit.create_model if section == "vision_cfg" else vit.create_clip_model)(f"local-dir:{tmp_path}")
    assert "\n" not in str(e.value)
    from vit.hub import open_clip_weights as ocw

    assert {f.name for f in dataclasses.fields(oc.CLIPVisionCfg)} <= ocw._VISION_KEYS
    assert {f.name for f in dataclasses.fields(oc.CLIPTextCfg)} <= ocw._TEXT_KEYS
