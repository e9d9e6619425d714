"""PatchCore and frozen features on a NaFlex checkpoint (data.naflex: each image whole, at its own aspect ratio):
numbers against the NaFlex model's own forward on the same image's patches, alone, with a float64 neighbourhood
average and nearest distance; the squashed square they used to get differs."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import import_script
from PIL import Image

from vit.data.naflex import collate_naflex
from vit.data.synthetic import wide_strip

SIZES = ((96, 24), (40, 40), (30, 70), (160, 16))  # (width, height): 4:1, 1:1, 1:2.3, 10:1


def _aggregate64(m: np.ndarray) -> np.ndarray:
    """(D, h, w) -> each patch's 3x3 neighbours summed and divided by 9 (zeros outside the grid), float64 loops."""
    D, h, w = m.shape
    out = np.zeros((D, h, w))
    for i in range(h):
        for j in range(w):
            out[:, i, j] = m[:, max(0, i - 1):i + 2, max(0, j - 1):j + 2].sum(axis=(1, 2)) / 9
    return out


@pytest.fixture(scope="module")
def naflex_checkpoint(tmp_path_factory):
    """An untrained NaFlex model (patch 8, at most 16 patches an image) saved as a checkpoint; strips of several
    aspect ratios in good/ and crack/."""
    from vit.config import load_config
    from vit.data.datasets import image_transform
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    tmp = tmp_path_factory.mktemp("naflex_anomaly")
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs/default.yaml",
                      ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=2",
                       "--model.num_heads=2", "--model.mlp_ratio=2", "--data.naflex={max_num_patches: 16}"])
    torch.manual_seed(0)
    model = build_model(cfg, 2).eval()
    assert model.embeds is not None
    save_checkpoint(tmp / "ck", model, cfg, ["crack", "good"])
    rng = np.random.default_rng(0)
    for name in ("good", "crack"):
        (tmp / "parts" / name).mkdir(parents=True)
        for i, (w, h) in enumerate(SIZES):
            Image.fromarray(wide_strip(rng, w, h, None if name == "good" else "crack")).save(
                tmp / "parts" / name / f"{i}.png")
    return tmp, model, image_transform(cfg, train=False)


def _alone(transform, path):
    return collate_naflex([(transform.load(path), 0)])[0]  # the image's own NaFlex batch, no padding


def test_patchcore_scores_each_image_on_its_own_grid_as_float64_says(naflex_checkpoint):
    from vit.eval.anomaly import fit_patchcore
    from vit.eval.inference import ImageFiles

    tmp, model, transform = naflex_checkpoint
    good, test = sorted((tmp / "parts" / "good").glob("*.png")), sorted((tmp / "parts").rglob("*.png"))
    pc = fit_patchcore(model, ImageFiles(good, transform), layers=(0, 1), ratio=1.0, batch_size=3)
    bank = pc.bank.double().numpy()
    scores, maps, ok = pc.score_files(model, ImageFiles(test, transform), batch_size=3)  # padded mixed batches
    assert ok.all() and len(maps) == len(test)
    grids = set()
    for path, s, m in zip(test, scores, maps):
        batch = _alone(transform, path)
        with torch.no_grad():
            layers = model.forward_intermediates(batch, indices=[0, 1], output_fmt="NCHW", intermediates_only=True)
        feats = np.concatenate([_aggregate64(layer[0].double().numpy()) for layer in layers])  # (2D, h, w)
        h, w = feats.shape[1:]
        want = np.sqrt(((feats.reshape(len(feats), -1).T[:, None] - bank[None]) ** 2).sum(-1)).min(1).reshape(h, w)
        assert m.shape == (h, w) == tuple(int(g) + 1 for g in batch["patch_coord"][0].amax(0))
        np.testing.assert_allclose(m, want, rtol=1e-4, atol=1e-5)
        assert s == pytest.approx(want.max(), rel=1e-4, abs=1e-5)
        grids.add((h, w))
    assert len(grids) == len(SIZES)  # every aspect ratio kept its own grid
    good_maps = [m for p, m in zip(test, maps) if p.parent.name == "good"]
    assert max(float(m.max()) for m in good_maps) < 1e-3  # banked patches are found at distance ~0


def test_anomaly_script_fits_and_scores_a_naflex_checkpoint(naflex_checkpoint, tmp_path):
    """anomaly.py fit crashed here ('list' object has no attribute 'float'); now fit, score and the maps run and
    the scores are the library's on each image alone."""
    from vit.eval.anomaly import load_patchcore

    tmp, model, transform = naflex_checkpoint
    script = import_script("anomaly")
    bank = tmp_path / "bank"
    assert script.main(["fit", "--checkpoint", str(tmp / "ck"), "--bank", str(bank), "--good",
                        str(tmp / "parts" / "good"), "--val", str(tmp / "parts" / "good"), "--ratio", "0.5"]) == 0
    out = tmp_path / "scores"
    assert script.main(["score", "--checkpoint", str(tmp / "ck"), "--bank", str(bank), str(tmp / "parts"),
                        "--out", str(out), "--maps"]) == 0
    rows = list(csv.DictReader((out / "scores.csv").open()))
    pc = load_patchcore(bank)
    want = [float(pc.score(model, _alone(transform, r["path"]))[0][0]) for r in rows]
    np.testing.assert_allclose([float(r["score"]) for r in rows], want, rtol=1e-5, atol=1e-6)
    assert len(rows) == 2 * len(SIZES) and all(Path(r["map"]).is_file() for r in rows)


