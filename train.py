"""Train a Vision Transformer with Accelerate: one CPU, one GPU or many, without edits.

    accelerate launch train.py                                   # configs/default.yaml: digits, offline
    accelerate launch train.py --config configs/cifar10_vit_small.yaml --optim.lr=5e-4
    accelerate launch --multi_gpu --num_processes 2 train.py     # two processes (gloo on a CPU-only machine)
    accelerate launch train.py --resume=auto                     # continue a run at its last saved step

The story (`main`): config -> accelerator -> data -> model and optimizer -> resume -> for each epoch: train,
evaluate and checkpoint, save the training state when due -> curves. The loop's pieces live in vit/train/engine.py.
Everything lands in runs/<run.name>/: config.yaml, metrics.csv, tensorboard/, best/, last/, state/, curves.png;
run.log_with adds experiment trackers (wandb, mlflow, ...; vit/train/tracking.py).
A run name that already holds a run is refused unless resumed (--resume=auto) or replaced (--run.overwrite=true);
a resume refuses a config that changes what the run computes (see vit/train/runfolder.py).
"""

from __future__ import annotations

import os
import sys

# next to this script, not the current directory: train.py run from anywhere finds it
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "default.yaml")
if os.path.abspath("configs/default.yaml") == DEFAULT_CONFIG:  # run from the repository: say it the short way
    DEFAULT_CONFIG = os.path.join("configs", "default.yaml")

if __name__ == "__main__" and any(a in ("-h", "--help") for a in sys.argv[1:]):  # answered before torch loads
    from vit.cli.help import train_help

    print(train_help(__doc__, sys.argv[1:], DEFAULT_CONFIG), end="")
    sys.exit(0)

if __name__ == "__main__":  # SIGTERM while torch loads: one line and exit 143 too (vit/train/preemption.py)
    from vit.train import preemption as _preemption

    _preemption.install(early=True)

from pathlib import Path

import torch
from accelerate.utils import set_seed

from vit.cli.outputs import check_writable
from vit.cli.runtime import apply_machine_defaults, make_accelerator, run_cli, single_process_note
from vit.config import Config, ConfigError, check_dataset_keys, diff, dump, load_config
from vit.data import (
    absolute_root,
    build_datasets,
    build_loaders,
    choose_channels,
    class_weights,
    resolve_data_config,
)
from vit.eval.plots import plot_curves
from vit.models.build import build_model, pretrained_cfg_of, resolve_name
from vit.train import preemption
from vit.train.console import Console, describe_model, format_settings, processes, schedule_warning
from vit.train.engine import (  # noqa: F401 (TrainState, mix_batch: imported from here by the tests)
    Run,
    TrainState,
    evaluate_and_checkpoint,
    finished,
    mix_batch,
    save_state_if_due,
    stop_if_preempted,
    train_one_epoch,
    trim_metrics,
)
from vit.train.lora import add_lora, trainable_share
from vit.train.optim import build_optimizer
from vit.train.runfolder import check_new_run, check_not_locked, claim_run_dir, interrupt_note, resume_run
from vit.train.tracking import accelerator_trackers, check_trackers, flat_config, tracker_kwargs, tracker_names
from vit.utils.atomic import atomic_write_text


