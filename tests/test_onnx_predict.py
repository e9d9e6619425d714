"""predict.py --onnx, run where `import torch` fails, writes predict.py's rows: the same files in the same order,
the same top-1, probabilities within 1e-4 (sigmoids and the labels column for a multi-label model); unreadable
files in skipped.csv as predict.py lists them; a tampered preprocessing.json, a decompression bomb or a model
that does not fit its preprocessing is one sentence."""

import csv
import io
import json
import os
import re
import resource
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, import_script, peaked_checkpoint, run_script
from PIL import Image

import vit
from vit.config import AugConfig
from vit.deploy.export import preprocessing
from vit.deploy.preprocess import ReferencePreprocessing

TINY = ["--model.img_size=32", "--model.embed_dim=32", "--model.depth=1", "--model.num_heads=2",
        "--model.mlp_ratio=2", "--model.in_chans=3", "--aug.mean=[0.485,0.456,0.406]",
        "--aug.std=[0.229,0.224,0.225]", "--aug.eval_crop_pct=0.875", "--aug.interpolation=bicubic"]

NO_TORCH = '''import importlib.abc, sys
class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "timm", "accelerate", "torchvision", "yaml"):
            raise ImportError(f"{name} is not installed here (test shim)")
sys.meta_path.insert(0, _Refuse())
'''


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("onnx")
    peaked_checkpoint(tmp / "ck", TINY)  # peaked probabilities: a 1e-4 comparison then means something
    assert import_script("export").main(["--checkpoint", str(tmp / "ck"), "--out", str(tmp / "exp")]) == 0
    rng = np.random.default_rng(0)
    imgs = tmp / "imgs"
    imgs.mkdir()
    for i, (h, w) in enumerate([(480, 640), (37, 53), (120, 90), (64, 64)]):
        a = np.clip(rng.normal(128, 60, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(a).save(imgs / f"{i}.jpg", quality=90)
        Image.fromarray(a[..., 0]).save(imgs / f"{i}_grey.png")
    (imgs / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    return tmp


@pytest.mark.slow
def test_onnx_predictor_without_torch_equals_predict(exported, tmp_path):
    ours = tmp_path / "torch"
    assert import_script("predict").main(["--checkpoint", str(exported / "ck"), str(exported / "imgs"),
                                          "--out", str(ours), "--topk", "3"]) == 0
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(NO_TORCH)
    probe = run_script("-c", "import torch", env={"PYTHONPATH": f"{shim}:{ROOT}"})
    assert probe.returncode != 0 and "test shim" in probe.stderr  # the shim works
    onnx = tmp_path / "onnx"
    r = run_script("predict.py", "--onnx", str(exported / "exp" / "model.onnx"), str(exported / "imgs"),
                   "--out", str(onnx), "--topk", "3", env={"PYTHONPATH": f"{shim}:{ROOT}"})
    assert r.returncode == 0, r.stderr
    a, b = _rows(ours / "predictions.csv"), _rows(onnx / "predictions.csv")
    assert len(a) == 8 and [x["path"] for x in a] == [x["path"] for x in b]
    assert [x["pred1"] for x in a] == [x["pred1"] for x in b]
    assert [x["pred1_name"] for x in a] == [x["pred1_name"] for x in b]
    probs = [(float(x[f"prob{k}"]), float(y[f"prob{k}"])) for x, y in zip(a, b) for k in (1, 2, 3)]
    assert max(abs(p - q) for p, q in probs) <= 1e-4
    assert max(p for p, _ in probs) > 0.5  # peaked: the comparison is not between near-uniform rows
    assert [x["path"] for x in _rows(ours / "skipped.csv")] == [x["path"] for x in _rows(onnx / "skipped.csv")]
    assert any(x["path"].endswith("broken.jpg") for x in _rows(onnx / "skipped.csv"))


def test_onnx_predictor_errors_are_one_sentence(tmp_path):
    r = run_script("predict.py", "--onnx", str(tmp_path / "none.onnx"), str(tmp_path), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "does not exist" in r.stderr
    (tmp_path / "model.onnx").write_bytes(b"not onnx")
    (tmp_path / "a.png").write_bytes(b"")
    r = run_script("predict.py", "--onnx", str(tmp_path / "model.onnx"), str(tmp_path / "a.png"))
    assert r.returncode == 2 and "preprocessing.json" in r.stderr and "Traceback" not in r.stderr
    r = run_script("predict.py", "--onnx", str(tmp_path / "model.onnx"), "--cam", str(tmp_path / "a.png"))
    assert r.returncode == 2 and "--cam with --onnx draws an anomaly export's heat maps, and" in r.stderr
    assert r.stderr.count("\n") == 1


# A hand-built ONNX classifier (no exporter: milliseconds): logits = x.reshape(N, 3 * 32 * 32) @ W, its sides
# symbolic, so a crop it cannot take fails inside ONNX Runtime, not at loading.
def linear_onnx(path, k: int = 4, size: int = 32) -> np.ndarray:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).normal(0, 0.05, (3 * size * size, k)).astype(np.float32)  # (3 S S, K)
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["logits"])],
        "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", k])],
        [numpy_helper.from_array(np.array([-1, 3 * size * size], np.int64), "shape"), numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return w


def bomb_png(path, side: int = 16000) -> None:
    """A grey PNG of side x side zero pixels, ~250 KB on disk, written row by row (never held whole)."""
    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    z, row = zlib.compressobj(9), b"\0" * (side + 1)  # filter byte + pixels
    idat = b"".join([z.compress(row) for _ in range(side)] + [z.flush()])
    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
                           + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    """(folder with model.onnx + preprocessing.json + g0.png, g1.png, bomb.png, W): a 4-class RGB model."""
    tmp = tmp_path_factory.mktemp("linear")
    w = linear_onnx(tmp / "model.onnx")
    model = vit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2,
                             num_classes=4)
    aug = AugConfig(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25], interpolation="bicubic", eval_crop_pct=0.875)
    info = preprocessing(model, aug, list("abcd"))
    del info["problem_type"]  # the file of an export that predates the key: it must load as single-label
    (tmp / "preprocessing.json").write_text(json.dumps(info))
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (50, 60, 3), dtype=np.uint8)).save(tmp / f"g{i}.png")
    bomb_png(tmp / "bomb.png")
    return tmp, w


