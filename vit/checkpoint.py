"""Run folders and checkpoints, written atomically, read without unpickling anything.

A model checkpoint is a folder holding `model.safetensors` (weights), `config.yaml` (the resolved config),
`classes.json` and `meta.json` (epoch, step, metrics): everything `evaluate.py` needs. Each file is written
into a temporary folder beside it, fsync'ed, and the folder is swapped in as a whole (vit/atomic.py:
replace_dir), so a process killed mid-save leaves the previous complete checkpoint, weights and meta.json
together. Accelerate's training state (optimizer, RNG, step) is saved into a fresh temporary
folder that is renamed to `state/step-XXXXXXXX` only once complete. Its `COMPLETE` marker is a manifest (size
and SHA-256 of every file): `verify_state` checks it before anything is loaded, so a truncated, corrupted or
planted file is never read, and `latest_state` falls back to the older kept state. Nothing in a state is
unpickled with `weights_only=False`: the loop's own state is JSON, EMA weights are safetensors, and
Accelerate reads its files with `weights_only=True`.

File writing itself lives in vit/atomic.py, the test-only crash hooks (`fault_point`) in vit/faults.py.

Every checkpoint folder also holds `config.json` in timm's hub format (architecture, num_classes, label_names,
model_args, pretrained_cfg): it is a timm hub repository, for `timm.create_model("local-dir:<folder>",
pretrained=True)` or `huggingface_hub.upload_folder` as it is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from .atomic import atomic_write_bytes, atomic_write_text, fsync_dir, new_file_mode, recover_dir, replace_dir
from .config import Config, dump, from_dict, read_yaml, withhold_remote_sources
from .factory import build_model  # re-exported: its home is vit.factory, beside the config
from .faults import fault_point
from .hub import split_tag, timm_config
from .pretrained import check_finite, check_weights
from .vision import VisionTransformer

log = logging.getLogger(__name__)
# Written into model.safetensors' metadata by save_checkpoint: the fixed sin-cos position table follows
# big_vision's posemb_sincos_2d since this marker exists; a sincos checkpoint without it used the earlier table.
SINCOS_MARK = ("pos_embed_sincos", "big_vision")

__all__ = ["save_checkpoint", "load_checkpoint", "build_model", "latest_state", "verify_state", "CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete or from another model; the message says which."""




