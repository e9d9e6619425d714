"""A `CLIP` saved as an open_clip repository: one folder that `vit.create_clip_model("local-dir:<folder>")` and
open_clip's `create_model("local-dir:<folder>")` both load with the same features, and that
`huggingface_hub.upload_folder` can publish as it is.

    open_clip_config.json        model_cfg (embed_dim, vision_cfg, text_cfg, quick_gelu, init_logit_bias, custom_text)
                                 and preprocess_cfg (mean, std, interpolation, resize mode), derived from the modules
    open_clip_model.safetensors  the weights in open_clip's names: the inverse of vit/hub/open_clip_weights.py
    tokenizer.json (+ tokenizer_config.json for a SentencePiece one, which open_clip reads with transformers)

The image tower is written in one of open_clip's two layouts: `visual.*` (its own ViT) when ours is CLIP's
(a patch embedding without bias, ln_pre, [CLS], learned positions, token or average pooling, a bias-free
projection), otherwise `visual.trunk.*`, a timm model that open_clip builds by its timm name, so the tower must
be that model's shape (SigLIP's `vit_base_patch16_siglip_224`, ...). The text tower is written at the top level
(open_clip's `CLIP`: causal, pooled at end-of-text, bias-free projection) or under `text.` (`CustomTextCLIP`:
any other pooling, mask or a biased projection, as SigLIP's). The folder is written beside its final place and
swapped in whole (vit/utils/atomic.py), so a kill mid-save leaves the previous folder complete.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save
from torch import nn

from ..hub.weights import check_finite
from ..layers.mlp import GELUTanh, QuickGELU
from ..utils.atomic import atomic_write_bytes, atomic_write_text, staged_dir
from .clip import CLIP

__all__ = ["open_clip_config", "open_clip_state_dict_of", "save_clip_model"]


def _refuse(what: str) -> ValueError:
    return ValueError(f"this CLIP model's {what}, which open_clip's repository layout cannot hold; save its towers "
                      "with torch.save(model.state_dict()) instead.")


def _activation(blocks: nn.Module, tower: str) -> str:
    act = blocks[0].mlp.act if len(blocks) else None
    if isinstance(act, QuickGELU):
        return "quick_gelu"
    if isinstance(act, GELUTanh):
        return "gelu_tanh"
    if act is None or (type(act) is nn.GELU and act.approximate == "none"):
        return "gelu"
    raise _refuse(f"{tower} uses the activation {type(act).__name__}")


def _native_vision(v: nn.Module) -> bool:
    """Whether the image tower is open_clip's own ViT: pre-norm stem, [CLS], learned positions, no extras."""
    return (not isinstance(v.norm_pre, nn.Identity) and v.has_class_token and v.num_reg_tokens == 0
            and v.dist_token is None and v.attn_pool is None and v.rope is None and v.pos_embed_type == "learn"
            and v.global_pool in ("token", "avg") and v.patch_embed.proj.bias is None
            and isinstance(v.norm, nn.Identity) != isinstance(v.fc_norm, nn.Identity))  # one final norm: ln_post


def _vision_cfg(v: nn.Module) -> dict:
    blk = v.blocks[0]
    grid = v.patch_embed.img_size
    patch = v.patch_embed.patch_size
    if grid[0] != grid[1] or patch[0] != patch[1]:
        raise _refuse(f"image tower takes non-square images {tuple(grid)} or patches {tuple(patch)}")
    cfg = dict(image_size=int(grid[0]), patch_size=int(patch[0]), layers=len(v.blocks), width=v.embed_dim,
               head_width=v.embed_dim // blk.attn.num_heads, mlp_ratio=blk.mlp.fc1.out_features / v.embed_dim,
               norm_kwargs=dict(eps=blk.norm1.eps))
    if not isinstance(blk.ls1, nn.Identity):
        cfg["ls_init_value"] = 1e-5  # any number: it only switches layer scale on; the weights hold the gammas
    if v.global_pool == "avg":
        cfg.update(pool_type="avg", final_ln_after_pool=not isinstance(v.fc_norm, nn.Identity))
    return cfg


def _trunk_name(v: nn.Module) -> str:
    """The timm name open_clip builds the tower by, checked against ours on the meta device (no memory)."""
    import timm

    name = str((getattr(v, "pretrained_cfg", None) or {}).get("architecture") or "")
    if name not in timm.list_models():
        raise _refuse(f"image tower ({name or 'unnamed'}) is neither open_clip's own ViT nor a model timm builds by "
                      "name")
    with torch.device("meta"):
        ref = timm.create_model(name, pretrained=False, num_classes=v.num_classes, global_pool=v.global_pool)
    ours = {k: tuple(t.shape) for k, t in v.state_dict().items()}
    theirs = {k: tuple(t.shape) for k, t in ref.state_dict().items()}
    if ours != theirs:
        diff = sorted(set(ours.items()) ^ set(theirs.items()))[:2]
        raise _refuse(f"image tower differs from timm's {name} in {diff}")
    return name


