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

__all__ = ["Embedder", "extract_features", "save_features", "load_features", "npz_headers", "check_npz_layout",
           "use_patch_tokens", "FEATURE_KEYS"]

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


# bounds a features file's arrays are checked against, from their .npy headers, before any is read
MAX_WIDTH = 1 << 16  # numbers per embedding or patch token (ViT-22B's are 6144)
MAX_TOKENS = 1 << 16  # patch tokens per image (a 256 x 256 grid)
MAX_TEXT = 4096  # characters of a path or a label
# features.py stores the arrays uncompressed: what they unpack to may exceed the file's size by this factor (a
# compressed file's strings), or be up to FLOOR_BYTES whatever the file's size
INFLATION, FLOOR_BYTES = 16, 256 << 20
# each array: (dtype kinds, ndim); ROWS hold one row per image
LAYOUT = {"paths": ("U", 1), "labels": ("U", 1), "embeddings": ("f", 2), "patch_tokens": ("f", 3), "grid": ("iu", 1)}
ROWS = ("paths", "labels", "embeddings", "patch_tokens")


def npz_headers(path: str | Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{key: (shape, dtype)} of the FEATURE_KEYS members of a .npz, read from their .npy headers without reading
    their data (numpy.lib.format), so that a file whose arrays would unpack to gigabytes is refused before they
    do. A file that is no .npz, or a header numpy cannot read: a ValueError."""
    import zipfile

    from numpy.lib import format as npy

    out = {}
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            for key in FEATURE_KEYS:
                if f"{key}.npy" not in names:
                    continue
                with zf.open(f"{key}.npy") as f:
                    version = npy.read_magic(f)
                    if version not in ((1, 0), (2, 0)):
                        raise ValueError(f"{key} is a .npy of format {version[0]}.{version[1]}")
                    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                    shape, _, dtype = read(f)
                out[key] = (tuple(int(n) for n in shape), dtype)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path} is not a features file ({e}); pass a .npz written by features.py.") from None
    return out


def said_bytes(n: float) -> str:
    """1.5 GiB, 4.0 MiB, 12 KiB: a size as a sentence says it."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{max(1, round(n / 1024))} KiB"


def check_npz_layout(path: Path, headers: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
    """One sentence (ValueError) for a .npz whose headers no probe can use: an array of another kind or rank than
    LAYOUT says, a width, token count or text length over the bounds above, row arrays of different lengths (a
    patch token row would be probed under another image's label), a grid that is not the token count, or arrays
    that would unpack to more than INFLATION times the file's size."""
    for key, (shape, dtype) in headers.items():
        kinds, ndim = LAYOUT[key]
        if dtype.kind not in kinds or len(shape) != ndim:
            want = {"U": "strings", "f": "floats", "iu": "integers"}[kinds]
            raise ValueError(f"{path} is not a features file: its {key} is a {len(shape)}-d array of {dtype} where "
                             f"features.py writes {ndim}-d {want}; pass a .npz written by features.py.")
    text = {k: headers[k][1].itemsize // 4 for k in ("paths", "labels") if k in headers}
    over = [f"{k} of {n} characters" for k, n in text.items() if n > MAX_TEXT]
    over += [f"{k} {n}-wide" for k in ("embeddings", "patch_tokens") if k in headers
             for n in [headers[k][0][-1]] if n > MAX_WIDTH]
    if "patch_tokens" in headers and headers["patch_tokens"][0][1] > MAX_TOKENS:
        over.append(f"{headers['patch_tokens'][0][1]} patch tokens per image")
    if over:
        raise ValueError(f"{path} holds {over[0]} (at most {MAX_TEXT} characters, {MAX_WIDTH} numbers per feature "
                         f"and {MAX_TOKENS} tokens per image are read); pass a .npz written by features.py.")
    empty = [f"{k} 0-wide" for k in ("embeddings", "patch_tokens") if k in headers and 0 in headers[k][0][1:]]
    if empty:  # a probe over zero numbers per image still reports a top-1: chance, under the model's name
        raise ValueError(f"{path} holds {empty[0]} (no numbers per image, nothing a probe can tell classes apart "
                         "by); write it again with features.py.")
    rows = {k: headers[k][0][0] for k in ROWS if k in headers}
    if len(set(rows.values())) > 1:
        said = ", ".join(f"{k} {n}" for k, n in rows.items())
        raise ValueError(f"{path} holds arrays of different lengths ({said}) where each holds one row per image; "
                         "write it again with features.py.")
    if "grid" in headers and headers["grid"][0] != (2,):
        raise ValueError(f"{path} has a grid of {headers['grid'][0][0]} numbers where features.py writes (h, w); "
                         "write it again with features.py.")
    size = sum(int(np.prod(shape, dtype=np.float64)) * dtype.itemsize for shape, dtype in headers.values())
    bound = max(FLOOR_BYTES, INFLATION * path.stat().st_size)
    if size > bound:
        raise ValueError(f"{path} would unpack to {said_bytes(size)} from {said_bytes(path.stat().st_size)} (over "
                         f"{said_bytes(bound)}); features.py stores its arrays uncompressed, so this file is damaged "
                         "or made to exhaust memory: write it again with features.py.")


def load_features(path: str | Path) -> dict:
    """A features file `save_features` wrote (.npz, never unpickled) or its .parquet: {paths, labels, embeddings
    [, patch_tokens, grid]} as NumPy arrays. A file of another kind, or one whose arrays disagree (check_npz_layout,
    from the headers before any data is read): a ValueError that says what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no features file {path}; write one with features.py.")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        t = pq.read_table(path)
        missing = {"path", "label", "embedding"} - set(t.column_names)
        if missing:
            raise ValueError(f"{path} has no {sorted(missing)[0]!r} column; pass a .parquet written by features.py.")
        import pyarrow as pa

        def text(tp) -> bool:  # pandas and polars may write large_string / large_list
            return pa.types.is_string(tp) or pa.types.is_large_string(tp)

        types = {"path": text, "label": text, "embedding": lambda tp: (pa.types.is_list(tp) or pa.types.is_large_list(
            tp)) and pa.types.is_floating(tp.value_type)}
        for col, fits in types.items():
            c = t.column(col)
            wrong = "holds nulls" if col != "embedding" and c.null_count else None if fits(c.type) else f"is {c.type}"
            if wrong:  # a null label would become a class named 'None'; strings or nested lists no width
                want = "strings" if col != "embedding" else "lists of floats"
                raise ValueError(f"{path}: its {col!r} column {wrong} where features.py writes {want}; write it "
                                 "again with features.py.")
        if not len(t):
            raise ValueError(f"{path} holds no rows; extract the features from a folder that holds images.")
        rows = t.column("embedding").to_pylist()
        widths = sorted({len(r) for r in rows if r is not None} | ({0} if None in rows else set()))
        if len(widths) > 1:
            raise ValueError(f"{path} has embeddings of {widths[0]} and {widths[-1]} numbers; every row needs the "
                             "same width, so write it again with features.py.")
        emb = np.array(rows, dtype=np.float32)
        return {"paths": np.array(t.column("path").to_pylist(), dtype=str),
                "labels": np.array(t.column("label").to_pylist(), dtype=str), "embeddings": emb.reshape(len(t), -1)}
    headers = npz_headers(path)
    if not {"paths", "labels", "embeddings"} <= set(headers):
        raise ValueError(f"{path} holds no paths/labels/embeddings arrays; pass a .npz written by features.py.")
    check_npz_layout(path, headers)
    try:
        with np.load(path, allow_pickle=False) as z:  # an object array inside would raise, not run code
            out = {k: z[k] for k in headers}
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path} is not a features file ({e}); pass a .npz written by features.py.") from None
    if "grid" in out and "patch_tokens" in out and (int(np.prod(out["grid"])) != out["patch_tokens"].shape[1]
                                                     or (out["grid"] < 1).any()):  # (-2, -2) is 4 tokens too
        raise ValueError(f"{path} has a {'x'.join(map(str, out['grid']))} grid but {out['patch_tokens'].shape[1]} "
                         "patch tokens per image; write it again with features.py.")
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
