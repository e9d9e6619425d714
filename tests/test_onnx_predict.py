"""predict.py --onnx, run where `import torch` fails, writes predict.py's rows: the same files in the same order,
the same top-1, probabilities within 1e-4; unreadable files in skipped.csv as predict.py lists them."""

import csv

import numpy as np
import pytest
import torch
from helpers import ROOT, import_script, run_script
from PIL import Image

from vit.config import load_config
from vit.models.build import build_model
from vit.models.checkpoint import save_checkpoint

TINY = ["--model.img_size=32", "--model.embed_dim=32", "--model.depth=1", "--model.num_heads=2",
        "--model.mlp_ratio=2", "--model.in_chans=3", "--aug.mean=[0.485,0.456,0.406]",
        "--aug.std=[0.229,0.224,0.225]", "--aug.eval_crop_pct=0.875", "--aug.interpolation=bicubic"]

NO_TORCH = '''import importlib.abc, sys
class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "timm", "accelerate", "torchvision"):
            raise ImportError(f"{name} is not installed here (test shim)")
sys.meta_path.insert(0, _Refuse())
'''


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("onnx")
    cfg = load_config(ROOT / "configs/default.yaml", TINY)
    torch.manual_seed(0)
    model = build_model(cfg, 10)
    with torch.no_grad():
        model.head.weight.mul_(30.0)  # peaked probabilities: a 1e-4 comparison then means something
    save_checkpoint(tmp / "ck", model, cfg, [str(i) for i in range(10)])
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
    assert r.returncode == 2 and "--cam does not apply to --onnx" in r.stderr
