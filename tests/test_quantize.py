"""export.py --quantize int8 and vit.deploy.int8: top-1 (or a multi-label model's mAP) kept within the budget on the
held-out split (recomputed here with ONNX Runtime), the budget's decisions on made-up figures, the float fallback
finds a planted outlier layer, and an impossible budget is exit 2 with no file under the loadable name."""

import json
import re

import numpy as np
import pytest
import torch
from helpers import ROOT, import_script, run_script
from PIL import Image

import vit
from vit.config import load_config
from vit.data import build_datasets
from vit.data.transforms import build_transform
from vit.deploy.int8 import budget_metric, choose_method, describe_change, resolution_warning
from vit.deploy.onnx_predict import softmax
from vit.deploy.quantize import (
    OnnxModel,
    QuantizeError,
    fewest_float_groups,
    quantize_within_budget,
    score,
    within_budget,
)
from vit.models.build import build_model
from vit.models.checkpoint import load_checkpoint, save_checkpoint

TINY = ["--model.img_size=32", "--model.embed_dim=32", "--model.depth=1", "--model.num_heads=2",
        "--model.mlp_ratio=2", "--model.in_chans=1", "--aug.mean=[0.5]", "--aug.std=[0.5]"]
OUTLIER = 300.0


def _outlier(model, where=("fc2",)):
    """Plant one huge activation channel (as LLM.int8() and SmoothQuant describe) in front of the named linear
    layers, the float model compensating: per-tensor INT8 then rounds every other channel there to zero."""
    blk = model.blocks[0]
    with torch.no_grad():
        if "fc2" in where:  # GELU(300 + ...) = 300 + ...: fc2's input channel 0; fc2 ignores it
            blk.mlp.fc1.bias[0] += OUTLIER
            blk.mlp.fc2.weight[:, 0] = 0
        if "proj" in where:  # the value projection's channel 0: every attention output row carries it
            d = model.embed_dim
            blk.attn.qkv.bias[2 * d] += OUTLIER
            blk.attn.proj.weight[:, 0] = 0
        for name, norm, lin in (("qkv", blk.norm1, blk.attn.qkv), ("fc1", blk.norm2, blk.mlp.fc1),
                                ("head", model.norm, model.head)):
            if name in where:  # LayerNorm's gain on channel 0, undone by the next layer's weight column
                norm.weight[0] *= OUTLIER
                norm.bias[0] *= OUTLIER
                lin.weight[:, 0] /= OUTLIER
    return model


def _checkpoint(path, where, seed=0):
    cfg = load_config(ROOT / "configs/default.yaml", TINY)
    torch.manual_seed(seed)
    model = build_model(cfg, 10)
    with torch.no_grad():
        model.head.weight.mul_(20.0)  # peaked, so that top-1 is decided by clear margins
    save_checkpoint(path, _outlier(model, where), cfg, [str(i) for i in range(10)])
    return path


def test_the_budget_refuses_a_drop_over_it_and_takes_any_gain():
    assert within_budget(0.5, 0.5) and within_budget(0.49, 0.5) and not within_budget(0.51, 0.5)
    assert not within_budget(1.54, 0.5)  # one image of 65 lost: over a 0.5 pt budget
    assert within_budget(-1.54, 0.5) and within_budget(-1.54, 0.0)  # a gain passes any budget, 0 included
    assert within_budget(0.0, 0.0) and not within_budget(1e-6, 0.0)


def test_the_fallback_keeps_the_fewest_sensitive_groups_float_that_meet_the_budget():
    ranking = [f"g{i}" for i in range(8)]  # most sensitive first; at most half (4) may stay float
    drops = {0: 9.0, 1: 3.0, 2: 0.4, 3: 0.2, 4: 0.1}  # made-up drop (points) with the first k kept float
    calls = []

    def drop_with(float_groups):
        calls.append(list(float_groups))
        return drops[len(float_groups)]

    best, tried = fewest_float_groups(ranking, drop_with, 0.5)
    assert best == 2 and all(c == ranking[:len(c)] for c in calls)  # always a prefix of the ranking
    assert tried == {2: 0.4, 1: 3.0}  # binary search over 1..4: k=2 passes, then k=1 fails
    assert fewest_float_groups(ranking, drop_with, 3.0)[0] == 1
    best, tried = fewest_float_groups(ranking, drop_with, 0.05)  # not even 4 float groups reach it
    assert best is None and max(tried) == 4 and 5 not in tried
    assert fewest_float_groups(ranking, lambda fl: -2.0, 0.0)[0] == 1  # a gain with one float group is kept