def main(argv: list[str] | None = None) -> int:
    preemption.install()  # SIGTERM (Slurm, Kubernetes) is handled like Ctrl-C, with a state saved
    config_path, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = resolve_name(load_config(config_path, overrides))  # model.name null: the architecture of the weights
    check_dataset_keys(cfg)  # a data.* key this dataset would ignore (data.val_split for a folder) is refused
    cfg, channel_note = choose_channels(cfg)  # model.in_chans null: the data's
    cfg = resolve_data_config(cfg, pretrained_cfg_of(cfg.model))  # the pretrained weights' preprocessing
    cfg = apply_machine_defaults(cfg)  # threads, loader workers, precision: `auto` -> from this machine
    cfg.data.root = absolute_root(cfg.data.root)  # the saved config then works from any directory
    cfg.data.labels_file = absolute_root(cfg.data.labels_file)
    run_dir = _RUN["dir"] = Path(cfg.run.output_dir) / cfg.run.name
    trackers = tracker_names(cfg)  # run.log_with
    check_trackers(trackers)  # a missing package or an MLflow store that does not open: one sentence, now

    # --- accelerator: devices, processes, precision; only the main process prints -----------------------------
    accelerator = make_accelerator(gradient_accumulation_steps=cfg.optim.grad_accum_steps,
                                   mixed_precision=cfg.run.mixed_precision,
                                   log_with=accelerator_trackers(trackers, run_dir), project_dir=str(run_dir))
    console = Console(accelerator)
    cfg.run.mixed_precision = accelerator.mixed_precision  # the precision that runs (not null) is saved and printed
    if accelerator.is_main_process:  # fail before any data is read; the lock itself is taken below
        check_writable(run_dir, "the output folder", "set run.output_dir to a writable folder")
        check_not_locked(run_dir)
        check_new_run(run_dir, cfg.run.resume, cfg.run.overwrite)
    set_seed(cfg.run.seed)
    console.print(format_settings(diff(load_config(config_path), load_config(config_path, overrides)), config_path))
    launch_note = single_process_note(accelerator)  # --num_processes 2 without --multi_gpu: one process ran
    if launch_note and accelerator.is_main_process:
        console.print(launch_note)
    console.print(f"device {accelerator.device}, {processes(accelerator)}, "
                  f"mixed precision {accelerator.mixed_precision}, {torch.get_num_threads()} thread(s), "
                  f"{cfg.data.num_workers} loader worker(s); full config: {run_dir / 'config.yaml'}")

    if channel_note:
        console.print(channel_note)

    # --- data -------------------------------------------------------------------------------------------------
    train_ds, val_ds, classes = build_datasets(cfg)
    train_loader, val_loader = build_loaders(cfg, train_ds, val_ds, accelerator)
    console.print(describe_data(cfg, train_ds, val_ds, classes))

    # --- model and optimizer ----------------------------------------------------------------------------------
    model = build_model(cfg, len(classes), pretrained=True)  # weights from model.pretrained, if set (one report)
    if cfg.optim.lora_rank:  # adapters on the projections, merged into the weights on every save
        add_lora(model, cfg.optim.lora_rank, cfg.optim.lora_alpha)
    console.print(f"model: {describe_model(model, cfg.model.name)}")
    trained, total = trainable_share(model)  # model.freeze, optim.lora_rank: part of the model learns
    if trained < total:
        console.print(f"training {trained:,} of {total:,} parameters ({100 * trained / total:.2f}%)")
    optimizer = build_optimizer(model, cfg.optim)
    if cfg.run.compile:
        model = torch.compile(model)
    model, optimizer, train_loader, val_loader = prepare(accelerator, model, optimizer, train_loader, val_loader)
    run = Run(accelerator, cfg, run_dir, model, optimizer, train_loader, val_loader, classes, console,
              ema=make_ema(cfg, accelerator, model), mixup=make_mixup(cfg, len(classes)),
              class_weights=class_weights(cfg, train_ds))

    # --- resume -----------------------------------------------------------------------------------------------
    lock = claim_run_dir(accelerator, cfg, run_dir)  # noqa: F841 (held until main returns or the process ends)
    if cfg.run.resume:
        resume_run(accelerator, cfg, run_dir, run.state, run.ema)
    open_run_folder(run)

    # --- loop: one save policy (vit/train/engine.py: state_save_due) ------------------------------------------------
    console.start_progress(run.total_steps, run.state.step)
    with preemption.deferred():  # SIGTERM: finish the step, save a state, exit 143 (vit/train/preemption.py)
        while not finished(run):
            stats = train_one_epoch(run)  # saves mid-epoch states as due (run.save_state_every, run.max_steps)
            evaluate_and_checkpoint(run, stats)
            save_state_if_due(run, "epoch")
            stop_if_preempted(run, saved=True)
    console.close()
    finish(run)
    return 0


