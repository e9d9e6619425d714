"""Anomaly detection II (vit/eval/anomaly_threshold.py, anomaly_metrics.py, AnomalyDINO in anomaly.py, the
command's methods): thresholds from good images only against the rule's definition (and the anomalib #2433
failure), metrics against float64 brute force and scikit-learn, AnomalyDINO's scores against its formula, and
anomaly.py fit / score with --method, masks, --force and the saved record."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from vit import create_model
from vit.data.synthetic import inspection_part
from vit.eval.anomaly_metrics import aupro, auroc, pixel_auroc, upsample_maps
from vit.eval.anomaly_threshold import (
    check_false_alarm_rate,
    choose_threshold,
    threshold_at_best_f1,
    threshold_at_false_alarm_rate,
)


@pytest.mark.parametrize("rate", [None, 0.02, 0.05, 0.1, 0.25, 0.5, 0.9])
def test_all_normal_validation_keeps_the_false_alarm_rate_and_never_takes_the_minimum(rate):
    """Good validation scores only, with ties (rounded), no defects given (an empty array, as a validation set with
    no defective images yields): at most floor(rate * n) good images at or above the threshold, and the threshold
    is above the lowest score. anomalib #2433's F1 rule returned the minimum here, flagging every good image."""
    rng = np.random.default_rng(0)
    for n in (7, 40, 201):
        s = np.round(rng.gamma(2.0, size=n), 1)
        t = choose_threshold(s, np.array([]), rate).value
        allowed = 0 if rate is None else math.floor(rate * n + 1e-9)
        assert (s >= t).sum() <= allowed and (s >= t).mean() <= (rate or 0.0)
        assert t > s.min()
        below = s[s < t]  # the threshold is the tightest: the highest score below it would be one alarm too many
        assert (s >= below.max()).sum() > allowed


def test_too_few_good_images_for_the_rate_is_one_line():
    s = np.linspace(0, 1, 40)
    c = threshold_at_false_alarm_rate(s, 0.01)
    assert c.note == ("a false-alarm rate of 0.01 needs at least 100 good validation images to allow one false alarm; "
                      "with 40 the threshold sits above all of them.")
    assert c.value > 1.0 and c.false_alarms == 0 and c.record()["target"] == 0.01
    assert threshold_at_false_alarm_rate(np.linspace(0, 1, 100), 0.01).note == ""


@pytest.mark.parametrize("bad", [0, 1, -0.1, 1.5, float("nan"), "0.1"])
def test_a_rate_outside_zero_one_is_one_sentence(bad):
    with pytest.raises(ValueError, match=r"^the false-alarm rate must be a share strictly between 0 and 1 .*good "
                                         r"image\.$"):
        check_false_alarm_rate(bad)


def test_f1_threshold_equals_brute_force():
    rng = np.random.default_rng(1)
    g, d = np.round(rng.normal(0, 1, 60), 1), np.round(rng.normal(1.5, 1, 25), 1)
    best = max((2 * (d >= t).sum() / ((d >= t).sum() + len(d) + (g >= t).sum()), t) for t in np.r_[g, d])
    c = threshold_at_best_f1(g, d)
    f1 = 2 * (d >= c.value).sum() / ((d >= c.value).sum() + len(d) + (g >= c.value).sum())
    assert f1 == pytest.approx(best[0], abs=1e-12) and c.rule == "f1" and c.defective == 25
    assert c.false_alarms == (g >= c.value).sum() and c.recall == pytest.approx((d >= c.value).mean())
    assert choose_threshold(g, d).rule == "f1" and choose_threshold(g, None).rule == "false_alarm_rate"


