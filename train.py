"""Train a Vision Transformer with Accelerate: one CPU, one GPU or many, without edits.

    accelerate launch train.py                                   # configs/default.yaml: digits, offline
    accelerate launch train.py --config configs/cifar10_vit_small.yaml --optim.lr=5e-4
    accelerate launch --multi_gpu --num_processes 2 train.py     # two processes (gloo on a CPU-only machine)
    accelerate launch train.py --resume=auto                     # continue a run at its last saved step

The story: config -> accelerator -> data -> model -> optimizer -> loop (train, evaluate, checkpoint) -> curves.
Everything lands in runs/<run.name>/: config.yaml, metrics.csv, tensorboard/, best/, last/, state/, curves.png.
A run name that already holds a run is refused unless resumed (--resume=auto) or replaced (--run.overwrite=true);
a resume refuses a config that changes what the run computes (see vit/runfolder.py).
"""

from __future__ import annotations

import csv
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from vit.checkpoint import (
    atomic_write_csv,
    atomic_write_text,
    build_model,
    fault_point,
    save_checkpoint,
)
from vit.config import ConfigError, dump, load_config
from vit.data import EpochSampler, build_datasets, resolve_data_config
from vit.layers import topk_warmup
from vit.metrics import predict, summarize_logits
from vit.optim import build_optimizer, lr_at, set_lr
from vit.plots import plot_curves
from vit.runfolder import (
    check_new_run,
    check_not_locked,
    check_weights,
    claim_run_dir,
    interrupt_note,
    resume_run,
    save_run_state,
)
from vit.runtime import apply_machine_defaults, make_accelerator, run_cli

METRIC_FIELDS = ["step", "epoch", "lr", "train_loss", "val_loss", "val_acc1", "val_acc5", "images_per_s",
                 "skipped_steps"]


@dataclass
class TrainState:
    """What the loop needs beyond model/optimizer/RNG to resume exactly; saved as train_state.json beside
    Accelerate's state (JSON: reading it back runs no code, unlike the pickle Accelerate would write)."""
    step: int = 0  # optimizer steps taken
    epoch: int = 0  # current epoch
    batch_in_epoch: int = 0  # batches of `epoch` already consumed
    best: list = field(default_factory=list)  # [(val_acc1, epoch)] of kept checkpoints, best first
    skipped: int = 0
    loss_sum: float = 0.0  # this epoch's running train-loss sum (mean over processes) and count, so that a
    loss_n: int = 0  # mid-epoch resume reports the loss of the whole epoch, not of the batches after it


