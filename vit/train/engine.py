"""The training loop's pieces, so that train.py's `main` reads as a story: one epoch of optimizer steps, the
evaluation and checkpoints after it, and the one rule for when Accelerate's training state is saved.

Why a module and not more functions in train.py: the save policy and the step are the parts a change most
easily breaks (resume exactness, crash safety), and here they are importable and testable on their own;
train.py keeps the order of events. What a micro-batch's loss is, what an evaluation measures and what a checkpoint
holds is the run's task (vit/train/tasks): the loop calls it and never asks which data it has.

One optimizer step = `grad_accum_steps` micro-batches. Whether a step is finite is decided once per step, on
the gradient norm at the sync point (DDP has already all-reduced the gradients, so every process sees the same
norm and no extra collective runs); a non-finite loss on any micro-batch makes that norm non-finite.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..layers import indexer_loss, topk_warmup
from ..utils.faults import fault_point, poison_loss
from .indexer import indexer_only_grads, indexer_schedule
from .optim import lr_at, set_lr
from .preemption import Preempted
from .preemption import requested as preemption_requested
from .records import append_metrics, keep_best
from .runfolder import check_run_weights, kept_note, save_run_state
from .state import state_dir_name
from .tasks import Task, task_for
from .tracking import log_row, log_step

__all__ = ["TrainState", "Run", "batch_images", "train_one_epoch", "evaluate_and_checkpoint",
           "state_save_due", "save_state_if_due", "stop_if_preempted", "finished"]


@dataclass
class TrainState:
    """What the loop needs beyond model/optimizer/RNG to resume exactly; saved as train_state.json beside
    Accelerate's state (JSON: reading it back runs no code, unlike the pickle Accelerate would write)."""
    step: int = 0  # optimizer steps taken
    epoch: int = 0  # current epoch
    batch_in_epoch: int = 0  # batches of `epoch` already consumed
    best: list = field(default_factory=list)  # [(score, epoch)] of kept checkpoints by run.select_by, best first
    skipped: int = 0  # optimizer steps skipped for non-finite gradients (run.on_nonfinite=skip)
    loss_sum: float = 0.0  # this epoch's running train-loss sum (mean over processes) and count, so that a
    loss_n: int = 0  # mid-epoch resume reports the loss of the whole epoch, not of the batches after it
    loss_sums: list = field(default_factory=list)  # each process's own running sum: a resume continues it exactly
    num_processes: int = 1  # processes that trained it: data.batch_size is per process, so a resume needs as many


@dataclass
class Run:
    """Everything the loop touches, prepared by Accelerate; `state` is what a resume restores. `task`: the training
    mode (vit/train/tasks; None: the config's, task_for); `extras`: its extra modules, prepared (Task.extra_modules)."""
    accelerator: Any
    cfg: Any
    run_dir: Path
    model: torch.nn.Module
    optimizer: Any
    train_loader: Any
    val_loader: Any
    classes: list[str]
    console: Any
    ema: Any = None  # timm ModelEmaV3 or None
    task: Task | None = None
    extras: dict[str, torch.nn.Module] = field(default_factory=dict)
    state: TrainState = field(default_factory=TrainState)

    def __post_init__(self) -> None:
        if self.task is None:
            self.task = task_for(self.cfg, self.classes)

    def trained_modules(self) -> list[torch.nn.Module]:
        """The model and the task's extra modules: what the optimizer steps and gradients accumulate over."""
        return [self.model, *self.extras.values()]

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.train_loader) / self.cfg.optim.grad_accum_steps)

    @property
    def total_steps(self) -> int:
        return self.cfg.run.epochs * self.steps_per_epoch

    @property
    def warmup_steps(self) -> int:
        return int(self.cfg.optim.warmup_epochs * self.steps_per_epoch)

    def lr(self) -> float:
        o = self.cfg.optim
        return lr_at(self.state.step, self.total_steps, self.warmup_steps, o.lr, o.min_lr)


@dataclass
class EpochStats:
    lr: float
    train_loss: float
    images_per_s: float
    indexer_loss: float | None = None  # the epoch's mean DSA indexer KL (model.sparse_attention.method=dsa), else None


def finished(run: Run) -> bool:
    return run.state.epoch >= run.cfg.run.epochs or _max_steps_reached(run)


