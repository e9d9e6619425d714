"""An anomaly checkpoint's detector for the torch-free predictor, any method: PatchCore and AnomalyDINO as their
feature model and bank (vit/deploy/export.py: `export_patchcore`), Dinomaly as one graph from images to its map.

    checks = export_detector(model, det, staging / "anomaly", batches, "preprocessing.json")  # {"onnx": {...}}

Dinomaly (vit/eval/dinomaly.py) is the frozen encoder's middle blocks, fused, through the bottleneck and the linear-
attention decoder; its map is 1 - cos(encoder group, decoder group) per patch, averaged over the groups. All of it
is exported as one ONNX model, dinomaly.onnx: images (B, C, S, S) -> map (B, h, w) (`DinomalyMap`); the image score,
the mean of the map's top 1% patches, is computed from it with NumPy (vit/deploy/onnx_anomaly.py: `OnnxDinomaly`).
Beside it patchcore.json holds the method, blocks, top share, threshold and grid. Right after it is written the
torch-free scorer's scores and maps on the verification batches must equal `Dinomaly.score`'s within 1e-4
(`check_patchcore`), or the export fails.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from ..eval.dinomaly import Dinomaly
from ..utils.atomic import atomic_write_text
from .export import (
    ONNX_OPSET,
    ExportableClassifier,
    ExportError,
    check_patchcore,
    dynamic_shapes,
    export_patchcore,
    require_onnx,
)
from .onnx_anomaly import SETTINGS, OnnxDinomaly, detector_file
from .openvino_ir import convert_onnx

__all__ = ["DinomalyMap", "export_dinomaly", "export_detector"]


class DinomalyMap(nn.Module):
    """Images (B, C, H, W) -> Dinomaly's map (B, h, w), what an exporter traces. Holds its own copies of the encoder
    (positions always resampled, as ExportableClassifier's) and of the detector, both in eval mode (the bottleneck's
    dropout off)."""

    def __init__(self, model, det: Dinomaly) -> None:
        super().__init__()
        self.model, self.det = ExportableClassifier(model).model, copy.deepcopy(det).float()
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        enc, (h, w) = self.det.encode(self.model, x)  # (B, N, D) per block read
        m = Dinomaly.anomaly_map(*self.det(enc))  # (B, N)
        return m.reshape(m.shape[0], h, w)


@torch.no_grad()
def export_dinomaly(model, det: Dinomaly, out_dir: str | Path, batches: list[torch.Tensor],
                    preprocessing_json: str | Path, atol: float = 1e-4, openvino: bool = False) -> dict:
    """dinomaly.onnx and patchcore.json in `out_dir`, checked against `det.score` on `batches` within `atol`
    (ExportError past it); `openvino`: also dinomaly.xml, checked the same way. -> {"onnx": the check's numbers,
    "openvino": its}."""
    require_onnx()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapper = DinomalyMap(model, det)
    example = batches[0] if len(batches[0]) > 1 else batches[0].repeat(2, 1, 1, 1)  # size 1 would be frozen
    try:
        program = torch.onnx.export(wrapper, (example,), dynamo=True,
                                    dynamic_shapes=dynamic_shapes(wrapper.model, wrapper.model.dynamic_img_size),
                                    input_names=["x"], output_names=["anomaly_map"], opset_version=ONNX_OPSET,
                                    verbose=False)
    except Exception as e:  # the exporter's own failure: one sentence, not its trace
        raise ExportError(f"PyTorch could not export this Dinomaly to ONNX ({str(e).splitlines()[0][:200]}); score "
                          "it with predict.py --checkpoint.") from None
    program.save(str(out_dir / detector_file("dinomaly")))
    grid = list(model.grid_size(tuple(batches[0].shape[-2:])))
    settings = dict(method="dinomaly", layers=list(det.layers), neighbourhood=1, normalize=False,
                    top_share=det.top_share, threshold=det.threshold, grid=grid, groups=[list(g) for g in det.groups],
                    output="anomaly_map (B, h, w): 1 - cos(encoder, decoder) per patch, averaged over the groups; "
                           "score = the mean of the top_share highest patches (the highest when 0)")
    atomic_write_text(out_dir / SETTINGS, json.dumps(settings, indent=1, allow_nan=False))
    res = {"onnx": check_patchcore(OnnxDinomaly(out_dir, preprocessing_json), model, det, batches, atol)}
    if openvino:
        xml = detector_file("dinomaly", "openvino")
        convert_onnx(out_dir / detector_file("dinomaly"), out_dir / xml)
        res["openvino"] = check_patchcore(OnnxDinomaly(out_dir, preprocessing_json, features=xml), model, det,
                                          batches, atol)
    return res


def export_detector(model, det, out_dir: str | Path, batches: list[torch.Tensor], preprocessing_json: str | Path,
                    openvino: bool = False) -> dict:
    """Any method's detector (`vit.eval.dinomaly.load_detector`'s) exported into `out_dir` and checked: Dinomaly
    by `export_dinomaly`, a nearest-neighbour bank by `export_patchcore`. -> {runtime: the check's numbers}."""
    export = export_dinomaly if isinstance(det, Dinomaly) else export_patchcore
    return export(model, det, out_dir, batches, preprocessing_json, openvino=openvino)
