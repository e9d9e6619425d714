"""PatchCore from good parts only (vit/eval/anomaly.py): scores against a float64 formula, the coreset against
brute-force k-center greedy, AUROC against scikit-learn; the generated inspection parts (vit/data/synthetic.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from vit import create_model
from vit.data.synthetic import DEFECTS, PART_KINDS, inspection_part
from vit.eval.anomaly import (
    PatchCore,
    coreset,
    k_center_greedy,
    load_patchcore,
    random_projection,
    save_patchcore,
)
from vit.eval.anomaly_metrics import auroc
from vit.eval.anomaly_threshold import choose_threshold


def _brute_k_center(z: np.ndarray, n: int, start: int) -> list[int]:
    """Each step recomputes, from the full float64 distance matrix, every row's distance to its nearest chosen row."""
    d = np.sqrt(((z[:, None, :] - z[None, :, :]) ** 2).sum(-1))
    chosen = [start]
    for _ in range(n - 1):
        chosen.append(int(np.argmax(d[:, chosen].min(axis=1))))
    return chosen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k_center_greedy_equals_brute_force(seed):
    z = np.random.default_rng(seed).normal(size=(40, 6))
    got = k_center_greedy(torch.from_numpy(z), 10, start=seed)
    assert got.tolist() == _brute_k_center(z, 10, seed)


def test_k_center_greedy_breaks_ties_on_the_first_row():
    """Rows on an integer grid, each repeated (exact ties, zero distances once every distinct row is chosen), in
    float32: the same choices as the float64 reference's first-maximum rule; one row: just the start."""
    z = np.tile(np.random.default_rng(3).integers(0, 3, size=(20, 3)), (2, 1)).astype(np.float32)  # (40, 3)
    assert k_center_greedy(torch.from_numpy(z), 25, start=7).tolist() == _brute_k_center(z.astype(np.float64), 25, 7)
    assert k_center_greedy(torch.from_numpy(z), 1, start=7).tolist() == [7]


def test_coreset_is_k_center_on_the_projection():
    x = torch.randn(50, 300, dtype=torch.float64)
    got = coreset(x, 7, projection_dim=16, seed=3)
    z = random_projection(x, 16, seed=3).numpy()
    assert got.tolist() == _brute_k_center(z, 7, int(got[0]))
    assert len(set(got.tolist())) == 7


def _aggregate64(m: np.ndarray) -> np.ndarray:
    """(B, D, h, w) -> each position's 3x3 neighbours summed and divided by 9 (PatchCore's zero padding: an edge
    patch's missing neighbours count as zeros), by loops in float64."""
    B, D, h, w = m.shape
    out = np.zeros_like(m, dtype=np.float64)
    for i in range(h):
        for j in range(w):
            out[:, :, i, j] = m[:, :, max(0, i - 1):i + 2, max(0, j - 1):j + 2].sum(axis=(2, 3)) / 9
    return out


