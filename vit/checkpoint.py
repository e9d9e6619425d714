"""Run folders and checkpoints, written atomically, read without unpickling anything.

A model checkpoint is a folder holding `model.safetensors` (weights), `config.yaml` (the resolved config),
`classes.json` and `meta.json` (epoch, step, metrics): everything `evaluate.py` needs. Each file is written to a
temporary name, fsync'ed and renamed over the old one, so a process killed mid-write leaves the previous
complete file in place. Accelerate's training state (optimizer, RNG, step) is saved into a fresh temporary
folder that is renamed to `state/step-XXXXXXXX` only once complete; `latest_state` ignores anything else.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from .config import Config, dump, from_dict, read_yaml
from .vision import VisionTransformer, create_model

FAULT_ENV = "VIT_FAULT_INJECT"  # tests only: "<point>:<n>" kills this process with SIGKILL at that point


def fault_point(point: str, n: int) -> None:
    """Die abruptly (SIGKILL, as a crash or an OOM killer would) when VIT_FAULT_INJECT names this point.
    Used by the crash-safety tests to stop a run at exact places; a no-op otherwise."""
    if os.environ.get(FAULT_ENV) == f"{point}:{n}":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


__all__ = [
    "atomic_write_bytes", "atomic_write_text", "atomic_write_csv", "save_checkpoint", "load_checkpoint", "build_model",
    "latest_state", "CheckpointError",
]


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete or from another model; the message says which."""


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_csv(path: str | Path, fieldnames: list[str], rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def build_model(cfg: Config, num_classes: int) -> VisionTransformer:
    """The model a config describes (the only place the config meets `create_model`)."""
    m = cfg.model
    overrides = dict(
        img_size=m.img_size, in_chans=m.in_chans, num_classes=num_classes, global_pool=m.global_pool,
        pos_embed=m.pos_embed, norm_layer=m.norm_layer, mlp_layer=m.mlp_layer, norm_first=m.norm_first,
        init_values=m.init_values, drop_rate=m.drop_rate, attn_drop_rate=m.attn_drop_rate,
        drop_path_rate=m.drop_path_rate,
    )
    for key in ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio"):
        if getattr(m, key) is not None:
            overrides[key] = getattr(m, key)
    return create_model(m.name, token_reduction=m.token_reduction, **overrides)


def save_checkpoint(folder: str | Path, model: torch.nn.Module, cfg: Config, classes: list[str],
                    meta: dict | None = None) -> Path:
    """Write a self-contained model checkpoint folder (weights, config, classes, meta), file by file atomically."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write_bytes(folder / "model.safetensors", save(state, metadata={"format": "pt", "model": cfg.model.name}))
    fault_point("checkpoint", int((meta or {}).get("step", -1)))
    atomic_write_text(folder / "config.yaml", dump(cfg))
    atomic_write_text(folder / "classes.json", json.dumps(classes, indent=1))
    atomic_write_text(folder / "meta.json", json.dumps(meta or {}, indent=1))
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
        meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").is_file() else {}
        state = load_file(str(folder / "model.safetensors"))
    except Exception as e:  # bad YAML/JSON, a config error, a file that is not safetensors, ...
        raise CheckpointError(f"checkpoint {folder} is unreadable ({str(e).splitlines()[0]}).") from None
    model = build_model(cfg, len(classes))
    own = model.state_dict()
    bad = [k for k in own if k not in state or state[k].shape != own[k].shape] + [k for k in state if k not in own]
    if bad:
        raise CheckpointError(f"checkpoint {folder} does not match its own config ({bad[0]} differs); "
                              "it is from another architecture or was edited.")
    model.load_state_dict(state)
    return model.eval(), cfg, classes, meta


def state_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def latest_state(run_dir: str | Path) -> Path | None:
    """The newest complete Accelerate state folder of a run, or None."""
    root = Path(run_dir) / "state"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and
                  (p / "COMPLETE").is_file())
    return done[-1] if done else None


def save_state_atomic(accelerator, run_dir: str | Path, step: int, keep: int = 2) -> Path | None:
    """accelerator.save_state into a temporary folder, then rename it into place; keep the newest `keep`."""
    root = Path(run_dir) / "state"
    final = root / state_dir_name(step)
    tmp = root / f".tmp-{state_dir_name(step)}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):  # left by a process killed mid-save
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    fault_point("state", step)  # files written, folder not yet renamed into place
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        atomic_write_text(tmp / "COMPLETE", str(step))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(root)
        old = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))[:-keep]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final
