"""Load timm / Hugging Face-timm weights into our models, adapting them to the model at hand.

Files are read without running code: `.safetensors` directly, `.pth` / `.pt` / `.bin` / `.ckpt` through
`torch.load(weights_only=True)`, which refuses pickles that would build arbitrary objects. Adaptations:
  - wrappers from training scripts (`{'model': ...}`, `{'state_dict': ...}`, `module.` prefixes) removed;
  - transformers' and open_clip's names renamed to timm's (`converted_state_dict`: vit/hub/hf_vision.py,
    vit/hub/open_clip_weights.py), for a source in their layout or a state dict with open_clip's `visual.` keys;
  - the model's own, through its `checkpoint_filter_fn` (as timm's models have one): for the ViT, positions
    resampled to its patch grid and the patch embedding adapted to its input channels (vit/models/vision_weights.py);
  - a classifier head whose class count differs is dropped and the model's fresh head kept, when the caller asked
    for another class count (fine-tuning); weights loaded as they are must fit their head.
Every tensor must be floating point (float16, bfloat16, float32 or float64) and finite: an integer, bool or
complex tensor would be cast in silence, and a NaN gives confident nonsense. Anything else that does not fit
raises one sentence naming the mismatch. Weights named rather than given as a
file (`vit_base_patch16_224`, `hf-hub:...`, `local-dir:...`) are found by `vit.hub` and read here.
"""

from __future__ import annotations

import logging
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from .hf_vision import hf_state_dict
from .names import Source, regular_file, weights_file
from .open_clip_weights import is_open_clip_state, open_clip_state_dict

__all__ = ["check_depth_fits", "load_pretrained", "read_state_dict", "LoadReport", "check_fit", "check_weights",
           "check_finite", "converted_state_dict", "timm_weights"]
log = logging.getLogger(__name__)

PICKLE_SUFFIXES = {".pth", ".pt", ".bin", ".ckpt"}
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_finite(state: dict[str, torch.Tensor], what: str, advice: str) -> None:
    """Raise FloatingPointError naming the first floating-point tensor holding inf or NaN: `what`, the tensor,
    then `advice` (what to do). The one check for weights saved (vit.models.checkpoint) and weights loaded (here)."""
    for k, v in state.items():
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise FloatingPointError(f"{what}: {k} holds non-finite values; {advice}")


def check_weights(state: dict[str, torch.Tensor], path: str | Path) -> None:
    """Refuse, in one sentence, weights that would load wrong without a word: a tensor that is not floating point
    (bool, integer or complex: load_state_dict would cast it) or that holds inf or NaN."""
    for k, v in state.items():
        if v.dtype not in FLOAT_DTYPES:
            raise ValueError(f"refusing to load {path}: {k} is {str(v.dtype).removeprefix('torch.')}, not a "
                             "floating-point tensor (float16, bfloat16, float32 or float64); it is not model weights "
                             "as saved, so re-export it from a trusted source.")
    check_finite(state, f"refusing to load {path}", "the weights are corrupt (or diverged in training): "
                 "re-download them, or load an earlier checkpoint.")


@dataclass
class LoadReport:
    path: str
    actions: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"loaded {self.path}" + ("".join(f"\n  - {a}" for a in self.actions) if self.actions else "")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a weights file into a flat {name: tensor} dict, never executing code from it."""
    path = regular_file(Path(path), "weights file", f"weights file {str(path)!r} does not exist; check the path.")
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except Exception as e:
            raise ValueError(f"{path} is not a readable safetensors file ({e}); re-download or re-export it.") from None
    if path.suffix not in PICKLE_SUFFIXES:
        raise ValueError(
            f"{path} has an unknown weights format {path.suffix!r}; use .safetensors, .pth, .pt, .bin or .ckpt."
        )
    _check_inflated_size(path)
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"refusing to load {path}: it contains pickled code or objects beyond plain tensors, which could run "
            f"arbitrary code ({str(e).splitlines()[0]}); convert it to .safetensors from a trusted source."
        ) from None
    except Exception as e:
        raise ValueError(f"{path} is not a readable PyTorch weights file ({e}).") from None
    return _unwrap(obj, path)


def _check_inflated_size(path: Path) -> None:
    """torch.save writes a zip archive without compression; one whose entries inflate to far more than the file
    (a zip bomb) is refused before torch.load inflates every entry in full."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as z:
            total = sum(i.file_size for i in z.infolist())
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{path} is not a readable PyTorch weights file ({e}).") from None
    size = path.stat().st_size
    if total > 4 * size + 2**20:
        raise ValueError(f"{path} inflates to {total} bytes from {size}: it is not a weights file as torch.save "
                         "writes it (uncompressed); re-export it, or convert it to .safetensors.")