def test_scores_equal_a_float64_recomputation():
    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=4, num_classes=2).eval()
    layers = (1, 2)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        maps = model.forward_intermediates(x, indices=list(layers), output_fmt="NCHW", intermediates_only=True)
    feats = np.concatenate([_aggregate64(m.double().numpy()) for m in maps], axis=1)  # (B, 2D, 4, 4)
    feats = feats.reshape(3, feats.shape[1], 16).transpose(0, 2, 1)  # (B, 16, 2D)
    bank = feats[1:].reshape(-1, feats.shape[2])[::3]  # the other images' patches, a third of them
    pc = PatchCore(torch.from_numpy(bank).float(), layers)
    scores, heat = pc.score(model, x)
    dist = np.sqrt(((feats[:, :, None, :] - bank[None, None]) ** 2).sum(-1)).min(-1)  # (B, 16)
    np.testing.assert_allclose(heat.numpy().reshape(3, 16), dist, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(scores.numpy(), dist.max(1), rtol=1e-4, atol=1e-5)
    assert dist[0].min() > 1e-3 and (dist[1:] < 1e-3).sum() == len(bank)  # image 0 is new; banked patches found


def test_the_torch_free_nearest_distance_equals_float64_and_torch():
    """vit/deploy/onnx_anomaly.py's NumPy distance (the |q|^2 + |m|^2 - 2 q.m expansion in float64) against
    differences in float64 and against the torch path's, including queries that sit on a bank row."""
    from vit.deploy.onnx_anomaly import nearest_distance as numpy_nearest
    from vit.eval.anomaly import nearest_distance

    rng = np.random.default_rng(0)
    bank = (rng.normal(size=(300, 24)) * 4 + 20).astype(np.float32)  # far from 0: cancellation would show
    q = np.concatenate([rng.normal(size=(50, 24)) * 4 + 20, bank[:5]]).astype(np.float32)
    want = np.sqrt(((q[:, None].astype(np.float64) - bank[None]) ** 2).sum(-1)).min(1)
    got = numpy_nearest(q, bank, chunk=16)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(nearest_distance(torch.from_numpy(q), torch.from_numpy(bank)).numpy(), want,
                               rtol=1e-5, atol=1e-5)
    assert (got[-5:] < 1e-5).all() and got[:50].min() > 1


def test_nearest_distance_ranks_by_a_product_but_measures_exactly():
    """Features far from the origin (ViT tokens carry large constant channels) whose rows differ by little: the
    product |m|^2 - 2 q.m of raw float32 features could not tell the rows apart; centred on the bank's mean it
    ranks them, and the exact pass gives float64's distance, even with a single candidate."""
    from vit.eval.anomaly import nearest_distance

    rng = np.random.default_rng(1)
    bank = (500 + rng.normal(size=(400, 16)) * 0.01).astype(np.float32)
    q = np.concatenate([bank[:60] + rng.normal(size=(60, 16)) * 0.002, 500 + rng.normal(size=(40, 16)) * 0.01])
    q = q.astype(np.float32)
    want = np.sqrt(((q[:, None].astype(np.float64) - bank[None]) ** 2).sum(-1)).min(1)
    for candidates in (1, 8):
        got = nearest_distance(torch.from_numpy(q), torch.from_numpy(bank), chunk=32, candidates=candidates)
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-3, atol=1e-5)


def test_empty_banks_and_sizes_below_one_are_one_sentence(tmp_path):
    """An empty bank (a hand-edited file, or a coreset of 0) or a count below 1: a ValueError that says so, not an
    IndexError from inside a reduction; an empty query set is fine (no distances)."""
    from vit.eval.anomaly import nearest_distance

    bank, q = torch.randn(5, 4), torch.randn(3, 4)
    assert nearest_distance(q[:0], bank).shape == (0,)
    for kw in ({"bank": bank[:0]}, {"bank": bank, "candidates": 0}, {"bank": bank, "chunk": 0}):
        with pytest.raises(ValueError, match="nearest distances need a bank of at least 1 row"):
            nearest_distance(q, **kw)
    for z, n in ((bank, 0), (bank[:0], 3)):
        with pytest.raises(ValueError, match="k-center greedy chooses at least 1 of at least 1 rows"):
            k_center_greedy(z, n)
    save_patchcore(tmp_path / "anomaly", PatchCore(torch.zeros(0, 4), (1, 2)))
    with pytest.raises(ValueError, match="bank of at least 1 row; rebuild it with anomaly.py fit"):
        load_patchcore(tmp_path / "anomaly")


def test_auroc_equals_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200).astype(bool)
    s = np.round(rng.normal(size=200) + y, 1)  # rounded: many ties
    assert auroc(s, y) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    with pytest.raises(ValueError, match="both good and defective"):
        auroc(s, np.ones(200, bool))


def test_threshold_and_files_round_trip(tmp_path):
    assert choose_threshold(np.array([0.1, 0.4, 0.3, np.nan])).value == np.nextafter(0.4, 1)  # none flagged
    assert choose_threshold(np.arange(100.0), rate=0.05).value == np.nextafter(94.0, 100)  # 95..99 flagged: 5%
    pc = PatchCore(torch.randn(20, 8), (1, 2), threshold=0.7)
    back = load_patchcore(save_patchcore(tmp_path / "anomaly", pc))
    assert torch.equal(back.bank, pc.bank) and back.layers == (1, 2) and back.threshold == 0.7
    (tmp_path / "anomaly" / "bank.safetensors").write_bytes(b"\x80\x04 not safetensors")
    with pytest.raises(ValueError, match="does not hold a PatchCore bank"):
        load_patchcore(tmp_path / "anomaly")


@pytest.mark.parametrize("kind", PART_KINDS)
def test_a_defect_changes_only_its_mask(kind):
    for i, defect in enumerate(DEFECTS):
        good, none = inspection_part(np.random.default_rng(i), 48, kind)
        bad, mask = inspection_part(np.random.default_rng(i), 48, kind, defect)
        assert not none.any() and 0.002 < mask.mean() < 0.06
        changed = (good != bad).any(axis=2)
        assert changed.any() and not (changed & ~mask).any()


