"""A training run's start and end around the loop (train.py's story): the model, optimizer and loaders prepared
for Accelerate, timm's EMA made from the config, the run folder opened (config.yaml, metrics.csv
trimmed to a resume, the trackers) and the run finished (curves, artifacts, the best checkpoint named)."""

from __future__ import annotations

import torch

from ..config import Config, ConfigError, dump
from ..eval.plots import plot_curves
from ..utils.atomic import atomic_write_text
from .console import schedule_warning
from .engine import Run
from .records import describe_best, trim_metrics
from .tracking import flat_config, log_artifacts, tracker_kwargs

__all__ = ["prepare", "make_ema", "open_run_folder", "finish"]


def prepare(accelerator, model, optimizer, *loaders, extras: dict | None = None):
    """accelerator.prepare for the model, the optimizer and the DataLoaders; shard loaders
    (vit/data/shard_loader.py) deal their shards to processes and workers themselves and are passed through.
    `extras`: the task's extra modules by name (Task.extra_modules), prepared with them and returned last, as a dict,
    when given."""
    from torch.utils.data import DataLoader

    extras = extras or {}
    plain = [i for i, ld in enumerate(loaders) if isinstance(ld, DataLoader)]
    model, optimizer, *prepared = accelerator.prepare(model, optimizer, *extras.values(), *(loaders[i] for i in plain))
    modules, prepared = prepared[:len(extras)], prepared[len(extras):]
    out = list(loaders)
    for i, ld in zip(plain, prepared):
        out[i] = ld
    return (model, optimizer, *out) + ((dict(zip(extras, modules)),) if extras else ())


def make_ema(cfg: Config, accelerator, model: torch.nn.Module):
    """timm's EMA of the weights (optim.ema), saved and restored with the training state; None without it."""
    if not cfg.optim.ema:
        return None
    from timm.utils import ModelEmaV3

    if accelerator.distributed_type == "FSDP":  # the EMA copy would be a full replica of the sharded weights
        raise ConfigError("optim.ema is not supported with FSDP yet; set optim.ema=false or launch with DDP.")
    return ModelEmaV3(accelerator.unwrap_model(model), decay=cfg.optim.ema_decay)


def open_run_folder(run: Run) -> None:
    """Create the run folder only now (a bad dataset or model has written nothing): the full config, metrics
    trimmed to the resumed step, the trackers (run.log_with) with the resolved config; then the one warning a
    schedule may deserve."""
    cfg, run_dir = run.cfg, run.run_dir
    if run.accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.yaml", dump(cfg))
        trim_metrics(run_dir / "metrics.csv", run.state.step)
    run.accelerator.init_trackers(cfg.run.project, config=flat_config(cfg), init_kwargs=tracker_kwargs(cfg, run_dir))
    warning = schedule_warning(run.total_steps, run.warmup_steps, cfg.run.epochs, bool(cfg.model.pretrained),
                               cfg.run.max_steps)
    if warning and not cfg.run.resume:
        run.console.print(warning)


def finish(run: Run) -> None:
    """Draw the curves, give MLflow the run's files, close the trackers, name the best checkpoint."""
    metrics = run.run_dir / "metrics.csv"
    if run.accelerator.is_main_process and metrics.is_file():
        plot_curves(metrics, run.run_dir / "curves.png")
    log_artifacts(run.accelerator, run.run_dir)  # before end_training closes the MLflow run
    # every rank here before any closes the process group: a rank leaving while the main one still saves tore
    # gloo's threads down under it (std::terminate, SIGABRT, the run killed; seen in CI's two-process tests)
    run.accelerator.wait_for_everyone()
    run.accelerator.end_training()
    if run.accelerator.is_main_process and run.state.best:
        run.console.print(f"{describe_best(run.cfg, run.state.best, run.task)}; checkpoint {run.run_dir / 'best'}")
