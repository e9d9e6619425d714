"""export.py --format openvino and predict.py --openvino (vit/deploy/openvino_ir.py, openvino_int8.py): the IR's
logits against ONNX Runtime's and PyTorch's on the same images (1e-4), the anomaly feature model and scores too,
predict.py --openvino's rows (torch and onnxruntime not importable) against --onnx's, NNCF INT8 within its budget
(recomputed here) and refused in one sentence past it, and a missing package, model.xml or model.bin as one
sentence."""

import importlib.util
import json
import shutil

import numpy as np
import pytest
import torch
from helpers import ROOT, import_script, peaked_checkpoint, run_script
from PIL import Image
from test_anomaly import anomaly_checkpoint  # noqa: F401 (the anomaly export tests' fixture, shared)
from test_onnx_predict import NO_TORCH, TINY, _rows

from vit.deploy.export_folder import Int8Request, quantized_openvino
from vit.deploy.int8 import LabelledImages
from vit.deploy.onnx_anomaly import OnnxPatchCore
from vit.deploy.openvino_int8 import OpenVinoModel, openvino_speed, quantize_openvino
from vit.deploy.openvino_ir import FEATURES_XML, OpenVinoSession
from vit.deploy.preprocess import ReferencePreprocessing, read_preprocessing
from vit.deploy.quantize import OnnxModel, QuantizeError
from vit.deploy.session import open_session
from vit.models.checkpoint import load_checkpoint

pytest.importorskip("openvino")