def _unwrap(obj: object, path: Path) -> dict[str, torch.Tensor]:
    for key in ("state_dict", "model", "module", "model_ema", "state_dict_ema"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path} does not hold a state dict of tensors; pass a model weights file.")
    prefix = "module."
    if all(k.startswith(prefix) for k in obj):  # saved from DistributedDataParallel
        obj = {k[len(prefix) :]: v for k, v in obj.items()}
    return obj


def adapt_state_dict(
    state: dict[str, torch.Tensor], model: nn.Module, report: LoadReport, new_head: bool = True
) -> dict[str, torch.Tensor]:
    """Fit `state` to `model` and record what was done: first the model's own adaptation, its
    `checkpoint_filter_fn(state, report)` if it has one (timm's name; the ViT's resamples positions and adapts
    input channels, vit/models/vision_weights.py), then the one every classifier shares: a head whose class count
    differs is dropped so the model keeps its fresh one (fine-tuning), if `new_head` (the caller asked for that
    class count); otherwise the mismatch is refused: the weights do not fit the config they came with."""
    filter_fn = getattr(model, "checkpoint_filter_fn", None)
    state = dict(filter_fn(state, report) if filter_fn is not None else state)
    own = model.state_dict()
    head_keys = [k for k in ("head.weight", "head.bias") if k in state]
    if head_keys and ("head.weight" not in own or state["head.weight"].shape != own["head.weight"].shape):
        n_old = state["head.weight"].shape[0]
        n_new = own["head.weight"].shape[0] if "head.weight" in own else 0
        if not new_head:
            raise ValueError(f"{report.path} holds a {n_old}-class head, but its config.json says {n_new} classes: "
                             f"the weights do not fit their own config; fix num_classes there, or pass num_classes="
                             f"(--model.num_classes / a dataset of that many classes) to fine-tune a fresh head.")
        for k in head_keys:
            del state[k]
        report.actions.append(f"dropped the {n_old}-class head; the model keeps its new {n_new}-class head")
    return state


def check_fit(state: dict[str, torch.Tensor], own: dict[str, torch.Tensor], where: str,
              may_miss: tuple[str, ...] = ()) -> None:
    """Raise one ValueError naming what keeps `state` from loading into a model whose state dict is `own`: shape
    mismatches, missing keys (other than those starting with a `may_miss` prefix) and unexpected keys."""
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items()
             if k in own and v.shape != own[k].shape]
    missing = [k for k in own if k not in state and not k.startswith(may_miss)]
    unexpected = [k for k in state if k not in own]
    if wrong or missing or unexpected:
        parts = []
        if wrong:
            parts.append("shape mismatch: " + ", ".join(wrong[:4]))
        if missing:
            parts.append("missing: " + ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else ""))
        if unexpected:
            parts.append("unexpected: " + ", ".join(unexpected[:4]) + (" ..." if len(unexpected) > 4 else ""))
        raise ValueError(
            f"{where} does not fit this model ({'; '.join(parts)}); it is from another architecture: "
            "create the model it was saved from."
        )


def converted_state_dict(state: dict[str, torch.Tensor], source: Source | None, report: LoadReport
                         ) -> dict[str, torch.Tensor]:
    """`state` in timm's ViT names: a transformers checkpoint renamed by vit.hub.hf_vision, an open_clip one (named
    so by its source, or recognised by its `visual.` keys, as timm's filter recognises it) by
    vit.hub.open_clip_weights; timm's own as it is."""
    fmt = source.format if source is not None else "timm"
    if fmt == "transformers":  # dtypes before q/k/v are fused: torch.cat casts a bool or int8 part to float in silence
        check_weights({k: v for k, v in state.items() if not k.endswith("position_ids")}, report.path)
        return hf_state_dict(state, source.format_config, report)
    if fmt == "open_clip" or is_open_clip_state(state):
        return open_clip_state_dict(state, report, source.format_config if source is not None else None)
    return state