def parse_args(argv: list[str]) -> tuple[str, list[str]]:
    config, rest, i = "configs/default.yaml", [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(__doc__)
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


def check_writable(run_dir: Path) -> None:
    """Fail early, creating nothing, if the run folder could not be made or written."""
    import tempfile

    existing = run_dir.absolute()
    while not existing.exists():
        existing = existing.parent
    try:  # a real attempt (permission bits say nothing to root): a temporary folder, removed at once
        os.rmdir(tempfile.mkdtemp(prefix=".vit-write-test-", dir=existing))
    except OSError as e:
        raise ConfigError(f"cannot write to the output folder {run_dir} ({existing}: {e.strerror}); "
                          "set run.output_dir to a writable folder.") from None


def mix_batch(mixup_fn, x, y, num_classes, smoothing):
    """timm's Mixup needs an even batch; an odd last sample keeps its own (smoothed) one-hot target."""
    from timm.data.mixup import mixup_target

    if mixup_fn is None:
        return x, y
    if x.shape[0] % 2 == 0:
        return mixup_fn(x, y)
    xm, ym = mixup_fn(x[:-1], y[:-1])
    y_last = mixup_target(y[-1:], num_classes, lam=1.0, smoothing=smoothing)
    return torch.cat([xm, x[-1:]]), torch.cat([ym, y_last.to(ym)])


def main(argv: list[str] | None = None) -> int:
    config_path, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = load_config(config_path, overrides)
    cfg = resolve_data_config(cfg)  # mean/std/crop/interpolation of the pretrained weights unless the config sets them
    cfg = apply_machine_defaults(cfg)  # threads, loader workers, precision: `auto` -> from this machine
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    _RUN["dir"] = run_dir

    # --- accelerator ------------------------------------------------------------------------------------------
    accelerator = make_accelerator(
        gradient_accumulation_steps=cfg.optim.grad_accum_steps,
        mixed_precision=cfg.run.mixed_precision,
        log_with="tensorboard",
        project_dir=str(run_dir),
    )
    logging.basicConfig(level=logging.INFO if accelerator.is_main_process else logging.ERROR,
                        format="%(message)s")
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # its per-file save messages drown the progress
    if accelerator.is_main_process:
        check_writable(run_dir)
        check_not_locked(run_dir)  # fail before any data is read; the lock itself is taken below
        check_new_run(run_dir, cfg.run.resume, cfg.run.overwrite)
    set_seed(cfg.run.seed)
    accelerator.print(f"config ({config_path}):\n{dump(cfg)}")
    accelerator.print(f"device {accelerator.device}, {accelerator.num_processes} process(es), "
                      f"mixed precision {accelerator.mixed_precision}, {torch.get_num_threads()} thread(s), "
                      f"{cfg.data.num_workers} loader worker(s)")

    # --- data -------------------------------------------------------------------------------------------------
    train_ds, val_ds, classes = build_datasets(cfg)
    num_classes = len(classes)
    sampler = EpochSampler(len(train_ds), shuffle=True, seed=cfg.run.seed)
    train_loader = DataLoader(train_ds, batch_size=cfg.data.batch_size, sampler=sampler, drop_last=False,
                              num_workers=cfg.data.num_workers, pin_memory=torch.cuda.is_available(),
                              generator=torch.Generator().manual_seed(cfg.run.seed))
    val_loader = DataLoader(val_ds, batch_size=cfg.data.eval_batch_size or cfg.data.batch_size, shuffle=False,
                            num_workers=cfg.data.num_workers, generator=torch.Generator().manual_seed(cfg.run.seed))
    # Own generators: starting a loader then draws its worker seed from them, not from the global RNG that
    # drop path and mixup use, so a resumed run consumes the global RNG exactly as an uninterrupted one.
    accelerator.print(f"data: {cfg.data.dataset}, {len(train_ds)} train / {len(val_ds)} val images, "
                      f"{num_classes} classes")
    for split, ds in (("train", train_ds), ("val", val_ds)):
        if getattr(ds, "bad", None):
            accelerator.print(f"skipped {len(ds.bad)} unreadable {split} image(s) (data.on_bad_image=skip): "
                              + "; ".join(ds.bad[:5]) + (" ..." if len(ds.bad) > 5 else ""))

    # --- model and optimizer ----------------------------------------------------------------------------------
    model = build_model(cfg, num_classes, pretrained=True)  # weights from model.pretrained, if set (report logged)
    accelerator.print(f"model: {cfg.model.name}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params")
    optimizer = build_optimizer(model, cfg.optim)
    if cfg.run.compile:
        model = torch.compile(model)
    model, optimizer, train_loader, val_loader = accelerator.prepare(model, optimizer, train_loader, val_loader)
    ema = None
    if cfg.optim.ema:
        from timm.utils import ModelEmaV3

        ema = ModelEmaV3(accelerator.unwrap_model(model), decay=cfg.optim.ema_decay)  # saved by save_run_state
    state = TrainState()

    steps_per_epoch = math.ceil(len(train_loader) / cfg.optim.grad_accum_steps)
    total_steps = cfg.run.epochs * steps_per_epoch
    warmup_steps = int(cfg.optim.warmup_epochs * steps_per_epoch)
    lr_peak = cfg.optim.lr

    mixup_fn = None
    if cfg.aug.mixup > 0 or cfg.aug.cutmix > 0:
        from timm.data import Mixup

        mixup_fn = Mixup(mixup_alpha=cfg.aug.mixup, cutmix_alpha=cfg.aug.cutmix, prob=cfg.aug.mixup_prob,
                         label_smoothing=cfg.aug.label_smoothing, num_classes=num_classes)

    # --- resume -----------------------------------------------------------------------------------------------
    lock = claim_run_dir(accelerator, cfg, run_dir)  # noqa: F841 (held until main returns or the process ends)
    if cfg.run.resume:
        resume_run(accelerator, cfg, run_dir, state, ema)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)  # only now: a bad dataset or model has written nothing
        atomic_write_text(run_dir / "config.yaml", dump(cfg))
        _trim_metrics(run_dir / "metrics.csv", state.step)
    accelerator.init_trackers("tensorboard", config=_flat_scalars(cfg))

    # --- loop -------------------------------------------------------------------------------------------------
    progress = tqdm(total=total_steps, initial=state.step, disable=not accelerator.is_local_main_process,
                    desc="train", dynamic_ncols=True)
    while state.epoch < cfg.run.epochs and not _done(cfg, state):
        model.train()
        train_ds.set_epoch(state.epoch)
        loader = accelerator.skip_first_batches(train_loader, state.batch_in_epoch) if state.batch_in_epoch \
            else train_loader
        # Accelerate's loader re-sets its sampler's epoch from its own iteration counter, which restarts at 0
        # in a resumed process: tell it the real epoch, so the permutation is (seed, epoch)'s.
        loader.set_epoch(state.epoch)
        loss_sum, loss_n = torch.full((), state.loss_sum, device=accelerator.device), state.loss_n
        seen, t0 = 0, time.perf_counter()
        lr = lr_at(state.step, total_steps, warmup_steps, lr_peak, cfg.optim.min_lr)
        for x, y in loader:
            with accelerator.accumulate(model):
                lr = lr_at(state.step, total_steps, warmup_steps, lr_peak, cfg.optim.min_lr)
                set_lr(optimizer, lr)
                topk_warmup(model, state.step / total_steps)  # EViT's keep-rate warm-up; no-op without topk
                xm, ym = mix_batch(mixup_fn, x, y, num_classes, cfg.aug.label_smoothing)
                with accelerator.autocast():
                    logits = model(xm)
                if mixup_fn is not None:
                    loss = torch.sum(-ym * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
                else:
                    loss = F.cross_entropy(logits.float(), ym, label_smoothing=cfg.aug.label_smoothing)
                if os.environ.get("VIT_FAULT_INJECT") == f"nan:{state.step}":  # tests: a numerical fault
                    loss = loss * float("nan")
                finite = accelerator.reduce(torch.isfinite(loss.detach()).float(), "min").item() > 0
                if not finite:
                    optimizer.zero_grad(set_to_none=True)
                    if cfg.run.on_nonfinite == "stop":
                        raise FloatingPointError(
                            f"the loss became non-finite at step {state.step} (epoch {state.epoch}); the last good "
                            f"checkpoint in {run_dir} is untouched. Lower optim.lr, enable optim.clip_grad, or set "
                            "run.on_nonfinite=skip.")
                    state.skipped += 1
                else:
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and cfg.optim.clip_grad:
                        accelerator.clip_grad_norm_(model.parameters(), cfg.optim.clip_grad)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    loss_sum += loss.detach()
                    loss_n += 1
            state.batch_in_epoch += 1
            seen += x.shape[0] * accelerator.num_processes
            if accelerator.sync_gradients:
                state.step += 1
                fault_point("step", state.step)
                if ema is not None:
                    ema.update(accelerator.unwrap_model(model), step=state.step)
                progress.update(1)
                if state.step % cfg.run.log_every == 0:
                    accelerator.log({"train/loss": loss.item(), "train/lr": lr}, step=state.step)
                    progress.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.2e}",
                                         img_s=f"{seen / (time.perf_counter() - t0):.0f}")
                if (cfg.run.save_state_every and state.step % cfg.run.save_state_every == 0
                        and state.batch_in_epoch < len(train_loader)):  # an epoch's end saves after evaluating
                    save_run_state(accelerator, cfg, run_dir, state, model, ema, loss_sum, loss_n)
                if _done(cfg, state):
                    break
        ips = seen / max(1e-9, time.perf_counter() - t0)
        train_loss = accelerator.reduce(loss_sum / max(1, loss_n), "mean").item()
        epoch_done = state.batch_in_epoch >= len(train_loader)
        if epoch_done:
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
        elif cfg.run.save_state_every == 0 or state.step % cfg.run.save_state_every:
            # stopped mid-epoch: save before evaluating
            save_run_state(accelerator, cfg, run_dir, state, model, ema, loss_sum, loss_n)
        # --- evaluate and checkpoint --------------------------------------------------------------------------
        last_epoch = state.epoch >= cfg.run.epochs or _done(cfg, state)
        if state.epoch % cfg.run.eval_every == 0 or last_epoch:
            eval_model = ema.module if ema is not None else model
            check_weights(accelerator, eval_model, state, run_dir)  # never evaluate or save NaN weights
            out = predict(eval_model, val_loader, accelerator)
            m = summarize_logits(out["logits"], out["labels"])
            row = dict(step=state.step, epoch=state.epoch, lr=lr, train_loss=train_loss, val_loss=m["loss"],
                       val_acc1=m["acc1"], val_acc5=m.get("acc5", ""), images_per_s=ips, skipped_steps=state.skipped)
            accelerator.log({"val/loss": m["loss"], "val/acc1": m["acc1"], "train/images_per_s": ips},
                            step=state.step)
            accelerator.print(f"epoch {state.epoch:3d}  step {state.step:6d}  train loss {train_loss:.4f}  "
                              f"val loss {m['loss']:.4f}  val top-1 {100 * m['acc1']:.2f}%  "
                              f"({m['n']} images)  {ips:.0f} img/s")
            if accelerator.is_main_process:
                meta = dict(epoch=state.epoch, step=state.step, val_acc1=m["acc1"], val_loss=m["loss"], n=m["n"])
                unwrapped = accelerator.unwrap_model(eval_model)
                save_checkpoint(run_dir / "last", unwrapped, cfg, classes, meta)
                _keep_best(run_dir, unwrapped, cfg, classes, meta, state, cfg.run.keep_best)
                _append_metrics(run_dir / "metrics.csv", row)
        if epoch_done:
            save_run_state(accelerator, cfg, run_dir, state, model, ema, 0.0, 0)

    progress.close()
    accelerator.end_training()
    if accelerator.is_main_process and (run_dir / "metrics.csv").is_file():
        plot_curves(run_dir / "metrics.csv", run_dir / "curves.png")
        best = state.best[0] if state.best else None
        if best:
            accelerator.print(f"best val top-1 {100 * best[0]:.2f}% at epoch {best[1]}; checkpoint {run_dir / 'best'}")
    return 0