def test_script_fits_scores_and_maps(tiny_run, tmp_path):
    import csv
    import json

    from helpers import run_script
    from PIL import Image
    from sklearn.metrics import roc_auc_score

    run, _ = tiny_run
    ckpt = tmp_path / "ckpt"
    shutil.copytree(run / "best", ckpt)
    rng = np.random.default_rng(0)
    for split, names in (("train", {"good": 6}), ("val", {"good": 3}), ("test", {"good": 3, "stain": 3})):
        for name, n in names.items():
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(n):
                img, _ = inspection_part(rng, 32, "weave", None if name == "good" else name)
                Image.fromarray(img).save(tmp_path / split / name / f"{i}.png")
    fit = run_script("anomaly.py", "fit", "--checkpoint", str(ckpt), "--good", str(tmp_path / "train"),
                     "--val", str(tmp_path / "val"), "--ratio", "0.5")
    assert fit.returncode == 0, fit.stderr[-2000:]
    settings = json.loads((ckpt / "anomaly" / "patchcore.json").read_text())
    assert settings["bank_size"] == 6 * 4 // 2 and settings["threshold"] > 0  # 32 px, patch 16: 2x2 patches
    out = tmp_path / "out"
    score = run_script("anomaly.py", "score", "--checkpoint", str(ckpt), str(tmp_path / "test"), "--out", str(out),
                       "--maps")
    assert score.returncode == 0, score.stderr[-2000:]
    rows = list(csv.DictReader((out / "scores.csv").open()))
    assert len(rows) == 6 and all(Path(r["map"]).is_file() for r in rows)
    assert all(r["verdict"] == ("defect" if float(r["score"]) >= settings["threshold"] else "good") for r in rows)
    y = [Path(r["path"]).parent.name != "good" for r in rows]
    auc = json.loads((out / "metrics.json").read_text())["auroc"]
    assert auc == pytest.approx(roc_auc_score(y, [float(r["score"]) for r in rows]), abs=1e-6)
    bad = run_script("anomaly.py", "score", "--checkpoint", str(run / "best"), str(tmp_path / "test"), "--out",
                     str(out))
    assert bad.returncode == 2 and "build them with anomaly.py fit" in bad.stderr


@pytest.fixture(scope="module")
def anomaly_checkpoint(tmp_path_factory):
    """An untrained 32-px, patch-8 model (4x4 grid) saved as a checkpoint with a bank of generated good weave
    parts and a threshold; folders of good and stained test parts."""
    from PIL import Image

    from vit.config import load_config
    from vit.data.transforms import build_transform
    from vit.eval.anomaly import fit_patchcore
    from vit.eval.inference import ImageFiles
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    tmp = tmp_path_factory.mktemp("anomaly")
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs/default.yaml",
                      ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=2",
                       "--model.num_heads=2", "--model.mlp_ratio=2"])
    torch.manual_seed(0)
    model = build_model(cfg, 4).eval()
    save_checkpoint(tmp / "ck", model, cfg, list(PART_KINDS))
    rng = np.random.default_rng(0)
    for split, names in (("train", {"good": 6}), ("test", {"good": 2, "stain": 2, "scratch": 2})):
        for name, n in names.items():
            (tmp / split / name).mkdir(parents=True)
            for i in range(n):
                img, _ = inspection_part(rng, 32, "weave", None if name == "good" else name)
                Image.fromarray(img).save(tmp / split / name / f"{i}.png")
    (tmp / "test" / "good" / "broken.png").write_bytes(b"\x89PNG not an image")
    transform = build_transform(cfg.aug, 32, train=False)
    paths = sorted((tmp / "train" / "good").glob("*.png"))
    pc = fit_patchcore(model, ImageFiles(paths, transform), ratio=0.5)
    test = sorted((tmp / "test").rglob("[0-9].png"))
    s = pc.score(model, torch.stack([transform.load(p) for p in test]))[0].sort().values
    pc.threshold = float(s[2:4].mean())  # between the two middle scores: no image sits on it (float noise would decide)
    save_patchcore(tmp / "ck" / "anomaly", pc)
    return tmp, model, pc, transform