def test_features_are_each_images_own_at_its_aspect_ratio(naflex_checkpoint, tmp_path):
    """features.py squashed every image to the checkpoint's square; now each embedding is what the NaFlex model's
    head reads on the image's own patches (the head on it gives the model's logits), and --patch-tokens, which
    needs one grid for all, is one sentence."""
    tmp, model, transform = naflex_checkpoint
    out = tmp_path / "f.npz"
    assert import_script("features").main(["--checkpoint", str(tmp / "ck"), str(tmp / "parts"), "--out", str(out),
                                           "--no-parquet"]) == 0
    with np.load(out, allow_pickle=False) as z:
        paths, emb = z["paths"], z["embeddings"]
    with torch.no_grad():
        batches = [_alone(transform, p) for p in paths]
        want = torch.cat([model.forward_head(model.forward_features(b), pre_logits=True) for b in batches])
        logits = torch.cat([model(b) for b in batches])
    np.testing.assert_allclose(emb, want.numpy(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.head(torch.from_numpy(emb)), logits, rtol=1e-5, atol=1e-5)
    from vit.config import ConfigError

    with pytest.raises(ConfigError, match=r"each on its own grid of patches, which one \(N, h\*w, D\) patch_tokens "
                                          r"array cannot hold; leave out --patch-tokens"):
        import_script("features").main(["--checkpoint", str(tmp / "ck"), str(tmp / "parts"), "--out",
                                        str(tmp_path / "g.npz"), "--patch-tokens"])


def test_predict_draws_rollout_and_anomaly_maps_on_each_images_own_grid(naflex_checkpoint, tmp_path, monkeypatch):
    """predict.py --cam refused a NaFlex checkpoint; now each image's rollout and anomaly maps are drawn over the
    image at its own aspect ratio, and the maps are those of the image alone (attention_maps, PatchCore.score)."""
    import shutil

    import vit.explain.overlays as overlays
    from vit.eval.anomaly import fit_patchcore, save_patchcore
    from vit.eval.inference import ImageFiles
    from vit.explain.rollout import attention_maps

    tmp, model, transform = naflex_checkpoint
    ck = tmp_path / "ck"
    shutil.copytree(tmp / "ck", ck)
    pc = fit_patchcore(model, ImageFiles(sorted((tmp / "parts" / "good").glob("*.png")), transform), ratio=0.5)
    pc.threshold = 1.0
    save_patchcore(ck / "anomaly", pc)
    import vit.eval.plots as plots

    drawn = {}

    def draw(path, image, grid_map, title, *scale):
        drawn[Path(path).name] = (image.shape, np.asarray(grid_map))

    monkeypatch.setattr(overlays, "plot_attention_map", draw)  # the rollout pictures
    monkeypatch.setattr(plots, "plot_attention_map", draw)  # the anomaly maps (vit.eval.plots.plot_anomaly_maps)
    assert import_script("predict").main(["--checkpoint", str(ck), str(tmp / "parts"), "--out", str(tmp_path / "p"),
                                          "--cam", "--batch-size", "3"]) == 0
    rows = list(csv.DictReader((tmp_path / "p" / "predictions.csv").open()))
    assert len(rows) == 2 * len(SIZES) and len(drawn) == 2 * len(rows)
    for i, r in enumerate(rows):
        batch = _alone(transform, r["path"])
        rollout = attention_maps(model, batch, "rollout")[0][0].numpy()
        score, heat = pc.score(model, batch)
        (shape, got), (shape2, got2) = (drawn[f"{i:06d}_{Path(r['path']).stem}{s}.png"] for s in ("", "_anomaly"))
        h, w = rollout.shape
        assert shape == shape2 == (8 * h, 8 * w, 3)  # the picture the model saw, at its own aspect ratio
        np.testing.assert_allclose(got, rollout, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got2, heat[0].numpy(), rtol=1e-4, atol=1e-5)
        assert float(r["anomaly_score"]) == pytest.approx(float(score[0]), rel=1e-5, abs=1e-6)


def test_visualize_attention_refuses_a_naflex_checkpoint_in_one_sentence(naflex_checkpoint, tmp_path):
    """It squashed a 1x5000 strip to the square size (a 4x4 map where predict.py --cam draws the strip's 1x16)."""
    from vit.config import ConfigError

    tmp, _, _ = naflex_checkpoint
    images = sorted(p for p in tmp.rglob("*.png"))[:1]
    with pytest.raises(ConfigError, match=r"^visualize_attention\.py draws maps on square images, and this "
                                          r"checkpoint reads each image at its own aspect ratio \(data\.naflex\); "
                                          r"draw its per-image rollout with predict\.py --checkpoint \.\.\. --cam"):
        import_script("visualize_attention").main(["--checkpoint", str(tmp / "ck"), str(images[0]),
                                                   "--out", str(tmp_path / "maps")])
    assert not (tmp_path / "maps").exists()


def test_export_refuses_a_naflex_checkpoint_in_one_sentence(naflex_checkpoint, tmp_path):
    from vit.config import ConfigError

    tmp, _, _ = naflex_checkpoint
    with pytest.raises(ConfigError, match=r"^export\.py writes models that read square images, and this checkpoint "
                                          r"reads each image at its own aspect ratio \(data\.naflex\); run it with "
                                          r"predict\.py --checkpoint, or export it from Python with "
                                          r"vit\.deploy\.export\.ExportableNaFlexClassifier \(docs/naflex\.md\)\.$"):
        import_script("export").main(["--checkpoint", str(tmp / "ck"), "--out", str(tmp_path / "exp")])
    assert not (tmp_path / "exp").exists() or not any((tmp_path / "exp").iterdir())