def _copy(linear, tmp_path, **changes) -> Path:
    """model.onnx beside a preprocessing.json with `changes` (a key -> value; 'step:name' -> that step's fields)."""
    src, _ = linear
    info = json.loads((src / "preprocessing.json").read_text())
    for key, value in changes.items():
        if key.startswith("step:"):
            step = next(s for s in info["steps"] if s["step"] == key[5:])
            step.update(value)
        else:
            info[key] = value
    (tmp_path / "m").mkdir()
    os.symlink(src / "model.onnx", tmp_path / "m" / "model.onnx")
    (tmp_path / "m" / "preprocessing.json").write_text(json.dumps(info))
    return tmp_path / "m" / "model.onnx"


def _onnx(model, *args, capsys) -> tuple[int, str]:
    code = import_script("predict").run_onnx(["--onnx", str(model), *map(str, args)])
    return code, capsys.readouterr().err


def _expected(linear, images, sig: bool = False) -> np.ndarray:
    """The oracle: the reference preprocessing, then x @ W and a softmax / sigmoid in float64."""
    src, w = linear
    pre = ReferencePreprocessing.from_file(src / "preprocessing.json")
    z = np.stack([pre.load(p) for p in images]).reshape(len(images), -1).astype(np.float64) @ w
    return 1 / (1 + np.exp(-z)) if sig else np.exp(z) / np.exp(z).sum(1, keepdims=True)