def test_the_fastest_method_within_budget_is_chosen_by_cpu_time_at_one_thread():
    def speed(wall, cpu=None):
        s = {"int8_over_eager_fp32": {"median": wall}}
        return s if cpu is None else {**s, "cpu_int8_over_eager_fp32": {"median": cpu}}

    cands = {"dynamic": {}, "static": {}}
    assert choose_method(cands, {"dynamic": speed(2.0, 1.5), "static": speed(1.8, 1.7)}) == "static"  # CPU time
    assert choose_method(cands, {"dynamic": speed(2.0), "static": speed(1.8)}) == "dynamic"  # wall clock
    assert choose_method({"static": {}}, {"dynamic": speed(9.0, 9.0), "static": speed(1.0, 1.0)}) == "static"


def test_the_change_is_printed_with_its_sign_and_the_budgets_resolution():
    line = describe_change("top1", 41 / 65, 42 / 65, 0.5, 65)  # INT8 got one more image of 65 right
    assert "top-1 63.08% -> 64.62% (+1.54 pt, a gain; budget: lose at most 0.5 pt; 65 images, one image = 1.54 pt)" \
        == line
    assert "(-1.54 pt, a loss;" in describe_change("top1", 42 / 65, 41 / 65, 2, 65)
    assert "(+0.00 pt, no change;" in describe_change("map", 0.8, 0.8 - 1e-12, 0.5, 6) and "one image" not in \
        describe_change("map", 0.8, 0.8, 0.5, 6)
    assert "finer than one of the 65 evaluation images (1.54 pt)" in resolution_warning("top1", 0.5, 65)
    assert resolution_warning("top1", 0.5, 360) is None and resolution_warning("top1", 0, 65) is None
    assert resolution_warning("map", 0.5, 65) is None


def test_the_budget_metric_follows_the_model_and_matches_scikit_learn():
    from sklearn.metrics import average_precision_score, f1_score

    single, multi = load_config(None, {}), load_config(None, {"data.dataset": "imagefolder", "data.root": "d",
                                                              "data.labels_file": "l.csv"})
    assert (budget_metric(single), budget_metric(multi), budget_metric(multi, "micro_f1")) == ("top1", "map",
                                                                                                "micro_f1")
    with pytest.raises(QuantizeError, match="^the INT8 budget metric map does not fit a single-label model; use top1"):
        budget_metric(single, "map")
    with pytest.raises(QuantizeError, match="top1 does not fit a multi-label model; use map or micro_f1"):
        budget_metric(multi, "top1")
    rng = np.random.default_rng(0)
    logits, y = rng.normal(0, 2, (40, 4)), (rng.random((40, 4)) > 0.6).astype(np.float32)
    y[:, 3] = 0  # a class without a positive is left out of mAP
    ap = [average_precision_score(y[:, c], logits[:, c]) for c in range(3)]
    assert score(logits, y, "map") == pytest.approx(np.mean(ap), abs=1e-12)
    assert score(logits, y, "micro_f1", 0.3) == pytest.approx(f1_score(y, 1 / (1 + np.exp(-logits)) >= 0.3,
                                                                        average="micro"))
    assert score(logits, np.arange(40) % 4, "top1") == pytest.approx((logits.argmax(-1) == np.arange(40) % 4).mean())


def test_a_missing_eval_images_folder_is_refused_before_any_export(tmp_path):
    from vit.config import ConfigError

    export = import_script("export")
    with pytest.raises(ConfigError, match=r"^--eval-images .*nonexistent is not a folder; pass a folder of"):
        export.parse_args(["--model", "vit_tiny_patch16_224", "--quantize", "int8", "--eval-images",
                           str(tmp_path / "nonexistent"), "--out", str(tmp_path / "exp")])
    assert not (tmp_path / "exp").exists()


