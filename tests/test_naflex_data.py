"""NaFlex data (vit/data/naflex.py) against timm's NaFlex pipeline as the oracle: the grid chosen for a patch
budget, the patches, coordinates and mask of an image, the padded batch; the token-budget sampler's guarantees;
data.naflex's config sentences; and a tiny train.py run whose checkpoint evaluate.py reads."""

import dataclasses
import random

import numpy as np
import pytest
import torch
from helpers import ROOT, TINY, run_script
from PIL import Image
from timm.data.naflex_dataset import NaFlexCollator
from timm.data.naflex_transforms import get_image_size_for_seq, patchify_image
from timm.data.transforms_factory import transforms_imagenet_eval

from vit.config import AugConfig, ConfigError, from_dict
from vit.data.datasets import ArrayDataset
from vit.data.loaders import EpochSampler
from vit.data.naflex import (
    BudgetBatchSampler,
    build_naflex_transform,
    collate_naflex,
    grid_for_budget,
    patchify,
    sequence_lengths,
    unpatchify,
)
from vit.data.synthetic import photo_like, wide_strip


def test_grid_matches_timm_get_image_size_for_seq():
    """Random sizes, patch sizes and budgets, plus the cases where timm's bisection is not the exact optimum
    (two sides crossing a patch boundary within its tolerance; a tiny image capped below 100x)."""
    rng = random.Random(0)
    cases = [(2984, 2155, 8, 256), (1, 3, 16, 256), (1, 15, 32, 196), (48, 192, 8, 64), (224, 224, 16, 196)]
    cases += [(rng.randint(1, 3000), rng.randint(1, 3000), rng.choice([8, 14, 16, 32]),
               rng.choice([16, 64, 196, 256, 576, 1024])) for _ in range(400)]
    for h, w, p, m in cases:
        _, (th, tw) = get_image_size_for_seq((h, w), p, m)
        assert grid_for_budget(h, w, p, m) == (th // p, tw // p), (h, w, p, m)


def test_eval_patches_equal_timm_naflex_transform():
    """timm's evaluation pipeline (ResizeToSequence, ToTensor, Normalize, Patchify) and ours on the same image:
    a 4:1 strip already at its budget size (both resizes are then the identity), same patches within 1e-6,
    same coordinates and mask; a strip that must be resized gets the same grid and coordinates."""
    mean, std = (0.48, 0.45, 0.40), (0.27, 0.26, 0.28)
    aug = AugConfig(mean=list(mean), std=list(std), interpolation="bilinear")
    timm_t = transforms_imagenet_eval(naflex=True, patchify=True, patch_size=8, max_seq_len=64, mean=mean, std=std,
                                      interpolation="bilinear")
    ours = build_naflex_transform(aug, 8, 64, train=False)
    img = photo_like(np.random.default_rng(0), 128, 32)  # (32, 128, 3): a 4 x 16 grid, 64 patches
    a, b = timm_t(Image.fromarray(img)), ours(img)
    assert b["patches"].shape == (64, 8 * 8 * 3)
    torch.testing.assert_close(b["patches"], a["patches"], atol=1e-6, rtol=0)
    assert torch.equal(b["patch_coord"], a["patch_coord"]) and torch.equal(b["patch_valid"], a["patch_valid"])
    strip = wide_strip(np.random.default_rng(1), 201, 47, "crack")  # resized: 4 x 16 again, by timm's rule
    a, b = timm_t(Image.fromarray(strip)), ours(strip)
    assert b["patches"].shape == a["patches"].shape == (64, 192)
    assert torch.equal(b["patch_coord"], a["patch_coord"]) and torch.equal(b["patch_valid"], a["patch_valid"])


def test_patchify_matches_timm_and_unpatchify_inverts_it():
    x = torch.randn(3, 24, 40, dtype=torch.float64)
    ours = patchify(x, 8)
    patches, coord, valid = patchify_image(x, (8, 8))
    assert torch.equal(ours["patches"], patches) and torch.equal(ours["patch_coord"], coord)
    assert torch.equal(ours["patch_valid"], valid)
    assert torch.equal(unpatchify(ours, 8), x)
    with pytest.raises(ValueError, match="whole number of 8x8 patches"):
        patchify(x[:, :20], 8)


def test_collate_pads_like_timm_and_padding_does_not_leak_through_timm_naflexvit():
    """The padded batch equals timm's NaFlexCollator's (padded to the same length); fed to timm's NaFlexVit, each
    image gets the logits it gets alone (the mask keeps padding out), within 1e-5."""
    import timm

    gen = torch.Generator().manual_seed(0)
    samples = [(patchify(torch.randn(3, h, w, generator=gen), 8), y) for (h, w), y in
               (((16, 64), 0), ((24, 40), 2), ((8, 120), 1))]
    batch, labels = collate_naflex(samples)
    ref, ref_labels = NaFlexCollator(max_seq_len=16)(samples)
    for key in ("patches", "patch_coord", "patch_valid"):
        assert torch.equal(batch[key], ref[key]), key
    assert torch.equal(labels, ref_labels) and batch["patch_valid"].sum(1).tolist() == [16, 15, 15]
    model = timm.create_model("naflexvit_base_patch16_gap", pretrained=False, patch_size=8, embed_dim=32, depth=2,
                              num_heads=2, num_classes=3).eval()
    with torch.no_grad():
        together = model(batch)
        alone = torch.cat([model(collate_naflex([s])[0]) for s in samples])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    assert not torch.allclose(alone[1], alone[2], atol=1e-3)  # distinct images: the comparison can fail


def test_budget_sampler_fits_budget_covers_every_image_once_and_resumes():
    """Batches never hold more than the budget (images x longest sequence), each epoch has every index once and
    as many batches as the sampler's length, epochs differ and repeat per (seed, epoch), evaluation keeps the
    order; Accelerate's mid-epoch skip continues the epoch exactly (train.py's resume)."""
    from accelerate import Accelerator

    lengths = [random.Random(i).choice([20, 33, 48, 60, 64]) for i in range(101)]
    s = BudgetBatchSampler(lengths, 200, EpochSampler(101, shuffle=True, seed=3))
    epochs = []
    for epoch in (0, 1, 0):
        s.set_epoch(epoch)
        batches = list(s)
        assert all(len(b) * max(lengths[i] for i in b) <= 200 for b in batches)
        assert sorted(i for b in batches for i in b) == list(range(101)) and len(batches) == len(s)
        epochs.append(batches)
    assert epochs[0] == epochs[2] and epochs[0] != epochs[1]
    ordered = list(BudgetBatchSampler(lengths, 200, EpochSampler(101, shuffle=False)))
    assert [i for b in ordered for i in b] == list(range(101))
    with pytest.raises(ValueError, match="raise the budget"):
        BudgetBatchSampler(lengths, 63, EpochSampler(101))

    ds = ArrayDataset(np.zeros((101, 1, 1, 3), np.uint8), range(101), ["x"], transform=lambda img, seed: seed)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=BudgetBatchSampler(
        lengths, 200, EpochSampler(101, shuffle=True, seed=3)), collate_fn=lambda b: [i for _, i in b])
    acc = Accelerator(cpu=True)
    full = acc.prepare(loader)
    full.set_epoch(1)
    whole = list(full)
    skipped = acc.skip_first_batches(full, 4)
    skipped.set_epoch(1)
    assert list(skipped) == whole[4:]
    # two processes (DDP): Accelerate deals whole batches in turn; together they hold every image, none over budget
    from accelerate.data_loader import BatchSamplerShard

    shards = [list(BatchSamplerShard(s, 2, rank)) for rank in (0, 1)]
    assert len(shards[0]) == len(shards[1]) and {i for sh in shards for b in sh for i in b} == set(range(101))
    assert all(len(b) * max(lengths[i] for i in b) <= 200 for sh in shards for b in sh)