def _max_steps_reached(run: Run) -> bool:
    return run.cfg.run.max_steps is not None and run.state.step >= run.cfg.run.max_steps


# --- the one save policy ----------------------------------------------------------------------------------


def state_save_due(state: TrainState, every: int, batches_per_epoch: int, moment: str) -> bool:
    """When Accelerate's training state is saved. `moment`:
    - "step": after an optimizer step, mid-epoch: every `every` steps (run.save_state_every; 0 = never mid-epoch);
      the step that ends an epoch is left to "epoch", which saves after evaluating.
    - "stop": training left an epoch early (run.max_steps): save before evaluating, unless "step" just did, so the
      state holds no evaluation of an unfinished epoch (a resume finishes it and evaluates it then).
    - "epoch": after an epoch's evaluation and checkpoints: always, at the epoch boundary (`state.epoch` advanced).
    """
    mid_epoch = 0 < state.batch_in_epoch < batches_per_epoch
    periodic = every > 0 and state.step % every == 0
    if moment == "step":
        return mid_epoch and periodic
    if moment == "stop":
        return mid_epoch and not periodic
    if moment == "epoch":
        return state.batch_in_epoch == 0
    raise ValueError(f"unknown save moment {moment!r}")


def save_state_if_due(run: Run, moment: str, loss_sum: torch.Tensor | float = 0.0, loss_n: int = 0) -> None:
    """Save the training state if `state_save_due` says so; `loss_sum/loss_n`: the unfinished epoch's train loss."""
    if state_save_due(run.state, run.cfg.run.save_state_every, len(run.train_loader), moment):
        save_run_state(run.accelerator, run.cfg, run.run_dir, run.state, run.model, run.ema, loss_sum, loss_n,
                       run.task)


def stop_if_preempted(run: Run, loss_sum: torch.Tensor | float = 0.0, loss_n: int = 0, saved: bool = False) -> None:
    """After SIGTERM (vit/train/preemption.py), on every process at the same point: save the state at this step
    unless it was just saved (`saved`, or the save policy's "step" moment did), then raise Preempted naming it."""
    if not preemption_requested(run.accelerator):
        return
    s = run.state
    if not saved and not state_save_due(s, run.cfg.run.save_state_every, len(run.train_loader), "step"):
        save_run_state(run.accelerator, run.cfg, run.run_dir, s, run.model, run.ema, loss_sum, loss_n, run.task)
    raise Preempted(f"saved {run.run_dir / 'state' / state_dir_name(s.step)} at step {s.step} (epoch {s.epoch}); "
                    "continue with --resume=auto")


# --- one epoch --------------------------------------------------------------------------------------------


def batch_images(x) -> int:
    """Images in a batch: a tensor's first dimension, the rows of a NaFlex batch dict (vit/data/naflex.py), or of the
    first crop of a multi-crop list (vit/data/pretrain.py)."""
    if isinstance(x, (list, tuple)):
        return x[0].shape[0]
    return len(x["patch_valid"]) if isinstance(x, dict) else x.shape[0]


