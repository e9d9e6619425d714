"""Frozen features out of any model `create_model` builds: each image's pooled embedding (the head's input,
`forward_head(tokens, pre_logits=True)`) and, optionally, its patch tokens, in input order with the image paths,
written to a file other tools read (NumPy .npz; Parquet too).

    paths, skipped = collect_images(["good/"])                             # vit.cli.images: what to read
    feats = extract_features(model, ImageFiles(paths, transform), 32, 0, accelerator, patch_tokens=True)
    save_features("feats.npz", feats)                                      # + feats.parquet (path, label, embedding)

The label of an image is the name of the folder it sits in (an ImageFolder's <class>/), so a folder of class
folders gives what `vit.eval.probes` (k-NN, linear probe) needs; a loose image's label is its folder's name too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..config import ConfigError
from ..utils.atomic import atomic_write_bytes
from .inference import ImageFiles, predict_files

__all__ = ["Embedder", "extract_features", "save_features", "load_features", "use_patch_tokens", "FEATURE_KEYS"]

# what a features .npz holds: paths (N,) str, labels (N,) str, embeddings (N, D) float32, optionally
# patch_tokens (N, h*w, D) float32 and grid (2,) int (h, w)
FEATURE_KEYS = ("paths", "labels", "embeddings", "patch_tokens", "grid")


class Embedder(nn.Module):
    """A classifier seen as a feature extractor: images (B, C, H, W) or a NaFlex batch (a dict: each image at its
    own aspect ratio) -> pooled embedding (B, D), followed, with `patch_tokens` (images only), by the flattened
    final patch tokens (B, h*w*D). One tensor per batch, so that the
    multi-process gathering of `vit.eval.metrics.predict` carries both."""

    def __init__(self, model: nn.Module, patch_tokens: bool = False) -> None:
        super().__init__()
        self.model, self.patch_tokens = model, patch_tokens

    def forward(self, x: torch.Tensor | dict) -> torch.Tensor:
        tokens = self.model.forward_features(x)  # (B, prefix + h*w, D) after the final norm; NaFlex: timm's dict
        pooled = self.model.forward_head(tokens, pre_logits=True)  # (B, D): what the head would read
        if not self.patch_tokens:
            return pooled

        return torch.cat([pooled, tokens[:, self.model.num_prefix_tokens:].flatten(1)], dim=1)


def extract_features(model: nn.Module, dataset: ImageFiles, batch_size: int, num_workers: int, accelerator,
                     patch_tokens: bool = False) -> dict:
    """{paths, labels, embeddings (N, D), ok (N,) bool[, patch_tokens (N, h*w, D), grid (h, w)]} of every file
    of `dataset`, in input order, gathered on every process; an unreadable file has ok False and zero features."""
    if patch_tokens and getattr(dataset, "naflex", False):
        raise ConfigError("these images are read at their own aspect ratio (data.naflex), each on its own grid of "
                          "patches, which one (N, h*w, D) patch_tokens array cannot hold; leave out --patch-tokens "
                          "(the pooled embeddings are each image's own).")
    model.eval()
    dim = model.num_features
    out = predict_files(Embedder(model, patch_tokens), dataset, batch_size, num_workers, accelerator)
    flat = out["logits"].numpy().astype(np.float32)  # (N, D [+ h*w*D])
    paths = [str(p) for p in dataset.paths]
    feats = {"paths": paths, "labels": [Path(p).parent.name for p in paths], "embeddings": flat[:, :dim],
             "ok": out["ok"].numpy()}
    if patch_tokens:
        size = dataset.shape[1:]
        grid = tuple(int(g) for g in model.grid_size(size)) if hasattr(model, "grid_size") \
            else tuple(s // p for s, p in zip(size, model.patch_embed.patch_size))
        feats["patch_tokens"] = flat[:, dim:].reshape(len(paths), -1, dim)
        feats["grid"] = grid
    return feats


def save_features(path: str | Path, feats: dict, parquet: bool = True) -> list[Path]:
    """Write the readable images' features to `path` (.npz, no pickled objects: strings as fixed-width unicode
    arrays) and, with `parquet` and pyarrow installed, the embeddings beside it as <stem>.parquet (columns path,
    label, embedding: a list of floats). Atomic: a reader sees the old file or the new one. -> the files written."""
    import io

    path = Path(path)
    ok = np.asarray(feats.get("ok", np.ones(len(feats["paths"]), bool)), bool)
    arrays = {"paths": np.array(feats["paths"], dtype=str)[ok], "labels": np.array(feats["labels"], dtype=str)[ok],
              "embeddings": np.asarray(feats["embeddings"], np.float32)[ok]}
    if feats.get("patch_tokens") is not None:
        arrays["patch_tokens"] = np.asarray(feats["patch_tokens"], np.float32)[ok]
        arrays["grid"] = np.asarray(feats["grid"], np.int64)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())
    written = [path]
    if parquet:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            return written
        table = pa.table({"path": arrays["paths"].tolist(), "label": arrays["labels"].tolist(),
                          "embedding": pa.array(list(arrays["embeddings"]), type=pa.list_(pa.float32()))})
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        atomic_write_bytes(path.with_suffix(".parquet"), sink.getvalue().to_pybytes())
        written.append(path.with_suffix(".parquet"))
    return written


def load_features(path: str | Path) -> dict:
    """A features file `save_features` wrote (.npz, never unpickled) or its .parquet: {paths, labels, embeddings
    [, patch_tokens, grid]} as NumPy arrays. A file of another kind: a ValueError that says what was expected."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no features file {path}; write one with features.py.")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        t = pq.read_table(path)
        missing = {"path", "label", "embedding"} - set(t.column_names)
        if missing:
            raise ValueError(f"{path} has no {sorted(missing)[0]!r} column; pass a .parquet written by features.py.")
        emb = np.array(t.column("embedding").to_pylist(), dtype=np.float32)
        return {"paths": np.array(t.column("path").to_pylist(), dtype=str),
                "labels": np.array(t.column("label").to_pylist(), dtype=str), "embeddings": emb.reshape(len(t), -1)}
    try:
        with np.load(path, allow_pickle=False) as z:  # an object array inside would raise, not run code
            out = {k: z[k] for k in FEATURE_KEYS if k in z.files}
    except (ValueError, OSError) as e:
        raise ValueError(f"{path} is not a features file ({e}); pass a .npz written by features.py.") from None
    if not {"paths", "labels", "embeddings"} <= set(out):
        raise ValueError(f"{path} holds no paths/labels/embeddings arrays; pass a .npz written by features.py.")
    sizes = {k: len(out[k]) for k in ("paths", "labels", "embeddings")}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"{path} has {sizes['embeddings']} embeddings for {sizes['paths']} paths and "
                         f"{sizes['labels']} labels; write it again with features.py.")
    return out