def open_clip_config(model: CLIP) -> dict:
    """open_clip_config.json for `model` (see the module docstring): {'model_cfg': ..., 'preprocess_cfg': ...}."""
    v, t = model.visual, model.text
    native = _native_vision(v)
    # a timm trunk has its own activation (by its name); open_clip's ViT and text tower share quick_gelu or not
    text_act = _activation(t.blocks, "text tower")
    if native and _activation(v.blocks, "image tower") != ("quick_gelu" if text_act == "quick_gelu" else "gelu"):
        raise _refuse("towers use activations open_clip cannot set apart (quick_gelu is one switch for both; GELU's "
                      "tanh approximation is the text tower's only)")
    width = v.num_classes or v.num_features  # no head: the pooled features are the embedding
    if width != model.embed_dim or (native and not v.num_classes):
        raise _refuse(f"image tower gives {width} features {'without a projection ' if native else ''}where the "
                      f"text tower gives {model.embed_dim}")
    top = model.pool == "eos" and t.causal and model.text_projection.bias is None
    blk = t.blocks[0]
    text = dict(context_length=t.max_len, vocab_size=t.vocab_size, width=t.embed_dim, heads=blk.attn.num_heads,
                layers=len(t.blocks), mlp_ratio=blk.mlp.fc1.out_features / t.embed_dim,
                norm_kwargs=dict(eps=blk.norm1.eps))
    if not t.causal:
        text["no_causal_mask"] = True
    if model.pool == "eos" and t.eos_token_id is not None:
        text.update(pool_type="eos", eos_id=int(t.eos_token_id))
    elif model.pool != "eos":
        text["pool_type"] = model.pool
    if model.text_projection.bias is not None:
        text["proj_bias"] = True
    if text_act == "gelu_tanh":  # SigLIP2's text tower
        text["act_kwargs"] = dict(approximate="tanh")
    tok = model.tokenizer
    if tok is not None and tok.kind == "hf":
        # open_clip reads a local folder's tokenizer.json through transformers when this is set
        text.update(hf_tokenizer_name=".", tokenizer_kwargs=dict(clean=tok.clean))
    elif tok is not None and tok.clean != "lower":
        text["tokenizer_kwargs"] = dict(clean=tok.clean)
    cfg: dict = dict(embed_dim=model.embed_dim, quick_gelu=text_act == "quick_gelu", text_cfg=text)
    if native:
        if isinstance(v.head, nn.Linear) and v.head.bias is not None and v.head.bias.any():
            raise _refuse("image projection has a bias (open_clip's ViT projects without one; keep visual.head.bias "
                          "frozen at zero when fine-tuning)")
        cfg["vision_cfg"] = _vision_cfg(v)
    else:
        cfg["vision_cfg"] = dict(image_size=int(v.patch_embed.img_size[0]), timm_model_name=_trunk_name(v),
                                 timm_pool=v.global_pool, timm_proj="" if v.num_classes else "none")
    if model.logit_bias is not None:
        cfg["init_logit_bias"] = float(model.logit_bias.detach())
    if not top:
        cfg["custom_text"] = True
    pre = getattr(v, "pretrained_cfg", None) or {}
    size = [int(s) for s in v.patch_embed.img_size]  # the tower's own size (a registry default may differ)
    preprocess = dict(size=size, mean=list(pre.get("mean", (0.48145466, 0.4578275, 0.40821073))),
                      std=list(pre.get("std", (0.26862954, 0.26130258, 0.27577711))),
                      interpolation=pre.get("interpolation", "bicubic"),
                      resize_mode="squash" if pre.get("crop_mode") == "squash" else "shortest")
    return dict(model_cfg=cfg, preprocess_cfg=preprocess)


_VISION = [("patch_embed.proj", "conv1"), ("pos_embed", "positional_embedding"), ("cls_token", "class_embedding"),
           ("blocks.", "transformer.resblocks."), ("norm_pre.", "ln_pre."), ("norm.", "ln_post."),
           (".norm1.", ".ln_1."), (".norm2.", ".ln_2."), (".ls1.", ".ls_1."), (".ls2.", ".ls_2."),
           ("attn.qkv.", "attn.in_proj_"), ("attn.proj.", "attn.out_proj."), ("mlp.fc1.", "mlp.c_fc."),
           ("mlp.fc2.", "mlp.c_proj.")]