@pytest.mark.slow
def test_predict_rows_carry_the_score_and_verdict_and_draw_the_map(anomaly_checkpoint, tmp_path):
    import csv

    from helpers import import_script

    tmp, model, pc, transform = anomaly_checkpoint
    out = tmp_path / "preds"
    assert import_script("predict").main(["--checkpoint", str(tmp / "ck"), str(tmp / "test"), "--out", str(out),
                                          "--cam", "--topk", "2"]) == 0
    rows = list(csv.DictReader((out / "predictions.csv").open()))
    assert len(rows) == 6 and not any(r["path"].endswith("broken.png") for r in rows)
    want, _ = pc.score(model, torch.stack([transform.load(r["path"]) for r in rows]))
    np.testing.assert_allclose([float(r["anomaly_score"]) for r in rows], want.numpy(), atol=2e-6)
    assert [r["verdict"] for r in rows] == ["defect" if s >= pc.threshold else "good" for s in want.tolist()]
    assert {r["verdict"] for r in rows} == {"defect", "good"}  # the threshold splits them: a real comparison
    assert all(Path(r["anomaly_map"]).is_file() and Path(r["cam"]).is_file() for r in rows)


@pytest.mark.slow
def test_onnx_predictor_reads_the_bank_as_an_array_and_scores_as_torch(anomaly_checkpoint, tmp_path):
    """export.py writes anomaly/ (features.onnx, bank.npy, patchcore.json) beside model.onnx; predict.py --onnx,
    run where torch cannot be imported, gives the torch path's scores within 1e-4 and the same verdicts."""
    import csv
    import json

    from helpers import ROOT, import_script, run_script
    from test_onnx_predict import NO_TORCH

    tmp, model, pc, transform = anomaly_checkpoint
    exp = tmp_path / "exp"
    assert import_script("export").main(["--checkpoint", str(tmp / "ck"), "--out", str(exp),
                                         "--images", str(tmp / "test")]) == 0
    check = json.loads((exp / "verification.json").read_text())["results"]["anomaly"]
    assert check["max_abs_score_diff"] <= 1e-4 and check["images"] > 0
    bank = np.load(exp / "anomaly" / "bank.npy", allow_pickle=False)
    assert np.array_equal(bank, pc.bank.numpy())
    from vit.deploy.onnx_anomaly import OnnxPatchCore

    for name, broken in (("empty", bank[:0]), ("nan", np.full_like(bank, np.nan))):  # a hand-edited bank.npy
        shutil.copytree(exp / "anomaly", tmp_path / name)
        np.save(tmp_path / name / "bank.npy", broken)
        with pytest.raises(ValueError, match="is not a finite, non-empty \\(K, F\\) float32 bank; export the"):
            OnnxPatchCore(tmp_path / name, exp / "preprocessing.json")
    ours = tmp_path / "torch"
    assert import_script("predict").main(["--checkpoint", str(tmp / "ck"), str(tmp / "test"), "--out", str(ours)]) == 0
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(NO_TORCH)
    r = run_script("predict.py", "--onnx", str(exp / "model.onnx"), str(tmp / "test"), "--out", str(tmp_path / "onnx"),
                   env={"PYTHONPATH": f"{shim}:{ROOT}"})
    assert r.returncode == 0, r.stderr
    a = list(csv.DictReader((ours / "predictions.csv").open()))
    b = list(csv.DictReader((tmp_path / "onnx" / "predictions.csv").open()))
    assert [x["path"] for x in a] == [x["path"] for x in b] and len(a) == 6
    diff = max(abs(float(x["anomaly_score"]) - float(y["anomaly_score"])) for x, y in zip(a, b))
    assert diff <= 1e-4 and [x["verdict"] for x in a] == [x["verdict"] for x in b]


class _Images:
    """n random images as ImageFiles gives them: (x, readable, index)."""

    def __init__(self, n: int, size: int = 32) -> None:
        self.x = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(n))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], 1, i


