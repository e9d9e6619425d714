"""Experiment tracking as Hugging Face users know it: `run.log_with` names Accelerate's trackers.

    run:
      log_with: [tensorboard, csv, mlflow]   # or one name (log_with: mlflow); null (the default): [tensorboard, csv]

train.py builds its Accelerator with `accelerator_trackers(...)`, calls `accelerator.init_trackers(run.project,
config=flat_config(cfg), init_kwargs=tracker_kwargs(...))` and, after every epoch, `log_row`: the trackers
receive the very numbers of that metrics.csv row (same names, same step), plus, every run.log_every steps,
`log_step`'s: one name per quantity, metrics.csv's (`lr`), and for a single step's value of a quantity that
metrics.csv holds per epoch, its name + `_step` (`train_loss_step`, as Lightning names it). At the end,
`log_artifacts` gives MLflow the run's files (as the HF Trainer does with HF_MLFLOW_LOG_ARTIFACTS): the best
checkpoint's model card, config.yaml, metrics.csv, curves.png and confusion.png; the weights stay in the run
folder. `csv` is our own metrics.csv, which is always written (curves.png and a resume read it): naming it only
makes the list say so.

Where the files go: TensorBoard into <run>/tensorboard/; wandb into <run>/wandb/
unless WANDB_DIR says otherwise (WANDB_MODE=offline keeps it on this machine; `wandb sync` uploads it later);
MLflow wherever MLFLOW_TRACKING_URI points (MLflow 3's own default is sqlite:///mlflow.db in the current folder,
which needs the full `mlflow` package; `file:` stores need MLFLOW_ALLOW_FILE_STORE=true). A tracker whose
package is missing, or an MLflow store that cannot open, is refused in one sentence before any data is read:
Accelerate itself would drop a missing tracker with a debug message only.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..config import Config, ConfigError, to_dict

__all__ = ["DEFAULT_TRACKERS", "tracker_names", "check_trackers", "accelerator_trackers", "tracker_kwargs",
           "flat_config", "log_row", "log_step", "log_artifacts", "ARTIFACTS"]

DEFAULT_TRACKERS = ["tensorboard", "csv"]
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny", "comet_ml": "comet_ml",
            "aim": "aim", "clearml": "clearml", "dvclive": "dvclive", "swanlab": "swanlab", "trackio": "trackio"}


def tracker_names(cfg: Config) -> list[str]:
    """Accelerate's trackers that `run.log_with` asks for, in its order, each once; csv (ours) left out."""
    names = DEFAULT_TRACKERS if cfg.run.log_with is None else cfg.run.log_with
    return [n for i, n in enumerate(names) if n != "csv" and n not in names[:i]]


def check_trackers(names: list[str]) -> None:
    """Raise ConfigError (one sentence) for a tracker that could not start: its package is missing, or, for
    MLflow, the tracking store named by MLFLOW_TRACKING_URI (or MLflow's default) does not open."""
    from accelerate.tracking import get_available_trackers

    available = {str(t) for t in get_available_trackers()}
    for name in names:
        if name not in available:
            extra = " (pip install -e '.[track]')" if name in ("wandb", "mlflow") else ""
            raise ConfigError(f"run.log_with names {name}, but its package is not installed; install "
                              f"{PACKAGES[name]}{extra} or remove {name} from run.log_with.")
    if "mlflow" in names:
        import mlflow

        try:
            mlflow.search_experiments(max_results=1)  # opens the store, as the tracker's start() will
        except Exception as e:  # MlflowException, or an ImportError for sqlite without SQLAlchemy
            first = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
            raise ConfigError(f"run.log_with names mlflow, but its tracking store {mlflow.get_tracking_uri()} "
                              f"does not open ({first}); set MLFLOW_TRACKING_URI to a server or to "
                              "file:<folder> with MLFLOW_ALLOW_FILE_STORE=true.") from None


def accelerator_trackers(names: list[str], run_dir: Path) -> list:
    """`log_with` for the Accelerator: TensorBoard as a tracker object writing into <run>/tensorboard (Accelerate
    would put it under logging_dir/<project>), the others by name."""
    from accelerate.tracking import TensorBoardTracker

    return [TensorBoardTracker("tensorboard", run_dir) if n == "tensorboard" else n for n in names]


def tracker_kwargs(cfg: Config, run_dir: Path) -> dict:
    """init_kwargs for `init_trackers`: every run is named run.name; wandb writes into the run folder."""
    wandb = {"name": cfg.run.name}
    if "WANDB_DIR" not in os.environ:
        wandb["dir"] = str(run_dir)
    return {"wandb": wandb, "mlflow": {"run_name": cfg.run.name}, "comet_ml": {"experiment_name": cfg.run.name}}


def flat_config(cfg: Config) -> dict:
    """The resolved config as {'section.key': scalar}: lists and None as their text (every tracker takes these)."""
    return {f"{section}.{k}": v if isinstance(v, (int, float, str, bool)) else str(v)
            for section, values in to_dict(cfg).items() for k, v in values.items()}


def log_row(accelerator, row: dict, log_every: int) -> None:
    """One metrics.csv row to every tracker at its step: the same names and the same numbers ('' left out). `lr`
    is left out at a step that `log_step` logged too (run.log_every divides it): one point per step and name."""
    step = int(row["step"])
    accelerator.log({k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))
                     and not (k == "lr" and step % log_every == 0)}, step=step)


def log_step(accelerator, step: int, loss: float, lr: float, indexer_loss: float | None = None) -> None:
    """One optimizer step's numbers (every run.log_every steps): that step's loss (metrics.csv's train_loss is the
    epoch's mean), the learning rate, and DSA's indexer KL when it trains."""
    values = {"train_loss_step": loss, "lr": lr}
    if indexer_loss is not None:
        values["indexer_loss_step"] = indexer_loss
    accelerator.log(values, step=step)


# the run's files MLflow receives: (path in the run folder, folder among the MLflow run's artifacts)
ARTIFACTS = [("best/README.md", "best"), ("config.yaml", None), ("metrics.csv", None), ("curves.png", None),
             ("confusion.png", None)]


def log_artifacts(accelerator, run_dir: Path) -> list[str]:
    """Give the MLflow run (if run.log_with has one) the ARTIFACTS that exist; call before end_training. Returns
    the paths logged (none without MLflow or on another process than the main one)."""
    if not accelerator.is_main_process or "mlflow" not in {t.name for t in accelerator.trackers}:
        return []
    tracker = accelerator.get_tracker("mlflow", unwrap=False)
    logged = []
    for path, folder in ARTIFACTS:
        if (run_dir / path).is_file():
            tracker.log_artifact(str(run_dir / path), artifact_path=folder)
            logged.append(path)
    return logged
