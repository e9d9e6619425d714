"""Hugging Face `transformers` vision models -> timm's ViT: model options, state-dict names and preprocessing.

A repository written by transformers' `save_pretrained` holds config.json (`model_type`, `architectures` and
the fields that differ from the config class's defaults), model.safetensors and preprocessor_config.json. Here:

    model_type             architectures                              timm ViT options (besides sizes)
    vit, deit              ViTModel, ViTForImageClassification,       [CLS] pooled; DeiT's distillation token:
                           DeiTForImageClassification(WithTeacher)    a register (no head) or `dist_token` + head_dist
    dinov2                 Dinov2Model                                LayerScale (`init_values`)
    dinov2_with_registers  Dinov2WithRegistersModel                  + `reg_tokens`, `no_embed_class`
    clip_vision_model      CLIPVisionModel(WithProjection), CLIPModel `pre_norm`, no patch bias; projection as head
    siglip_vision_model    SiglipVisionModel, SiglipModel             no [CLS], `global_pool="map"` (`attn_pool.*`)
    siglip2_vision_model   Siglip2VisionModel, Siglip2Model           SigLIP's, at one fixed resolution: patch_size *
                                                                      sqrt(num_patches), squashed (NaFlex's own
                                                                      sizes and padded patches are not read here)

and the renames (L = encoder.layer.i, E = encoder.layers.i; q/k/v fused into `qkv`, rows in that order):

    timm                 ViT / DeiT / DINOv2                       CLIP / SigLIP (under vision_model.)
    patch_embed.proj     embeddings.patch_embeddings.projection    embeddings.patch_embedding (SigLIP2: a Linear
                                                                   over (p, p, C) patches, made a conv kernel)
    cls_token, pos_embed embeddings.cls_token, .position_embeddings  embeddings.class_embedding, .position_embedding
    norm_pre             -                                         pre_layrnorm (CLIP)
    blocks.i.norm1|2     L.layernorm_before|after (DINOv2 norm1|2) E.layer_norm1|2
    blocks.i.attn.qkv    L.attention.attention.query|key|value     E.self_attn.q|k|v_proj
    blocks.i.attn.proj   L.attention.output.dense                  E.self_attn.out_proj
    blocks.i.mlp.fc1|2   L.intermediate.dense, L.output.dense      E.mlp.fc1|2
    blocks.i.ls1|2.gamma L.layer_scale1|2.lambda1 (DINOv2)         -
    norm                 layernorm                                 post_layernorm
    head                 classifier, cls_classifier                visual_projection (zero bias, as timm's CLIP)
    attn_pool.*          -                                         head.probe, .attention, .layernorm, .mlp

What is dropped is reported: ViTModel's pooler (dense + tanh over [CLS], which no classifier reads: our pre-logits
are its input), DINOv2's mask token (masked-image training only), CLIP's / SigLIP's text tower. An architecture
or option that timm's ViT does not compute (a classifier over [CLS] + mean of patches, SwiGLU DINOv2, ...) is
refused in one sentence. Nothing is imported from transformers: its config defaults are written here
(tests/test_hf_vision.py holds them against transformers' config classes).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from .qkv import fuse_qkv

__all__ = ["DEFAULTS", "is_transformers_config", "hf_model_args", "hf_pretrained_cfg", "hf_state_dict"]

_VIT = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
            layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3, qkv_bias=True)
_DINO = dict({k: v for k, v in _VIT.items() if k != "intermediate_size"}, mlp_ratio=4, layer_norm_eps=1e-6,
             patch_size=14, layerscale_value=1.0, use_swiglu_ffn=False)
_TOWER = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, num_channels=3,
              image_size=224)
# transformers' config defaults per model_type: save_pretrained writes only the fields that differ from them
DEFAULTS: dict[str, dict[str, Any]] = {
    "vit": _VIT,
    "deit": _VIT,
    "dinov2": _DINO,
    "dinov2_with_registers": dict(_DINO, patch_size=16, num_register_tokens=4),
    "clip_vision_model": dict(_TOWER, projection_dim=512, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5),
    "siglip_vision_model": dict(_TOWER, patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                                vision_use_head=True),
    "siglip2_vision_model": dict({k: v for k, v in _TOWER.items() if k != "image_size"}, patch_size=16,
                                 hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, vision_use_head=True,
                                 num_patches=256),
}
# full models: their vision_config
_TOWERS = {"clip": "clip_vision_model", "siglip": "siglip_vision_model", "siglip2": "siglip2_vision_model"}
# architecture -> its head: None (a base model), or the checkpoint's head layer(s)
_HEADS = {"ViTModel": None, "DeiTModel": None, "Dinov2Model": None, "Dinov2WithRegistersModel": None,
          "CLIPVisionModel": None, "SiglipVisionModel": None, "SiglipModel": None,
          "Siglip2VisionModel": None, "Siglip2Model": None,
          "ViTForImageClassification": "classifier", "DeiTForImageClassification": "classifier",
          "DeiTForImageClassificationWithTeacher": "teacher", "CLIPVisionModelWithProjection": "projection",
          "CLIPModel": "projection"}
_ACT = {"gelu": "gelu", "quick_gelu": "quick_gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}
_SIZES = {(192, 12): "tiny", (384, 12): "small", (768, 12): "base", (1024, 24): "large", (1280, 32): "huge",
          (1152, 27): "so400m", (1536, 40): "giant2"}
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}  # PIL's numbers
_PREPROCESS = {  # the image processors' defaults, for a preprocessor_config.json that leaves a field out
    "vit": dict(image_mean=[0.5] * 3, image_std=[0.5] * 3, resample=2),
    "deit": dict(image_mean=[0.5] * 3, image_std=[0.5] * 3, resample=3),  # DeiTImageProcessor's
    # DINOv2 repositories name BitImageProcessor, whose defaults are OpenAI's (their files give ImageNet's)
    "dinov2": dict(image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711],
                   resample=3),
    "dinov2_with_registers": dict(image_mean=[0.48145466, 0.4578275, 0.40821073],
                                  image_std=[0.26862954, 0.26130258, 0.27577711], resample=3),
    "clip_vision_model": dict(image_mean=[0.48145466, 0.4578275, 0.40821073],
                              image_std=[0.26862954, 0.26130258, 0.27577711], resample=3),
    "siglip_vision_model": dict(image_mean=[0.5] * 3, image_std=[0.5] * 3, resample=3),
    "siglip2_vision_model": dict(image_mean=[0.5] * 3, image_std=[0.5] * 3, resample=2),
}


def is_transformers_config(config: dict) -> bool:
    """Whether a config.json was written by transformers (a `model_type`, no timm `architecture`)."""
    return "model_type" in config and "architecture" not in config


def _refuse(name: str, what: str) -> None:
    raise ValueError(f"{name}: {what}, which timm's ViT does not compute; load it with transformers instead.")


def _vision_config(config: dict, name: str) -> tuple[str, dict, str | None]:
    """(model_type, its fields over the defaults, the architecture) of a config.json, a full CLIP / SigLIP model's
    vision tower included."""
    model_type = config.get("model_type")
    archs = config.get("architectures") or [None]
    arch = archs[0] if isinstance(archs, list) else None
    for key, value, want in (("model_type", model_type, str), ("architectures[0]", arch, (str, type(None)))):
        if not isinstance(value, want):  # a list is unhashable: the table look-ups below would raise TypeError
            raise ValueError(f"{name}: its config.json sets {key} to {value!r:.60}, which is not a name; re-save it "
                             "with transformers.")
    if model_type in _TOWERS:
        outer = config
        model_type, config = _TOWERS[model_type], config.get("vision_config") or {}
        if not isinstance(config, dict):
            raise ValueError(f"{name}: its config.json sets vision_config to {config!r:.60}, which is not an object "
                             "of the image tower's fields; re-save it with transformers.")
        if arch == "CLIPModel":  # its projection's width is the full model's
            config = {**config, "projection_dim": outer.get("projection_dim", 512)}
    if model_type not in DEFAULTS:
        raise ValueError(f"{name}: its config.json is a transformers {model_type!r} model, not one of the vision "
                         f"models this library loads ({', '.join(sorted({*DEFAULTS, *_TOWERS}))}).")
    if arch is not None and arch not in _HEADS:
        _refuse(name, f"it is a {arch}, whose head or objective is not a ViT classifier (loadable: "
                      f"{', '.join(sorted(_HEADS))})")
    fields = {**DEFAULTS[model_type], **config}
    if model_type == "siglip2_vision_model":  # a square position table, read at its own size
        n = fields["num_patches"]
        side = math.isqrt(n) if type(n) is int and n > 0 else 0
        if side * side != n:
            raise ValueError(f"{name}: its Siglip2 vision_config sets num_patches to {n!r:.40}, which is not a square "
                             "grid; only fixed-resolution SigLIP2 loads here (NaFlex's variable sizes are not "
                             "supported by this loader).")
        fields["image_size"] = side * _pair(fields["patch_size"], "patch_size", name)
    return model_type, fields, arch


def _pair(value: Any, what: str, name: str) -> int:
    v = (value, value) if isinstance(value, int) else tuple(value)
    if len(v) != 2 or v[0] != v[1]:
        raise ValueError(f"{name}: its config.json sets a non-square {what} {value}; only square ones load.")
    return int(v[0])


def _mlp_ratio(hidden: int, dim: int) -> float:
    """A ratio r with int(dim * r) == hidden, as timm sizes its MLP."""
    r = hidden / dim
    return r if int(dim * r) == hidden else (hidden + 0.5) / dim


def hf_model_args(config: dict, name: str) -> tuple[str, dict[str, Any]]:
    """A transformers config.json -> (the timm-style architecture name, the ViT's options): sizes always, and the
    options beyond a plain ViT (`reg_tokens`, `pre_norm`, `global_pool`, `dist_token`, ...) only where they differ
    from the default, so that a model without them builds with the options it has."""
    model_type, c, arch = _vision_config(config, name)
    try:
        return _model_args(model_type, c, arch, config, name)
    except (TypeError, KeyError, ZeroDivisionError, AttributeError) as e:  # a field of the wrong type, '0' ...
        raise ValueError(f"{name}: its config.json is not a valid {model_type} config ({type(e).__name__}: {e}); "
                         "re-save it with transformers.") from None


def _model_args(model_type: str, c: dict, arch: str | None, config: dict, name: str) -> tuple[str, dict[str, Any]]:
    head = _HEADS.get(arch) if arch else None
    dim, depth = c["hidden_size"], c["num_hidden_layers"]
    patch, img = _pair(c["patch_size"], "patch_size", name), _pair(c["image_size"], "image_size", name)
    if c["hidden_act"] not in _ACT:
        _refuse(name, f"its activation {c['hidden_act']!r} (supported: {', '.join(_ACT)})")
    ratio = float(c["mlp_ratio"]) if "mlp_ratio" in c else _mlp_ratio(c["intermediate_size"], dim)
    args: dict[str, Any] = dict(img_size=img, patch_size=patch, in_chans=c["num_channels"], embed_dim=dim,
                                depth=depth, num_heads=c["num_attention_heads"], mlp_ratio=ratio,
                                qkv_bias=bool(c.get("qkv_bias", True)), norm_eps=float(c["layer_norm_eps"]),
                                mlp_layer=_ACT[c["hidden_act"]], num_classes=0)
    size = _SIZES.get((dim, depth), f"d{dim}x{depth}")
    arch_name = f"vit_{size}_patch{patch}_{img}"
    if model_type == "deit":
        arch_name = f"deit_{size}_{'distilled_' if head == 'teacher' else ''}patch{patch}_{img}"
        if head == "teacher":
            args["dist_token"] = True
        else:  # the distillation token is in the sequence without a head of its own: a register with a position
            args["reg_tokens"] = 1
    elif model_type.startswith("dinov2"):
        if c["use_swiglu_ffn"]:
            _refuse(name, "its SwiGLU MLP (use_swiglu_ffn, DINOv2-g)")
        args["init_values"] = float(c["layerscale_value"])
        regs = c.get("num_register_tokens", 0)
        arch_name = f"vit_{size}_patch{patch}_{f'reg{regs}_' if regs else ''}dinov2"
        if regs:
            args.update(reg_tokens=regs, no_embed_class=True)
    elif model_type == "clip_vision_model":
        args["pre_norm"] = True
        arch_name = f"vit_{size}_patch{patch}_clip_{img}"
    elif model_type in ("siglip_vision_model", "siglip2_vision_model"):
        args["class_token"] = False
        args["global_pool"] = "map" if c["vision_use_head"] else ""
        arch_name = f"vit_{size}_patch{patch}_siglip_{img}"
    if head in ("classifier", "teacher"):
        labels = config.get("id2label") or {}
        args["num_classes"] = len(labels) if labels else int(config.get("num_labels", 2))
    elif head == "projection":
        args["num_classes"] = int(c["projection_dim"])
    return arch_name, args


def hf_pretrained_cfg(config: dict, preprocessor: dict | None, args: dict, name: str) -> dict[str, Any]:
    """timm's pretrained config from a preprocessor_config.json (None: the image processor's defaults): mean,
    std and interpolation as given; the crop ratio (crop / resize; 1.0 and `squash` when it resizes to the size
    without a crop) applied at the model's own image size; the labels of config.json's id2label."""
    model_type = _vision_config(config, name)[0]
    labels = config.get("id2label")
    if labels and not (isinstance(labels, dict) and all(str(k).isdigit() and isinstance(v, str)
                                                          for k, v in labels.items())):
        raise ValueError(f"{name}: its config.json's id2label must map class numbers to names "
                         f"({{\"0\": \"cat\", ...}}), got {str(labels)[:80]}; re-save it with transformers.")
    if isinstance(preprocessor, dict):
        _check_preprocessor(preprocessor, name)
    try:
        return _pretrained_cfg(model_type, config, preprocessor, args)
    except (TypeError, ValueError, AttributeError) as e:  # e.g. an image_mean of strings, a size that is a list
        raise ValueError(f"{name}: its preprocessor_config.json is not a valid image processor config "
                         f"({type(e).__name__}: {e}); re-save it with transformers.") from None


def _check_preprocessor(p: dict[str, Any], name: str) -> None:
    """Values no image processor can apply, refused with their key (a crop_size of 0 was a crop ratio of 1.0, a
    resample of 99 timm's bilinear, an image_std of 0 a division by zero, all without a word)."""
    def bad(key: str, want: str) -> None:
        raise ValueError(f"{name}: its preprocessor_config.json sets {key}={p[key]!r:.60}, which is not {want}; fix "
                         "that key (transformers' save_pretrained writes a valid one).")

    if "resample" in p and not (type(p["resample"]) is int and p["resample"] in _RESAMPLE):
        bad("resample", "one of PIL's filters (0 nearest, 1 lanczos, 2 bilinear, 3 bicubic, 4 box, 5 hamming)")
    for key in ("size", "crop_size"):
        value = p.get(key)
        sides = list(value.values()) if isinstance(value, dict) else [value]
        if value is not None and not all(s is None or (type(s) is int and s > 0) for s in sides):
            bad(key, "a size in whole pixels > 0 (an integer, or e.g. {\"height\": 224, \"width\": 224})")
    for key, least in (("image_mean", -math.inf), ("image_std", 0.0)):
        values = p.get(key)
        numbers = isinstance(values, (list, tuple)) and all(type(v) in (int, float) for v in values)
        if numbers and not all(math.isfinite(v) and v > least for v in values):  # other types: the reader's error
            bad(key, "a list of finite numbers" + (" > 0 (each channel is divided by its std)" if least == 0 else ""))


def _pretrained_cfg(model_type: str, config: dict, preprocessor: dict | None, args: dict) -> dict[str, Any]:
    from timm.models import PretrainedCfg

    p = {**_PREPROCESS[model_type], **(preprocessor or {})}
    # size: {"shortest_edge": s} (aspect kept) or {"height": h, "width": w} (squashed); an int: the shortest edge
    resize, crop = p.get("size") or {}, p.get("crop_size") or {}
    resize = {"shortest_edge": resize} if isinstance(resize, (int, float)) else resize
    crop = {"height": crop} if isinstance(crop, (int, float)) else crop
    side = resize.get("shortest_edge") or resize.get("height")
    cropped = crop.get("height") if p.get("do_center_crop", bool(crop)) else None
    crop_pct = min(1.0, float(cropped) / float(side)) if cropped and side else 1.0
    # timm's squash: resize to size / crop_pct, then crop (SigLIP2's fixed-resolution stand-in for NaFlex's resize)
    crop_mode = "squash" if "height" in resize or model_type == "siglip2_vision_model" else "center"
    labels = config.get("id2label") or {}
    label_names = [labels[k] for k in sorted(labels, key=int)] if labels and args["num_classes"] == len(labels) \
        else None
    interpolation = p["resample"]
    cfg = PretrainedCfg(
        input_size=(args["in_chans"], args["img_size"], args["img_size"]), fixed_input_size=True,
        interpolation=_RESAMPLE.get(interpolation, str(interpolation)), crop_pct=crop_pct, crop_mode=crop_mode,
        mean=tuple(float(v) for v in p["image_mean"]), std=tuple(float(v) for v in p["image_std"]),
        num_classes=args["num_classes"], label_names=label_names, first_conv="patch_embed.proj", classifier="head")
    return cfg.to_dict()


_LAYER = r"blocks.\1."
_RULES = [  # (regex on a key, timm's name); the first that matches renames
    (r"embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"embeddings\.patch_embedding\.", "patch_embed.proj."),
    (r"embeddings\.(cls_token|class_embedding)$", "cls_token"),
    (r"embeddings\.(position_embeddings|position_embedding\.weight)$", "pos_embed"),
    (r"embeddings\.register_tokens$", "reg_token"),
    (r"pre_layrnorm\.", "norm_pre."),
    (r"encoder\.layers?\.(\d+)\.(?:attention\.attention|self_attn)\.(query|key|value|q|k|v)(?:_proj)?\.",
     _LAYER + r"attn.\2."),
    (r"encoder\.layers?\.(\d+)\.(?:attention\.output\.dense|self_attn\.out_proj)\.", _LAYER + "attn.proj."),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.", _LAYER + "mlp.fc1."),
    (r"encoder\.layer\.(\d+)\.output\.dense\.", _LAYER + "mlp.fc2."),
    (r"encoder\.layers?\.(\d+)\.mlp\.(fc1|fc2)\.", _LAYER + r"mlp.\2."),
    (r"encoder\.layer\.(\d+)\.(?:layernorm_before|norm1)\.", _LAYER + "norm1."),
    (r"encoder\.layer\.(\d+)\.(?:layernorm_after|norm2)\.", _LAYER + "norm2."),
    (r"encoder\.layers\.(\d+)\.layer_norm(1|2)\.", _LAYER + r"norm\2."),
    (r"encoder\.layer\.(\d+)\.layer_scale(1|2)\.lambda1$", _LAYER + r"ls\2.gamma"),
    (r"(?:layernorm|post_layernorm)\.", "norm."),
    (r"(?:classifier|cls_classifier)\.", "head."),
    (r"distillation_classifier\.", "head_dist."),
    (r"head\.probe$", "attn_pool.latent"),
    (r"head\.attention\.out_proj\.", "attn_pool.proj."),
    (r"head\.layernorm\.", "attn_pool.norm."),
    (r"head\.mlp\.(fc1|fc2)\.", r"attn_pool.mlp.\1."),
]
_PREFIXES = ("vit.", "deit.", "dinov2.", "dinov2_with_registers.", "vision_model.")
_DROPPED = {"pooler.": "the pooler (dense + tanh over [CLS]; our pre-logits are its input)",
            "embeddings.mask_token": "the mask token (masked-image training only)",
            "text_model.": "the text tower", "text_projection.": "the text projection",
            "logit_": "the contrastive logit scale / bias"}
_QKV = {"query": 0, "key": 1, "value": 2, "q": 0, "k": 1, "v": 2}


def hf_state_dict(state: dict[str, torch.Tensor], config: dict, report: Any) -> dict[str, torch.Tensor]:
    """A transformers checkpoint of a model `hf_model_args` accepts, in timm's ViT names; `report.actions`
    (a vit.hub.weights.LoadReport) records what was dropped. Keys no rule knows keep their names, so that the
    loader's strict check names them."""
    model_type = _vision_config(config, "the checkpoint")[0]
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, list[torch.Tensor | None]] = {}  # 'blocks.0.attn.qkv.weight' -> [q, k, v]
    dropped: set[str] = set()
    for key, value in state.items():
        key = next((key[len(p):] for p in _PREFIXES if key.startswith(p)), key)
        why = next((w for p, w in _DROPPED.items() if key.startswith(p)), None)
        if why or key.endswith("position_ids"):
            dropped.update([why] if why else [])
            continue
        if key == "visual_projection.weight":  # (E, D), no bias: timm's CLIP head gets a zero one
            out["head.weight"], out["head.bias"] = value, value.new_zeros(value.shape[0])
            continue
        if key.startswith("head.attention.in_proj_"):  # SigLIP's MAP head: (3D, D) -> q (D, D), kv (2D, D)
            kind, d = key.rsplit("_", 1)[1], value.shape[0] // 3
            out[f"attn_pool.q.{kind}"], out[f"attn_pool.kv.{kind}"] = value[:d], value[d:]
            continue
        for pattern, name in _RULES:
            key, hit = re.subn("^" + pattern, name, key, count=1)
            if hit:
                break
        m = re.fullmatch(r"(blocks\.\d+\.attn)\.(query|key|value|q|k|v)\.(weight|bias)", key)
        if m:
            parts.setdefault(f"{m[1]}.qkv.{m[3]}", [None, None, None])[_QKV[m[2]]] = value
        else:
            out[key] = value
    out.update(fuse_qkv(parts, report.path))
    w = out.get("patch_embed.proj.weight")
    if model_type == "siglip2_vision_model" and w is not None and w.ndim == 2:  # (D, p * p * C) over (p, p, C)
        c = _vision_config(config, "the checkpoint")[1]
        p = _pair(c["patch_size"], "patch_size", "the checkpoint")
        out["patch_embed.proj.weight"] = w.reshape(w.shape[0], p, p, c["num_channels"]).permute(0, 3, 1, 2)
    if "cls_token" in out and out["cls_token"].ndim == 1:  # CLIP: (D,) -> (1, 1, D)
        out["cls_token"] = out["cls_token"][None, None]
    if "pos_embed" in out and out["pos_embed"].ndim == 2:  # CLIP / SigLIP: an embedding table (N, D)
        out["pos_embed"] = out["pos_embed"][None]
    if model_type == "deit" and "embeddings.distillation_token" in out:
        out["dist_token" if "head_dist.weight" in out else "reg_token"] = out.pop("embeddings.distillation_token")
    if "reg_token" in out and model_type.startswith("dinov2"):  # registers get no position: fold [CLS]'s into it
        pos = out["pos_embed"]
        out["cls_token"], out["pos_embed"] = out["cls_token"] + pos[:, :1], pos[:, 1:]
    if dropped:
        report.actions.append("dropped " + ", ".join(sorted(dropped)))
    return out