def test_bank_building_and_scoring_are_linear_in_images(monkeypatch):
    """Counted, not timed: each image goes through the model once; the features kept, the coreset's distance
    evaluations under a fixed max_bank, and the scoring's query-bank distances double when the images do."""
    import vit.eval.anomaly as anomaly

    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=2,
                         num_classes=2).eval()
    counts = {"images": 0, "coreset": 0, "pairs": 0}
    forward = model.forward_intermediates
    greedy, nearest = anomaly.k_center_greedy, anomaly.nearest_distance

    def counted_forward(x, **kw):
        counts["images"] += len(x)
        return forward(x, **kw)

    def counted_greedy(z, n, start=0):
        counts["coreset"] += len(z) * n  # each of the n steps measures every row once
        return greedy(z, n, start)

    def counted_nearest(q, bank, chunk=2048):
        counts["pairs"] += len(q) * len(bank)
        return nearest(q, bank, chunk)

    monkeypatch.setattr(model, "forward_intermediates", counted_forward)
    monkeypatch.setattr(anomaly, "k_center_greedy", counted_greedy)
    monkeypatch.setattr(anomaly, "nearest_distance", counted_nearest)
    seen = []
    for n in (6, 12):
        counts.update(images=0, coreset=0, pairs=0)
        pc = anomaly.fit_patchcore(model, _Images(n), ratio=0.5, batch_size=4, max_bank=20)
        fit = dict(counts)
        counts.update(images=0, coreset=0, pairs=0)
        scores, maps, ok = pc.score_files(model, _Images(n), batch_size=4)
        seen.append((fit, dict(counts), len(pc.bank), maps.shape))
    (fit6, score6, bank6, maps6), (fit12, score12, bank12, maps12) = seen
    assert bank6 == bank12 == 20 and fit6["images"] == 6 and fit12["images"] == 12  # 16 patches each
    assert fit12["coreset"] == 2 * fit6["coreset"] == 2 * 6 * 16 * 20
    assert score12["images"] == 12 and score12["pairs"] == 2 * score6["pairs"] == 2 * 6 * 16 * 20
    assert maps6 == (6, 4, 4) and maps12 == (12, 4, 4)


@pytest.mark.parametrize("args", [["--good", "0"], ["--good", "-5"], ["--neighbourhoods", "3", "2"]])
def test_parts_experiment_refuses_bad_counts_before_training(tmp_path, capsys, args):
    """scripts/anomaly_parts.py: --good 0 or below (which would have emptied the bank's folder) or an even
    neighbourhood is one sentence at once, not a failure after the backbone's minutes of training."""
    from helpers import import_script

    with pytest.raises(SystemExit) as e:
        import_script("scripts/anomaly_parts").main(["--out", str(tmp_path / "parts"), *args])
    assert e.value.code == 2 and not (tmp_path / "parts").exists()
    assert "--good must be at least 1 part and every --neighbourhoods an odd number" in capsys.readouterr().err


@pytest.mark.parametrize("mode, extra, named", [
    ("fit", ["--out", "elsewhere"], "--out"),  # the bank went to <checkpoint>/anomaly, the folder given unused
    ("fit", ["--maps"], "--maps"),
    ("score", ["--ratio", "0.5"], "--ratio"),
    ("score", ["--false-alarm-rate", "0.1"], "--false-alarm-rate"),
    ("score", ["--val", "x"], "--val"),
])
def test_an_option_the_other_mode_reads_is_refused_before_the_model_loads(tmp_path, mode, extra, named):
    from helpers import import_script

    from vit.config import ConfigError

    other = "score" if mode == "fit" else "fit"
    args = [mode, "--checkpoint", str(tmp_path / "no-such-run")] + (["--good", "g"] if mode == "fit" else ["img"])
    with pytest.raises(ConfigError, match=rf"^anomaly\.py {mode} does not read {named} \(anomaly\.py {other} does\); "
                                          r"remove it\.$"):
        import_script("anomaly").main(args + extra)
    assert not (tmp_path / "elsewhere").exists()


def test_tiles_of_a_strip_are_stitched_and_its_score_is_the_worst_tile(anomaly_checkpoint):
    """vit/eval/anomaly_tiles.py against a float64 loop over the same crops: an image of the tile's size gives the
    whole-image score and map; a strip's map is the average of its tiles' upsampled maps where they overlap (tiles
    at 0, 16, 32 and 40: the last flush with the edge, batches cut across them), its score the worst tile's."""
    from vit.eval.anomaly_metrics import upsample_maps
    from vit.eval.anomaly_tiles import tiled_score

    _, model, pc, _ = anomaly_checkpoint
    g = torch.Generator().manual_seed(0)
    square = torch.randn(3, 32, 32, generator=g)
    s, m = tiled_score(pc, model, square, 32)
    s0, m0 = pc.score(model, square[None])
    assert s == pytest.approx(float(s0[0]), abs=1e-6)
    np.testing.assert_allclose(m, upsample_maps(m0.numpy(), (32, 32))[0], atol=1e-6)
    strip = torch.randn(3, 32, 72, generator=g)
    s, m = tiled_score(pc, model, strip, 32, batch_size=3)
    total, count, scores = np.zeros((32, 72)), np.zeros((32, 72)), []
    for left in (0, 16, 32, 40):
        si, mi = pc.score(model, strip[None, :, :, left:left + 32])
        total[:, left:left + 32] += upsample_maps(mi.numpy(), (32, 32))[0]
        count[:, left:left + 32] += 1
        scores.append(float(si[0]))
    assert m.shape == (32, 72) and count.min() == 1 and count.max() == 3
    np.testing.assert_allclose(m, total / count, atol=1e-6)
    assert s == pytest.approx(max(scores), abs=1e-6)
    with pytest.raises(ValueError, match=r"--tile 40 does not fit the image of 72x32 pixels \(.* shorter side, 32\); "):
        tiled_score(pc, model, strip, 40)


