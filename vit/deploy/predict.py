"""Labelling inputs that have no labels with a PyTorch model: top-k rows per image (or per sentence, for a text
checkpoint), in input order, on one process or many; what predict.py --checkpoint / --model runs.

    model, cfg, classes, _ = load_model_and_config(checkpoint="runs/default/best")   # vit/eval/inference.py
    result = predict_images(model, cfg, classes, paths, topk=5)      # result.rows: path, pred1, pred1_name, ...

The rows are vit/deploy/predictions.py's, the same the ONNX predictor makes.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..data.datasets import image_transform
from ..eval.anomaly import PatchCore
from ..eval.inference import ImageFiles, decode_error, label_names, predict_files
from ..eval.metrics import end_processes
from ..eval.multilabel import decision_threshold
from .predictions import Predictions, add_anomaly, check_threshold, rows_for

__all__ = ["predict_images", "predict_sentences", "multilabel_threshold"]


def multilabel_threshold(cfg, threshold: float | None = None, checkpoint: str | Path | None = None) -> float | None:
    """None for a single-label model; for a multi-label one (its config has data.labels_file), `threshold`,
    else the threshold training chose on its validation split (saved in `checkpoint`), else 0.5."""
    check_threshold(threshold, bool(cfg.data.labels_file))
    if not cfg.data.labels_file:
        return None
    return threshold if threshold is not None else decision_threshold(cfg, checkpoint)


def predict_images(model, cfg, classes: list[str] | None, paths: list[Path], topk: int = 5,
                   threshold: float | None = None, batch_size: int | None = None, num_workers: int = 0,
                   patchcore: PatchCore | None = None, accelerator=None) -> Predictions | None:
    """The top-`topk` rows of every readable image of `paths` (rows_for's: softmax, or for a multi-label config
    sigmoids with the labels at `threshold`), through `cfg`'s evaluation preprocessing; `classes` None: the
    model's own names (label_names). A `patchcore` bank adds each row's anomaly score and verdict.
    The images are dealt over `accelerator`'s processes (default: a new Accelerator) and gathered; that is its
    last collective, so its process group is closed after it, and every process but the main one gets None."""
    if accelerator is None:
        from accelerate import Accelerator

        accelerator = Accelerator()
    classes = classes or label_names(model, model.num_classes)
    transform = image_transform(cfg, train=False)  # data.naflex: each image at its own aspect ratio, patchified
    dataset = ImageFiles(paths, transform, cfg.model.in_chans)
    batch = batch_size or cfg.data.eval_batch_size or cfg.data.batch_size
    t0 = time.perf_counter()
    out = predict_files(model, dataset, batch, num_workers, accelerator)  # input order, one entry per file
    seconds = time.perf_counter() - t0
    num_processes = accelerator.num_processes
    if not end_processes(accelerator):
        return None
    ok, index = out["ok"].tolist(), out["index"].tolist()
    good = [i for i, flag in zip(index, ok) if flag]
    skipped = [(str(paths[i]), decode_error(paths[i], transform)) for i, flag in zip(index, ok) if not flag]
    result = Predictions([], skipped, seconds, threshold, good, dataset, num_processes=num_processes)
    if not good:
        return result
    logits = out["logits"][out["ok"]].float()
    probs = logits.softmax(1) if threshold is None else logits.sigmoid()  # multi-label: one sigmoid per class
    result.rows = rows_for([paths[i] for i in good], probs.numpy(), classes, topk, threshold)
    if patchcore is not None:
        scores, result.anomaly_maps, _ = patchcore.score_files(model, dataset, batch)  # (N,), (N, h, w)
        add_anomaly(result.rows, scores[good], patchcore.threshold)
    return result


def predict_sentences(checkpoint: str | Path, files: list[str], topk: int = 5,
                      batch_size: int | None = None) -> Predictions:
    """A text checkpoint's top-`topk` rows for the sentences of `files` (text files, one a line, or CSVs: their
    data.text_column), in input order; each row names its file:line (`path`) and its `text`."""
    from vit.data import DataError
    from vit.eval.text import predict_texts, read_texts
    from vit.hub.tokenizer import load_tokenizer
    from vit.models.checkpoint import load_checkpoint

    model, cfg, classes, _ = load_checkpoint(checkpoint)
    texts, where = read_texts(files, cfg.data.text_column)
    if not texts:
        raise DataError(f"no sentences in {' '.join(files)}; pass text files (one a line) or CSVs.")
    t0 = time.perf_counter()
    logits = predict_texts(model, load_tokenizer(cfg.model.pretrained), texts,
                           batch_size or cfg.data.eval_batch_size or cfg.data.batch_size)
    seconds = time.perf_counter() - t0
    rows = [{"path": r.pop("path"), "text": t, **r}
            for t, r in zip(texts, rows_for(where, logits.softmax(1).numpy(), classes, topk))]
    return Predictions(rows, [], seconds)
