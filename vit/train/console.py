"""What train.py prints: a few lines a person reads, not a log dump.

At launch: the command's settings that differ from the config file, where the full config is kept, the data,
what model was built (width, depth, heads, patch, tokens, parameters) and at most one warning about the
schedule. While training: a progress bar on a terminal; in a log file (stdout or stderr not a terminal, or
TQDM_DISABLE set) a plain progress line every `PLAIN_EVERY_S` seconds instead, so that a bar's carriage
returns never glue onto the epoch lines. Then one line per epoch. Only the main process prints.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from typing import Any

import torch

__all__ = ["Console", "describe_model", "schedule_warning", "rare_class_warning", "describe_data", "val_class_warning",
           "quiet_libraries", "MIN_STEPS", "FEW_VAL_IMAGES"]

PLAIN_EVERY_S = 30.0  # a log file gets a progress line this often (a long epoch shows it is alive)
# A run from scratch with fewer optimizer steps than this is warned about (a chosen round number): the digits
# default (23 steps an epoch, 1,380 in its 60 epochs) sits at 19% top-1 after 2 epochs (46 steps, measured here).
MIN_STEPS = 100


def quiet_libraries(is_main: bool) -> None:
    """Our own INFO lines (the pretrained-loading report) from the main process only; Accelerate's per-file save
    messages and the profiler's native (kineto) log lines off."""
    root = logging.getLogger()
    if not root.handlers:  # one handler: a second one (or a library's) would print every line twice
        logging.basicConfig(format="%(message)s")
    logging.getLogger("vit").setLevel(logging.INFO if is_main else logging.ERROR)
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # 'gpuGetDeviceCount failed', 'profiler_start' lines on stderr


def describe_model(model: torch.nn.Module, name: str) -> str:
    """'vit_tiny_patch16_224 as built: 3 channels (RGB), width 128, depth 4, 4 heads, patch 16, 17 tokens (4x4 + 1),
    0.63M params'; a CLIP model (vit.models.clip): its image tower so, then its text tower and shared width; a
    segmenter: its backbone so, then its head."""
    params = sum(p.numel() for p in model.parameters())
    visual, text = getattr(model, "visual", None), getattr(model, "text", None)
    backbone, head = getattr(model, "backbone", None), getattr(model, "head", None)
    if isinstance(backbone, torch.nn.Module) and isinstance(head, torch.nn.Module):  # a Segmenter: both parts
        n = sum(p.numel() for p in head.parameters())
        return (f"{describe_model(backbone, name).removesuffix(' params')} params backbone; "
                f"{type(head).__name__} {f'{n / 1e6:.2f}M' if n >= 10_000 else n} params on blocks "
                f"{', '.join(str(i) for i in getattr(model, 'indices', []))}; {params / 1e6:.2f}M params")
    if visual is not None and text is not None:
        return (f"{describe_model(visual, name).removesuffix(' params')} params image tower; text tower width "
                f"{text.embed_dim}, depth {len(text.blocks)}, context {text.max_len}; both projected to "
                f"{model.embed_dim}; {params / 1e6:.2f}M params")
    parts = []
    chans = getattr(model, "in_chans", None)
    if chans:
        parts.append(f"{chans} channel{'s' if chans != 1 else ''}" + {1: " (grey)", 3: " (RGB)"}.get(chans, ""))
    width = getattr(model, "embed_dim", None)
    if width:
        parts.append(f"width {width}")
    blocks = getattr(model, "blocks", None)
    if blocks is not None and hasattr(blocks, "__len__"):
        parts.append(f"depth {len(blocks)}")
    heads = next((m.num_heads for m in model.modules() if isinstance(getattr(m, "num_heads", None), int)), None)
    if heads:
        parts.append(f"{heads} heads")
    pe = getattr(model, "patch_embed", None)
    if pe is not None and hasattr(pe, "grid_size"):
        ph, pw = pe.patch_size
        gh, gw = pe.grid_size
        prefix = getattr(model, "num_prefix_tokens", 0)
        parts.append(f"patch {ph if ph == pw else f'{ph}x{pw}'}")
        parts.append(f"{gh * gw + prefix} tokens ({gh}x{gw}" + (f" + {prefix})" if prefix else ")"))
    parts.append(f"{params / 1e6:.2f}M params")
    return f"{name} as built: " + ", ".join(parts)


def processes(accelerator) -> str:
    """'1 process', '2 DDP processes' or '2 FSDP processes': how the model is spread, for the device line."""
    n = accelerator.num_processes
    if n == 1:
        return "1 process"
    return f"{n} {'FSDP' if str(accelerator.distributed_type).endswith('FSDP') else 'DDP'} processes"


def schedule_warning(total_steps: int, warmup_steps: int, epochs: int, pretrained: bool,
                     max_steps: int | None = None) -> str | None:
    """One sentence when the schedule cannot work as meant, else None: a warm-up at least as long as the run
    (the learning rate never reaches its peak), or a run from scratch of fewer than MIN_STEPS optimizer steps.
    run.max_steps (`max_steps`) ends the run early; the schedule keeps its epochs' length."""
    if max_steps is not None and max_steps < total_steps:
        if warmup_steps >= max_steps > 0:
            return (f"warning: the warm-up ({warmup_steps} steps) is not shorter than the run (run.max_steps="
                    f"{max_steps}), so the learning rate never reaches optim.lr; lower optim.warmup_epochs or raise "
                    "run.max_steps.")
        return None  # a deliberately short run (a smoke test): no advice about its length
    if warmup_steps >= total_steps > 0:
        return (f"warning: the warm-up ({warmup_steps} steps) is not shorter than the run ({total_steps} steps), so "
                "the learning rate never reaches optim.lr; lower optim.warmup_epochs or raise run.epochs.")
    if not pretrained and total_steps < MIN_STEPS:
        return (f"warning: {epochs} epoch(s) are only {total_steps} optimizer steps; a model trained from scratch "
                f"needs at least ~{MIN_STEPS} to learn (expect chance accuracy); raise run.epochs.")
    return None


