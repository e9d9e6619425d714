"""transformers' vision models by name (vit.hub.hf_vision) against transformers' own outputs on the same weights.

Each architecture is built by transformers from a small config with random (then perturbed) weights, saved with
save_pretrained (with its image processor) into a Hugging Face hub cache built in a temporary folder, and read by
`hf-hub:org/name` with HF_HUB_OFFLINE=1. The converted options and weights load strictly into `vit_class` and
give transformers' last hidden state, pooled output and logits within 1e-5.
"""

import json

import pytest
import torch
from helpers import hub_snapshot, perturb

import vit
from vit.hub.hf_vision import DEFAULTS
from vit.hub.weights import timm_weights

transformers = pytest.importorskip("transformers")

D, LAYERS, HEADS, IMG = 32, 2, 4, 32
SMALL = dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, image_size=IMG)
LABELS = {i: f"class_{i}" for i in range(5)}
TEXT = dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            max_position_embeddings=8)


@pytest.fixture
def vit_class():
    """What the converted weights are loaded into: our VisionTransformer, built by create_model from the options
    the converter gives (timm's keywords)."""
    return lambda kw: vit.create_model("vit_base_patch16_224", **kw)


def _models():
    T = transformers
    vit_cfg = dict(SMALL, intermediate_size=4 * D, patch_size=8, hidden_act="gelu", qkv_bias=True)
    dino = dict(SMALL, image_size=28, patch_size=7, mlp_ratio=4, layerscale_value=0.5)
    tower = dict(SMALL, intermediate_size=3 * D, patch_size=8)
    clip_pre = T.CLIPImageProcessor(size={"shortest_edge": 36}, crop_size={"height": IMG, "width": IMG})
    return {
        "vit": (T.ViTModel, T.ViTConfig(**vit_cfg), T.ViTImageProcessor(size={"height": IMG, "width": IMG})),
        "vit_cls": (T.ViTForImageClassification, T.ViTConfig(**vit_cfg, id2label=LABELS), None),
        "deit": (T.DeiTForImageClassification, T.DeiTConfig(**vit_cfg, id2label=LABELS),
                 T.DeiTImageProcessor(size={"height": 36, "width": 36}, crop_size={"height": IMG, "width": IMG})),
        "deit_teacher": (T.DeiTForImageClassificationWithTeacher, T.DeiTConfig(**vit_cfg, id2label=LABELS), None),
        "dinov2": (T.Dinov2Model, T.Dinov2Config(**dino), T.BitImageProcessor(crop_size={"height": 28, "width": 28},
                                                                              size={"shortest_edge": 32})),
        "dinov2_reg": (T.Dinov2WithRegistersModel, T.Dinov2WithRegistersConfig(**dino, num_register_tokens=3), None),
        "clip": (T.CLIPVisionModel, T.CLIPVisionConfig(**tower), clip_pre),
        "clip_proj": (T.CLIPVisionModelWithProjection, T.CLIPVisionConfig(**tower, projection_dim=24,
                                                                          hidden_act="gelu"), None),
        "siglip": (T.SiglipVisionModel, T.SiglipVisionConfig(**tower), T.SiglipImageProcessor()),
        # whole contrastive models: their image tower (CLIP's with its projection as the head)
        "clip_full": (T.CLIPModel, T.CLIPConfig(text_config=TEXT, vision_config=tower, projection_dim=20), None),
        "siglip_full": (T.SiglipModel, T.SiglipConfig(text_config=TEXT, vision_config=tower), None),
    }


FAMILIES = list(_models())


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_vision")
    refs = {}
    torch.manual_seed(0)
    for family, (cls, config, processor) in _models().items():
        model = perturb(cls(config))
        folder = hub_snapshot(root / "hub", f"org/{family}")
        model.save_pretrained(folder)
        if processor is not None:
            processor.save_pretrained(folder)
        refs[family] = (model, processor)
    # an architecture whose head timm's ViT has not: refused by its config.json alone
    T = transformers
    T.Dinov2Config(**dict(SMALL, image_size=28, patch_size=7), architectures=["Dinov2ForImageClassification"]) \
        .save_pretrained(hub_snapshot(root / "hub", "org/dinov2_head"))
    return root, refs


@pytest.fixture
def hub(cache, offline_hub):
    offline_hub(cache[0] / "hub")
    return cache[1]


def _images(size, n=3):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(2))