def test_a_file_without_problem_type_is_single_label_and_a_multi_label_one_gives_sigmoids_and_labels(linear, tmp_path,
                                                                                                       capsys):
    src, _ = linear
    imgs = [src / "g0.png", src / "g1.png"]
    assert _onnx(src / "model.onnx", *imgs, "--out", tmp_path / "s", capsys=capsys)[0] == 0  # written before the key
    rows = _rows(tmp_path / "s" / "predictions.csv")
    probs = np.array([[float(r[f"prob{k}"]) for k in range(1, 5)] for r in rows])
    ref = np.sort(_expected(linear, imgs), 1)[:, ::-1]
    assert "labels" not in rows[0] and np.abs(probs - ref).max() < 1e-5 and probs.max() > 0.5

    model = _copy(linear, tmp_path, problem_type="multi_label_classification", threshold=0.4)
    assert _onnx(model, *imgs, "--out", tmp_path / "m1", capsys=capsys)[0] == 0
    rows = _rows(tmp_path / "m1" / "predictions.csv")
    sig = _expected(linear, imgs, sig=True)
    got = np.array([[float(r[f"prob{k}"]) for k in range(1, 5)] for r in rows])
    assert np.abs(got - np.sort(sig, 1)[:, ::-1]).max() < 1e-5
    assert [r["labels"] for r in rows] == [" ".join("abcd"[j] for j in np.flatnonzero(p >= 0.4)) for p in sig]
    assert 0 < sum(len(r["labels"].split()) for r in rows) < 8  # the threshold chose: not all, not none
    assert _onnx(model, *imgs, "--out", tmp_path / "m2", "--threshold", "0.9", capsys=capsys)[0] == 0
    assert [r["labels"] for r in _rows(tmp_path / "m2" / "predictions.csv")] == [
        " ".join("abcd"[j] for j in np.flatnonzero(p >= 0.9)) for p in sig]
    code, err = _onnx(src / "model.onnx", *imgs, "--out", tmp_path / "s2", "--threshold", "0.5", capsys=capsys)
    assert code == 2 and "--threshold is for multi-label models" in err