def timm_weights(name: str, cache_dir: str | Path | None = None) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """What a named repository (`hf-hub:org/repo`, `local-dir:/folder`; timm's, transformers' or open_clip's
    layout) gives timm's ViT: (its construction options, its state dict in timm's names, its pretrained config),
    read without building a model. The options use this library's names for norm and MLP (`norm_eps`,
    `mlp_layer`) and timm's for the rest (`pre_norm`, `reg_tokens`, `global_pool='map'`, ...)."""
    from .names import resolve_source

    source = resolve_source(name, True, cache_dir=cache_dir)
    report = LoadReport(f"{name} ({source.weights})")
    state = converted_state_dict(read_state_dict(source.weights), source, report)
    check_weights(state, source.weights)
    return source.model_kwargs(), state, source.pretrained_cfg


def load_pretrained(model: nn.Module, path: str | Path | Source, strict: bool = True,
                    cache_dir: str | Path | None = None, new_head: bool = True) -> LoadReport:
    """Load a timm (or HF-timm, transformers, open_clip) checkpoint into `model`, adapting positions, head and
    input channels.

    `path`: a weights file, or a `vit.hub.names.Source` (its model.safetensors / pytorch_model.bin from the hub cache
    or its folder). With strict=True (default) any other missing, unexpected or mis-shaped parameter raises a
    ValueError that names it. `new_head=False`: the model's head is the one the weights' config describes, so
    a head that differs is refused rather than replaced (see `adapt_state_dict`). Non-float and non-finite
    tensors are refused (`check_weights`). Returns a report of the adaptations, also logged.
    """
    source = path if isinstance(path, Source) else None
    if isinstance(path, Source):
        name, path = path.name, weights_file(path, cache_dir)
        report = LoadReport(str(path) if name == str(path) else f"{name} ({path})")
    else:
        report = LoadReport(str(path))
    state = converted_state_dict(read_state_dict(path), source, report)
    check_weights(state, path)
    state = adapt_state_dict(state, model, report, new_head)
    own = model.state_dict()
    dropped_head = any("head" in a for a in report.actions)
    indexers = tuple(k for k in own if k not in state and ".attn.sparse.indexer." in k)  # DSA's, untrained
    if indexers and len(indexers) < len(own):  # dense weights: the indexers learn from them (indexer warm-up)
        report.actions.append(f"{len(indexers)} DSA indexer tensors start untrained (optim.indexer_warmup_steps)")
    if strict:
        check_fit(state, own, str(path), may_miss=(("head.",) if dropped_head else ()) + indexers)
    state = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
    model.load_state_dict(state, strict=False)
    log.info("%s", report)
    return report


_BLOCK_KEY = re.compile(r"(?:^|\.)(?:blocks|layer|layers|resblocks)\.(\d+)\.")  # timm, transformers, open_clip


def check_depth_fits(depth: int | None, weights: Path | None, name: str) -> None:
    """Refuse a config asking for more blocks than a .safetensors file holds, from the file's header alone (the key
    names), before a model of that depth is allocated: a config.json saying 10**6 layers at width 16 passes the
    parameter bound yet needs ~13 GB. The most blocks any tower holds is the bound, so a two-tower file (open_clip,
    CLIPModel) never refuses a real image tower."""
    if not isinstance(depth, int) or weights is None or Path(weights).suffix != ".safetensors":
        return
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            found = [int(m.group(1)) + 1 for k in f.keys() for m in [_BLOCK_KEY.search(k)] if m]
    except Exception:  # an unreadable header is the loader's to report, in its own sentence
        return
    if found and depth > max(found):
        raise ValueError(f"{name}: its config asks for {depth} blocks but its weights hold {max(found)}; fix the "
                         "config's depth (num_hidden_layers, layers or depth) to match the weights.")
