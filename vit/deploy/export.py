"""Ship a classifier to a runtime without this code: ONNX, OpenVINO IR, TorchScript or a `torch.export` program,
each checked against the PyTorch model right after it is written.

    wrapper = ExportableClassifier(model)                  # images (B, 3, H, W) -> logits (B, num_classes)
    path = export_model(wrapper, "onnx", out_dir, example, dynamic_img_size=True)
    run = load_exported(path, "onnx")                      # the exported file, as a function of a tensor
    check = verify(wrapper, run, batches)                  # max |p_exported - p_torch|, top-1 agreement

The batch dimension is always dynamic; height and width too when the model has `dynamic_img_size` (as a
multiple of the pixels per token, `patch_embed.token_step`: the patch size, a hybrid's stem stride times it).
The model's `forward` chooses between its own position table and a resampled one with a Python comparison of the
patch grid against the configured grid; an exporter would freeze that choice at the example's size, so
`ExportableClassifier` always resamples (bicubic, antialiased, as `resample_abs_pos_embed`; at the configured
size the resampling is the identity). ONNX goes through PyTorch's
current exporter (`torch.onnx.export(..., dynamo=True)`) at opset 23, whose `Attention` operator carries
`F.scaled_dot_product_attention` as one node; OpenVINO IR is that ONNX file converted (vit/deploy/openvino_ir.py:
fp32 weights, run with f32 precision), the node becoming OpenVINO's ScaledDotProductAttention. TorchScript is
traced (`torch.jit.trace`): scripting the model would compile the attention layer's error messages, which
TorchScript's compiler does not accept.

A NaFlex model (vit.layers.naflex) goes through `ExportableNaFlexClassifier`: inputs `patches` (B, N, P*P*C),
`patch_coord` (B, N, 2) and `patch_valid` (B, N), batch and sequence length both dynamic. Its positions are
resampled per image by weights read from lookup tables (`NaFlexEmbeds.positions_by_weights`, the same numbers as
the eager per-grid resampling) for grids up to `max_side` patches a side, so no size is read from data.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import key_padding_mask
from ..models.vision_transformer import VisionTransformer
from ..utils.atomic import atomic_write_text
from .openvino_ir import FEATURES_XML, convert_onnx, require_openvino
from .session import open_session

__all__ = ["FORMATS", "ExportError", "ExportableClassifier", "ExportableNaFlexClassifier", "export_model",
           "load_exported", "verify", "preprocessing", "write_preprocessing", "require_onnx", "fingerprint",
           "export_patchcore", "check_patchcore", "dynamic_shapes", "ONNX_OPSET"]

FORMATS = {"onnx": "model.onnx", "openvino": "model.xml", "torchscript": "model.torchscript.pt",
           "exported-program": "model.pt2"}  # openvino: model.xml with its weights in model.bin
ONNX_OPSET = 23  # the first opset with an Attention operator (SDPA as one node)


class ExportError(ValueError):
    """An export that cannot be made or that does not reproduce the PyTorch model; the message says which."""


def require_onnx() -> None:
    """Look for the optional ONNX packages now (without importing them: onnxscript alone takes seconds), so
    that a missing one is one sentence, not a traceback in the middle of an export."""
    missing = [name for name in ("onnx", "onnxruntime", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(f"ONNX export and ONNX Runtime need {', '.join(missing)}, which is not installed; "
                          "run pip install -e '.[export]'.")


class ExportableClassifier(nn.Module):
    """Images (B, C, H, W) -> logits (B, num_classes), with no Python branch on the input's size.

    Holds its own copy of the model (eval mode), whose position step is replaced by one that always resamples
    the position table to the input's patch grid; the weights are shared with nothing, so exporting never
    changes the caller's model."""

    def __init__(self, model: VisionTransformer) -> None:
        super().__init__()
        if getattr(model, "embeds", None) is not None:
            raise ExportError("a NaFlex model reads patch batches, not images of one size: export it with "
                              "vit.deploy.export.ExportableNaFlexClassifier and an example batch (docs/naflex.md).")
        self.model = copy.deepcopy(model)
        self.eval()  # exporters record the mode: dropout and drop-path off
        if self.model.dynamic_img_size:
            self.model._pos_embed = self._pos_embed  # instance attribute: shadows the method in encode()

    def _pos_embed(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """x: (B, h*w, D) patch tokens -> (B, prefix + h*w, D); positions resampled to `grid` always."""
        m = self.model
        p = m.num_pos_prefix
        if m.pos_embed_type == "learn":
            h0, w0 = m.patch_embed.grid_size
            table = m.pos_embed[:, p:].reshape(1, h0, w0, -1).permute(0, 3, 1, 2)  # (1, D, h0, w0)
            table = F.interpolate(table, size=grid, mode="bicubic", antialias=True)  # (1, D, h, w)
            pos = torch.cat([m.pos_embed[:, :p], table.flatten(2).transpose(1, 2)], dim=1)
        else:
            pos = m._sincos(grid).to(x)
        return m.pos_drop(m.add_positions(x, pos))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class ExportableNaFlexClassifier(nn.Module):
    """A NaFlex batch as three tensors -> logits (B, num_classes), with no Python loop over the images' grids.

    Holds its own copy of the model (eval mode) whose per-image positions come from per-axis resampling weights
    for every side up to `max_side` patches (buffers `weights_y`, `weights_x`), and passes the padding mask as
    (B, 1, S, S): ONNX Runtime's Attention kernel does not broadcast the mask's query dimension."""

    def __init__(self, model: VisionTransformer, max_side: int = 64) -> None:
        super().__init__()
        if model.embeds is None:
            raise ExportError("ExportableNaFlexClassifier exports a NaFlex model (built with naflex=...); use "
                              "ExportableClassifier for an image model.")
        if model.rope is not None:
            raise ExportError("a NaFlex model with rotary positions computes its per-image tables in Python; "
                              "export one with a learned position table, or run it in PyTorch.")
        self.model = copy.deepcopy(model)
        self.eval()
        embeds = self.model.embeds
        if embeds.pos_embed is not None or embeds.pos_embed_y is not None:
            wy, wx = embeds.position_weights(max_side)
            self.register_buffer("weights_y", wy, persistent=False)
            self.register_buffer("weights_x", wx, persistent=False)
            embeds.positions = lambda coord, valid: embeds.positions_by_weights(coord, valid, self.weights_y,
                                                                                self.weights_x)

    def forward(self, patches: torch.Tensor, patch_coord: torch.Tensor, patch_valid: torch.Tensor) -> torch.Tensor:
        mask = key_padding_mask(patch_valid, self.model.num_prefix_tokens)  # (B, 1, 1, S)
        mask = mask.expand(-1, -1, mask.shape[-1], -1)  # (B, 1, S, S)
        batch = {"patches": patches, "patch_coord": patch_coord, "patch_valid": patch_valid}
        return self.model(batch, attn_mask=mask)


def dynamic_shapes(model: VisionTransformer, dynamic_img_size: bool) -> dict:
    dims = {0: torch.export.Dim("batch", min=1, max=65536)}
    if dynamic_img_size:  # sides as whole numbers of tokens, so the exporter knows they tile exactly (a hybrid's
        # token is its stem's stride times the patch size)
        sh, sw = model.patch_embed.token_step
        dims[2] = sh * torch.export.Dim("grid_h", min=1, max=1024)
        dims[3] = sw * torch.export.Dim("grid_w", min=1, max=1024)
    return {"x": dims}


def export_model(wrapper: ExportableClassifier | ExportableNaFlexClassifier, fmt: str, out_dir: str | Path,
                 example: torch.Tensor | dict[str, torch.Tensor]) -> Path:
    """Write `wrapper` in format `fmt` into `out_dir` (file name from FORMATS) and return its path. A NaFlex
    wrapper's example is a batch dict (its inputs are named as its keys)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FORMATS[fmt]
    tmp = path.with_name(f".tmp-{path.name}")  # renamed into place once complete: a failed export loses nothing
    if isinstance(wrapper, ExportableNaFlexClassifier):
        args, names, dynamic = _naflex_inputs(example)
    else:
        stem = getattr(wrapper.model.patch_embed, "stem", None)
        if fmt == "exported-program" and wrapper.model.dynamic_img_size and getattr(stem, "kind", "") == "resnetv2":
            raise ExportError("a resnetv2 stem's 'same' padding is computed with math.ceil of the input size, which "
                              "a torch.export program cannot save at dynamic sizes; export onnx or torchscript, or "
                              "build the model without dynamic_img_size.")
        dynamic = dynamic_shapes(wrapper.model, wrapper.model.dynamic_img_size)
        if example.shape[0] < 2:  # exporters treat a size-1 dimension as the constant 1: trace a batch of two
            example = example.repeat(2, 1, 1, 1)
        args, names = (example,), ["x"]
    with torch.no_grad():
        if fmt in ("onnx", "openvino"):  # OpenVINO IR: the ONNX file converted
            require_onnx()
            if fmt == "openvino":
                require_openvino()
            program = torch.onnx.export(wrapper, args, dynamo=True, dynamic_shapes=dynamic,
                                        input_names=names, output_names=["logits"], opset_version=ONNX_OPSET,
                                        verbose=False)
            program.save(str(tmp.with_suffix(".onnx")))
        elif fmt == "torchscript":
            torch.jit.save(torch.jit.trace(wrapper, args, check_trace=False), str(tmp))
        else:
            torch.export.save(torch.export.export(wrapper, args, dynamic_shapes=dynamic), str(tmp))
    if fmt == "openvino":
        try:
            return convert_onnx(tmp.with_suffix(".onnx"), path)  # written atomically, model.bin first
        finally:
            tmp.with_suffix(".onnx").unlink(missing_ok=True)
    tmp.replace(path)
    return path


def _naflex_inputs(example: dict[str, torch.Tensor]) -> tuple[tuple, list[str], dict]:
    """A NaFlex example batch -> the exporter's arguments, input names and dynamic (batch, sequence) dims."""
    if not isinstance(example, dict):
        raise ExportError("a NaFlex model is exported from an example batch dict (patches, patch_coord, "
                          "patch_valid), not from images.")
    names = ["patches", "patch_coord", "patch_valid"]
    args = tuple(example[k] for k in names)
    if args[0].shape[0] < 2:  # exporters treat a size-1 dimension as the constant 1: trace a batch of two
        args = tuple(a.repeat(2, *([1] * (a.dim() - 1))) for a in args)
    batch, seq = torch.export.Dim("batch", min=1, max=65536), torch.export.Dim("seq", min=1, max=1 << 20)
    return args, names, {k: {0: batch, 1: seq} for k in names}


def load_exported(path: str | Path, fmt: str):
    """The exported file as a function: float32 images (B, C, H, W) tensor -> logits tensor, on the CPU; for a
    NaFlex model, a batch dict -> logits."""
    path = str(path)
    if fmt in ("onnx", "openvino"):  # a .xml opens on OpenVINO's CPU runtime (vit/deploy/session.py)
        require_onnx() if fmt == "onnx" else require_openvino()
        session = open_session(path)
        name = session.get_inputs()[0].name

        def run_onnx(x: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
            feed = {k: v.numpy() for k, v in x.items()} if isinstance(x, dict) else {name: x.numpy()}
            return torch.from_numpy(session.run(None, feed)[0])

        return run_onnx
    if fmt == "torchscript":
        with warnings.catch_warnings():  # TorchScript is deprecated upstream, still what many runtimes load
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(path)
    else:
        module = torch.export.load(path).module()

    def run(x: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            return module(*(x[k] for k in ("patches", "patch_coord", "patch_valid"))) if isinstance(x, dict) \
                else module(x)

    return run


@torch.no_grad()
def verify(reference: nn.Module, run, batches: list[torch.Tensor], atol: float = 1e-4) -> dict:
    """Run the exported model and the PyTorch one on each batch: the largest absolute difference of the softmax
    probabilities, and how many images get a different top-1 class. Raises ExportError past `atol`."""
    reference.eval()
    worst, differ, n, shapes = 0.0, 0, 0, []
    for x in batches:
        p_ref, p_exp = reference(x).softmax(-1), run(x).float().softmax(-1)
        # NaN compares false, so max() and != alone would certify a NaN model as exact
        if not torch.isfinite(p_ref).all():
            raise ExportError("the PyTorch model's outputs are not finite (NaN or inf) on the verification images; "
                              "its weights are broken: export a checkpoint that evaluates to finite numbers.")
        if not torch.isfinite(p_exp).all():
            raise ExportError("the exported model's outputs are not finite (NaN or inf) where PyTorch's are; "
                              "it must not be used.")
        worst = max(worst, float((p_ref - p_exp).abs().max()))
        differ += int((p_ref.argmax(-1) != p_exp.argmax(-1)).sum())
        n += len(x)
        shapes.append(list(x.shape))
    res = dict(max_abs_prob_diff=worst, top1_disagreements=differ, images=n, input_shapes=shapes, atol=atol)
    if worst > atol or differ:
        raise ExportError(f"the exported model differs from the PyTorch model (max |p| difference {worst:.2e}, "
                          f"{differ} different top-1 of {n}); it must not be used.")
    return res


def fingerprint(model: nn.Module) -> str:
    """sha256 of the weights (names, dtypes, shapes, bytes): which model an exported file was verified for."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # 0-dim too (BN counts)
    return h.hexdigest()


def preprocessing(model: VisionTransformer, aug, classes: list[str], threshold: float | None = None) -> dict:
    """What a runtime must do to an image before the exported model sees it, and with its logits: timm's
    pretrained_cfg keys; `steps`, every step `vit.data.transforms` runs for evaluation, stated so that it can be
    reproduced without this code (vit/deploy/preprocess.py is such a reproduction, tested equal to ours); and the
    head: `label_names`, `problem_type` (Hugging Face's name) and, for a multi-label model (`threshold` given:
    `vit.eval.multilabel.decision_threshold`), the probability from which a class is predicted."""
    aug = aug.resolved()
    ph, pw = model.patch_embed.patch_size
    chans = model.in_chans
    size = model.patch_embed.img_size[0]
    resize = int(round(size / aug.eval_crop_pct))
    flt = "INTER_CUBIC" if aug.interpolation == "bicubic" else "INTER_LINEAR"
    steps = [
        dict(step="decode", library="opencv", call="cv2.imdecode (libjpeg-turbo)", applies_to=
             "a complete JPEG (bytes start FF D8 FF and end FF D9)", exif_orientation="applied", output="RGB uint8",
             reduced_size_decoding="libjpeg DCT scaling (cv2.IMREAD_REDUCED_COLOR_r; PIL: Image.draft) by r, the "
             "largest of 8, 4, 2 with floor(w / r) >= w * s and floor(h / r) >= h * s where s = "
             f"{resize} / min(w, h); else r = 1"),
        dict(step="decode", library="pillow", applies_to="every other file, and a JPEG OpenCV refuses (decoded "
             "with Image.draft at the same r)", exif_orientation="applied (ImageOps.exif_transpose)",
             output="RGB uint8: 16-bit grey x / 65535 * 255 + 0.5 truncated, transparency composited over white, "
                    "palette and grey converted with Image.convert('RGB')"),
        dict(step="resize", library="opencv", call="cv2.resize", filter=flt, shorter_side=resize,
             longer_side=f"int({resize} * longer / shorter), truncated", note="no antialiasing beyond the filter"),
        dict(step="center_crop", size=[size, size], offset="int(round((side - crop) / 2)), round half to even"),
        *([dict(step="to_grey", library="opencv", call="cv2.cvtColor(COLOR_RGB2GRAY)",
                formula="0.299 R + 0.587 G + 0.114 B, rounded to uint8")] if chans == 1 else []),
        dict(step="normalize", formula="(v - 255 * mean) / (255 * std), float64 then float32", mean=list(aug.mean),
             std=list(aug.std)),
        dict(step="layout", channel_order="RGB" if chans == 3 else "grey", layout="NCHW", dtype="float32",
             input_name="x"),
    ]
    return dict(
        input_size=[chans, *model.patch_embed.img_size],
        mean=list(aug.mean), std=list(aug.std), interpolation=aug.interpolation, crop_pct=aug.eval_crop_pct,
        crop_mode="center", resize=f"shorter side to {resize} (round(input_size / crop_pct)), then a center crop",
        steps=steps, reference="vit/deploy/preprocess.py (NumPy, Pillow, OpenCV; no torch)",
        dynamic_img_size=bool(model.dynamic_img_size), patch_size=[ph, pw],
        input_multiple=list(model.patch_embed.token_step), input_name="x", output_name="logits",
        output="logits (B, num_classes); " + ("softmax gives the probabilities" if threshold is None else
                                               "a sigmoid per class gives the probabilities; a class is predicted "
                                               "where it is at or above threshold"),
        num_classes=len(classes), label_names=list(classes),
        problem_type="single_label_classification" if threshold is None else "multi_label_classification",
        **({} if threshold is None else {"threshold": float(threshold)}),
    )


def write_preprocessing(out_dir: str | Path, info: dict) -> Path:
    path = Path(out_dir) / "preprocessing.json"
    atomic_write_text(path, json.dumps(info, indent=1))
    return path


@torch.no_grad()
def export_patchcore(model: VisionTransformer, pc, out_dir: str | Path, batches: list[torch.Tensor],
                     preprocessing_json: str | Path, atol: float = 1e-4, openvino: bool = False) -> dict:
    """An anomaly checkpoint's PatchCore (`vit.eval.anomaly`) for the torch-free predictor, in `out_dir`:
    features.onnx, a separate model from images to the patch features the bank holds (B, h*w, F), whose first
    output is that; bank.npy, the bank as a plain float32 array; patchcore.json, its settings with the grid. The
    scores of vit/deploy/onnx_anomaly.py on `batches` (read with `preprocessing_json`, the classifier's) must
    equal PatchCore.score's within `atol`, else ExportError. `openvino`: also features.xml (its OpenVINO IR), checked
    the same way. -> {"onnx": the check's numbers, "openvino": its}."""
    import numpy as np

    from ..eval.anomaly import PatchFeatures
    from .onnx_anomaly import BANK_NPY, FEATURES_ONNX, SETTINGS, OnnxPatchCore

    require_onnx()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    features = PatchFeatures(ExportableClassifier(model).model, pc.layers, pc.neighbourhood, pc.normalize).eval()
    example = batches[0] if len(batches[0]) > 1 else batches[0].repeat(2, 1, 1, 1)  # size 1 would be frozen
    dynamic = dynamic_shapes(features.model, features.model.dynamic_img_size)
    program = torch.onnx.export(features, (example,), dynamo=True, dynamic_shapes=dynamic, input_names=["x"],
                                output_names=["patch_features"], opset_version=ONNX_OPSET, verbose=False)
    program.save(str(out_dir / FEATURES_ONNX))
    with open(out_dir / BANK_NPY, "wb") as f:
        np.save(f, pc.bank.numpy().astype(np.float32), allow_pickle=False)
    grid = list(model.grid_size(tuple(batches[0].shape[-2:])))
    settings = dict(method=pc.method, layers=list(pc.layers), neighbourhood=pc.neighbourhood,
                    normalize=pc.normalize, top_share=pc.top_share, threshold=pc.threshold, grid=grid,
                    bank_size=len(pc.bank), output="patch_features (B, h*w, F); score = the mean of the top_share "
                    "highest patches' distances to their nearest bank row (the highest when 0)")
    atomic_write_text(out_dir / SETTINGS, json.dumps(settings, indent=1))
    res = {"onnx": check_patchcore(OnnxPatchCore(out_dir, preprocessing_json), model, pc, batches, atol)}
    if openvino:  # features.xml, the same feature model converted, checked the same way on OpenVINO
        convert_onnx(out_dir / FEATURES_ONNX, out_dir / FEATURES_XML)
        scorer = OnnxPatchCore(out_dir, preprocessing_json, features=FEATURES_XML)
        res["openvino"] = check_patchcore(scorer, model, pc, batches, atol)
    return res


@torch.no_grad()
def check_patchcore(scorer, model: VisionTransformer, pc, batches: list[torch.Tensor], atol: float = 1e-4) -> dict:
    """The exported scorer's (vit.deploy.onnx_anomaly's OnnxPatchCore or OnnxDinomaly) image scores and patch maps
    on `batches` against the PyTorch detector's `score` (PatchCore's, Dinomaly's): ExportError past `atol`, else the
    check's numbers."""
    import numpy as np

    worst, worst_map, n = 0.0, 0.0, 0
    for x in batches:
        if tuple(x.shape[-2:]) != tuple(batches[0].shape[-2:]):
            continue  # the detector's grid is the checkpoint's: other sizes are the classifier's check only
        ref, ref_map = pc.score(model, x)
        got, got_map = scorer.score(x.numpy())
        if not (np.isfinite(got).all() and torch.isfinite(ref).all()):
            raise ExportError("the anomaly scores are not finite (NaN or inf); the detector or the model is broken.")
        worst, n = max(worst, float(np.abs(got - ref.double().numpy()).max())), n + len(x)
        worst_map = max(worst_map, float(np.abs(got_map - ref_map.double().numpy()).max()))
    if max(worst, worst_map) > atol:
        raise ExportError(f"the exported anomaly scorer ({scorer.features.name}) differs from PyTorch's by "
                          f"{max(worst, worst_map):.2e} (> {atol:g}); it must not be used.")
    return dict(max_abs_score_diff=worst, max_abs_map_diff=worst_map, images=n, atol=atol, file=str(scorer.features))
