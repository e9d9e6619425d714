"""A CLIP model saved in open_clip's repository layout, so that `vit.create_clip_model("local-dir:<folder>")` and
open_clip's `create_model("local-dir:<folder>")` both load it:

    open_clip_config.json        model_cfg (embed_dim, quick_gelu, vision_cfg, text_cfg, init_logit_bias),
                                 preprocess_cfg (size, mean, std, interpolation)
    open_clip_model.safetensors  open_clip's CLIP names (the renames below, the reverse of vit.hub.open_clip_weights)
    tokenizer.json (+ tokenizer_config.json)   the tokenizer, for an 'hf' one named by text_cfg.hf_tokenizer_name

    ours (VisionTransformer / TextEncoder)        open_clip
    patch_embed.proj.weight                       visual.conv1.weight (CLIP's patch embedding has no bias)
    cls_token (1, 1, D), pos_embed (1, N, D)      visual.class_embedding (D,), visual.positional_embedding (N, D)
    norm_pre, norm                                visual.ln_pre, visual.ln_post
    blocks.i.norm1|norm2, .attn.qkv, .attn.proj   transformer.resblocks.i.ln_1|ln_2, .attn.in_proj_, .attn.out_proj
    blocks.i.mlp.fc1|fc2, .ls1|ls2.gamma          ....mlp.c_fc|c_proj, .ls_1|ls_2.gamma
    head.weight (E, D), head.bias = 0             visual.proj (D, E): pooled @ proj
    text: token_embed, pos_embed, norm            token_embedding, positional_embedding (N, D), ln_final
    text_projection.weight (E, D)                 text_projection (D, E) (a biased one: text_projection.weight/bias)

Only towers open_clip's own VisionTransformer and TextTransformer compute can be written so: a [CLS]-pooled or
averaged ViT with CLIP's norm before the blocks, and a text tower pooled at its end token; anything else (a
register token, a SigLIP trunk, an image-projection bias) is refused in one sentence naming the part.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import save

from ..hub.clip_tokenizer import tokenizer_files
from ..hub.weights import check_finite
from ..utils.atomic import atomic_write_bytes, atomic_write_text, recover_dir, replace_dir
from .clip import CLIP

__all__ = ["open_clip_layout", "save_clip_model"]

_BLOCK = [("norm1.", "ln_1."), ("norm2.", "ln_2."), ("attn.qkv.", "attn.in_proj_"), ("attn.proj.", "attn.out_proj."),
          ("mlp.fc1.", "mlp.c_fc."), ("mlp.fc2.", "mlp.c_proj."), ("ls1.", "ls_1."), ("ls2.", "ls_2.")]
_BLOCK_KEY = re.compile(r"blocks\.(\d+)\.(.*)")


class LayoutError(ValueError):
    """A model part open_clip's layout has no place for; the message names it."""


def _block(key: str, where: str) -> str:
    """blocks.3.attn.qkv.weight -> transformer.resblocks.3.attn.in_proj_weight."""
    i, rest = _BLOCK_KEY.fullmatch(key).groups()
    for ours, theirs in _BLOCK:
        if rest.startswith(ours):
            return f"transformer.resblocks.{i}.{theirs}{rest[len(ours):]}"
    raise LayoutError(f"{where} has {key}, which open_clip's layout has no place for")