@pytest.mark.parametrize("changes, match", [
    (dict(std=[0.25, 0.25, 0.0], **{"step:normalize": dict(std=[0.25, 0.25, 0.0])}), "std .* at or below 0"),
    ({"step:normalize": dict(mean=[0.5, 0.5])}, "not a list of 1 or 3 finite numbers"),
    ({"step:normalize": dict(mean=[0.5, float("nan"), 0.5])}, "not a list of 1 or 3 finite numbers"),
    ({"step:normalize": dict(std=[0.25])}, "3 mean.* but 1 std"),
    ({"step:center_crop": dict(size=[0, 0])}, "crop size is 0, not a whole number of pixels from 1 to 8192"),
    ({"step:resize": dict(shorter_side=10**6)}, "resize .* is 1000000, not a whole number of pixels from 32 to"),
    ({"step:resize": dict(shorter_side=16)}, "resize .* is 16, not a whole number of pixels from 32 to"),
    (dict(interpolation="lanczos"), "interpolation 'lanczos' is not one of bicubic, bilinear"),
    (dict(steps=[{"step": "sharpen"}]), "step.*'sharpen' are not ones this predictor runs"),
    (dict(problem_type="regression"), "problem_type 'regression' is not one of"),
    (dict(problem_type="multi_label_classification", threshold=1.5), "threshold is 1.5, not a probability"),
    (dict(problem_type="multi_label_classification", threshold=1), "threshold is 1, not a probability"),  # no class
    (dict(label_names=list("abcde"), num_classes=5), "model.onnx gives 4 outputs per image but preprocessing.json "
                                                     "names 5 classes"),
    ({"step:center_crop": dict(size=[40, 40]), "step:resize": dict(shorter_side=46), "input_size": [3, 40, 40]},
     "ONNX Runtime cannot run model.onnx on input \\(2, 3, 40, 40\\)"),

    # every field the predictor could be read to follow agrees with what it does, else one sentence
    (dict(std=[1e-320] * 3, **{"step:normalize": dict(std=[1e-320] * 3)}), "std .* under 1e-06"),  # inf, then NaN
    ({"step:layout": dict(channel_order="BGR")}, "layout step's channel_order 'BGR' is not 'RGB'"),
    ({"step:layout": dict(layout="NHWC")}, "layout step's layout 'NHWC' is not 'NCHW'"),
    ({"step:resize": dict(filter="INTER_LINEAR")}, "filter 'INTER_LINEAR' differs from interpolation 'bicubic'"),
    (dict(input_size=[3, 64, 64]), "input_size \\[3, 64, 64\\] differs from the 3 channel"),
    (dict(steps=[{"step": "resize", "shorter_side": 64}]), "the resize step comes more than once"),
    (dict(label_names=list("abca")), "has a repeated or blank name"),
    (dict(label_names=["a", "b", " ", "d"]), "has a repeated or blank name"),
])
def test_a_tampered_preprocessing_json_is_one_sentence(linear, tmp_path, capsys, changes, match):
    if "steps" in changes:  # an unknown step beside the real ones
        changes["steps"] = json.loads((linear[0] / "preprocessing.json").read_text())["steps"] + changes["steps"]
    model = _copy(linear, tmp_path, **changes)
    code, err = _onnx(model, linear[0] / "g0.png", linear[0] / "g1.png", "--out", tmp_path / "o", capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(match, err), err
    assert not (tmp_path / "o" / "predictions.csv").exists()


def test_a_preprocessing_json_that_is_no_regular_file_or_too_large_is_named_so(linear, tmp_path, capsys):
    model = _copy(linear, tmp_path)
    pre = model.parent / "preprocessing.json"
    img = linear[0] / "g0.png"
    for make, match in ((lambda: os.mkfifo(pre), "is not a regular file"),  # never waits for a writer
                        (lambda: os.symlink("/dev/zero", pre), "is not a regular file"),  # never read
                        (lambda: pre.write_text(" " * (2**20 + 1) + "{}"), "1048579 bytes, over the 1048576"),
                        (lambda: pre.write_text("[1, 2]"), "holds a JSON list"),
                        (lambda: pre.mkdir(), "is not a regular file"),  # os.fdopen raised IsADirectoryError
                        (lambda: None, "does not exist")):
        pre.rmdir() if pre.is_dir() and not pre.is_symlink() else pre.unlink(missing_ok=True)
        make()
        code, err = _onnx(model, img, "--out", tmp_path / "o", capsys=capsys)
        assert code == 2 and err.count("\n") == 1 and match in err, err
    os.mkfifo(tmp_path / "fifo.onnx")  # the model itself: stat'ed, never opened
    code, err = _onnx(tmp_path / "fifo.onnx", img, "--out", tmp_path / "o", capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "fifo.onnx is not a regular file" in err, err


def test_a_decompression_bomb_is_one_line_and_the_other_images_keep_their_rows_under_a_memory_limit(linear, tmp_path):
    """The same call under RLIMIT_AS = its own peak without the bomb + 512 MiB: the 16000 x 16000 PNG (250 KB, ~1 GB
    to decode) is refused from its header, the two good images get their rows. Also: the run imported no torch,
    PyYAML or vit.config."""
    src, _ = linear
    probe = ("import runpy, sys; sys.argv = ['predict.py'] + sys.argv[1:]\n"
             "try: runpy.run_path('predict.py', run_name='__main__')\n"
             "except SystemExit as e: code = e.code\n"
             "print(open('/proc/self/status').read().split('VmPeak:')[1].split()[0], code, sorted(m for m in "
             "sys.modules if m.split('.')[0] in ('torch', 'yaml', 'timm', 'accelerate') or m == 'vit.config'))")

    def run(images, out, limit=None):
        def cap():
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        return subprocess.run([sys.executable, "-c", probe, "--onnx", str(src / "model.onnx"), *map(str, images),
                               "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                              env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"]}, preexec_fn=limit and cap)

    good = [src / "g0.png", src / "g1.png"]
    r = run(good, tmp_path / "a")
    peak_kb, code, heavy = r.stdout.splitlines()[-1].split(maxsplit=2)
    assert code == "0" and heavy.strip() == "[]", r.stdout + r.stderr
    r = run([good[0], src / "bomb.png", good[1]], tmp_path / "b", limit=(int(peak_kb) + 512 * 1024) * 1024)
    assert r.stdout.splitlines()[-1].split()[1] == "0", r.stdout + r.stderr[-2000:]
    assert [x["path"] for x in _rows(tmp_path / "b" / "predictions.csv")] == [str(p) for p in good]
    (skip,) = _rows(tmp_path / "b" / "skipped.csv")
    assert skip["path"] == str(src / "bomb.png") and "16000x16000 pixels would take" in skip["reason"]
    assert "\n" not in skip["reason"]


def test_one_opening_rule_refuses_the_bomb_on_the_torch_path_and_the_reference(linear):
    from vit.data.decode import BadImageError
    from vit.data.transforms import build_transform

    bomb = linear[0] / "bomb.png"
    pre = ReferencePreprocessing.from_file(linear[0] / "preprocessing.json")
    pipeline = build_transform(AugConfig(), 32, train=False)  # predict.py's, evaluate.py's and the demo's opener
    for load in (pre.load, pipeline.load, lambda p: pipeline.load_bytes(p.read_bytes(), p)):
        with pytest.raises(BadImageError, match="16000x16000 pixels would take 1.9 GiB decoded"):
            load(bomb)


def test_a_jpeg_header_of_billions_of_pixels_is_one_line_and_the_other_images_keep_their_rows(linear, tmp_path):
    """A complete 8 x 8 JPEG whose frame header says 60000 x 60000: the reference's JPEG scale probe refuses it as
    the torch path does (Pillow's DecompressionBombError escaped predict() and lost every row of the call)."""
    from vit.data.transforms import build_transform
    from vit.deploy.onnx_predict import OnnxClassifier

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    sof = data.find(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", 60000, 60000)
    (tmp_path / "big.jpg").write_bytes(bytes(data))
    src = linear[0]
    probs, ok, reasons = OnnxClassifier(src / "model.onnx").predict([src / "g0.png", tmp_path / "big.jpg",
                                                                      src / "g1.png"])
    assert ok.tolist() == [True, False, True] and np.isfinite(probs[[0, 2]]).all()
    assert reasons[1] == f"cannot decode image {tmp_path / 'big.jpg'}: 60000x60000 pixels is over the limit of " \
                         "256000000 (PIL.Image.MAX_IMAGE_PIXELS); shrink it or raise the limit."
    with pytest.raises(ValueError, match=re.escape(reasons[1])):  # the torch path's sentence
        build_transform(AugConfig(), 32, train=False).load(tmp_path / "big.jpg")


def _probs(row) -> dict:
    return {row[f"pred{k}_name"]: float(row[f"prob{k}"]) for k in range(1, 100) if f"prob{k}" in row}


def _same_rows(checkpoint, images, out, topk: str = "10") -> list[dict]:
    """export.py, then predict.py --checkpoint and predict.py --onnx on `images`: the same paths, labels columns and
    probabilities (every class: --topk covers them) within 1e-4. Returns the --onnx rows."""
    assert import_script("export").main(["--checkpoint", str(checkpoint), "--out", str(out / "exp")]) == 0
    predict = import_script("predict")
    assert predict.main(["--checkpoint", str(checkpoint), str(images), "--out", str(out / "torch"), "--topk", topk,
                         "--num-workers", "0"]) == 0
    assert predict.run_onnx(["--onnx", str(out / "exp" / "model.onnx"), str(images), "--out", str(out / "onnx"),
                             "--topk", topk]) == 0
    a, b = _rows(out / "torch" / "predictions.csv"), _rows(out / "onnx" / "predictions.csv")
    assert len(a) > 5 and [x["path"] for x in a] == [x["path"] for x in b]
    assert [x.get("labels") for x in a] == [x.get("labels") for x in b]
    assert max(abs(_probs(x)[c] - _probs(y)[c]) for x, y in zip(a, b) for c in _probs(x)) <= 1e-4
    return b


@pytest.fixture(scope="module")
def tiny_exported(tiny_run, tmp_path_factory):
    """The session's tiny run exported, its validation images predicted by both predictors: (folder, images)."""
    run, data = tiny_run
    out = tmp_path_factory.mktemp("tiny_exported")
    _same_rows(run / "best", data / "val", out)
    return out, data / "val"


@pytest.mark.slow
def test_an_exported_single_label_run_predicts_as_its_checkpoint(tiny_exported):
    out, _ = tiny_exported  # the rows compared in the fixture (_same_rows)
    rows = _rows(out / "onnx" / "predictions.csv")
    assert "labels" not in rows[0] and all(abs(sum(_probs(r).values()) - 1) < 1e-5 for r in rows)  # a softmax
    info = json.loads((out / "exp" / "preprocessing.json").read_text())
    assert info["problem_type"] == "single_label_classification" and "threshold" not in info


# What docs/predict-export.md tells a user of the torch-free predictor to install, at constraints.txt's versions.
PREDICTOR_PACKAGES = ["onnxruntime", "numpy", "pillow", "opencv-python-headless"]


@pytest.mark.slow
def test_the_predictor_runs_in_a_fresh_virtualenv_with_four_packages(tiny_exported, tmp_path):
    """A new virtualenv with onnxruntime, NumPy, Pillow and OpenCV only (torch and PyYAML not importable there):
    the checkout's predict.py --onnx, without PYTHONPATH, gives the rows it gives in the project's environment."""
    out, images = tiny_exported
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    py = str(venv / "bin" / "python")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "-c",  # this pip, that venv
                        str(ROOT / "constraints.txt"), *PREDICTOR_PACKAGES], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}  # no PYTHONPATH: the script's folder is on sys.path
    for name in ("torch", "yaml", "vit"):
        assert subprocess.run([py, "-c", f"import {name}"], capture_output=True, cwd=tmp_path, env=env).returncode
    r = subprocess.run([py, str(ROOT / "predict.py"), "--onnx", str(out / "exp" / "model.onnx"), str(images),
                        "--out", str(tmp_path / "v"), "--topk", "10"], capture_output=True, text=True, cwd=tmp_path,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = _rows(out / "onnx" / "predictions.csv"), _rows(tmp_path / "v" / "predictions.csv")
    assert len(a) > 5 and [x["path"] for x in a] == [x["path"] for x in b]
    assert max(abs(_probs(x)[c] - _probs(y)[c]) for x, y in zip(a, b) for c in _probs(x)) <= 1e-6


@pytest.mark.slow
def test_an_exported_multi_label_run_predicts_as_its_checkpoint(tmp_path):
    """A 2-epoch multi-label run (40 generated images of 1-3 shapes): the export carries problem_type and the
    threshold training chose, so predict.py --onnx gives sigmoids and the labels column of predict.py --checkpoint."""
    from test_multilabel import ML, make_shapes_set

    labels = make_shapes_set(tmp_path / "d", n=40)
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={tmp_path / 'd'}",
                   f"--data.labels_file={labels}", "--data.val_fraction=0.25", *ML, "--run.epochs=2",
                   "--run.eval_every=1", f"--run.output_dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    best = tmp_path / "default" / "best"
    rows = _same_rows(best, tmp_path / "d" / "img", tmp_path)
    info = json.loads((tmp_path / "exp" / "preprocessing.json").read_text())
    assert info["problem_type"] == "multi_label_classification"
    assert info["threshold"] == json.loads((best / "meta.json").read_text())["threshold"]
    assert any(abs(sum(_probs(r).values()) - 1) > 0.1 for r in rows)  # sigmoids, not a softmax
    assert all(r["labels"].split() == sorted(c for c, p in _probs(r).items() if p >= info["threshold"])
               for r in rows)