def _pro_brute(maps: np.ndarray, masks: np.ndarray, limit: float = 0.3) -> float:
    """Every distinct score as a threshold, regions by a flood fill (8-connected), overlap and FPR by counting;
    the area to `limit` by trapezoids with the last segment cut by linear interpolation."""
    regions = []
    for i, m in enumerate(masks):
        seen = np.zeros_like(m)
        for r, c in zip(*np.nonzero(m)):
            if seen[r, c]:
                continue
            stack, pix = [(r, c)], []
            seen[r, c] = True
            while stack:
                y, x = stack.pop()
                pix.append((i, y, x))
                for dy in (-1, 0, 1):
                    for dx in (-1, 0, 1):
                        yy, xx = y + dy, x + dx
                        if 0 <= yy < m.shape[0] and 0 <= xx < m.shape[1] and m[yy, xx] and not seen[yy, xx]:
                            seen[yy, xx] = True
                            stack.append((yy, xx))
            regions.append(tuple(np.array(pix).T))
    pts = [(0.0, 0.0)]
    for t in np.sort(np.unique(maps))[::-1]:
        pts.append(((maps[~masks] >= t).mean(), np.mean([(maps[r] >= t).mean() for r in regions])))
    x, y = np.array(pts).T
    j = np.searchsorted(x, limit, side="right")
    xs, ys = list(x[:j]), list(y[:j])
    if j < len(x) and xs[-1] < limit:
        xs.append(limit)
        ys.append(y[j - 1] + (limit - x[j - 1]) / (x[j] - x[j - 1]) * (y[j] - y[j - 1]))
    return float(sum((xs[k + 1] - xs[k]) * (ys[k + 1] + ys[k]) / 2 for k in range(len(xs) - 1)) / limit)


def _regions():
    masks = np.zeros((4, 12, 12), bool)
    masks[1, 1:4, 2:6] = True
    masks[1, 8:10, 8:11] = True
    masks[1, 4, 6] = True  # touches the first region at a corner: one 8-connected region
    masks[2, 5:9, 5:7] = True
    maps = np.round(np.random.default_rng(2).normal(size=masks.shape) + 1.2 * masks, 1)  # ties
    return maps, masks


def test_aupro_and_pixel_auroc_equal_brute_force_and_sklearn():
    from sklearn.metrics import roc_auc_score

    maps, masks = _regions()
    assert aupro(maps, masks) == pytest.approx(_pro_brute(maps, masks), abs=1e-12)
    assert aupro(maps, masks, 1.0) == pytest.approx(_pro_brute(maps, masks, 1.0), abs=1e-12)
    assert pixel_auroc(maps, masks) == pytest.approx(roc_auc_score(masks.ravel(), maps.ravel()), abs=1e-12)
    assert aupro(masks * 1.0, masks) == pytest.approx(1.0)  # perfect maps
    up = upsample_maps(np.arange(4.0).reshape(1, 2, 2), (4, 4))
    assert up[0, 0, 0] == 0 and up[0, 1, 1] == pytest.approx(0.75)  # half-pixel centres: (0 + 1 + 2 + 3) / 4 x ...
    with pytest.raises(ValueError, match="both good and defective"):
        auroc([1, 2], [True, True])


def test_anomalydino_scores_equal_its_formula():
    """Every patch of the good images in the bank (no coreset, no neighbourhood mean), cosine distance 1 - cos
    to the nearest, and the image score the mean of its top 1% (ceil) patches, in float64 from the blocks' tokens."""
    from vit.eval.anomaly import METHODS, fit_patchcore

    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", img_size=64, patch_size=4, depth=2, embed_dim=32, num_heads=2,
                         num_classes=2).eval()  # a 16 x 16 grid: 256 patches, top 1% = 3
    good, test = torch.randn(2, 3, 64, 64), torch.randn(3, 3, 64, 64)
    data = [(x, 1, i) for i, x in enumerate(good)]
    pc = fit_patchcore(model, data, layers=(0, 1), **METHODS["anomalydino"], method="anomalydino")
    scores, maps = pc.score(model, test)
    with torch.no_grad():
        feats = lambda x: torch.cat(model.forward_intermediates(x, indices=[0, 1], output_fmt="NCHW",  # noqa: E731
                                                                intermediates_only=True), 1).flatten(2).transpose(1, 2)
        bank, q = feats(good).double().flatten(0, 1), feats(test).double()
    bank, q = bank / bank.norm(dim=-1, keepdim=True), q / q.norm(dim=-1, keepdim=True)
    d = (1 - q @ bank.T).amin(-1)  # (3, 256)
    assert len(pc.bank) == 512
    np.testing.assert_allclose(maps.reshape(3, -1).numpy(), d.numpy(), atol=2e-6)
    np.testing.assert_allclose(scores.numpy(), d.sort(-1, descending=True).values[:, :3].mean(-1).numpy(), atol=2e-6)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """A 32-px, patch-8 checkpoint (untrained) and folders of generated weave parts with masks beside the defects."""
    from PIL import Image

    from vit.config import load_config
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    tmp = tmp_path_factory.mktemp("methods")
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs/default.yaml",
                      ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=2",
                       "--model.num_heads=2", "--model.mlp_ratio=2"])
    torch.manual_seed(0)
    save_checkpoint(tmp / "ck", build_model(cfg, 4).eval(), cfg, ["a", "b", "c", "d"])
    rng = np.random.default_rng(0)
    for split, names in (("train", {"good": 4}), ("val", {"good": 3}), ("vald", {"stain": 2}),
                         ("test", {"good": 3, "stain": 3})):
        for name, n in names.items():
            (tmp / split / name).mkdir(parents=True)
            for i in range(n):
                img, mask = inspection_part(rng, 32, "weave", None if name == "good" else name)
                Image.fromarray(img).save(tmp / split / name / f"{i}.png")
                if name != "good":
                    np.save(tmp / split / name / f"{i}.mask.npy", mask)
    return tmp