def save_checkpoint(folder: str | Path, model: torch.nn.Module, cfg: Config, classes: list[str],
                    meta: dict | None = None, state_dict: dict | None = None) -> Path:
    """Write a self-contained model checkpoint folder (weights, config, classes, meta), file by file atomically.
    `state_dict`: the weights to write instead of `model.state_dict()` (FSDP: accelerator.get_state_dict's
    consolidated copy, gathered on every process, as the model holds only this process's shards)."""
    folder = Path(folder)
    weights = model.state_dict() if state_dict is None else state_dict
    state = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
    check_finite(state, f"refusing to save {folder}", "lower optim.lr or enable optim.clip_grad.")
    # the preprocessing the data pipeline used: train.py resolves it from the weights first; what is still unset
    # got build_transform's fallbacks, and the saved config says so (not the registry's values for the name)
    cfg = dataclasses.replace(cfg, aug=cfg.aug.resolved(None, cfg.model.in_chans))
    # the whole folder at once: written beside it, then swapped in (a kill between files leaves the old one whole)
    folder.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(folder, f".tmp-{folder.name}-*")
    tmp = folder.parent / f".tmp-{folder.name}-{os.getpid()}"
    tmp.mkdir()
    try:
        metadata = {"format": "pt", "model": cfg.model.name, SINCOS_MARK[0]: SINCOS_MARK[1]}
        atomic_write_bytes(tmp / "model.safetensors", save(state, metadata=metadata))
        fault_point("checkpoint", int((meta or {}).get("step", -1)))
        atomic_write_text(tmp / "config.yaml", dump(cfg))
        atomic_write_text(tmp / "classes.json", json.dumps(classes, indent=1))
        atomic_write_text(tmp / "meta.json", json.dumps(meta or {}, indent=1))
        # timm's hub format beside ours: timm.create_model("local-dir:<folder>", pretrained=True) rebuilds the model
        arch = (getattr(model, "pretrained_cfg", None) or {}).get("architecture") or split_tag(cfg.model.name)
        aug = cfg.aug  # resolved above: what the pipeline used
        data = dict(mean=aug.mean, std=aug.std, crop_pct=aug.eval_crop_pct, interpolation=aug.interpolation)
        atomic_write_text(tmp / "config.json", json.dumps(timm_config(model, arch, classes, data), indent=2))
        replace_dir(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def load_checkpoint(folder: str | Path) -> tuple[VisionTransformer, Config, list[str], dict]:
    """Read a checkpoint folder written by `save_checkpoint` -> (model in eval mode, config, classes, meta)."""
    folder = Path(folder)
    if folder.is_file() and folder.name == "model.safetensors":
        folder = folder.parent
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} does not exist; pass a run's best/ or last/ folder.")
    missing = [n for n in ("model.safetensors", "config.yaml", "classes.json") if not (folder / n).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {folder} is incomplete (no {', '.join(missing)}); "
                              "pass a folder written by train.py.")
    try:
        cfg = from_dict(read_yaml(folder / "config.yaml"))
        classes = json.loads((folder / "classes.json").read_text())
        if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
            raise ValueError("classes.json must hold a non-empty list of class names")
        meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").is_file() else {}
        state = load_file(str(folder / "model.safetensors"))
        saved = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else None
        if saved is not None and not isinstance(saved.get("architecture"), str):
            raise ValueError("config.json names no architecture")
    except Exception as e:  # bad YAML/JSON, a config error, a file that is not safetensors, ...
        raise CheckpointError(f"checkpoint {folder} is unreadable ({str(e).splitlines()[0]}).") from None
    withhold_remote_sources(cfg)  # a pipe: or URL data source from a folder one was handed is never run or fetched
    try:
        check_weights(state, folder / "model.safetensors")  # non-float or non-finite: refused, not cast
    except (ValueError, FloatingPointError) as e:
        raise CheckpointError(str(e)) from None
    model = build_model(cfg, len(classes), saved=saved)
    own = model.state_dict()
    bad = [k for k in own if k not in state or state[k].shape != own[k].shape] + [k for k in state if k not in own]
    if bad:
        raise CheckpointError(f"checkpoint {folder} does not match its own config ({bad[0]} differs); "
                              "it is from another architecture or was edited.")
    model.load_state_dict(state)
    marked = _metadata(folder / "model.safetensors").get(SINCOS_MARK[0]) == SINCOS_MARK[1]
    if cfg.model.pos_embed == "sincos" and not marked:
        log.warning("%s was trained with the earlier sin-cos position table (y before x, other frequencies); this "
                    "version computes big_vision's, so its accuracy may drop: fine-tune or retrain it.", folder)
    # preprocessing the config leaves unset (a hand-written or older checkpoint) follows config.json's, as in timm
    pretrained_cfg = saved.get("pretrained_cfg") if saved else None
    aug = cfg.aug.resolved(pretrained_cfg if isinstance(pretrained_cfg, dict) else None, cfg.model.in_chans)
    return model.eval(), dataclasses.replace(cfg, aug=aug), classes, meta


def _metadata(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}