def _visual(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        if k == "cls_token":
            out["class_embedding"] = v.reshape(-1)
        elif k == "pos_embed":
            out["positional_embedding"] = v[0]
        elif k == "patch_embed.proj.weight":
            out["conv1.weight"] = v
        elif k.startswith(("norm_pre.", "norm.")):
            out[k.replace("norm_pre.", "ln_pre.") if k.startswith("norm_pre.") else k.replace("norm.", "ln_post.")] = v
        elif k == "head.weight":
            out["proj"] = v.T.contiguous()  # (D, E)
        elif k == "head.bias":
            if v.abs().max() > 0:
                raise LayoutError("the image tower's projection has a bias, which open_clip's `visual.proj` has not")
        elif _BLOCK_KEY.fullmatch(k):
            out[_block(k, "the image tower")] = v
        else:
            raise LayoutError(f"the image tower has {k}, which open_clip's VisionTransformer has no place for")
    if "ln_pre.weight" not in out or "class_embedding" not in out:
        raise LayoutError("the image tower has no [CLS] token or no norm before its blocks (model.pre_norm), which "
                          "open_clip's VisionTransformer has")
    return out


def _text(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        if k == "token_embed.weight":
            out["token_embedding.weight"] = v
        elif k == "pos_embed":
            out["positional_embedding"] = v[0]
        elif k.startswith("norm."):
            out[k.replace("norm.", "ln_final.")] = v
        elif _BLOCK_KEY.fullmatch(k):
            out[_block(k, "the text tower")] = v
        else:
            raise LayoutError(f"the text tower has {k}, which open_clip's TextTransformer has no place for")
    return out


def _act(module: torch.nn.Module) -> str:
    names = {type(m).__name__ for m in module.modules()}
    return "quick_gelu" if "QuickGELU" in names else "gelu"


def open_clip_layout(model: CLIP, state_dict: dict | None = None, preprocess: dict | None = None
                     ) -> tuple[dict, dict[str, torch.Tensor]]:
    """(open_clip_config.json's content, open_clip's state dict) of `model` (see the module docstring).
    `state_dict`: the weights to write instead of the model's; `preprocess`: mean, std, interpolation."""
    weights = model.state_dict() if state_dict is None else state_dict
    state = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
    v, t = model.visual, model.text
    where = "this CLIP model cannot be saved in open_clip's layout: "
    try:
        out = {f"visual.{k}": x for k, x in _visual({k[7:]: x for k, x in state.items()
                                                     if k.startswith("visual.")}).items()}
        out.update(_text({k[5:]: x for k, x in state.items() if k.startswith("text.")}))
    except LayoutError as e:
        raise LayoutError(where + str(e) + "; train one from model.* with a CLIP image tower (e.g. "
                          "vit_base_patch16_clip_224 with its sizes set).") from None
    if model.pool != "eos" or _act(v) != _act(t) or t.global_pool != "eos":
        raise LayoutError(where + "its text tower does not pool at the end token, or its towers use different "
                          "activations; open_clip's CLIP has one activation and pools at the end token.")
    proj = state["text_projection.weight"]  # (E, D)
    biased = "text_projection.bias" in state
    if biased:
        out["text_projection.weight"], out["text_projection.bias"] = proj, state["text_projection.bias"]
    else:
        out["text_projection"] = proj.T.contiguous()  # (D, E)
    out["logit_scale"] = state["logit_scale"]
    if "logit_bias" in state:
        out["logit_bias"] = state["logit_bias"]
    block = v.blocks[0] if len(v.blocks) else None
    width, heads = v.embed_dim, block.attn.num_heads if block is not None else 1
    vision = dict(image_size=v.patch_embed.img_size[0], patch_size=v.patch_embed.patch_size[0], width=width,
                  layers=len(v.blocks), head_width=width // heads,
                  mlp_ratio=block.mlp.fc1.out_features / width if block is not None else 4.0,
                  norm_kwargs={"eps": v.norm_pre.eps})
    if v.global_pool == "avg":
        vision.update(pool_type="avg", final_ln_after_pool=not isinstance(v.fc_norm, torch.nn.Identity))
    elif v.global_pool != "token":
        raise LayoutError(where + f"its image tower pools with {v.global_pool!r}; open_clip's pools the [CLS] token "
                          "or the average.")
    if block is not None and not isinstance(block.ls1, torch.nn.Identity):
        vision["ls_init_value"] = 1.0  # only its presence matters: the gammas are saved
    tb = t.blocks[0] if len(t.blocks) else None
    text = dict(context_length=t.pos_embed.shape[1], vocab_size=t.token_embed.num_embeddings,
                width=t.token_embed.embedding_dim, heads=tb.attn.num_heads if tb is not None else 1,
                layers=len(t.blocks), mlp_ratio=tb.mlp.fc1.out_features / t.token_embed.embedding_dim
                if tb is not None else 4.0, norm_kwargs={"eps": t.norm.eps}, proj_bias=biased)
    if t.eos_token_id is None:
        text["pool_type"] = "argmax"
    else:
        text.update(pool_type="eos", eos_id=int(t.eos_token_id))
    if not t.causal:
        text["no_causal_mask"] = True
    tok = model.tokenizer
    if tok is not None and getattr(tok, "kind", None) == "hf":
        text.update(hf_tokenizer_name="tokenizer.json", tokenizer_kwargs={"clean": tok.clean})
    cfg = dict(embed_dim=model.embed_dim, quick_gelu=_act(v) == "quick_gelu", vision_cfg=vision, text_cfg=text)
    if model.logit_bias is not None:
        cfg["init_logit_bias"] = float(state["logit_bias"])
    pre = dict(size=vision["image_size"], resize_mode="shortest", **(preprocess or {}))
    return {"model_cfg": cfg, "preprocess_cfg": pre}, out


def save_clip_model(folder: str | Path, model: CLIP, preprocess: dict | None = None,
                    extra: dict[str, str] | None = None, state_dict: dict | None = None) -> Path:
    """Write `model` into `folder` in open_clip's layout (the module docstring), atomically: the whole folder is
    written beside it and swapped in. `extra`: more text files (train.py's config.yaml, meta.json, ...)."""
    folder = Path(folder)
    config, state = open_clip_layout(model, state_dict, preprocess)
    check_finite(state, f"refusing to save {folder}", "lower optim.lr or enable optim.clip_grad.")
    folder.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(folder, f".tmp-{folder.name}-*")
    tmp = folder.parent / f".tmp-{folder.name}-{os.getpid()}"
    tmp.mkdir()
    try:
        atomic_write_bytes(tmp / "open_clip_model.safetensors", save(state, metadata={"format": "pt"}))
        atomic_write_text(tmp / "open_clip_config.json", json.dumps(config, indent=2))
        files = tokenizer_files(model.tokenizer) if model.tokenizer is not None else {}
        for name, text in {**files, **(extra or {})}.items():
            atomic_write_text(tmp / name, text)
        replace_dir(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder
