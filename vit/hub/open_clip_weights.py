"""open_clip checkpoints' image tower -> timm's ViT: model options, state-dict names and preprocessing.

An open_clip repository holds open_clip_config.json (`model_cfg`: `embed_dim`, `vision_cfg`, `quick_gelu`;
`preprocess_cfg`: mean, std, interpolation, resize mode) and open_clip_model.safetensors (or
open_clip_pytorch_model.bin). Its image tower comes in two layouts, both read as timm's own filter reads them
(timm's `_convert_openai_clip` and the `visual.trunk.` branch of its `checkpoint_filter_fn`):

    visual.* (OpenAI / LAION CLIP ViTs)           timm                       options
    conv1 (no bias)                               patch_embed.proj           pre_norm (no patch bias, norm_pre)
    class_embedding (D,), positional_embedding    cls_token (1, 1, D), pos_embed (1, N, D)
    ln_pre, ln_post                               norm_pre, norm (fc_norm: avg pooling, final_ln_after_pool)
    transformer.resblocks.i.ln_1|ln_2             blocks.i.norm1|norm2
    ....attn.in_proj_weight|bias (3D, D)          blocks.i.attn.qkv          (q, k, v rows, as timm's)
    ....attn.out_proj, .mlp.c_fc, .mlp.c_proj     blocks.i.attn.proj, .mlp.fc1, .mlp.fc2
    ....ls_1|ls_2.gamma                           blocks.i.ls1|ls2.gamma     init_values
    proj (D, E): pooled @ proj                    head.weight (E, D) = proj.T, head.bias = 0 (timm's CLIP head)

    visual.trunk.* (a timm model inside, e.g. SigLIP's vit_base_patch16_siglip_224): timm's names already;
    visual.head.proj.weight (its linear projection, if any) -> head.weight, with a zero bias.

The text tower and the contrastive scale are dropped (reported). Towers timm's ViT does not compute (ResNets,
attentional poolers, sine-cosine positions, a missing ln_pre, custom attention blocks, an MLP projection) are
refused in one sentence. Encoded images (`encode_image`, before normalisation) equal the model's logits.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["OPENAI_MEAN", "OPENAI_STD", "TEXT_POOLS", "is_open_clip_config", "open_clip_model_args",
           "open_clip_pretrained_cfg", "open_clip_text_args", "final_norm_after_pool", "open_clip_text_state_dict",
           "open_clip_state_dict", "is_open_clip_state"]

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # open_clip's defaults when preprocess_cfg leaves them out
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# vision_cfg fields whose non-default value timm's ViT does not compute: field -> (its default, what it is)
_UNSUPPORTED = {"attentional_pool": (False, "an attentional pooler (CoCa)"),
                "pos_embed_type": ("learnable", "sine-cosine position embeddings"),
                "no_ln_pre": (False, "no ln_pre (a patch embedding without bias needs one in timm's ViT)"),
                "act_kwargs": (None, "activation arguments"), "qk_norm": (False, "q/k normalisation"),
                "scaled_cosine_attn": (False, "scaled cosine attention"), "scale_heads": (False, "head scales"),
                "scale_attn_inner": (False, "an inner attention norm"), "scale_attn": (False, "an attention norm"),
                "scale_fc": (False, "an MLP norm"), "block_type": (None, "a custom block")}


# the fields of open_clip's CLIPVisionCfg and CLIPTextCfg (open_clip 3.3): a key outside them is a config of
# another model or version, whose meaning this reader would otherwise skip without a word (open_clip refuses it)
_VISION_KEYS = {"layers", "width", "head_width", "mlp_ratio", "patch_size", "image_size", "ls_init_value",
               "patch_dropout", "attentional_pool", "attn_pooler_queries", "attn_pooler_heads", "no_ln_pre",
               "pos_embed_type", "final_ln_after_pool", "pool_type", "output_tokens", "act_kwargs", "norm_kwargs",
               "block_type", "qk_norm", "scaled_cosine_attn", "scale_heads", "scale_attn_inner", "scale_attn",
               "scale_fc", "timm_model_name", "timm_model_pretrained", "timm_pool", "timm_proj", "timm_proj_bias",
               "timm_drop", "timm_drop_path"}
_TEXT_KEYS = {"context_length", "vocab_size", "hf_tokenizer_name", "tokenizer_mode", "tokenizer_kwargs", "width",
             "heads", "layers", "mlp_ratio", "ls_init_value", "embed_cls", "pad_id", "eos_id", "no_causal_mask",
             "final_ln_after_pool", "pool_type", "proj_bias", "proj_type", "output_tokens", "act_kwargs",
             "norm_kwargs", "block_type", "qk_norm", "scaled_cosine_attn", "scale_heads", "scale_attn_inner",
             "scale_attn", "scale_fc", "hf_model_name", "hf_model_pretrained", "hf_proj_type", "hf_pooler_type"}


def _check_known_keys(section: dict, known: set[str], which: str, name: str) -> None:
    """ValueError naming the first key of an open_clip `which` (vision_cfg, text_cfg) section outside `known`."""
    unknown = sorted(set(section) - known)
    if unknown:
        raise ValueError(f"{name}: its open_clip {which} sets {unknown[0]!r:.60}, which open_clip's own config does "
                         "not have, so what it changes is not known here; remove it, or load the model with the "
                         "open_clip version that wrote it.")


def is_open_clip_config(config: dict) -> bool:
    """Whether a JSON file is an open_clip config (`model_cfg` with a `vision_cfg`, or the model config itself)."""
    return "vision_cfg" in config.get("model_cfg", config)


def is_open_clip_state(state: dict[str, torch.Tensor]) -> bool:
    """Whether a state dict is a whole open_clip model's (an image tower under `visual.`)."""
    return "visual.class_embedding" in state or any(k.startswith("visual.trunk.") for k in state)