@pytest.fixture(scope="module")
def int8_export(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("int8")
    ck = _checkpoint(tmp / "ck", ("fc2",))
    assert import_script("export").main(["--checkpoint", str(ck), "--quantize", "int8", "--out", str(tmp / "exp"),
                                         "--calibration-images", "32"]) == 0
    return tmp


@pytest.mark.slow
def test_int8_export_keeps_top1_within_budget_on_the_held_out_split(int8_export):
    out = int8_export / "exp"
    res = json.loads((out / "verification.json").read_text())["results"]
    q = res["int8"]
    assert set(res) == {"onnx", "int8"} and q["method"] in ("dynamic", "static")
    assert q["top1_fp32"] - q["top1_int8"] <= 0.005 + 1e-9 and q["images"] == 360  # digits' held-out split
    assert q["bytes_fp32"] == (out / "model.onnx").stat().st_size
    assert q["bytes_int8"] == (out / "model.int8.onnx").stat().st_size < q["bytes_fp32"]
    assert q["speed"]["int8_over_eager_fp32"]["median"] > 0 and 0 <= q["agreement_with_torch"] <= 1
    assert q["speed"]["cpu_int8_over_eager_fp32"]["median"] > 0  # 1 thread: also in CPU time
    # the numbers, recomputed here: PyTorch's top-1 on the split, and the INT8 file's own through ONNX Runtime
    model, cfg, classes, _ = load_checkpoint(int8_export / "ck")
    _, val, _ = build_datasets(cfg, check_images=False, splits=("val",), classes=classes)
    val.transform = build_transform(cfg.aug, 32, train=False)
    x = torch.stack([val[i][0] for i in range(len(val))])
    y = np.array([val[i][1] for i in range(len(val))])
    with torch.no_grad():
        p_torch = model(x).softmax(-1).numpy()
    p_int8 = OnnxModel(out / "model.int8.onnx")(x.numpy())
    assert abs((p_torch.argmax(-1) == y).mean() - q["top1_fp32"]) <= 1 / 360
    assert (p_int8.argmax(-1) == y).mean() == pytest.approx(q["top1_int8"])
    assert (p_int8.argmax(-1) == p_torch.argmax(-1)).mean() == pytest.approx(q["agreement_with_torch"], abs=1e-9)


@pytest.mark.slow
def test_fallback_keeps_the_planted_outlier_layer_float(int8_export, tmp_path):
    fp32 = int8_export / "exp" / "model.onnx"
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (64, 1, 32, 32)).astype(np.float32)
    y = OnnxModel(fp32)(x).argmax(-1)  # labels: the float model's own answers, so any change is a loss
    lines = []
    res = quantize_within_budget(fp32, tmp_path / "q.onnx", "dynamic", x[:32], x, y, 5.0, log=lines.append)
    assert float(re.search(r"\(([-+][0-9.]+) pt\)", lines[0]).group(1)) < -5.0  # all INT8: a loss over budget
    assert res["drop_points"] <= 5.0 and res["float_groups"][0] == "blocks.0.mlp.fc2"
    assert res["sensitivity_ranking"][0] == "blocks.0.mlp.fc2"  # found by measuring, not by a list
    assert len(res["float_groups"]) < len(res["quantized_groups"])