_RUN: dict[str, Path] = {}  # the run folder, for the Ctrl-C message


def _interrupt_note() -> str:
    return interrupt_note(_RUN.get("dir"))


def _done(cfg, state) -> bool:
    return cfg.run.max_steps is not None and state.step >= cfg.run.max_steps


def _keep_best(run_dir, model, cfg, classes, meta, state, k) -> None:
    """`best/` holds the best checkpoint; with keep_best > 1 the runners-up live in top/epoch-XXX."""
    import shutil

    acc, epoch = meta["val_acc1"], meta["epoch"]
    ranked = sorted(state.best + [[acc, epoch]], key=lambda t: (-t[0], t[1]))
    if [acc, epoch] not in ranked[:k]:
        return
    if ranked[0] == [acc, epoch]:
        save_checkpoint(run_dir / "best", model, cfg, classes, meta)
    if k > 1:
        save_checkpoint(run_dir / "top" / f"epoch-{epoch:04d}", model, cfg, classes, meta)
        for _, e in ranked[k:]:
            shutil.rmtree(run_dir / "top" / f"epoch-{e:04d}", ignore_errors=True)
    state.best = ranked[:k]


def _append_metrics(path: Path, row: dict) -> None:
    rows = _read_metrics(path) + [{k: row.get(k, "") for k in METRIC_FIELDS}]
    atomic_write_csv(path, METRIC_FIELDS, rows)


def _read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def _trim_metrics(path: Path, step: int) -> None:
    """On resume, forget rows written after the state we resumed from (they will be written again)."""
    rows = _read_metrics(path)
    kept = [r for r in rows if int(r["step"]) <= step]
    if len(kept) != len(rows) or (not kept and path.is_file()):
        atomic_write_csv(path, METRIC_FIELDS, kept)


def _flat_scalars(cfg) -> dict:
    from vit.config import to_dict

    out = {}
    for section, values in to_dict(cfg).items():
        for k, v in values.items():
            out[f"{section}.{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


if __name__ == "__main__":
    run_cli(main, _interrupt_note)