def _expected(family, ref, x):
    """transformers' (all tokens after the final norm, pooled vector, logits or None)."""
    with torch.no_grad():
        if family in ("vit_cls", "deit", "deit_teacher"):
            base = getattr(ref, "vit", None) or ref.deit
            tokens = base(x).last_hidden_state
            return tokens, None, ref(x).logits
        out = ref.get_image_features(pixel_values=x) if family.endswith("_full") else ref(x)
        tokens = out.last_hidden_state
        if family.startswith("clip"):  # CLIP's last_hidden_state is the encoder's, before post_layernorm
            tokens = getattr(ref, "vision_model", ref).post_layernorm(tokens)
        if family == "clip_proj":
            return tokens, None, out.image_embeds
        if family == "clip_full":  # get_image_features: the projected pooled vector
            return tokens, None, out.pooler_output
        pooled = tokens[:, 0] if family == "vit" else out.pooler_output  # ViTModel's pooler is dropped
        return tokens, pooled, None


def _check(model, family, ref, size):
    x = _images(size)
    tokens, pooled, logits = _expected(family, ref, x)
    with torch.no_grad():
        feats = model.forward_features(x)
        torch.testing.assert_close(feats, tokens, atol=1e-5, rtol=0)
        if pooled is not None:
            torch.testing.assert_close(model.forward_head(feats, pre_logits=True), pooled, atol=1e-5, rtol=0)
        if logits is not None:
            torch.testing.assert_close(model(x), logits, atol=1e-5, rtol=0)
    assert tokens.std(0).mean() > 0.05  # not vacuous: outputs vary by image


@pytest.mark.parametrize("family", FAMILIES)
def test_family_loads_strictly_and_equals_transformers(hub, vit_class, family):
    kwargs, state, cfg = timm_weights(f"hf-hub:org/{family}")
    model = vit_class(kwargs).eval()
    model.load_state_dict(state, strict=True)
    _check(model, family, hub[family][0], kwargs["img_size"])


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "dinov2_head"])
def test_families_by_name_through_create_model(hub, family):
    """Every family end to end by its hub name: create_model and load_pretrained."""
    model = vit.create_model(f"hf-hub:org/{family}", pretrained=True).eval()
    assert type(model) is vit.VisionTransformer
    _check(model, family, hub[family][0], model.patch_embed.img_size[0])
    if family == "vit_cls":
        assert model.pretrained_cfg["label_names"] == list(LABELS.values())
        tuned = vit.create_model(f"hf-hub:org/{family}", pretrained=True, num_classes=3)  # fine-tuning: a new head
        assert tuned.head.out_features == 3
        torch.testing.assert_close(tuned.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight)


def test_a_save_pretrained_folder_with_pytorch_model_bin(hub, tmp_path):
    """local-dir: a folder with config.json and pytorch_model.bin (read with weights_only=True), the tensors
    save_pretrained wrote (under the names of the hub's checkpoints, not those of the module's state_dict)."""
    from safetensors.torch import load_file

    ref = hub["vit_cls"][0]
    ref.config.save_pretrained(tmp_path)
    torch.save(load_file(vit.hub.repo_file("hf-hub:org/vit_cls", ("model.safetensors",))),
               tmp_path / "pytorch_model.bin")
    model = vit.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    _check(model, "vit_cls", ref, IMG)


@pytest.mark.parametrize("family", ["vit", "clip_full"])
def test_a_config_deeper_than_its_weights_is_refused_before_building(hub, tmp_path, family):
    """num_hidden_layers 10**5 at width 32 passes the parameter bound but would allocate ~5 GB: the weights'
    header (key names only) says how many blocks there are, and nothing is built. CLIPModel holds two towers."""
    import shutil

    src = vit.hub.repo_file(f"hf-hub:org/{family}", ("model.safetensors",))
    shutil.copy(src, tmp_path / "model.safetensors")
    config = json.loads(vit.hub.repo_file(f"hf-hub:org/{family}", ("config.json",)).read_text())
    (config.get("vision_config") or config)["num_hidden_layers"] = 10**5
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"asks for 100000 blocks but its weights hold 2; fix"):
        vit.create_model(f"local-dir:{tmp_path}", pretrained=True)


def test_the_pipeline_gets_the_processor_preprocessing(hub):
    """evaluate.py's / predict.py's path: the model by name, its data config from its preprocessor_config.json."""
    from vit.eval.inference import load_model_and_config

    model, cfg, _, lines = load_model_and_config(model_name="hf-hub:org/dinov2")
    assert lines == []  # weights by name: nothing to report
    processor = hub["dinov2"][1]
    assert cfg.model.img_size == 28 and model.patch_embed.img_size == (28, 28)
    assert cfg.aug.mean == pytest.approx(processor.image_mean) and cfg.aug.std == pytest.approx(processor.image_std)
    assert (cfg.aug.eval_crop_pct, cfg.aug.interpolation) == (pytest.approx(28 / 32), "bicubic")


def test_preprocessing_comes_from_the_image_processor(hub):
    """mean, std, resample and the crop ratio of preprocessor_config.json become timm's pretrained config."""
    for family, crop_pct, mode in [("vit", 1.0, "squash"), ("clip", IMG / 36, "center"), ("dinov2", 28 / 32, "center"),
                                   ("siglip", 1.0, "squash"), ("deit", IMG / 36, "squash")]:
        processor = hub[family][1]
        cfg = timm_weights(f"hf-hub:org/{family}")[2]
        assert cfg["mean"] == pytest.approx(processor.image_mean) and cfg["std"] == pytest.approx(processor.image_std)
        assert cfg["interpolation"] == {2: "bilinear", 3: "bicubic"}[int(processor.resample)]
        assert (cfg["crop_pct"], cfg["crop_mode"]) == (pytest.approx(crop_pct), mode)
    assert timm_weights("hf-hub:org/vit_cls")[2]["mean"] == (0.5, 0.5, 0.5)  # no processor: ViT's defaults


def test_a_bad_preprocessor_config_is_refused_in_one_sentence(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_mean": ["a", "b", "c"]}))
    with pytest.raises(ValueError, match="preprocessor_config.json is not a valid image processor config"):
        vit.create_model(f"local-dir:{tmp_path}")


def test_a_head_timm_lacks_is_refused(hub):
    with pytest.raises(ValueError, match="Dinov2ForImageClassification, whose head .* load it with transformers"):
        vit.create_model("hf-hub:org/dinov2_head")


@pytest.mark.parametrize("config, match", [
    ({"model_type": "bert", "architectures": ["BertModel"]}, "a transformers 'bert' model, not one of the vision"),
    ({"model_type": "vit", "hidden_size": "big"}, "is not a valid vit config"),
    ({"model_type": "vit", "image_size": [32, 48]}, "non-square image_size"),
    ({"model_type": "vit", "hidden_act": "relu"}, "its activation 'relu'"),
    ({"model_type": "dinov2", "use_swiglu_ffn": True}, "its SwiGLU MLP"),
    ({"model_type": ["vit"]}, "sets model_type to \\['vit'\\], which is not a name"),  # TypeError: unhashable
    ({"model_type": "vit", "architectures": [["ViTModel"]]}, "sets architectures\\[0\\] to \\['ViTModel'\\]"),
    ({"model_type": "clip", "vision_config": "x"}, "sets vision_config to 'x', which is not an object"),
])
def test_a_config_json_we_cannot_convert_is_refused_in_one_sentence(tmp_path, config, match):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match) as e:
        vit.create_model(f"local-dir:{tmp_path}")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("model_type", list(DEFAULTS))
def test_defaults_are_transformers(model_type):
    """The defaults a save_pretrained config.json leaves out are those of transformers' config classes."""
    cls = transformers.AutoConfig.for_model(model_type).__class__
    ref = cls()
    for key, value in DEFAULTS[model_type].items():
        assert getattr(ref, key) == value, key



# transformers' image processor for each model type (AutoImageProcessor's mapping; the *_vision_model types have none
# of their own)
PROCESSORS = [("vit", "ViTImageProcessor"), ("clip_vision_model", "CLIPImageProcessor"),
              ("siglip_vision_model", "SiglipImageProcessor"), ("siglip2_vision_model", "Siglip2ImageProcessor"),
              ("deit", "DeiTImageProcessor"),
              ("dinov2", "BitImageProcessor"), ("dinov2_with_registers", "BitImageProcessor")]


@pytest.mark.parametrize("model_type, processor", PROCESSORS)
def test_preprocessing_without_a_processor_file_is_the_processor_classs_defaults(model_type, processor):
    """No preprocessor_config.json: mean, std and resampling are those transformers' processor class defaults to
    (the other tests give every field, so they cannot see a wrong default)."""
    from vit.hub.hf_vision import hf_pretrained_cfg

    ref = getattr(transformers, processor)()
    cfg = hf_pretrained_cfg({"model_type": model_type}, None, dict(in_chans=3, img_size=32, num_classes=0), "m")
    assert (cfg["mean"], cfg["std"]) == (tuple(ref.image_mean), tuple(ref.image_std))
    assert cfg["interpolation"] == {2: "bilinear", 3: "bicubic"}[int(ref.resample)]