@pytest.mark.parametrize("method", ["anomalydino", pytest.param("dinomaly", marks=pytest.mark.slow)])
def test_fit_records_its_inputs_refuses_a_second_fit_and_score_reports_pixel_metrics(parts, tmp_path, method):
    from helpers import import_script

    from vit.config import ConfigError

    anomaly = import_script("anomaly")
    bank = tmp_path / "bank"
    fit = ["fit", "--checkpoint", str(parts / "ck"), "--bank", str(bank), "--method", method, "--good",
           str(parts / "train"), "--val", str(parts / "val"), "--val-defects", str(parts / "vald")]
    fit += ["--steps", "3"] if method == "dinomaly" else []
    assert anomaly.main(fit) == 0
    s = json.loads((bank / "patchcore.json").read_text())
    assert s["method"] == method and s["backbone"] == str(parts / "ck") and s["good"] == [str(parts / "train")]
    assert s["threshold_choice"]["rule"] == "f1" and s["threshold_choice"]["value"] == s["threshold"]
    assert s["layers"] == ([0, 1] if method == "dinomaly" else [0, 1])
    with pytest.raises(ConfigError, match=r"already holds a fitted detector; pass --force to replace it"):
        anomaly.main(fit)
    assert anomaly.main(fit + ["--force"]) == 0
    out = tmp_path / "out"
    assert anomaly.main(["score", "--checkpoint", str(parts / "ck"), "--bank", str(bank), str(parts / "test"),
                         "--out", str(out), "--maps"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert 0 <= m["pixel_auroc"] <= 1 and 0 <= m["aupro"] <= 1
    raw = sorted((out / "maps").glob("*.npy"))
    assert len(raw) == 6 and np.load(raw[0]).shape == (4, 4)


def test_a_bad_rate_or_defects_without_good_validation_are_refused_before_the_model_loads(tmp_path):
    from helpers import import_script

    from vit.config import ConfigError

    base = ["fit", "--checkpoint", str(tmp_path / "none"), "--good", "g"]
    with pytest.raises(ConfigError, match=r"^--false-alarm-rate must be a share strictly between 0 and 1"):
        import_script("anomaly").main(base + ["--false-alarm-rate", "0"])
    with pytest.raises(ConfigError, match=r"--val-defects sets an F1 threshold .* pass --val too\.$"):
        import_script("anomaly").main(base + ["--val-defects", "d"])
    with pytest.raises(ConfigError, match=r"^anomaly\.py fit --method dinomaly does not read --ratio; remove it\.$"):
        import_script("anomaly").main(base + ["--method", "dinomaly", "--ratio", "0.5"])


def test_a_folder_of_another_method_is_one_sentence(parts, tmp_path):
    from vit.eval.anomaly import PatchCore, load_patchcore, save_patchcore
    from vit.eval.dinomaly import Dinomaly, load_dinomaly, save_dinomaly

    save_dinomaly(tmp_path / "d", Dinomaly(32, 2, (0, 1)))
    with pytest.raises(ValueError, match=r"holds a dinomaly model, not a nearest-neighbour bank"):
        load_patchcore(tmp_path / "d")
    save_patchcore(tmp_path / "p", PatchCore(torch.randn(4, 8), (0,)))
    with pytest.raises(ValueError, match=r"holds a patchcore bank, not a Dinomaly model"):
        load_dinomaly(tmp_path / "p")


def test_maps_share_one_scale_anchored_at_the_threshold():
    """With a scale (0, 2 x threshold) a good part's map (every patch below the threshold) stays in the lower
    half of the colours, where min-max scaling alone would paint its worst patch at the top."""
    from vit.eval.plots import scaled_heat

    good = np.array([[0.1, 0.2], [0.3, 0.4]])
    m, _ = scaled_heat(good, (4, 4), (0.0, 2 * 0.5))
    np.testing.assert_allclose(m, good / 1.0)
    assert m.max() < 0.5 and scaled_heat(good, (4, 4))[0].max() == 1.0
    np.testing.assert_allclose(scaled_heat(np.array([[2.0, -1.0]]), (1, 2), (0.0, 1.0))[0], [[1.0, 0.0]])


def test_the_torch_free_scorer_applies_anomalydinos_distance_and_top_share():
    """vit/deploy/onnx_anomaly.py on features an exported AnomalyDINO model gives (unit vectors): 1 - cos to the
    nearest bank row per patch and the mean of the top ceil(1% x 16) = 1 patches, as PatchCore.score does."""
    from vit.deploy.onnx_anomaly import OnnxPatchCore
    from vit.eval.anomaly import PatchCore, top_mean

    rng = np.random.default_rng(3)
    unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    bank, feats = unit(rng.normal(size=(30, 8))).astype(np.float32), unit(rng.normal(size=(2, 16, 8)))
    onnx = object.__new__(OnnxPatchCore)  # the scorer alone: no files, a stand-in session
    onnx.bank, onnx.grid, onnx.normalize, onnx.top_share, onnx.input = bank, (4, 4), True, 0.2, "x"
    onnx.folder = Path("exported")
    onnx.session = type("S", (), {"run": lambda self, out, feed: [feats.astype(np.float32)]})()
    scores, maps = onnx.score(np.zeros((2, 3, 8, 8), np.float32))
    want = (1 - feats.astype(np.float32).astype(np.float64) @ bank.T.astype(np.float64)).min(-1)  # (2, 16)
    np.testing.assert_allclose(maps.reshape(2, 16), want, atol=1e-6)
    np.testing.assert_allclose(scores, np.sort(want, 1)[:, ::-1][:, :4].mean(1), atol=1e-6)  # ceil(0.2 x 16) = 4
    assert top_mean(torch.from_numpy(want), 0.2).numpy() == pytest.approx(scores, abs=1e-6)
    assert PatchCore(torch.from_numpy(bank), (0,), normalize=True, top_share=0.2).top_share == 0.2


def test_predict_reads_a_dinomaly_detector_beside_the_checkpoint(parts, tmp_path):
    """predict.py with a Dinomaly model in <checkpoint>/anomaly/: each row's anomaly score is the detector's own
    score of the same file, the verdict its threshold's, and --cam draws its map."""
    import csv
    import shutil

    from helpers import run_script

    from vit.data.transforms import build_transform
    from vit.eval.dinomaly import Dinomaly, find_detector, save_dinomaly
    from vit.eval.inference import ImageFiles
    from vit.models.checkpoint import load_checkpoint

    ck = tmp_path / "ck"
    shutil.copytree(parts / "ck", ck)
    torch.manual_seed(0)
    det = Dinomaly(32, 2, (0, 1), threshold=0.02)
    save_dinomaly(ck / "anomaly", det)
    assert isinstance(find_detector(ck), Dinomaly)
    paths = sorted((parts / "test").rglob("*.png"))
    model, cfg, *_ = load_checkpoint(ck)
    want, _, _ = det.score_files(model.eval(), ImageFiles(paths, build_transform(cfg.aug, 32, train=False)))
    r = run_script("predict.py", "--checkpoint", str(ck), *map(str, paths), "--out", str(tmp_path / "out"), "--cam")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {row["path"]: row for row in csv.DictReader((tmp_path / "out" / "predictions.csv").open())}
    for p, s in zip(paths, want):
        row = rows[str(p)]
        assert float(row["anomaly_score"]) == pytest.approx(float(s), abs=1e-5)
        assert row["verdict"] == ("defect" if float(s) >= 0.02 else "good")
    assert len(list((tmp_path / "out" / "cam").glob("*anomaly*.png"))) == len(paths)