def _refuse(name: str, what: str) -> None:
    raise ValueError(f"{name}: its image tower has {what}, which timm's ViT does not compute; load it with "
                     "open_clip instead.")


def _float(value: Any, key: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: its open_clip vision_cfg sets {key} to {value!r}, which is not a number.")
    return float(value)


def open_clip_model_args(config: dict, name: str) -> tuple[str, dict[str, Any]]:
    """An open_clip config -> (the timm architecture, the ViT's options). A native tower gives every size and
    `pre_norm`; a timm trunk gives its timm model name with the pooling and projection open_clip set on it."""
    model = config.get("model_cfg", config)
    vision = model.get("vision_cfg") or {} if isinstance(model, dict) else None
    if not isinstance(vision, dict) or not isinstance(vision.get("norm_kwargs") or {}, dict):
        raise ValueError(f"{name}: its open_clip config's model_cfg, vision_cfg or norm_kwargs is not an object; it "
                         "is not an open_clip model config.")
    _check_known_keys(vision, _VISION_KEYS, "vision_cfg", name)
    embed_dim = model.get("embed_dim")
    if not isinstance(embed_dim, int):
        raise ValueError(f"{name}: its open_clip config has no integer embed_dim; it is not an open_clip model config.")
    if vision.get("timm_model_name"):
        pool, proj = vision.get("timm_pool", "avg"), vision.get("timm_proj", "linear")
        if pool in ("abs_attn", "rot_attn") or proj == "mlp":
            _refuse(name, f"a timm trunk with {'attention pooling ' + pool if proj != 'mlp' else 'an MLP projection'}")
        args: dict[str, Any] = {"num_classes": 0 if proj == "none" else embed_dim}
        if proj in ("none", ""):  # the trunk is built with this pooling (and the norm placement it implies)
            args["global_pool"] = pool
        elif pool:  # built with its own pooling, then reset to this one: the norm stays on the tokens (for a
            # trunk whose own pooling is [CLS] or map, as timm's ViTs; another one fails the strict load)
            args.update(global_pool=pool, fc_norm=False)
        return str(vision["timm_model_name"]), args
    layers, width = vision.get("layers", 12), vision.get("width", 768)
    if not isinstance(layers, int):
        _refuse(name, f"ResNet stages {layers}")
    for field, (default, what) in _UNSUPPORTED.items():
        if vision.get(field, default) not in (default, "default"):
            _refuse(name, what)
    pool = vision.get("pool_type", "tok")
    if pool not in ("tok", "avg"):
        _refuse(name, f"pool_type {pool!r}")
    size, patch = vision.get("image_size", 224), vision.get("patch_size", 16)
    if not isinstance(size, int) or not isinstance(patch, int):
        _refuse(name, f"a non-square image or patch size ({size}, {patch})")
    head_width = vision.get("head_width", 64)
    if not isinstance(width, int) or not isinstance(head_width, int) or head_width <= 0 or width % head_width:
        raise ValueError(f"{name}: its open_clip vision_cfg has width {width!r} and head_width {head_width!r}; the "
                         "width must be a positive multiple of head_width.")
    args = dict(img_size=size, patch_size=patch, embed_dim=width, depth=layers, num_heads=width // head_width,
                mlp_ratio=_float(vision.get("mlp_ratio", 4.0), "mlp_ratio", name),
                norm_eps=_float((vision.get("norm_kwargs") or {}).get("eps", 1e-5), "norm_kwargs.eps", name),
                mlp_layer="quick_gelu" if model.get("quick_gelu") else "gelu", num_classes=embed_dim, pre_norm=True)
    if vision.get("ls_init_value") is not None:
        args["init_values"] = _float(vision["ls_init_value"], "ls_init_value", name)
    if pool == "avg":  # open_clip averages the patch tokens, normed before (fc_norm=False) or after pooling
        args.update(global_pool="avg", fc_norm=bool(vision.get("final_ln_after_pool", False)))
    size_name = {(768, 12): "base", (1024, 24): "large", (1280, 32): "huge"}.get((width, layers), f"d{width}x{layers}")
    return f"vit_{size_name}_patch{patch}_clip_{'quickgelu_' if model.get('quick_gelu') else ''}{size}", args


def open_clip_pretrained_cfg(config: dict, num_classes: int) -> dict[str, Any]:
    """timm's pretrained config from open_clip's `preprocess_cfg` (open_clip's defaults for what it leaves out:
    OpenAI's mean and std, bicubic, shortest side resized then centre-cropped to the image size: crop_pct 1)."""
    from timm.models import PretrainedCfg

    model = config.get("model_cfg", config)
    pre = config.get("preprocess_cfg") or {}
    size = pre.get("size", (model.get("vision_cfg") or {}).get("image_size", 224))
    size = (size, size) if isinstance(size, int) else tuple(size)
    trunk = bool((model.get("vision_cfg") or {}).get("timm_model_name"))  # its size is its timm name's
    cfg = PretrainedCfg(
        input_size=(3, *size), fixed_input_size=not trunk, interpolation=pre.get("interpolation", "bicubic"),
        crop_pct=1.0,
        crop_mode="squash" if pre.get("resize_mode") == "squash" else "center",
        mean=tuple(pre.get("mean", OPENAI_MEAN)), std=tuple(pre.get("std", OPENAI_STD)), num_classes=num_classes,
        first_conv="patch_embed.proj", classifier="head")
    return cfg.to_dict()


_SWAPS = [("conv1", "patch_embed.proj"), ("positional_embedding", "pos_embed"), ("class_embedding", "cls_token"),
          ("transformer.resblocks.", "blocks."), ("ln_pre", "norm_pre"), ("ln_post", "norm"), (".ln_1", ".norm1"),
          (".ln_2", ".norm2"), (".ls_1", ".ls1"), (".ls_2", ".ls2"), ("attn.in_proj_", "attn.qkv."),
          ("attn.out_proj", "attn.proj"), ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")]


def final_norm_after_pool(config: dict | None) -> bool:
    """Whether an open_clip config's native tower norms after average pooling (`final_ln_after_pool`): its
    `ln_post` is then timm's `fc_norm` (on the pooled features), not `norm` (on the tokens)."""
    model = (config or {}).get("model_cfg", config or {})
    vision = model.get("vision_cfg") if isinstance(model, dict) else None
    return isinstance(vision, dict) and vision.get("pool_type") == "avg" and bool(vision.get("final_ln_after_pool"))


def open_clip_state_dict(state: dict[str, torch.Tensor], report: Any, config: dict | None = None
                         ) -> dict[str, torch.Tensor]:
    """A whole open_clip model's state dict -> its image tower in timm's ViT names (see the table above);
    `report.actions` (a vit.hub.weights.LoadReport) records what was dropped. `config`: its open_clip config,
    which says where `ln_post` goes (`final_norm_after_pool`; without one, on the tokens, open_clip's default)."""
    swaps = [(a, "fc_norm" if a == "ln_post" and final_norm_after_pool(config) else b) for a, b in _SWAPS]
    prefix = "module." if all(k.startswith("module.") for k in state) else ""
    visual = {k[len(prefix) + 7:]: v for k, v in state.items() if k.startswith(prefix + "visual.")}
    if not visual:
        raise ValueError("the checkpoint holds no open_clip image tower (no visual.* keys); it is not an open_clip "
                         "CLIP model.")
    out: dict[str, torch.Tensor] = {}
    if any(k.startswith("trunk.") for k in visual):
        for k, v in visual.items():
            if k.startswith("trunk."):
                out[k[6:]] = v
            elif k in ("head.proj.weight", "head.proj.bias"):  # (E, D) [, (E,)]
                out["head." + k.rsplit(".", 1)[1]] = v
            else:
                out[k] = v  # left for the strict check to name
        if "head.weight" in out and "head.bias" not in out:
            out["head.bias"] = out["head.weight"].new_zeros(out["head.weight"].shape[0])
    else:
        for k, v in visual.items():
            for old, new in swaps:
                k = k.replace(old, new)
            if k == "proj":  # (D, E), used as pooled @ proj: a Linear's weight is its transpose
                out["head.weight"], out["head.bias"] = v.T.contiguous(), v.new_zeros(v.shape[1])
            elif k == "cls_token":
                out[k] = v.reshape(1, 1, -1)
            elif k == "pos_embed":
                out[k] = v[None]
            else:
                out[k] = v
    others = sorted({k[len(prefix):].split(".")[0] for k in state if not k.startswith(prefix + "visual.")})
    if others:
        report.actions.append(f"kept the image tower; dropped {', '.join(others)} (text tower, logit scale)")
    return out


# text_cfg fields whose non-default value our TextEncoder does not compute: field -> (its default, what it is)
_TEXT_UNSUPPORTED = {"hf_model_name": (None, "a Hugging Face text model inside"),
                     "embed_cls": (False, "a class embedding (CoCa)"), "ls_init_value": (None, "layer scale"),
                     "final_ln_after_pool": (False, "the final norm after pooling"),
                     "qk_norm": (False, "q/k normalisation"),
                     "scaled_cosine_attn": (False, "scaled cosine attention"), "scale_heads": (False, "head scales"),
                     "scale_attn_inner": (False, "an inner attention norm"), "scale_attn": (False, "an attention norm"),
                     "scale_fc": (False, "an MLP norm"), "block_type": (None, "a custom block"),
                     "tokenizer_mode": (None, "a custom tokenizer mode")}
TEXT_POOLS = {"argmax": "eos", "eos": "eos", "first": "first", "last": "last"}  # open_clip's -> ours


def open_clip_text_args(config: dict, name: str) -> dict[str, Any]:
    """An open_clip config's text tower -> `TextEncoder` keyword arguments plus `pool` ('eos' | 'first' | 'last',
    the token whose state is projected) and `context_length`. CLIP's: causal, pooled at the highest id (the
    end-of-text token); SigLIP's: no mask, pooled at the last position."""
    model = config.get("model_cfg", config)
    text = model.get("text_cfg") or {}
    if isinstance(text, dict):
        _check_known_keys(text, _TEXT_KEYS, "text_cfg", name)
    for field, (default, what) in _TEXT_UNSUPPORTED.items():
        if text.get(field, default) not in (default, "default"):
            raise ValueError(f"{name}: its text tower has {what}, which our TextEncoder does not compute; load it "
                             "with open_clip instead.")
    pool = text.get("pool_type", "argmax")
    if pool not in TEXT_POOLS:
        raise ValueError(f"{name}: its text tower pools with {pool!r}; supported: {', '.join(TEXT_POOLS)}.")
    width, heads = text.get("width", 512), text.get("heads", 8)
    if not all(isinstance(v, int) and v > 0 for v in (width, heads, text.get("layers", 12))) or width % heads:
        raise ValueError(f"{name}: its open_clip text_cfg has width {width!r}, heads {heads!r}; the width must be a "
                         "positive multiple of the heads.")
    eos, vocab = text.get("eos_id", 2) if pool == "eos" else None, text.get("vocab_size", 49408)
    if eos is not None and isinstance(vocab, int) and not (type(eos) is int and 0 <= eos < vocab):
        # no token has it: every caption would be pooled at position 0, whatever it says
        raise ValueError(f"{name}: its open_clip text_cfg sets eos_id to {eos!r:.40}, which is no token of its "
                         f"vocabulary (ids 0 to {vocab - 1}); set it to the tokenizer's end-of-text id.")
    act = "quick_gelu" if model.get("quick_gelu") else "gelu"
    if text.get("act_kwargs") not in (None, {}):  # SigLIP2's text tower: GELU's tanh approximation
        if text["act_kwargs"] != {"approximate": "tanh"} or act != "gelu":
            raise ValueError(f"{name}: its text tower has activation arguments {text['act_kwargs']!r:.60}, which our "
                             "TextEncoder does not compute (only GELU's approximate='tanh'); load it with open_clip "
                             "instead.")
        act = "gelu_tanh"
    return dict(vocab_size=vocab, embed_dim=width, depth=text.get("layers", 12),
                num_heads=heads, max_len=text.get("context_length", 77),
                mlp_ratio=_float(text.get("mlp_ratio", 4.0), "mlp_ratio", name), norm_first=True,
                norm_eps=_float((text.get("norm_kwargs") or {}).get("eps", 1e-5), "norm_kwargs.eps", name),
                mlp_layer=act, causal=not text.get("no_causal_mask", False), global_pool=TEXT_POOLS[pool],
                eos_token_id=eos)


_TEXT_SWAPS = [("token_embedding.", "token_embed."), ("transformer.resblocks.", "blocks."), ("ln_final.", "norm."),
               (".ln_1.", ".norm1."), (".ln_2.", ".norm2."), ("attn.in_proj_", "attn.qkv."),
               ("attn.out_proj.", "attn.proj."), ("mlp.c_fc.", "mlp.fc1."), ("mlp.c_proj.", "mlp.fc2.")]


def open_clip_text_state_dict(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """A whole open_clip model's state dict -> (its text tower in `TextEncoder` names, the rest: `proj.weight`
    (E, D) [and `proj.bias`] of the text projection as a Linear, `logit_scale`, `logit_bias`). The text tower is
    at the top level (`CLIP`) or under `text.` (`CustomTextCLIP`, SigLIP's)."""
    prefix = "module." if all(k.startswith("module.") for k in state) else ""
    state = {k[len(prefix):]: v for k, v in state.items()}
    extra = {k: state[k] for k in ("logit_scale", "logit_bias") if k in state}
    inner = "text." if any(k.startswith("text.") for k in state) else ""
    text: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if not k.startswith(inner) or k.startswith("visual.") or k in extra or k == "attn_mask":
            continue
        k = k[len(inner):]
        if k == "text_projection":  # (D, E), used as pooled @ proj
            extra["proj.weight"] = v.T.contiguous()
        elif k.startswith("text_projection."):  # an nn.Linear (SigLIP's, with a bias)
            extra["proj." + k.split(".", 1)[1]] = v
        elif k == "positional_embedding":
            text["pos_embed"] = v[None]  # (N, D) -> (1, N, D)
        else:
            for old, new in _TEXT_SWAPS:
                k = k.replace(old, new)
            text[k] = v
    return text, extra