_TEXT = [("token_embed.", "token_embedding."), ("blocks.", "transformer.resblocks."), ("norm.", "ln_final."),
         (".norm1.", ".ln_1."), (".norm2.", ".ln_2."), ("attn.qkv.", "attn.in_proj_"),
         ("attn.proj.", "attn.out_proj."), ("mlp.fc1.", "mlp.c_fc."), ("mlp.fc2.", "mlp.c_proj.")]


def _rename(key: str, swaps: list[tuple[str, str]]) -> str:
    key = "." + key
    for ours, theirs in swaps:
        key = key.replace(ours if ours.startswith(".") else "." + ours, theirs if theirs.startswith(".")
                          else "." + theirs)
    return key[1:]


def open_clip_state_dict_of(model: CLIP, config: dict, state: dict[str, torch.Tensor] | None = None
                            ) -> dict[str, torch.Tensor]:
    """`model`'s weights (or `state`, its state dict: an EMA's, a gathered FSDP copy) in open_clip's names for
    the layout `config` (open_clip_config's result) describes."""
    state = model.state_dict() if state is None else state
    cfg = config["model_cfg"]
    out: dict[str, torch.Tensor] = {"logit_scale": state["logit_scale"]}
    if "logit_bias" in state:
        out["logit_bias"] = state["logit_bias"]
    native = "timm_model_name" not in cfg["vision_cfg"]
    for k, v in state.items():
        if not k.startswith("visual."):
            continue
        k = k[7:]
        if not native:
            out["visual.trunk." + k] = v
        elif k == "head.weight":  # (E, D) Linear weight -> open_clip's (D, E), used as pooled @ proj
            out["visual.proj"] = v.T
        elif k != "head.bias":  # zero (checked by open_clip_config)
            # the pooled features' norm is open_clip's ln_post too (final_ln_after_pool, set by _vision_cfg)
            k = "ln_post." + k[8:] if k.startswith("fc_norm.") else _rename(k, _VISION)
            out["visual." + k] = v.reshape(-1) if k == "class_embedding" else v[0] if k == "positional_embedding" \
                else v
    inner = "text." if cfg.get("custom_text") else ""
    for k, v in state.items():
        if k.startswith("text."):
            k = k[5:]
            out[inner + ("positional_embedding" if k == "pos_embed" else _rename(k, _TEXT))] = \
                v[0] if k == "pos_embed" else v
        elif k.startswith("text_projection."):
            if cfg["text_cfg"].get("proj_bias"):
                out[inner + k] = v  # an nn.Linear's weight (E, D) and bias
            else:
                out[inner + "text_projection"] = v.T  # (D, E), used as pooled @ proj
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}


def save_clip_model(model: CLIP, folder: str | Path, state_dict: dict[str, torch.Tensor] | None = None,
                    extra: dict[str, str] | None = None, preprocess: dict | None = None) -> Path:
    """Write `model` into `folder` as an open_clip repository (see the module docstring), atomically.
    `state_dict`: the weights to write instead of `model.state_dict()` (an EMA's, or FSDP's gathered copy);
    `extra`: more text files for the folder (train.py's config.yaml, ...); `preprocess`: mean, std and
    interpolation to record instead of the image tower's pretrained ones (what a training run used). Returns the
    folder."""
    if not isinstance(model, CLIP):
        raise TypeError(f"save_clip_model saves a vit CLIP model (vit.create_clip_model), not a "
                        f"{type(model).__name__}.")
    folder = Path(folder)
    config = open_clip_config(model)
    config["preprocess_cfg"].update({k: list(v) if isinstance(v, tuple) else v for k, v in (preprocess or {}).items()})
    state = open_clip_state_dict_of(model, config, state_dict)
    check_finite(state, f"refusing to save {folder}", "lower optim.lr or enable optim.clip_grad.")
    with staged_dir(folder) as tmp:
        atomic_write_bytes(tmp / "open_clip_model.safetensors", save(state, metadata={"format": "pt"}))
        atomic_write_text(tmp / "open_clip_config.json", json.dumps(config, indent=2))
        if model.tokenizer is not None:
            tok = model.tokenizer.tokenizer
            atomic_write_text(tmp / "tokenizer.json", tok.backend.to_str())
            if model.tokenizer.kind == "hf":  # what transformers' AutoTokenizer needs beside it (open_clip's path)
                atomic_write_text(tmp / "tokenizer_config.json", json.dumps(dict(
                    tokenizer_class="PreTrainedTokenizerFast", pad_token=tok.pad_token,
                    padding_side=tok.padding_side, model_max_length=model.tokenizer.context_length), indent=2))
        for name, text in (extra or {}).items():
            atomic_write_text(tmp / name, text)
    return folder