def test_sequence_lengths_from_sizes_without_decoding(tmp_path):
    """In-memory arrays and folder files (header only, EXIF quarter turns applied) give the grid's patch count."""
    arrays = ArrayDataset(np.zeros((2, 48, 192, 3), np.uint8), [0, 0], ["x"], None)
    assert sequence_lengths(arrays, 8, 64) == [64, 64]
    img = Image.fromarray(np.zeros((40, 160, 3), np.uint8))
    exif = img.getexif()
    exif[0x0112] = 6  # rotated a quarter turn: displayed 160 x 40
    img.save(tmp_path / "r.jpg", exif=exif)
    img.save(tmp_path / "p.png")
    folder = type("F", (), {"samples": [(tmp_path / "p.png", 0), (tmp_path / "r.jpg", 0), (tmp_path / "no.png", 0)]})
    h, w = grid_for_budget(40, 160, 8, 64)
    assert sequence_lengths(folder(), 8, 64) == [h * w, h * w, 64]
    assert grid_for_budget(160, 40, 8, 64) == (w, h)


def test_predict_files_reads_each_image_at_its_own_aspect_ratio(tmp_path):
    """predict.py's reader with a NaFlex checkpoint's pipeline: each image gets the logits it gets alone (timm's
    NaFlexVit as the model), an unreadable file costs one flagged row."""
    import timm
    from accelerate import Accelerator

    from vit.eval.inference import ImageFiles, predict_files

    rng = np.random.default_rng(0)
    paths = []
    for i, (w, h) in enumerate(((96, 24), (40, 40), (30, 70))):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(wide_strip(rng, w, h, "pits")).save(paths[-1])
    (tmp_path / "bad.png").write_bytes(b"not an image")
    paths.insert(1, tmp_path / "bad.png")
    transform = build_naflex_transform(AugConfig(), 8, 16, train=False)
    model = timm.create_model("naflexvit_base_patch16_gap", pretrained=False, patch_size=8, embed_dim=32, depth=2,
                              num_heads=2, num_classes=3).eval()
    out = predict_files(model, ImageFiles(paths, transform), 4, 0, Accelerator(cpu=True))
    assert out["ok"].tolist() == [True, False, True, True]
    with torch.no_grad():
        alone = torch.cat([model(collate_naflex([(transform.load(p), 0)])[0]) for p in paths if p.stem != "bad"])
    torch.testing.assert_close(out["logits"][out["ok"]], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("naflex, extra, message", [
    ({"max_num_patches": 0}, {}, "config key 'data.naflex.max_num_patches' must be a positive integer"),
    ({"max_num_patches": 64, "tokens_per_batch": 32}, {}, "at least max_num_patches (64)"),
    # each image was enlarged (up to 100x) to fill 10**8 patches and attended over 300,000 tokens: a hang
    ({"max_num_patches": 10**8}, {}, "'data.naflex.max_num_patches' must be at most 65536 (a 256 x 256 grid"),
    ({"max_num_patches": 64}, {"aug": {"mixup": 0.2}}, "set both to 0 or remove data.naflex"),
    ({"max_num_patches": 64}, {"data": {"dataset": "wds", "root": "x"}}, "does not give; use one of imagefolder"),
    ({"max_num_patches": 64}, {"data": {"sampler": "balanced"}}, "set data.sampler=shuffle"),
])
def test_bad_naflex_config_is_one_sentence(naflex, extra, message):
    raw = {**extra, "data": {**extra.get("data", {}), "naflex": naflex}}
    with pytest.raises(ConfigError) as e:
        from_dict(raw)
    assert message in str(e.value) and str(e.value).count(". ") == 0


def test_the_patch_bound_is_the_largest_grid_a_model_reads():
    from vit.config.options import NAFLEX_MAX_PATCHES
    from vit.layers.naflex import MAX_GRID_PATCHES

    assert NAFLEX_MAX_PATCHES == MAX_GRID_PATCHES
    assert from_dict({"data": {"naflex": {"max_num_patches": MAX_GRID_PATCHES}}}).data.naflex.max_num_patches == 65536


def test_data_naflex_builds_a_naflex_model_and_refuses_square_pretrained_weights():
    """A square architecture named with data.naflex gets NaFlex embeddings (it reads patch batches); its square
    pretrained weights would not fit them, which is one sentence, before any download."""
    from vit.models.build import build_model

    cfg = from_dict({"model": {"name": "vit_tiny_patch16_224", "img_size": 32, "patch_size": 8, "depth": 1},
                     "data": {"naflex": {"max_num_patches": 16}}})
    model = build_model(cfg, 3)
    batch = {"patches": torch.randn(2, 16, 8 * 8 * 3), "patch_coord": torch.stack(torch.meshgrid(
        torch.arange(4), torch.arange(4), indexing="ij"), -1).reshape(1, 16, 2).expand(2, -1, -1),
        "patch_valid": torch.ones(2, 16, dtype=torch.bool)}
    assert model.embeds is not None and model(batch).shape == (2, 3)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pretrained=True))
    with pytest.raises(ConfigError, match=r"^data\.naflex feeds patches of every aspect ratio, and "
                                          r"vit_tiny_patch16_224 is a square ViT"):
        build_model(cfg, 3, pretrained=True)


