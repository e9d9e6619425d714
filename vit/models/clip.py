"""Two towers, one encoder: CLIP (Radford et al., 2021) and SigLIP (Zhai et al., 2023) by repository name, the
image tower our `VisionTransformer`, the text tower our `TextEncoder`.

    model = vit.create_clip_model("hf-hub:timm/ViT-B-16-SigLIP2")    # or local-dir:/folder
    ids = model.tokenizer(["a photo of a cat", "a photo of a dog"])  # (2, context_length), open_clip's ids
    image_features, text_features, scale, *bias = model(images, ids) # normalised (B, E), (T, E); exp(scale)
    logits = scale * image_features @ text_features.T (+ bias)       # softmax (CLIP) / sigmoid (SigLIP) per image

Repositories in two layouts load:
    open_clip      open_clip_config.json + open_clip_model.safetensors (or open_clip_pytorch_model.bin): image tower
                   by vit.hub.open_clip_weights (`visual.*` or a timm trunk), text tower by its text functions
                   (`transformer.*` at the top level for CLIP, under `text.` for SigLIP's CustomTextCLIP)
    transformers   config.json of a CLIPModel, SiglipModel or Siglip2Model (fixed resolution: NaFlex's variable
                   sizes are refused) + model.safetensors: image tower by vit.hub.hf_vision,
                   text tower by vit.hub.text_weights (`text_model.*`), `text_projection` (CLIP, no bias) or
                   `text_model.head` (SigLIP, biased) as the projection
The text tower pools one token: CLIP's end-of-text (causal attention), SigLIP's last position (no mask); the
projection is a Linear (E, D). The image tower's head is its projection, bias-free where the repository's is
(open_clip's own ViT, CLIPModel), so a fine-tune saves back into open_clip's layout. `logit_scale` is stored as its
logarithm, as both libraries store it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..hub.clip_tokenizer import ClipTokenizer, repo_clip_tokenizer
from ..hub.names import WEIGHT_FILES, read_json, repo_file
from ..hub.open_clip_weights import WEIGHT_FILES as OPEN_CLIP_FILES
from ..hub.open_clip_weights import open_clip_text_args, open_clip_text_state_dict
from ..hub.text_weights import text_state_dict
from ..hub.weights import LoadReport, check_fit, check_weights, read_state_dict
from .build import create_model
from .model_size import MAX_PARAMS, check_size, entries, shown_size, text_size
from .text_build import ACTIVATIONS, text_model_args
from .text_encoder import TextEncoder

__all__ = ["CLIP", "create_clip_model"]

# transformers' SiglipTextConfig defaults (config.json leaves out what equals them)
SIGLIP_TEXT = dict(vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                   num_attention_heads=12, max_position_embeddings=64, hidden_act="gelu_pytorch_tanh",
                   layer_norm_eps=1e-6, attention_dropout=0.0)


class CLIP(nn.Module):
    """An image tower and a text tower projected into one space of width E.

    visual: images (B, 3, H, W) -> (B, E) (its head is the image projection); text: ids (T, N) -> states;
    `pool`: which token's state is projected ('eos' / 'first': the TextEncoder's pooled output; 'last': the last
    position's); text_projection: (D,) -> (E,). `logit_bias` is None for CLIP, a learned scalar for SigLIP."""

    def __init__(self, visual: nn.Module, text: TextEncoder, text_projection: nn.Module, pool: str = "eos",
                 logit_scale: float = 2.6592600, logit_bias: float | None = None,
                 tokenizer: ClipTokenizer | None = None) -> None:
        super().__init__()
        if pool not in ("eos", "first", "last"):
            raise ValueError(f"unknown text pool {pool!r}; use 'eos' (CLIP), 'first' or 'last' (SigLIP).")
        self.visual, self.text, self.text_projection, self.pool = visual, text, text_projection, pool
        self.logit_scale = nn.Parameter(torch.tensor(float(logit_scale)))  # log of the similarity scale
        self.logit_bias = nn.Parameter(torch.tensor(float(logit_bias))) if logit_bias is not None else None
        self.tokenizer = tokenizer

    @property
    def embed_dim(self) -> int:
        return self.text_projection.weight.shape[0]

    def encode_image(self, images: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        x = self.visual(images)  # (B, E)
        return F.normalize(x, dim=-1) if normalize else x

    def encode_text(self, input_ids: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        out = self.text(input_ids)  # no padding mask: open_clip's towers attend over the padded context
        pooled = out.last_hidden_state[:, -1] if self.pool == "last" else out.pooler_output  # (T, D)
        x = self.text_projection(pooled)  # (T, E)
        return F.normalize(x, dim=-1) if normalize else x

    def forward(self, images: torch.Tensor | None = None, input_ids: torch.Tensor | None = None) -> tuple:
        """(image features, text features) normalised, exp(logit_scale)[, logit_bias], as open_clip's forward."""
        image = self.encode_image(images, normalize=True) if images is not None else None
        text = self.encode_text(input_ids, normalize=True) if input_ids is not None else None
        if self.logit_bias is not None:
            return image, text, self.logit_scale.exp(), self.logit_bias
        return image, text, self.logit_scale.exp()

    def logits(self, image_features: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
        """Normalised (B, E) and (T, E) -> (B, T) scaled similarities (+ SigLIP's bias)."""
        out = self.logit_scale.exp() * image_features @ text_features.T
        return out + self.logit_bias if self.logit_bias is not None else out


def _bad(name: str, what: str) -> ValueError:
    return ValueError(f"{name}: {what}; it is not a CLIP or SigLIP repository this library loads (open_clip's "
                      "open_clip_config.json, or transformers' CLIPModel / SiglipModel / Siglip2Model config.json).")


def _open_clip_parts(name: str, config: dict, cache_dir: Any
                     ) -> tuple[dict, dict, dict, ClipTokenizer | None, bool]:
    """(TextEncoder options, its state, projection and logit tensors, tokenizer, whether the image projection is a
    bare matrix: open_clip's own ViT's `visual.proj`) of an open_clip repository."""
    kwargs = open_clip_text_args(config, name)
    weights = repo_file(name, OPEN_CLIP_FILES, cache_dir, "its weights")
    state = read_state_dict(weights)
    check_weights(state, weights)
    text, extra = open_clip_text_state_dict(state)
    bare = any(k in state for k in ("visual.proj", "module.visual.proj"))
    return kwargs, text, extra, repo_clip_tokenizer(name, cache_dir), bare


def _transformers_parts(name: str, config: dict, cache_dir: Any
                        ) -> tuple[dict, dict, dict, ClipTokenizer | None, bool]:
    """The same for a transformers CLIPModel / SiglipModel repository (CLIPModel's `visual_projection` is bare)."""
    weights = repo_file(name, WEIGHT_FILES, cache_dir, "its weights")
    state = read_state_dict(weights)
    extra = {k: state[k] for k in ("logit_scale", "logit_bias") if k in state}
    if config["model_type"] == "clip":
        _, kwargs = text_model_args(config, name)
        if "text_projection.weight" in state:
            extra["proj.weight"] = state["text_projection.weight"]  # (E, D), no bias
    else:  # siglip, siglip2: the text tower's names are CLIP-text's; its head is the projection
        c = {**SIGLIP_TEXT, **(config.get("text_config") or {})}
        if c["hidden_act"] not in ACTIVATIONS:
            raise _bad(name, f"its text activation {c['hidden_act']!r} is not one of {', '.join(ACTIVATIONS)}")
        kwargs = dict(vocab_size=c["vocab_size"], embed_dim=c["hidden_size"], depth=c["num_hidden_layers"],
                      num_heads=c["num_attention_heads"], max_len=c["max_position_embeddings"],
                      mlp_ratio=c["intermediate_size"] / c["hidden_size"], norm_eps=c["layer_norm_eps"],
                      mlp_layer=ACTIVATIONS[c["hidden_act"]], norm_first=True, causal=False, global_pool="last")
        for part in ("weight", "bias"):
            if f"text_model.head.{part}" in state:
                extra[f"proj.{part}"] = state[f"text_model.head.{part}"]
    report = LoadReport(f"{name} ({weights})")
    text = text_state_dict({k: v for k, v in state.items() if not k.startswith("text_model.head.")}, "clip_text",
                           report)
    bare = "visual_projection.weight" in state and "visual_projection.bias" not in state
    return kwargs, text, extra, repo_clip_tokenizer(name, cache_dir), bare


def _bias_free_head(visual: nn.Module) -> None:
    """The image tower's head (E, D) without its bias, as open_clip's `visual.proj`: a bias the loaders fill with
    zeros (timm's CLIP head has one) would learn in a fine-tune, and open_clip's layout cannot hold it."""
    head = getattr(visual, "head", None)
    if isinstance(head, nn.Linear) and head.bias is not None:
        visual.head = nn.Linear(head.in_features, head.out_features, bias=False, device=head.weight.device,
                                dtype=head.weight.dtype)
        visual.head.weight.data.copy_(head.weight.data)


def create_clip_model(name: str, cache_dir: str | Path | None = None) -> CLIP:
    """The CLIP or SigLIP model `name` names (`hf-hub:org/repo[@revision]` or `local-dir:/folder`, in open_clip's
    or transformers' layout) with its weights, in eval mode; `model.tokenizer` is its tokenizer (None when the
    repository has no tokenizer.json). Pickled .bin weights load with weights_only=True."""
    if not isinstance(name, str):
        raise TypeError(f"create_clip_model takes a repository name (a str, 'hf-hub:org/repo' or "
                        f"'local-dir:/folder'), got {type(name).__name__} {name!r:.60}.")
    try:
        path, is_open_clip = repo_file(name, ("open_clip_config.json",), cache_dir), True
    except FileNotFoundError:
        path, is_open_clip = repo_file(name, ("config.json",), cache_dir), False
    config = read_json(path, name)
    if is_open_clip:
        kwargs, text_state, extra, tok, bare = _open_clip_parts(name, config, cache_dir)
    elif config.get("model_type") in ("clip", "siglip", "siglip2"):
        kwargs, text_state, extra, tok, bare = _transformers_parts(name, config, cache_dir)
    else:
        raise _bad(name, f"its config.json is a {config.get('model_type')!r} model")
    D, depth, V, P = kwargs["embed_dim"], kwargs["depth"], kwargs["vocab_size"], kwargs["max_len"]
    if not all(isinstance(v, int) and v > 0 for v in (D, depth, V, P)):
        raise _bad(name, f"its text tower's sizes (width {D!r}, layers {depth!r}, vocabulary {V!r}, context {P!r}) "
                   "are not positive integers")
    pool = kwargs.pop("global_pool")
    kwargs["global_pool"] = "avg" if pool == "last" else pool  # 'last' is read in CLIP
    n = text_size(kwargs)  # before anything is allocated (a hostile config: its vocabulary, depth, MLP width)
    if n is not None and not n <= MAX_PARAMS:
        raise _bad(name, f"its text tower would have {shown_size(n)} parameters (buffers included), more than "
                   f"{MAX_PARAMS:.0e} (width {D}, layers {depth}, vocabulary {V}, MLP ratio "
                   f"{kwargs.get('mlp_ratio', 4.0):.3g}); its config is wrong")
    if "proj.weight" not in extra or "logit_scale" not in extra:
        raise _bad(name, "its weights have no text projection or logit_scale")
    text = TextEncoder(**kwargs)
    where = f"{name} (text tower)"
    check_fit(text_state, text.state_dict(), where)
    text.load_state_dict(text_state)
    scale = extra["logit_scale"].reshape(-1)[:1].float()
    if scale.numel() != 1 or not torch.isfinite(scale.exp()).all():  # NaN, or every logit inf
        raise ValueError(f"{name}: its logit_scale (the log of the similarity scale) is {scale.tolist()}, whose exp "
                         "is not a finite float32, so every logit would be inf or NaN; these weights are damaged "
                         "(trained CLIP and SigLIP models hold 2.6 to 4.8).")
    proj_w = extra["proj.weight"]
    projection = nn.Linear(proj_w.shape[1], proj_w.shape[0], bias="proj.bias" in extra)
    projection.load_state_dict({k[5:]: v for k, v in extra.items() if k.startswith("proj.")})
    visual = create_model(name, pretrained=True, cache_dir=cache_dir)
    if bare:  # its head's bias is the loader's zero filler: gone, so a fine-tune cannot learn one it cannot save
        _bias_free_head(visual)
    bias = extra.get("logit_bias")
    model = CLIP(visual, text, projection, pool, float(extra["logit_scale"].reshape(-1)[0]),
                 None if bias is None else float(bias.reshape(-1)[0]), tok)
    return model.eval()


def new_clip_model(visual: nn.Module, tokenizer: ClipTokenizer, embed_dim: int, text_width: int, text_depth: int,
                   text_heads: int, logit_scale: float, logit_bias: float | None = None) -> CLIP:
    """A CLIP with fresh text weights around the image tower `visual` (its head (E, D) the image projection, without
    bias, as open_clip's `visual.proj`): a causal text tower of `text_depth` blocks on
    `tokenizer`'s vocabulary and context, pooled at its highest id (the end token), projected without bias.
    `logit_bias`: SigLIP's initial bias (None: CLIP, no bias)."""
    if getattr(visual, "num_classes", embed_dim) != embed_dim:
        raise ValueError(f"the image tower projects to {visual.num_classes} features, not embed_dim={embed_dim}; "
                         "build it with num_classes=embed_dim.")
    _bias_free_head(visual)
    vocab = tokenizer.tokenizer.vocab_size
    options = dict(vocab_size=vocab, embed_dim=text_width, depth=text_depth, num_heads=text_heads,
                   max_len=tokenizer.context_length, global_pool="eos", causal=True, norm_eps=1e-5)
    tower = text_size(options)
    if tower is not None:  # the image tower is built: the two together, before the text tower is allocated
        check_size(tower + text_width * embed_dim + entries(visual), "the contrastive model",
                   f"text tower: width {text_width}, depth {text_depth}, vocabulary {vocab}, context "
                   f"{tokenizer.context_length}; image tower: {entries(visual):.2g}",
                   "lower contrastive.text_width, text_depth or context_length, or the image tower's size")
    return CLIP(visual, TextEncoder(**options), nn.Linear(text_width, embed_dim, bias=False), "eos", logit_scale,
                logit_bias, tokenizer)