def _loss(run: Run, x: torch.Tensor, y: torch.Tensor, stage: str | None = None
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The loss to minimise and the DSA indexer's KL within it (None without DSA): in the indexer warm-up the
    KL (plus 0 x the task loss, so that DDP sees every parameter take part; `indexer_only_grads` then keeps the
    step to the indexers), afterwards the task loss plus the KL (vit.layers.sparse_attention)."""
    loss = run.task.loss(run, x, y)
    aux = indexer_loss(run.model) if stage is not None else None
    if aux is None:
        return loss, None
    return (aux + 0.0 * loss if stage == "warmup" else loss + aux), aux.detach()


def average_gradients(run) -> None:
    """The mean over processes of every trained parameter's gradient, in place, as DistributedDataParallel would
    have made it: for a task that runs the model unwrapped (Task.bypasses_wrapper), whose backward the wrapper never
    saw. A parameter with a gradient on some processes only gets zeros where it has none (as DDP's unused
    parameters do); one without a gradient anywhere keeps None. One process: nothing to do."""
    acc = run.accelerator
    if acc.num_processes == 1:
        return
    import torch.distributed as dist

    params = [p for m in run.trained_modules() for p in acc.unwrap_model(m).parameters() if p.requires_grad]
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=acc.device)
    dist.all_reduce(present)
    params = [p for p, n in zip(params, present.tolist()) if n > 0]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if params:
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= acc.num_processes
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p.grad))


def _optimizer_step(run: Run, step_losses: torch.Tensor) -> bool:
    """Clip, check and apply the accumulated gradients; False when the step was not finite (and not applied).
    One host sync per optimizer step (`.item()` on the norm), none per micro-batch."""
    acc, cfg = run.accelerator, run.cfg
    if run.task.bypasses_wrapper:
        average_gradients(run)
    # the total norm, clipped to optim.clip_grad if set (inf: only measured; grads times 1.0 are unchanged)
    params = [p for m in run.trained_modules() for p in m.parameters()]
    norm = acc.clip_grad_norm_(params, cfg.optim.clip_grad or math.inf)
    if acc.scaler is not None:
        # fp16: GradScaler skips a step whose gradients overflowed and lowers its scale (normal while it finds
        # the scale), and must see every step; only a non-finite loss is ours to count or stop on
        finite = acc.reduce(torch.isfinite(step_losses).float(), "min").item() > 0
        run.optimizer.step()
    else:
        finite = bool(torch.isfinite(norm))
        if finite:
            run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    if not finite and cfg.run.on_nonfinite == "stop":
        s = run.state
        raise FloatingPointError(
            f"the loss became non-finite at step {s.step} (epoch {s.epoch}); {kept_note(run.run_dir)}. "
            "Lower optim.lr, enable optim.clip_grad, or set run.on_nonfinite=skip.")
    return finite


def _epoch_loader(run: Run):
    """The train loader at this epoch's permutation, past the batches a resumed epoch already consumed."""
    acc, state = run.accelerator, run.state
    set_epoch = getattr(run.train_loader.dataset, "set_epoch", None)  # augmentation seeded per (seed, epoch, index)
    if set_epoch is not None:
        set_epoch(state.epoch)
    loader = run.train_loader
    if state.batch_in_epoch:  # a shard loader (vit/data/shard_loader.py) skips its finished shards unread
        own_skip = getattr(loader, "skip_first_batches", None)
        loader = own_skip(state.batch_in_epoch) if own_skip else acc.skip_first_batches(loader, state.batch_in_epoch)
    # Accelerate's loader re-sets its sampler's epoch from its own iteration counter, which restarts at 0
    # in a resumed process: tell it the real epoch, so the permutation is (seed, epoch)'s.
    loader.set_epoch(state.epoch)
    return loader


def _log_step(run: Run, loss: torch.Tensor, aux: torch.Tensor | None, lr: float, images_per_s: float) -> None:
    """Every run.log_every steps the last micro-batch's loss to the trackers and the console; a tick otherwise."""
    if run.state.step % run.cfg.run.log_every == 0:
        log_step(run.accelerator, run.state.step, loss.item(), lr, aux.item() if aux is not None else None)
        run.console.step(loss=f"{loss.item():.3f}", lr=f"{lr:.2e}", img_s=f"{images_per_s:.0f}")
    else:
        run.console.step()


def train_one_epoch(run: Run) -> EpochStats:
    """Optimizer steps until the epoch ends or run.max_steps is reached, saving mid-epoch states as due. A resumed
    epoch skips the batches it already consumed (same permutation: EpochSampler depends on (seed, epoch) only)."""
    acc, cfg, state, model = run.accelerator, run.cfg, run.state, run.model
    for m in run.trained_modules():
        m.train()
    loader = _epoch_loader(run)
    # this process's own sum (the mean over processes, as states before loss_sums hold, rounds differently)
    own = state.loss_sums[acc.process_index] if len(state.loss_sums) == acc.num_processes else state.loss_sum
    loss_sum, loss_n = torch.full((), own, device=acc.device), state.loss_n
    step_losses, step_n = torch.zeros((), device=acc.device), 0  # micro-batch losses of the step being built
    aux_sum, aux_n = 0.0, 0  # the DSA indexer's KL, summed over this epoch's micro-batches
    seen, t0 = 0, time.perf_counter()
    lr = run.lr()
    for x, y in loader:
        with acc.accumulate(*run.trained_modules()):
            lr = run.lr()
            set_lr(run.optimizer, lr)
            topk_warmup(model, state.step / run.total_steps)  # EViT's keep-rate warm-up; no-op without topk
            stage = indexer_schedule(model, state.step, cfg.optim.indexer_warmup_steps,  # None without DSA
                                     cfg.optim.indexer_kl_rows)
            loss, aux = _loss(run, x, y, stage)
            loss = poison_loss(loss, state.step)  # the test hook makes a known step's loss NaN
            if aux is not None:
                aux_sum, aux_n = aux_sum + aux, aux_n + 1
            acc.backward(loss)
            step_losses, step_n = step_losses + loss.detach(), step_n + 1
            if acc.sync_gradients:
                if stage == "warmup":
                    indexer_only_grads(model)  # the indexer warm-up moves the indexers only
                if _optimizer_step(run, step_losses):
                    loss_sum, loss_n = loss_sum + step_losses, loss_n + step_n
                else:
                    state.skipped += 1
                step_losses, step_n = torch.zeros((), device=acc.device), 0
        state.batch_in_epoch += 1
        seen += batch_images(x) * acc.num_processes
        if acc.sync_gradients:
            state.step += 1
            fault_point("step", state.step)
            if run.ema is not None:
                run.ema.update(acc.unwrap_model(model), step=state.step)
            run.task.after_step(run)
            _log_step(run, loss, aux, lr, seen / (time.perf_counter() - t0))
            save_state_if_due(run, "step", loss_sum, loss_n)
            if 0 < state.batch_in_epoch < len(run.train_loader):  # an epoch's last step: after its evaluation
                stop_if_preempted(run, loss_sum, loss_n)
            if _max_steps_reached(run):
                break
    ips = seen / max(1e-9, time.perf_counter() - t0)
    train_loss = acc.reduce(loss_sum / max(1, loss_n), "mean").item()
    if state.batch_in_epoch >= len(run.train_loader):
        state.epoch, state.batch_in_epoch = state.epoch + 1, 0
    else:
        save_state_if_due(run, "stop", loss_sum, loss_n)
    aux_mean = acc.reduce(aux_sum / aux_n, "mean").item() if aux_n else None
    return EpochStats(lr=lr, train_loss=train_loss, images_per_s=ips, indexer_loss=aux_mean)


# --- evaluation, checkpoints, metrics ------------------------------------------------------------------------


def _train_columns(state: TrainState, stats: EpochStats) -> dict:
    """The columns of metrics.csv that every row has, evaluated or not, single- or multi-label (indexer_loss
    empty without DSA); the val_* ones are added where the epoch was evaluated."""
    return dict(step=state.step, epoch=state.epoch, lr=stats.lr, train_loss=stats.train_loss,
                images_per_s=stats.images_per_s, skipped_steps=state.skipped,
                indexer_loss="" if stats.indexer_loss is None else stats.indexer_loss)


def evaluate_and_checkpoint(run: Run, stats: EpochStats) -> None:
    """Every run.eval_every epochs and at the end: the task's held-out metrics, last/ and best/ checkpoints (the
    task's writer), a metrics row. Epochs in between get a row too, without the val_* values: curves.png shows
    every epoch's train loss and lr."""
    acc, cfg, state, task = run.accelerator, run.cfg, run.state, run.task
    if not (state.epoch % cfg.run.eval_every == 0 or finished(run)):
        if acc.is_main_process:
            row = _train_columns(state, stats)
            append_metrics(run.run_dir / "metrics.csv", row)
            log_row(acc, row, cfg.run.log_every)
        return
    eval_model = run.ema.module if run.ema is not None else run.model
    check_run_weights(acc, eval_model, state, run.run_dir)  # never evaluate or save NaN weights
    ev = task.evaluate(run, eval_model)
    run.console.print(f"epoch {state.epoch:3d}  step {state.step:6d}  train loss {stats.train_loss:.4f}  {ev.line}  "
                      f"{stats.images_per_s:.0f} img/s")
    weights = acc.get_state_dict(eval_model)  # FSDP: every process helps gather the one consolidated copy
    if acc.is_main_process:
        row = dict(_train_columns(state, stats), **ev.row)
        meta = dict(epoch=state.epoch, step=state.step, **ev.meta)
        unwrapped = acc.unwrap_model(eval_model)
        task.save(run.run_dir / "last", unwrapped, meta, weights)
        if keep_best(run, unwrapped, meta, weights, task):
            task.on_new_best(run, ev)
        append_metrics(run.run_dir / "metrics.csv", row)
        log_row(acc, row, cfg.run.log_every)  # the trackers get this row's numbers (run.log_with)