@pytest.mark.slow
def test_train_naflex_and_evaluate_reads_it(tmp_path):
    """train.py with data.naflex on wide images of several sizes, two epochs; evaluate.py scores best/ with the
    same patching and reports the loss training reported. (A resume's part, the sampler's (seed, epoch) order
    and Accelerate's skip, is checked without a run above.)"""
    import json

    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 3)):
        for c in ("good", "crack"):
            (tmp_path / "data" / split / c).mkdir(parents=True)
            for i in range(n):
                img = wide_strip(rng, int(rng.integers(60, 130)), int(rng.integers(24, 40)), c if c != "good" else None)
                Image.fromarray(img).save(tmp_path / "data" / split / c / f"{i}.png")
    args = ["--data.dataset=imagefolder", f"--data.root={tmp_path / 'data'}", f"--run.output_dir={tmp_path}",
            "--run.name=nf", "--run.epochs=2", *TINY, "--data.batch_size=4", "--model.patch_size=8",
            "--data.naflex={max_num_patches: 16}"]
    r = run_script("train.py", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "NaFlex: each image whole" in r.stdout and "at most 16 patches of 8 px" in r.stdout
    meta = json.loads((tmp_path / "nf" / "best" / "meta.json").read_text())
    r = run_script("evaluate.py", "--checkpoint", str(tmp_path / "nf" / "best"),
                   "--out", str(tmp_path / "eval"))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["n"] == 6 and metrics["loss"] == pytest.approx(meta["val_loss"], abs=1e-5)


def test_wide_strip_defects_lie_near_the_ends_and_the_script_writes_the_folder(tmp_path):
    """The defect is drawn after the texture, so the same generator state with and without it differs only in
    the defect's pixels: all within the outer 12% (+ the crack's tilt and the pits' spread) of one end.
    scripts/naflex_strips.py writes train/ and val/ with one folder per class."""
    import importlib.util

    for seed in range(20):
        good = wide_strip(np.random.default_rng(seed), 192, 48)
        for defect in ("crack", "pits"):
            cols = np.flatnonzero((wide_strip(np.random.default_rng(seed), 192, 48, defect) != good).any(axis=(0, 2)))
            assert len(cols) and (cols.max() < 0.12 * 192 + 14 or cols.min() > 0.88 * 192 - 15), (seed, defect)
    spec = importlib.util.spec_from_file_location("naflex_strips", ROOT / "scripts" / "naflex_strips.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    data = script.make_strips(tmp_path / "data", {"train": 2, "val": 1})
    sizes = {Image.open(p).size for p in data.glob("*/*/*.png")}
    assert len(list(data.glob("train/*/*.png"))) == 6 and len(list(data.glob("val/*/*.png"))) == 3
    assert all(h == 48 and 176 <= w <= 208 for w, h in sizes)
