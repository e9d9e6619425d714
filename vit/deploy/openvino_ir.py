"""OpenVINO IR beside the ONNX export: the same model converted (model.xml + model.bin), and a CPU session with
ONNX Runtime's calling shape, so the torch-free predictor (`onnx_predict`, `onnx_anomaly`) runs either file.

    xml = convert_onnx("exported/model.onnx", "exported/model.xml")   # fp32, weights not compressed to fp16
    session = open_openvino(xml, threads=1)                           # .get_inputs(), .get_outputs(), .run()
    logits = session.run(None, {"x": images})[0]                      # (B, num_classes) float32

The IR is `openvino.convert_model` of the verified ONNX file saved with `compress_to_fp16=False`: the weights stay
float32, as in model.onnx. The CPU plugin is compiled with INFERENCE_PRECISION_HINT f32: on a processor with
AMX or AVX512-BF16 its default is bfloat16, which moves a tiny ViT's logits by ~1e-3 (measured here), past the
1e-4 every export is checked to. Imports the standard library only; openvino when a model is converted or opened.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["OPENVINO_FILE", "OPENVINO_INT8_FILE", "FEATURES_XML", "require_openvino", "weights_of", "ir_bytes",
           "convert_onnx", "open_openvino", "OpenVinoSession"]

OPENVINO_FILE, OPENVINO_INT8_FILE = "model.xml", "model.int8.xml"  # each with its .bin beside it
FEATURES_XML = "features.xml"  # an anomaly checkpoint's feature model, in anomaly/ beside features.onnx


def require_openvino(what: str = "OpenVINO export and prediction") -> None:
    """One sentence (ValueError) when the openvino package is missing, found without importing it."""
    if importlib.util.find_spec("openvino") is None:
        raise ValueError(f"{what} needs the openvino package, which is not installed; run pip install -e "
                         "'.[openvino]' (or pip install openvino).")


def weights_of(xml: str | Path) -> Path:
    """The .bin an IR's .xml reads its weights from (same folder, same stem)."""
    return Path(xml).with_suffix(".bin")


def ir_bytes(xml: str | Path) -> int:
    """Size of an IR on disk: its .xml and .bin together."""
    return Path(xml).stat().st_size + weights_of(xml).stat().st_size


def convert_onnx(onnx: str | Path, xml: str | Path) -> Path:
    """`onnx` converted to OpenVINO IR at `xml` (+ .bin), float32 weights. Written under temporary names and
    renamed into place, the .bin first, so an .xml is never seen beside another model's weights."""
    require_openvino()
    import openvino as ov

    xml = Path(xml)
    tmp = xml.with_name(f".tmp-{xml.name}")
    try:
        model = ov.convert_model(str(onnx))
    except Exception as e:  # the frontend's own errors (an operator it does not know): one sentence
        raise ValueError(f"OpenVINO cannot convert {onnx}: {str(e).strip().splitlines()[0][:300]}") from None
    ov.save_model(model, str(tmp), compress_to_fp16=False)
    weights_of(tmp).replace(weights_of(xml))
    tmp.replace(xml)
    return xml


class _Port:
    """An input or output as ONNX Runtime describes one: `name`, and `shape` with ints where fixed and None where
    dynamic."""

    def __init__(self, port) -> None:
        self.name = port.get_any_name()
        self.shape = [d.get_length() if d.is_static else None for d in port.get_partial_shape()]


def shared_core():
    """One openvino.Core for the process: every session compiles through it (a Core per session loads the CPU
    plugin again each time, and their teardown beside ONNX Runtime and torch crashed the test suite)."""
    global _CORE
    if _CORE is None:
        import openvino as ov

        _CORE = ov.Core()
    return _CORE


_CORE = None


class OpenVinoSession:
    """An IR compiled for OpenVINO's CPU plugin, called as an `onnxruntime.InferenceSession` is:
    get_inputs(), get_outputs(), run(None, {name: array}) -> [arrays in output order]."""

    def __init__(self, xml: str | Path, threads: int = 0) -> None:
        require_openvino()
        core = shared_core()
        config = {"INFERENCE_PRECISION_HINT": "f32"}  # not the bf16 default of AMX CPUs: see the module docstring
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        self.compiled = core.compile_model(core.read_model(str(xml)), "CPU", config)
        self.request = self.compiled.create_infer_request()

    def get_inputs(self) -> list[_Port]:
        return [_Port(p) for p in self.compiled.inputs]

    def get_outputs(self) -> list[_Port]:
        return [_Port(p) for p in self.compiled.outputs]

    def run(self, output_names, feed: dict) -> list:
        """Like InferenceSession.run: `output_names` None for every output; the arrays are copies, not views of
        the request's buffers (the next call would overwrite those)."""
        result = self.request.infer(feed)
        ports = self.compiled.outputs if output_names is None else [self.compiled.output(n) for n in output_names]
        return [result[p].copy() for p in ports]


def open_openvino(xml: str | Path, threads: int = 0) -> OpenVinoSession:
    """An OpenVinoSession for `xml`; its .bin missing or either file unreadable is one sentence (ValueError)."""
    xml = Path(xml)
    if not weights_of(xml).is_file():
        raise ValueError(f"{xml} has no {weights_of(xml).name} beside it (the IR's weights); export it again with "
                         "export.py --format openvino.")
    try:
        return OpenVinoSession(xml, threads)
    except ValueError:
        raise
    except Exception as e:  # OpenVINO's own errors (not an IR, truncated weights)
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]  # OpenVINO's cause is on the last
        raise ValueError(f"OpenVINO cannot load {xml} ({(lines[-1] if lines else type(e).__name__)[:300]}); export "
                         "it again with export.py --format openvino.") from None