def parse_args(argv: list[str]) -> tuple[str, list[str]]:
    config, rest, i = DEFAULT_CONFIG, [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            from vit.cli.help import train_help

            print(train_help(__doc__, argv, DEFAULT_CONFIG), end="")
            sys.exit(0)
        if a == "--config" and i + 1 < len(argv):
            config, i = argv[i + 1], i + 2
            continue
        if a.startswith("--config="):
            config = a.split("=", 1)[1]
        elif a == "--resume" or a.startswith("--resume="):
            rest.append("--run.resume=" + (a.split("=", 1)[1] if "=" in a else "auto"))
        else:
            rest.append(a)
        i += 1
    return config, rest


def describe_data(cfg: Config, train_ds, val_ds, classes: list[str]) -> str:
    line = f"data: {cfg.data.dataset}, {len(train_ds)} train / {len(val_ds)} val images, {len(classes)} classes"
    for split, ds in (("train", train_ds), ("val", val_ds)):
        if getattr(ds, "bad", None):
            line += (f"\nskipped {len(ds.bad)} unreadable {split} image(s) (data.on_bad_image=skip): "
                     + "; ".join(ds.bad[:5]) + (f" ... and {len(ds.bad) - 5} more" if len(ds.bad) > 5 else ""))
    return line


def prepare(accelerator, model, optimizer, *loaders):
    """accelerator.prepare for the model, the optimizer and the DataLoaders; shard loaders
    (vit/data/shard_loader.py) deal their shards to processes and workers themselves and are passed through."""
    from torch.utils.data import DataLoader

    plain = [i for i, ld in enumerate(loaders) if isinstance(ld, DataLoader)]
    model, optimizer, *prepared = accelerator.prepare(model, optimizer, *(loaders[i] for i in plain))
    out = list(loaders)
    for i, ld in zip(plain, prepared):
        out[i] = ld
    return (model, optimizer, *out)


def make_ema(cfg: Config, accelerator, model: torch.nn.Module):
    """timm's EMA of the weights (optim.ema), saved and restored with the training state; None without it."""
    if not cfg.optim.ema:
        return None
    from timm.utils import ModelEmaV3

    if accelerator.distributed_type == "FSDP":  # the EMA copy would be a full replica of the sharded weights
        raise ConfigError("optim.ema is not supported with FSDP yet; set optim.ema=false or launch with DDP.")
    return ModelEmaV3(accelerator.unwrap_model(model), decay=cfg.optim.ema_decay)


def make_mixup(cfg: Config, num_classes: int):
    """timm's Mixup/CutMix (with label smoothing) when aug.mixup or aug.cutmix is set; None otherwise."""
    if cfg.aug.mixup <= 0 and cfg.aug.cutmix <= 0:
        return None
    from timm.data import Mixup

    return Mixup(mixup_alpha=cfg.aug.mixup, cutmix_alpha=cfg.aug.cutmix, prob=cfg.aug.mixup_prob,
                 label_smoothing=cfg.aug.label_smoothing, num_classes=num_classes,
                 multi_label=bool(cfg.data.labels_file))  # multi-hot targets mixed as they are


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
    """Close the trackers, draw the curves, name the best checkpoint."""
    run.accelerator.end_training()
    metrics = run.run_dir / "metrics.csv"
    if run.accelerator.is_main_process and metrics.is_file():
        plot_curves(metrics, run.run_dir / "curves.png")
        if run.state.best:
            score, epoch = run.state.best[0]
            what = "mAP" if run.cfg.data.labels_file else "top-1"
            run.console.print(f"best val {what} {100 * score:.2f}% at epoch {epoch}; checkpoint {run.run_dir / 'best'}")


_RUN: dict[str, Path] = {}  # the run folder, for the Ctrl-C message


def _interrupt_note() -> str:
    return interrupt_note(_RUN.get("dir"))


if __name__ == "__main__":
    run_cli(main, _interrupt_note)