@pytest.fixture(scope="module")
def ov_export(tmp_path_factory):
    """A tiny 3-channel checkpoint (peaked head) exported with --format openvino, and photo-sized test images
    (one unreadable): (folder, images)."""
    tmp = tmp_path_factory.mktemp("openvino")
    peaked_checkpoint(tmp / "ck", TINY)  # peaked probabilities: a 1e-4 comparison then means something
    assert import_script("export").main(["--checkpoint", str(tmp / "ck"), "--format", "openvino",
                                         "--out", str(tmp / "exp")]) == 0
    rng = np.random.default_rng(0)
    imgs = tmp / "imgs"
    imgs.mkdir()
    for i, (h, w) in enumerate([(480, 640), (37, 53), (120, 90), (64, 64), (200, 150)]):
        Image.fromarray(np.clip(rng.normal(128, 60, (h, w, 3)), 0, 255).astype(np.uint8)).save(imgs / f"{i}.jpg")
    (imgs / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    return tmp, imgs


def _openvino_only(exp, dest):
    """The files a device that runs OpenVINO alone receives: model.xml/.bin, preprocessing.json and, for an anomaly
    checkpoint, anomaly/ without features.onnx; so a predictor that read an ONNX file would fail there."""
    for f in [exp / n for n in ("model.xml", "model.bin", "preprocessing.json")] + [
            f for f in (exp / "anomaly").glob("*") if f.suffix != ".onnx"]:
        (dest / f.relative_to(exp)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest / f.relative_to(exp))
    return dest


def _images(exp, imgs) -> np.ndarray:
    """The readable test images through the export's reference preprocessing: (N, 3, 32, 32) float32."""
    pre = ReferencePreprocessing.from_dict(read_preprocessing(exp / "preprocessing.json"))
    return np.stack([pre.load(p) for p in sorted(imgs.glob("[0-9].jpg"))])


def test_openvino_logits_equal_onnx_runtime_and_pytorch_on_the_same_images(ov_export):
    tmp, imgs = ov_export
    exp = tmp / "exp"
    ver = json.loads((exp / "verification.json").read_text())["results"]
    assert set(ver) == {"onnx", "openvino"} and ver["openvino"]["max_abs_prob_diff"] <= 1e-4
    assert (exp / "model.xml").is_file() and (exp / "model.bin").is_file() and not list(exp.glob(".*"))
    x = _images(exp, imgs)
    model = load_checkpoint(tmp / "ck")[0].eval()
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    ov = OpenVinoSession(exp / "model.xml").run(None, {"x": x})[0]
    ort = open_session(exp / "model.onnx").run(None, {"x": x})[0]
    assert np.abs(ref).max() > 1.0 and np.abs(ref - ref.mean(0)).max() > 0.1  # large, and each image its own
    assert np.abs(ov - ref).max() <= 1e-4 and np.abs(ov - ort).max() <= 1e-4
    assert (ov.argmax(-1) == ref.argmax(-1)).all()
    # the batch is dynamic in the IR as in the ONNX file: one image alone gives its row of the batch
    assert np.abs(OpenVinoSession(exp / "model.xml").run(None, {"x": x[2:3]})[0] - ov[2:3]).max() <= 1e-5


def test_predict_openvino_without_torch_writes_the_onnx_rows(ov_export, tmp_path, capsys):
    tmp, imgs = ov_export
    predict = import_script("predict")
    assert predict.run_onnx(["--onnx", str(tmp / "exp" / "model.onnx"), str(imgs), "--out", str(tmp_path / "onnx"),
                             "--topk", "10"]) == 0
    shim = tmp_path / "shim"
    shim.mkdir()
    no_ort = NO_TORCH.replace('"yaml")', '"yaml", "onnxruntime", "onnx", "nncf")')  # OpenVINO alone
    assert no_ort != NO_TORCH
    (shim / "sitecustomize.py").write_text(no_ort)
    ov_only = _openvino_only(tmp / "exp", tmp_path / "ov_only")
    r = run_script("predict.py", "--openvino", str(ov_only), str(imgs), "--out", str(tmp_path / "ov"), "--topk",
                   "10", env={"PYTHONPATH": f"{shim}:{ROOT}"})
    assert r.returncode == 0, r.stderr
    assert "OpenVINO" in r.stdout
    a, b = _rows(tmp_path / "onnx" / "predictions.csv"), _rows(tmp_path / "ov" / "predictions.csv")
    assert len(a) == 5 and [x["path"] for x in a] == [x["path"] for x in b]
    assert [x["pred1_name"] for x in a] == [x["pred1_name"] for x in b]
    assert max(abs(float(x[f"prob{k}"]) - float(y[f"prob{k}"])) for x, y in zip(a, b) for k in range(1, 11)) <= 1e-5
    assert max(float(x["prob1"]) for x in a) > 0.5  # peaked rows
    assert _rows(tmp_path / "onnx" / "skipped.csv") == _rows(tmp_path / "ov" / "skipped.csv") != []


def _labelled(exp, n: int = 96, seed: int = 1) -> LabelledImages:
    """Random images labelled with the fp32 IR's own answers (top-1 fp32 is 100%: any change is a loss)."""
    x = np.random.default_rng(seed).normal(0, 1, (n, 3, 32, 32)).astype(np.float32)
    y = OpenVinoModel(exp / "model.xml")(x).argmax(-1)
    return LabelledImages(x, y, x[:32], f"{n} random images")


def test_nncf_int8_keeps_its_budget_and_its_numbers_are_the_files_own(ov_export, tmp_path):
    tmp, _ = ov_export
    exp, model = tmp / "exp", load_checkpoint(tmp / "ck")[0].eval()
    data = _labelled(exp)
    lines = []
    res = quantize_openvino(exp / "model.xml", tmp_path / "model.int8.xml", model, data, "top1", 5.0,
                            log=lines.append)  # no ort files: no speed check (timed below, shorter)
    assert res["drop_points"] <= 5.0 and res["method"] == "nncf" and res["top1_fp32"] == 1.0
    assert res["bytes_int8"] < res["bytes_fp32"] and "speed" not in res and "budget: lose at most 5 pt" in lines[0]
    sp = openvino_speed(exp / "model.xml", tmp_path / "model.int8.xml", {"fp32": exp / "model.onnx"}, data.x[:1],
                        repeats=2, min_seconds=0.01)
    assert sp["ov_int8_over_ort_fp32"]["median"] > 0 and set(sp["images_per_s"]) == {"ov_fp32", "ov_int8", "ort_fp32"}
    q = OpenVinoSession(tmp_path / "model.int8.xml")  # recomputed here from the file on disk
    logits = q.run(None, {"x": data.x})[0]
    assert (logits.argmax(-1) == data.y).mean() == pytest.approx(res["top1_int8"])
    with torch.no_grad():
        torch_top1 = model(torch.from_numpy(data.x)).argmax(-1).numpy()
    assert (logits.argmax(-1) == torch_top1).mean() == pytest.approx(res["agreement_with_torch"])
    assert 0 < np.abs(logits - OnnxModel(exp / "model.onnx")(data.x)).max() < 5  # INT8: changed, not broken
    import openvino as ov

    ops = {op.get_type_name() for op in ov.Core().read_model(str(tmp_path / "model.int8.xml")).get_ordered_ops()}
    assert "FakeQuantize" in ops  # NNCF's quantizers are in the file itself, whatever the plugin makes of them


def test_nncf_int8_over_a_tiny_budget_is_one_sentence_and_no_loadable_file(ov_export, tmp_path):
    tmp, _ = ov_export
    exp, model = tmp / "exp", load_checkpoint(tmp / "ck")[0].eval()
    x = np.random.default_rng(2).normal(0, 1, (256, 3, 32, 32)).astype(np.float32)
    logits = OpenVinoModel(exp / "model.xml")(x)
    top2 = np.sort(logits, -1)[:, -2:]
    near = np.argsort(top2[:, 1] - top2[:, 0])[:64]  # the images whose answer hangs on the smallest margins
    data = LabelledImages(x[near], logits[near].argmax(-1), x[:32], "64 near-tie images")
    with pytest.raises(QuantizeError) as e:
        quantize_openvino(exp / "model.xml", tmp_path / "model.int8.xml", model, data, "top1", 0.0, log=print)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("NNCF INT8 loses ") and msg.endswith("over the budget of 0.")
    assert not (tmp_path / "model.int8.xml").exists() and (tmp_path / "model.int8.xml.rejected").is_file()
    assert (tmp_path / "model.int8.bin.rejected").is_file()
    # export.py's step (vit.deploy.export_folder): the same refusal names what to do and moves the attempt into --out
    staging, out = tmp_path / "staging", tmp_path / "out"
    staging.mkdir(), out.mkdir()
    with pytest.raises(QuantizeError) as e:
        quantized_openvino(Int8Request(max_drop=0.0), model, data, "top1", {"onnx": exp / "model.onnx", "openvino":
                           exp / "model.xml"}, staging, out, None, print)
    assert "\n" not in str(e.value) and str(e.value).endswith("raise --max-drop or keep the fp32 model.xml.")
    assert sorted(p.name for p in out.iterdir()) == ["model.int8.bin.rejected", "model.int8.xml.rejected"]


def test_a_missing_package_model_xml_or_bin_is_one_sentence(ov_export, tmp_path, capsys, monkeypatch):
    tmp, imgs = ov_export
    predict, img = import_script("predict"), str(imgs / "0.jpg")
    assert predict.run_onnx(["--openvino", str(tmp_path), img, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no model.xml; export one with export.py --format openvino" in err
    (tmp_path / "x").mkdir()
    for name in ("model.xml", "preprocessing.json"):  # an IR whose weights were not copied along
        (tmp_path / "x" / name).write_bytes((tmp / "exp" / name).read_bytes())
    assert predict.run_onnx(["--openvino", str(tmp_path / "x"), img, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no model.bin beside it" in err
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else
                        find_spec(name, *a))
    assert predict.run_onnx(["--openvino", str(tmp / "exp"), img, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the openvino package, which is not installed; run pip install" in err
    with pytest.raises(ValueError, match=r"^export.py --format openvino needs the openvino package"):
        import_script("export").main(["--checkpoint", str(tmp / "ck"), "--format", "openvino", "--out",
                                      str(tmp_path / "e")])


def test_anomaly_features_and_scores_on_openvino_equal_onnx_runtime_and_pytorch(anomaly_checkpoint,  # noqa: F811
                                                                                 tmp_path):
    tmp, model, pc, transform = anomaly_checkpoint
    exp = tmp_path / "exp"
    assert import_script("export").main(["--checkpoint", str(tmp / "ck"), "--format", "openvino", "--out", str(exp),
                                         "--images", str(tmp / "test")]) == 0
    ver = json.loads((exp / "verification.json").read_text())["results"]
    assert ver["anomaly_openvino"]["max_abs_score_diff"] <= 1e-4 and ver["anomaly_openvino"]["images"] > 0
    paths = sorted((tmp / "test").rglob("[0-9].png"))
    x = torch.stack([transform.load(p) for p in paths])
    ref, _ = pc.score(model, x)
    ov, ort = OnnxPatchCore(exp / "anomaly", features=FEATURES_XML), OnnxPatchCore(exp / "anomaly")
    f_ov = ov.session.run(None, {"x": x.numpy()})[0]
    f_ort = ort.session.run(None, {"x": x.numpy()})[0]
    assert f_ov.shape == f_ort.shape and np.abs(f_ov - f_ort).max() <= 1e-4 and np.abs(f_ort).max() > 0.1
    s_ov, s_ort = ov.score(x.numpy())[0], ort.score(x.numpy())[0]
    assert np.abs(s_ov - ref.double().numpy()).max() <= 1e-4 and np.abs(s_ov - s_ort).max() <= 1e-4
    predict = import_script("predict")
    for flag, src in (("--onnx", exp / "model.onnx"), ("--openvino", _openvino_only(exp, tmp_path / "ov_only"))):
        assert predict.run_onnx([flag, str(src), str(tmp / "test"), "--out", str(tmp_path / flag)]) == 0
    a, b = _rows(tmp_path / "--onnx" / "predictions.csv"), _rows(tmp_path / "--openvino" / "predictions.csv")
    assert len(a) == 6 and [r["verdict"] for r in a] == [r["verdict"] for r in b]
    assert {r["verdict"] for r in b} == {"defect", "good"}  # the threshold splits them: a real comparison
    assert max(abs(float(r["anomaly_score"]) - float(s["anomaly_score"])) for r, s in zip(a, b)) <= 1e-5