def test_score_with_tiles_writes_each_strips_map_at_its_own_size(anomaly_checkpoint, tmp_path):
    import csv

    from helpers import run_script
    from PIL import Image

    tmp, *_ = anomaly_checkpoint
    rng = np.random.default_rng(3)
    (tmp_path / "strips" / "good").mkdir(parents=True)
    for i, width in enumerate((72, 96)):
        Image.fromarray(np.concatenate([inspection_part(rng, 32, "weave", None)[0] for _ in range(3)], 1)[:, :width]
                        ).save(tmp_path / "strips" / "good" / f"{i}.png")
    out = tmp_path / "out"
    r = run_script("anomaly.py", "score", "--checkpoint", str(tmp / "ck"), str(tmp_path / "strips"), "--out",
                   str(out), "--maps", "--tile", "32")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader((out / "scores.csv").open()))
    assert [np.load(Path(r["map"]).with_suffix(".npy")).shape for r in rows] == [(32, 72), (32, 96)]
    assert all(r["verdict"] in ("good", "defect") for r in rows)
    (tmp_path / "low" / "good").mkdir(parents=True)  # 24 pixels high: no 32-pixel tile fits
    Image.fromarray(inspection_part(rng, 32, "weave", None)[0][:24]).save(tmp_path / "low" / "good" / "low.png")
    r = run_script("anomaly.py", "score", "--checkpoint", str(tmp / "ck"), str(tmp_path / "low"), "--out",
                   str(out), "--tile", "32")
    assert r.returncode == 2 and "--tile 32 does not fit image" in r.stderr and "low.png" in r.stderr
    assert "note: the detector and its threshold were fitted on whole images" in run_script(
        "anomaly.py", "score", "--checkpoint", str(tmp / "ck"), str(tmp_path / "strips"), "--out", str(out),
        "--tile", "32").stderr
    # fit --tile: the bank holds the tiles' patches (2 strips: 4 + 5 tiles of 16 patches, half kept), the
    # threshold comes from the tiled validation strips, and score tiles by default as the detector was fitted
    r = run_script("anomaly.py", "fit", "--checkpoint", str(tmp / "ck"), "--good", str(tmp_path / "strips"),
                   "--val", str(tmp_path / "strips"), "--tile", "32", "--bank", str(tmp_path / "b"), "--ratio", "0.5")
    assert r.returncode == 0, r.stderr[-2000:]
    settings = json.loads((tmp_path / "b" / "patchcore.json").read_text())
    assert settings["tile"] == 32 and settings["bank_size"] == (4 + 5) * 16 // 2
    r = run_script("anomaly.py", "score", "--checkpoint", str(tmp / "ck"), "--bank", str(tmp_path / "b"),
                   str(tmp_path / "strips"), "--out", str(tmp_path / "o2"), "--maps")
    assert r.returncode == 0 and "note:" not in r.stderr, r.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "o2" / "scores.csv").open()))
    assert [np.load(Path(r["map"]).with_suffix(".npy")).shape for r in rows] == [(32, 72), (32, 96)]
    assert [r["verdict"] for r in rows] == ["good", "good"]  # its own validation strips: under the threshold
    for tile in ("0", "7", "16"):  # not the fixed-size model's input size: one sentence, never untiled scoring
        r = run_script("anomaly.py", "score", "--checkpoint", str(tmp / "ck"), str(tmp_path / "strips"), "--out",
                       str(out), "--tile", tile)
        assert r.returncode == 2 and f"--tile {tile} is not a tile this model takes: use its input size, 32" \
            in r.stderr, r.stderr