def state_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_state(path: str | Path) -> dict:
    """Check a state folder against its manifest before anything in it is loaded: the same files, none added,
    none missing, each with the size and SHA-256 it was written with; RNG files must load with weights_only=True
    (Accelerate skips an unreadable one silently, which would break exactness). Returns the manifest, or raises
    CheckpointError saying what differs."""
    path = Path(path)
    try:
        manifest = json.loads((path / "COMPLETE").read_text())
        int(manifest["step"])
        files = {str(k): (int(v[0]), str(v[1])) for k, v in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise CheckpointError(f"state {path} has no readable manifest (COMPLETE); it was not saved completely by "
                              "this version of train.py.") from None
    present = {str(f.relative_to(path)) for f in path.rglob("*") if not f.is_dir() or f.is_symlink()}
    present.discard("COMPLETE")
    extra, missing = sorted(present - set(files)), sorted(set(files) - present)
    if extra or missing:
        what = f"holds a file train.py did not write ({extra[0]})" if extra else f"is missing {missing[0]}"
        raise CheckpointError(f"state {path} {what}.")
    for name, (size, digest) in files.items():
        f = path / name
        if f.is_symlink() or not f.is_file():
            raise CheckpointError(f"state {path}: {name} is not a regular file.")
        if f.stat().st_size != size or _sha256(f) != digest:
            raise CheckpointError(f"state {path}: {name} is not the file that was saved (truncated, corrupted or "
                                  "replaced).")
    from accelerate.utils.other import load  # torch.load(weights_only=True) with numpy's RNG arrays allowed

    for f in sorted(path.glob("random_states_*.pkl")):
        try:
            rng = load(f)
            rng["random_state"], rng["numpy_random_seed"], rng["torch_manual_seed"]
        except Exception as e:  # UnpicklingError for a planted pickle, KeyError/TypeError for another object
            raise CheckpointError(f"state {path}: {f.name} is not an RNG state ({str(e).splitlines()[0][:120]}).") \
                from None
    return manifest


def latest_state(run_dir: str | Path, warn=None) -> Path | None:
    """The newest state folder of a run that passes `verify_state`, or None if the run saved none. A damaged
    newest state is reported through `warn` and the older kept one is tried; if every state is damaged,
    CheckpointError."""
    root = Path(run_dir) / "state"
    if not root.is_dir():
        return None
    done = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and
                   (p / "COMPLETE").is_file()), reverse=True)
    errors = []
    for p in done:
        try:
            verify_state(p)
            return p
        except CheckpointError as e:
            errors.append(str(e))
            if warn is not None:
                warn(f"warning: {e} Trying the previous saved state.")
    if errors:
        raise CheckpointError(f"no saved state in {root} is intact (newest: {errors[0]}); start over with "
                              "--run.overwrite=true or pick another --run.name.")
    return None


def save_state_atomic(accelerator, run_dir: str | Path, step: int, keep: int = 2,
                      extra: dict[str, bytes] | None = None) -> Path | None:
    """accelerator.save_state into a temporary folder, plus `extra` files ({name: bytes}, written by the main
    process), then a manifest, then rename it into place; keep the newest `keep`."""
    root = Path(run_dir) / "state"
    final = root / state_dir_name(step)
    tmp = root / f".tmp-{state_dir_name(step)}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):  # left by a process killed mid-save
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        _write_state(accelerator, tmp, final, root, step, keep, extra)
    except OSError as e:  # a full disk, a quota, a folder gone read-only: the partial folder goes, the older stays
        shutil.rmtree(tmp, ignore_errors=True)
        kept = [p.name for p in sorted(root.glob("step-*")) if (p / "COMPLETE").is_file()]
        kept_note = f"the older state {root / kept[-1]} is untouched" if kept else "no earlier state was saved"
        raise CheckpointError(f"could not save the training state of step {step} into {root} "
                              f"({e.strerror or e}); {kept_note}; free space or fix the folder, then continue "
                              "with --resume=auto.") from None
    accelerator.wait_for_everyone()
    return final


def _write_state(accelerator, tmp: Path, final: Path, root: Path, step: int, keep: int,
                 extra: dict[str, bytes] | None) -> None:
    accelerator.save_state(str(tmp), safe_serialization=True)
    if accelerator.is_main_process:
        for name, data in (extra or {}).items():
            (tmp / name).write_bytes(data)
    fault_point("state", step)  # files written, folder not yet renamed into place
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        files = {}
        mode = new_file_mode(tmp / "COMPLETE")  # 0666 & ~umask: safetensors' own writer leaves 0600
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                os.chmod(f, mode)
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
                files[str(f.relative_to(tmp))] = [f.stat().st_size, _sha256(f)]
        atomic_write_text(tmp / "COMPLETE", json.dumps({"step": step, "files": files}, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(root)
        old = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))[:-keep]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