FEW_VAL_IMAGES = 5  # a class with fewer validation images moves val top-1 by whole images: best/ follows noise


def rare_class_warning(counts: list[int] | None, classes: list[str], select_by: str | None) -> str | None:
    """One sentence when a class has fewer than FEW_VAL_IMAGES validation images (`counts`: images per class,
    None where the split does not list its labels), else None."""
    rare = [(name, n) for name, n in zip(classes, counts or []) if n < FEW_VAL_IMAGES]
    if not rare:
        return None
    shown = ", ".join(f"{name}: {n}" for name, n in rare[:5]) + (f", ... ({len(rare)} in all)" if len(rare) > 5 else "")
    advice = ("" if select_by not in (None, "top1") else
              ", or set run.select_by=balanced_accuracy (or macro_f1) so that each class counts alike")
    return (f"warning: {len(rare)} of {len(classes)} classes have fewer than {FEW_VAL_IMAGES} validation images "
            f"({shown}), so the number that picks best/ moves by whole images and may follow noise; add validation "
            f"images{advice}.")


def describe_data(cfg, train_ds, val_ds, classes: list[str]) -> str:
    """The data line: dataset, images per split, classes; then the unreadable images skipped, five named."""
    what = "texts" if cfg.data.dataset == "text_csv" else "images"
    line = f"data: {cfg.data.dataset}, {len(train_ds)} train / {len(val_ds)} val {what}, {len(classes)} classes"
    nf = cfg.data.naflex
    if nf is not None:  # the crop options are not used: say so once
        line += (f"; NaFlex: each image whole at its own aspect ratio, at most {nf.max_num_patches} patches of "
                 f"{cfg.model.patch_size} px, batches of at most "
                 f"{nf.tokens_per_batch or cfg.data.batch_size * nf.max_num_patches} tokens (aug.random_resized_crop "
                 "does not apply)")
    for split, ds in (("train", train_ds), ("val", val_ds)):
        if getattr(ds, "bad", None):
            line += (f"\nskipped {len(ds.bad)} unreadable {split} image(s) (data.on_bad_image=skip): "
                     + "; ".join(ds.bad[:5]) + (f" ... and {len(ds.bad) - 5} more" if len(ds.bad) > 5 else ""))
    return line


def val_class_warning(cfg, val_ds, classes: list[str]) -> str | None:
    """`rare_class_warning` for the held-out split's class counts, where the dataset lists its labels (shards
    stream unlisted; multi-label data has no one class per image)."""
    from ..data import class_counts

    listed = not cfg.data.labels_file and getattr(val_ds, "labels", None) is not None  # shards stream unlisted
    return rare_class_warning(class_counts(val_ds).tolist() if listed else None, classes, cfg.run.select_by)


def _is_terminal() -> bool:
    if os.environ.get("TQDM_DISABLE", "").lower() not in ("", "0", "false"):
        return False
    return sys.stdout.isatty() and sys.stderr.isatty()


class Console:
    """The main process's printer; every other process stays silent (call the methods on all of them)."""

    def __init__(self, accelerator) -> None:
        self.enabled = accelerator.is_main_process
        self.bar = None
        self.total = self.done = 0
        self.postfix: dict[str, Any] = {}
        self.last_line = time.perf_counter()
        quiet_libraries(self.enabled)

    def print(self, line: str) -> None:
        """One line; on a terminal above the progress bar (never glued onto it)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def start_progress(self, total: int, initial: int) -> None:
        self.total, self.done, self.last_line = total, initial, time.perf_counter()
        if self.enabled and _is_terminal():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", dynamic_ncols=True, leave=False)

    def step(self, **postfix: Any) -> None:
        """One optimizer step done; `postfix` (loss, lr, img/s) updates what the progress shows."""
        self.done += 1
        self.postfix.update(postfix)
        if self.bar is not None:
            self.bar.update(1)
            if postfix:
                self.bar.set_postfix(self.postfix, refresh=False)
        elif self.enabled and time.perf_counter() - self.last_line >= PLAIN_EVERY_S:
            self.last_line = time.perf_counter()
            shown = "  ".join(f"{k} {v}" for k, v in self.postfix.items())
            line = f"step {self.done}/{self.total} ({100 * self.done / max(1, self.total):.0f}%)  {shown}"
            print(line.rstrip(), flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def format_settings(changed: dict[str, tuple[Any, Any]], config_path: str) -> str:
    """'settings: configs/default.yaml with run.epochs=2, optim.lr=0.0005' (what the command line changed)."""
    if not changed:
        return f"settings: {config_path} as written"
    shown = ", ".join(f"{k}={_short(b)}" for k, (_, b) in sorted(changed.items()))
    return f"settings: {config_path} with {shown}"


def _short(v: Any) -> str:
    if isinstance(v, float) and math.isfinite(v) and v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4):
        return f"{v:.2e}"
    return str(v).lower() if isinstance(v, bool) else str(v)