@pytest.mark.slow
def test_impossible_budget_is_exit_2_and_no_loadable_file(tmp_path):
    ck = _checkpoint(tmp_path / "ck", ("qkv", "proj", "fc1", "fc2", "head"))
    model, cfg, _, _ = load_checkpoint(ck)
    t = build_transform(cfg.aug, 32, train=False)
    rng = np.random.default_rng(1)
    for i in range(40):  # a folder labelled with the float model's answers: top-1 fp32 is 100%
        img = np.clip(rng.normal(128, 70, (40, 40, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(tmp_path / "tmp.png")
        with torch.no_grad():
            label = int(model(t.load(tmp_path / "tmp.png")[None]).argmax())
        (tmp_path / "eval" / str(label)).mkdir(parents=True, exist_ok=True)
        (tmp_path / "tmp.png").replace(tmp_path / "eval" / str(label) / f"{i}.png")
    out = tmp_path / "exp"
    r = run_script("export.py", "--checkpoint", str(ck), "--quantize", "int8", "--int8-method", "dynamic",
                   "--max-top1-drop", "0", "--eval-images", str(tmp_path / "eval"), "--out", str(out))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "over the budget of 0" in r.stderr and "Traceback" not in r.stderr
    assert not (out / "model.int8.onnx").exists() and (out / "model.int8.onnx.rejected").is_file()
    assert not (out / "model.onnx").exists() and not (out / "preprocessing.json").exists()  # nothing installed


@pytest.mark.slow
def test_prepared_graph_is_exact_and_int8_keeps_no_linear_weight_float(tmp_path):
    """The quantizer's input (constants folded) computes what the export does, and every linear layer's weight,
    the last block's key and value included (Slice/Transpose of its qkv weight in the export), is INT8."""
    import onnx

    from vit.deploy.export import ExportableClassifier, export_model
    from vit.deploy.quantize import prepare, quantize, weight_groups

    torch.manual_seed(0)
    model = vit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                             num_classes=5).eval()
    with torch.no_grad():
        model.head.weight.mul_(20.0)  # peaked, so that top-1 is decided by clear margins
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    src = export_model(ExportableClassifier(model), "onnx", tmp_path, x[:2])
    with torch.no_grad():
        ref = model(x).numpy()
    prepared = prepare(src, tmp_path / "prepared.onnx")
    assert np.abs(OnnxModel(prepared)(x.numpy()) - OnnxModel(src)(x.numpy())).max() <= 1e-5
    # the modules PyTorch has, by their names; the last block's query and key-value products slice its qkv
    # weight inside the attention module ([CLS] queries only), so they are named after that module
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)} - {"blocks.1.attn.qkv"}
    groups = weight_groups(prepared, scopes_from=src)
    assert set(groups) == linear | {"blocks.1.attn"} and len(groups["blocks.1.attn"]) == 2
    q = quantize(src, tmp_path / "int8.onnx", "dynamic")
    floats = {tuple(t.dims) for t in onnx.load(str(q)).graph.initializer
              if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2}
    d = model.embed_dim
    assert not floats & {(d, d), (d, 3 * d), (d, 2 * d), (d, 64), (64, d), (d, 5)}  # no linear weight left float
    logits = OnnxModel(q)(x.numpy())
    assert np.abs(logits - ref).max() > 1e-4  # it is quantized: not the float model under another name
    # per-tensor INT8 of random weights: probabilities within 0.15 of PyTorch's, the same top-1 on >= 90%
    assert np.abs(softmax(logits) - softmax(ref)).max() <= 0.15 and (logits.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


@pytest.fixture(scope="module")
def multilabel_checkpoint(tmp_path_factory):
    """An untrained multi-label checkpoint (sigmoid per class) on 24 generated shapes images, 6 held out: an
    untrained ViT already ranks the shapes by colour (test_multilabel.py), so mAP is far from chance."""
    from test_multilabel import make_shapes_set

    tmp = tmp_path_factory.mktemp("ml")
    labels = make_shapes_set(tmp / "d", n=24)
    cfg = load_config(None, ["--data.dataset=imagefolder", f"--data.root={tmp / 'd'}", f"--data.labels_file={labels}",
                             "--data.val_fraction=0.25", "--model.img_size=32", "--model.patch_size=8",
                             "--model.embed_dim=32", "--model.depth=1", "--model.num_heads=2", "--model.mlp_ratio=2"])
    _, _, classes = build_datasets(cfg, check_images=False, splits=("train",))
    torch.manual_seed(0)
    save_checkpoint(tmp / "ck", build_model(cfg, len(classes)), cfg, classes, {"threshold": 0.5})
    return tmp / "ck"


@pytest.mark.slow
def test_int8_export_of_a_multi_label_checkpoint_keeps_its_map_budget(multilabel_checkpoint, tmp_path):
    from sklearn.metrics import average_precision_score

    out = tmp_path / "exp"
    r = run_script("export.py", "--checkpoint", str(multilabel_checkpoint), "--quantize", "int8", "--int8-method",
                   "dynamic", "--max-drop", "5", "--calibration-images", "8", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    q = json.loads((out / "verification.json").read_text())["results"]["int8"]
    assert q["metric"] == "map" and q["images"] == 6 and q["drop_points"] <= 5 + 1e-9
    assert "mAP" in r.stdout and "6 images" in r.stdout
    model, cfg, classes, _ = load_checkpoint(multilabel_checkpoint)
    _, val, _ = build_datasets(cfg, check_images=False, splits=("val",), classes=classes)
    val.transform = build_transform(cfg.aug, 32, train=False)
    x = torch.stack([val[i][0] for i in range(len(val))])
    y = torch.stack([val[i][1] for i in range(len(val))]).numpy()
    present = [c for c in range(len(classes)) if y[:, c].any()]

    def map_of(scores):  # scikit-learn's AP, the oracle, over the classes with a positive
        return float(np.mean([average_precision_score(y[:, c], scores[:, c]) for c in present]))

    with torch.no_grad():
        assert map_of(model(x).numpy()) == pytest.approx(q["map_fp32"], abs=1e-4)
    assert map_of(OnnxModel(out / "model.int8.onnx")(x.numpy())) == pytest.approx(q["map_int8"], abs=1e-9)
    assert q["drop_points"] == pytest.approx(100 * (q["map_fp32"] - q["map_int8"]))