@pytest.mark.parametrize("bad, match", [
    (lambda q: q > 0, "query.weight is bool, not a floating-point tensor"),
    (lambda q: (q * 100).to(torch.int8), "query.weight is int8, not a floating-point tensor"),
    (lambda q: q[:, :8].contiguous(), "shape mismatch: blocks.0.attn weight query, key, value \\(16, 8\\), "
                                      "\\(16, 16\\), \\(16, 16\\)"),
])
def test_qkv_are_checked_before_they_are_fused(tmp_path, bad, match):
    """A bool or int8 query was joined to float key and value by torch.cat and cast without a word; a query of
    another shape was torch.cat's RuntimeError."""
    from safetensors.torch import load_file, save_file

    T = transformers
    T.ViTModel(T.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                           image_size=32, patch_size=8)).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    q = "encoder.layer.0.attention.attention.query.weight"
    save_file({**state, q: bad(state[q])}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=match) as e:
        vit.create_model(f"local-dir:{tmp_path}", pretrained=True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("key, value, match", [
    ("crop_size", 0, r"sets crop_size=0, which is not a size in whole pixels > 0"),
    ("crop_size", {"height": 0, "width": 0}, r"sets crop_size=\{'height': 0, 'width': 0\}, which is not a size"),
    ("size", {"shortest_edge": -32}, r"sets size=\{'shortest_edge': -32\}, which is not a size"),
    ("resample", 99, r"sets resample=99, which is not one of PIL's filters"),
    ("resample", "bicubic", r"sets resample='bicubic', which is not one of PIL's filters"),
    ("image_std", [0.5, 0.0, 0.5], r"sets image_std=\[0\.5, 0\.0, 0\.5\], which is not a list of finite numbers > 0"),
])
def test_an_impossible_preprocessor_value_is_refused_with_its_key(tmp_path, key, value, match):
    """A crop_size of 0 became a crop ratio of 1.0 and a resample of 99 timm's bilinear, without a word."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"crop_size": 32, key: value}))
    with pytest.raises(ValueError, match=match) as e:
        vit.create_model(f"local-dir:{tmp_path}")
    assert "preprocessor_config.json" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("family, key, value, match", [
    # every token normalised to LayerNorm's bias: the same output for every image, without a word
    ("vit", "layer_norm_eps", 1e30, r"'model_args\.norm_eps' \(LayerNorm's epsilon, .*\) must be at most 0\.1"),
    ("dinov2", "layer_norm_eps", 1.0, r"'model_args\.norm_eps' .* must be at most 0\.1"),
    # a ValueError from inside the patch embedding that named no file
    ("vit", "patch_size", 64, r"config\.json: config key 'model_args\.patch_size' \(64\) must divide "
                              r"'model_args\.img_size' \(32\)"),
    ("dinov2", "patch_size", 5, r"config key 'model_args\.patch_size' \(5\) must divide 'model_args\.img_size' \(28\)"),
    # blamed preprocessor_config.json ("invalid literal for int()")
    ("deit", "id2label", {"x": "cat"}, r"its config\.json's id2label must map class numbers to names"),
    ("deit", "id2label", ["cat", "dog"], r"its config\.json's id2label must map class numbers to names"),
])
def test_a_hostile_transformers_config_value_is_one_sentence_naming_the_folder(tmp_path, family, key, value, match):
    T = transformers
    cls, cfg = {"vit": (T.ViTModel, T.ViTConfig(**SMALL, intermediate_size=4 * D, patch_size=8)),
                "deit": (T.DeiTForImageClassification, T.DeiTConfig(**SMALL, intermediate_size=4 * D, patch_size=8,
                                                                    id2label=LABELS)),
                "dinov2": (T.Dinov2Model, T.Dinov2Config(**dict(SMALL, image_size=28), patch_size=7))}[family]
    torch.manual_seed(0)
    cls(cfg).save_pretrained(tmp_path)
    assert vit.create_model(f"local-dir:{tmp_path}", pretrained=True) is not None  # the folder as saved loads
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(ValueError, match=match) as e:
        vit.create_model(f"local-dir:{tmp_path}", pretrained=True)
    assert str(e.value).startswith(f"local-dir:{tmp_path}") and "\n" not in str(e.value)
