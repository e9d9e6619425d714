"""Train a Vision Transformer with Accelerate: one CPU, one GPU or many, without edits.

    accelerate launch train.py                                   # configs/default.yaml: digits, offline
    accelerate launch train.py --config configs/cifar10_vit_small.yaml --optim.lr=5e-4
    accelerate launch --multi_gpu --num_processes 2 train.py     # two processes (gloo on a CPU-only machine)
    accelerate launch train.py --resume=auto                     # continue a run at its last saved step

The story (`main`): config -> accelerator -> data -> model, task and optimizer (`make_run`) -> resume -> for each
epoch: train, evaluate and checkpoint, save the training state when due -> curves. The loop's pieces live in
vit/train/engine.py, what each training mode computes and saves in vit/train/tasks/, the run's start and end in
vit/train/lifecycle.py, the config's resolution in vit/cli/training.py.
Everything lands in runs/<run.name>/: config.yaml, metrics.csv, tensorboard/, best/, last/, state/, curves.png;
run.log_with adds experiment trackers (wandb, mlflow, ...; vit/train/tracking.py).
A run name that already holds a run is refused unless resumed (--resume=auto) or replaced (--run.overwrite=true);
a resume refuses a config that changes what the run computes (see vit/train/runfolder.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# next to the root train.py (the repository's configs/), not the current directory: train.py run from anywhere finds
# it; in an installed wheel there is none, and --help says so
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 3, "configs", "default.yaml")
DEFAULT_CONFIG = os.path.normpath(DEFAULT_CONFIG)
if os.path.abspath("configs/default.yaml") == DEFAULT_CONFIG:  # run from the repository: say it the short way
    DEFAULT_CONFIG = os.path.join("configs", "default.yaml")


def main(argv: list[str] | None = None) -> int:
    # the imports train.py had at its top: here, so that `vit train --help` answers before torch loads
    from accelerate.utils import set_seed

    from vit.cli.outputs import check_writable
    from vit.cli.runtime import make_accelerator
    from vit.cli.training import start_lines, train_config
    from vit.train import preemption
    from vit.train.console import Console
    from vit.train.engine import (
        evaluate_and_checkpoint,
        finished,
        save_state_if_due,
        stop_if_preempted,
        train_one_epoch,
    )
    from vit.train.lifecycle import finish, open_run_folder
    from vit.train.runfolder import check_new_run, check_not_locked, claim_run_dir, resume_run
    from vit.train.tracking import accelerator_trackers, check_trackers, tracker_names

    preemption.install()  # SIGTERM (Slurm, Kubernetes) is handled like Ctrl-C, with a state saved
    config_path, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    cfg, channel_note = train_config(config_path, overrides)  # every null and `auto` resolved
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
    for line in start_lines(accelerator, cfg, config_path, overrides, channel_note):
        console.print(line)

    run = make_run(cfg, accelerator, console, run_dir)  # data, model, task, optimizer, prepared

    # --- resume -----------------------------------------------------------------------------------------------
    lock = claim_run_dir(accelerator, cfg, run_dir)  # noqa: F841 (held until main returns or the process ends)
    if cfg.run.resume:
        resume_run(accelerator, cfg, run_dir, run.state, run.ema, run.task)
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


def make_run(cfg, accelerator, console, run_dir: Path):
    """The data, model, task (vit/train/tasks: its loss, metrics, checkpoints) and optimizer of a run, prepared by
    Accelerate into the engine's `Run`; their description printed by the main process."""
    import torch

    from vit.cli.training import model_lines, train_model
    from vit.data import build_datasets, build_loaders
    from vit.data.pretrain import build_pretrain_datasets
    from vit.train.console import describe_data, val_class_warning
    from vit.train.engine import Run
    from vit.train.lifecycle import make_ema, prepare
    from vit.train.optim import build_optimizer
    from vit.train.tasks import task_for

    # --- data -------------------------------------------------------------------------------------------------
    # pretrain.method: the unlabelled images of any layout (DINO's crops; vit/data/pretrain.py)
    train_ds, val_ds, classes = (build_pretrain_datasets if cfg.pretrain.method else build_datasets)(cfg)
    train_loader, val_loader = build_loaders(cfg, train_ds, val_ds, accelerator)
    for line in filter(None, (describe_data(cfg, train_ds, val_ds, classes), val_class_warning(cfg, val_ds, classes))):
        console.print(line)

    # --- model, task and optimizer ----------------------------------------------------------------------------
    model = train_model(cfg, len(classes), getattr(train_ds, "tokenizer", None))  # captions: their tokenizer
    for line in model_lines(cfg, model):
        console.print(line)
    task = task_for(cfg, classes, train_ds, model)  # the mode: its loss, metrics, checkpoints (vit/train/tasks)
    if task.bypasses_wrapper and accelerator.distributed_type == "FSDP":
        from vit.config import ConfigError

        raise ConfigError(f"pretrain.method={cfg.pretrain.method} runs the student's parts itself (masked and local "
                          "crops), which FSDP's sharded weights do not allow; launch with DDP (e.g. "
                          "configs/accelerate/multi_gpu_bf16.yaml) instead.")
    extras = task.extra_modules()  # trained beside the model (a distillation projection)
    optimizer = build_optimizer(model, cfg.optim, extras.values())
    if cfg.run.compile:
        model = torch.compile(model)
    model, optimizer, train_loader, val_loader, *prepared = prepare(accelerator, model, optimizer, train_loader,
                                                                    val_loader, extras=extras)
    return Run(accelerator, cfg, run_dir, model, optimizer, train_loader, val_loader, classes, console,
               ema=make_ema(cfg, accelerator, model), task=task, extras=prepared[0] if prepared else {})


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


_RUN: dict[str, Path] = {}  # the run folder, for the Ctrl-C message


def _interrupt_note() -> str:
    from vit.train.runfolder import interrupt_note

    return interrupt_note(_RUN.get("dir"))


def run(argv: list[str]) -> int:
    """train.py as a process: --help before torch loads, SIGTERM handled while it loads, then main under run_cli."""
    if any(a in ("-h", "--help") for a in argv):  # answered before torch loads
        from vit.cli.help import train_help

        print(train_help(__doc__, argv, DEFAULT_CONFIG), end="")
        return 0
    from vit.train import preemption  # SIGTERM while torch loads: one line and exit 143 too

    preemption.install(early=True)
    from vit.cli.runtime import run_cli

    run_cli(lambda: main(argv), _interrupt_note)