def use_patch_tokens(feats: dict[str, dict], files: dict[str, str]) -> None:
    """Make each features dict of `feats` (role -> load_features' dict; "train" among them) probe its patch
    tokens: `embeddings` becomes patch_tokens flattened in grid order, (N, h*w*D). `files` (role -> path) names
    them in the one-sentence ConfigError for a file without patch tokens (a .parquet never has them) or with
    another grid or width than the training file's: two grids of one flattened size (another image size, or
    another model's width) would put other patches side by side."""
    def layout(f: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:  # ((h, w), (h*w, D))
        return tuple(int(g) for g in f.get("grid", ())), f["patch_tokens"].shape[1:]

    def said(shape) -> str:
        return "x".join(map(str, shape[0])) + f" grid of {shape[1][-1]}-d tokens"

    for role, f in feats.items():
        if "patch_tokens" not in f:
            raise ConfigError(f"--{role} {files[role]} holds no patch tokens; pass the .npz that features.py "
                              "--patch-tokens writes (the .parquet beside it has only the pooled embeddings), "
                              "or probe those (--features pooled).")
    ref = layout(feats["train"])
    for role, f in feats.items():
        if layout(f) != ref:
            raise ConfigError(f"--{role} {files[role]} holds patch tokens on a {said(layout(f))} but --train "
                              f"{files['train']} on a {said(ref)}; extract every file with the same model at "
                              "the same image size.")
        f["embeddings"] = f["patch_tokens"].reshape(len(f["patch_tokens"]), -1)
