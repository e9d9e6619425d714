"""The few-shot table (vit/train/few_shot.py): samples, k-NN rows against scikit-learn, what each method trains."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vit import create_model
from vit.config import AugConfig
from vit.train.few_shot import FINETUNE, embed, few_shot_rows, finetune, random_affine, sample_per_class, summarize


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 12)
    colours = torch.tensor([[1.0, -1, -1], [-1, 1, -1], [-1, -1, 1]])
    x = colours[y][:, :, None, None] + 0.5 * torch.from_numpy(rng.normal(size=(36, 3, 16, 16))).float()
    return x, y


def _backbone():
    torch.manual_seed(0)
    return create_model("vit_tiny_patch16_224", img_size=16, patch_size=8, depth=2, embed_dim=32, num_heads=2,
                        num_classes=4).eval()


def test_sample_per_class_takes_n_of_each():
    y = np.array([0] * 5 + [1] * 2 + [2] * 7)
    idx = sample_per_class(y, 3, seed=1)
    assert np.bincount(y[idx]).tolist() == [3, 2, 3] and len(set(idx)) == len(idx)
    assert not np.array_equal(idx, sample_per_class(y, 3, seed=2))


def test_knn_rows_match_sklearn(data):
    from sklearn.neighbors import KNeighborsClassifier

    x, y = data
    tr, te = np.arange(0, 36, 2), np.arange(1, 36, 2)
    model = _backbone()
    rows = few_shot_rows(model, x[tr], y[tr], x[te], y[te], shots=(2,), seeds=(0, 1), methods=("knn",), k=3,
                         temperature=0.1)
    feats_tr, feats_te = embed(model, x[tr]).numpy(), embed(model, x[te]).numpy()
    for r in rows:
        idx = sample_per_class(y[tr], 2, r["seed"])
        ref = KNeighborsClassifier(n_neighbors=3, metric="cosine", algorithm="brute",
                                   weights=lambda d: np.exp((1 - d) / 0.1)).fit(feats_tr[idx], y[tr][idx])
        assert r["top1"] == pytest.approx(float((ref.predict(feats_te) == y[te]).mean()))
    table = summarize(rows)
    assert table[0]["mean"] == pytest.approx(np.mean([r["top1"] for r in rows]))


def test_frozen_rows_on_patch_tokens_match_sklearn(data):
    """features=("pooled", "patches"): knn rows on the pooled embedding and knn-patches rows on the final patch
    tokens flattened in grid order, each as scikit-learn's weighted vote on those arrays."""
    from sklearn.neighbors import KNeighborsClassifier

    x, y = data
    tr, te = np.arange(0, 36, 2), np.arange(1, 36, 2)
    model = _backbone()
    rows = few_shot_rows(model, x[tr], y[tr], x[te], y[te], shots=(3,), seeds=(0,), methods=("knn",), k=3,
                         temperature=0.1, features=("pooled", "patches"))
    assert [r["method"] for r in rows] == ["knn", "knn-patches"]
    with torch.no_grad():
        tokens = [model.forward_features(x[i]) for i in (tr, te)]  # (N, 1 + 4, D): [CLS] then the 2x2 grid
    want = {"knn": [t[:, 0].numpy() for t in tokens], "knn-patches": [t[:, 1:].flatten(1).numpy() for t in tokens]}
    torch.testing.assert_close(embed(model, x[te], features="patches").numpy(), want["knn-patches"][1])
    idx = sample_per_class(y[tr], 3, 0)
    for r in rows:
        f_tr, f_te = want[r["method"]]
        ref = KNeighborsClassifier(n_neighbors=3, metric="cosine", algorithm="brute",
                                   weights=lambda d: np.exp((1 - d) / 0.1)).fit(f_tr[idx], y[tr][idx])
        assert r["top1"] == pytest.approx(float((ref.predict(f_te) == y[te]).mean()))
    with pytest.raises(ValueError, match="unknown few-shot method or features 'tokens'"):
        few_shot_rows(model, x[tr], y[tr], x[te], y[te], methods=("knn",), features=("tokens",))
    with pytest.raises(ValueError, match="k-NN and the linear probe need features to read"):
        few_shot_rows(model, x[tr], y[tr], x[te], y[te], methods=("knn", "full"), features=())
    twice = few_shot_rows(model, x[tr], y[tr], x[te], y[te], shots=(3,), seeds=(0,), methods=("knn",), k=3,
                          temperature=0.1, features=("patches", "patches"))
    assert twice == rows[1:]  # one knn-patches row, as above


def test_lora_trains_a_small_share_and_full_everything(data):
    pytest.importorskip("peft")
    x, y = data
    backbone = _backbone()
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    lora, share = finetune(backbone, x, torch.from_numpy(y), 3, FINETUNE, steps=3, lora_rank=2)
    full, full_share = finetune(backbone, x, torch.from_numpy(y), 3, FINETUNE, AugConfig().resolved(), steps=3)
    assert full_share == 1.0 and 0 < share < 0.2
    assert all(torch.equal(v, backbone.state_dict()[k]) for k, v in before.items())  # the backbone is copied
    base = {k.replace(".base_layer", ""): v for k, v in lora.state_dict().items() if "lora_" not in k}
    assert torch.equal(base["blocks.0.attn.qkv.weight"], before["blocks.0.attn.qkv.weight"])  # frozen under LoRA
    assert not torch.equal(full.state_dict()["blocks.0.attn.qkv.weight"], before["blocks.0.attn.qkv.weight"])


def test_random_affine_is_torchvisions_affine():
    """Each image against torchvision's affine at the same draw (its angle runs the other way), fill included."""
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    x = torch.rand(3, 2, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    fill = torch.tensor([-1.0, 0.5], dtype=torch.float64)
    got = random_affine(x, 0.1, 10, 0.1, fill, torch.Generator().manual_seed(3))
    u = torch.rand(3, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2 - 1
    for i in range(3):
        ref = TF.affine(x[i] - fill[:, None, None], angle=-10 * float(u[i, 0]), scale=1 + 0.1 * float(u[i, 1]),
                        translate=[1.6 * float(u[i, 2]), 1.6 * float(u[i, 3])], shear=[0.0, 0.0],
                        interpolation=InterpolationMode.BILINEAR) + fill[:, None, None]
        torch.testing.assert_close(got[i], ref, atol=1e-12, rtol=0)
    assert (got - x).abs().max() > 0.1  # it moved the images
    assert torch.isclose(got, fill[None, :, None, None]).any()  # the uncovered border is the fill


@pytest.mark.parametrize("kw", [{"reg_tokens": 2}, {"class_token": False, "global_pool": "avg"}])
def test_patch_features_leave_out_every_prefix_token(data, kw):
    """features="patches" on registers (3 prefix tokens) or none: exactly timm's final patch tokens, flattened in
    grid order, for any number of prefix tokens (slicing off only a [CLS] would keep the registers)."""
    import timm

    args = dict(img_size=16, patch_size=8, depth=2, embed_dim=32, num_heads=2, num_classes=4, **kw)
    torch.manual_seed(0)
    model = create_model("vit_tiny_patch16_224", **args).eval()
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, **args).eval()
    ref.load_state_dict(model.state_dict())
    x = data[0][:5]
    with torch.no_grad():
        want = ref.forward_features(x)[:, ref.num_prefix_tokens:].flatten(1)  # (5, 2*2*32)
    torch.testing.assert_close(embed(model, x, features="patches"), want, atol=1e-6, rtol=1e-6)


def test_finetune_fills_the_uncovered_border_with_black_after_normalisation(data, monkeypatch):
    """The affine augmentation's uncovered border is a black pixel as the model sees it, (0 - mean) / std per
    channel (the training pipeline's Affine pads with 0 before Normalize); mean / std instead is near-white, a
    bright frame the test images never have. The fill finetune hands random_affine, and the border it makes."""
    import vit.train.few_shot as few_shot

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # ImageNet's: near-white and black far apart
    aug = AugConfig(mean=mean, std=std, affine_translate=0.2, affine_rotate=30, affine_scale=0.1, hflip=0.0)
    seen = []

    def spy(x, translate, rotate, scale, fill, generator=None):
        out = random_affine(x, translate, rotate, scale, fill, generator)
        seen.append((fill, out))
        return out

    monkeypatch.setattr(few_shot, "random_affine", spy)
    x, y = data
    finetune(_backbone(), x[:6], torch.from_numpy(y[:6]), 3, FINETUNE, aug, steps=1)
    black = torch.tensor([(0.0 - m) / s for m, s in zip(mean, std)])  # the float formula
    fill, out = seen[0]
    torch.testing.assert_close(fill.double(), black.double(), atol=1e-6, rtol=0)
    corners = out[:, :, [0, 0, -1, -1], [0, -1, 0, -1]].permute(0, 2, 1).reshape(-1, 3)  # (N * 4, C)
    assert torch.isclose(corners, black.to(corners), atol=1e-5).all(1).any()  # some corner uncovered: black


def test_script_takes_a_model_name_as_features_py_does(tmp_path, request):
    """few_shot.py --model NAME --weights FILE (the front-end features.py and anomaly.py share): its k-NN and
    linear rows are those of timm's model with the same weights, under the weights' own preprocessing."""
    import csv

    import timm
    from helpers import import_script, make_image_folder
    from safetensors.torch import save_file

    from vit.config import load_config
    from vit.data import resolve_data_config
    from vit.data.transforms import build_transform

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # hundreds of tiny L-BFGS steps: a second thread on a busy machine only waits
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32).eval()
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    img = make_image_folder(tmp_path / "img", classes=("a", "b", "c"), n_train=4, n_val=3, size=32)
    script = import_script("few_shot")
    assert script.main(["--model", "vit_tiny_patch16_224", "--weights", str(tmp_path / "w.safetensors"),
                        "--img-size", "32", "--train", str(img / "train"), "--test", str(img / "val"), "--shots", "2",
                        "--seeds", "0", "1", "--methods", "knn", "linear", "--out", str(tmp_path / "o")]) == 0
    with open(tmp_path / "o" / "few_shot.csv") as f:
        got = [(r["method"], int(r["seed"]), float(r["top1"])) for r in csv.DictReader(f)]
    cfg = resolve_data_config(load_config(None, ["--model.img_size=32"]), ref.pretrained_cfg)  # timm's own
    t = build_transform(cfg.aug, 32, train=False)
    train_x, train_y, classes = script.load_folder(str(img / "train"), t, 3)
    test_x, test_y, _ = script.load_folder(str(img / "val"), t, 3, classes)
    want = few_shot_rows(ref, train_x, train_y, test_x, test_y, shots=(2,), seeds=(0, 1), methods=("knn", "linear"))
    assert got == [(r["method"], r["seed"], pytest.approx(r["top1"])) for r in want]
    with pytest.raises(ValueError, match="--img-size goes with --model NAME"):
        script.main(["--checkpoint", str(tmp_path), "--img-size", "32", "--train", str(img / "train"), "--test",
                     str(img / "val"), "--out", str(tmp_path / "o2")])


@pytest.mark.parametrize("extra,match", [
    (["--shots", "-1"], r"--shots must be distinct numbers of 0 or more, got -1\."),
    (["--shots", "1", "1"], r"--shots must be distinct numbers .*got 1 1\."),
    (["--seeds", "0", "0"], r"--seeds must be distinct numbers .*got 0 0\."),  # std over one sample counted twice
    (["--seeds", "-1"], r"--seeds must be distinct numbers"),  # numpy's 'expected non-negative integer'
    (["--lora-rank", "0"], r"--lora-rank must be at least 1, got 0\."),
    (["--steps", "0"], r"--steps must be at least 1, got 0\."),
    (["--lr-lora", "inf"], r"--lr-lora must be a finite number above 0, got inf\."),  # 33% (chance), exit 0
    (["--lr", "nan"], r"--lr must be a finite number above 0, got nan\."),  # torch's 'Invalid learning rate'
    (["--layer-decay", "nan"], r"--layer-decay must be in \[0, 1\] \(0: none\), got nan\."),
])
def test_script_names_the_one_bad_number(extra, match):
    from helpers import import_script

    from vit.config import ConfigError

    script = import_script("few_shot")
    args = script.build_parser().parse_args(["--checkpoint", "x", "--train", "a", "--test", "b", *extra])
    with pytest.raises(ConfigError, match=match):
        script.check_numbers(args)


def test_script_refuses_more_shots_than_a_class_has_and_a_single_class(tmp_path):
    """--shots 99 over 3 images a class reported a row 'N 99' made of 3 images each."""
    import shutil

    import timm
    from helpers import import_script, make_image_folder
    from safetensors.torch import save_file

    from vit.config import ConfigError

    save_file(timm.create_model("vit_tiny_patch16_224", img_size=32).state_dict(), str(tmp_path / "w.safetensors"))
    img = make_image_folder(tmp_path / "img", classes=("a", "b"), n_train=3, n_val=1, size=32)
    (img / "train" / "a" / "000.png").unlink()
    with pytest.raises(ConfigError, match=r"--shots 3 is more than the 2 image\(s\) of class 'a' in .*; give at "
                                          r"most 2, or 0 for all\."):
        import_script("few_shot").main(["--model", "vit_tiny_patch16_224", "--weights", str(tmp_path / "w.safetensors"),
                                        "--img-size", "32", "--train", str(img / "train"), "--test", str(img / "val"),
                                        "--shots", "1", "3", "--methods", "knn", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
    for split in ("train", "val"):  # one class: every method scored 100%, exit 0
        shutil.rmtree(img / split / "b")
    with pytest.raises(ConfigError, match=r"has one class \('a'\); a few-shot table needs two or more class folders"):
        import_script("few_shot").main(["--model", "vit_tiny_patch16_224", "--weights", str(tmp_path / "w.safetensors"),
                                        "--img-size", "32", "--train", str(img / "train"), "--test", str(img / "val"),
                                        "--shots", "1", "--methods", "knn", "--out", str(tmp_path / "o")])


def test_the_plot_shows_every_image_rows_as_a_level(tmp_path, monkeypatch):
    """--shots 0 alone drew an empty plot (and matplotlib's 'No artists with labels' warning): it is a dashed level."""
    import warnings

    from matplotlib.axes import Axes

    from vit.eval import plots

    levels = []
    real = Axes.axhline
    monkeypatch.setattr(Axes, "axhline", lambda self, y, **kw: levels.append((y, kw["label"])) or real(self, y, **kw))
    summary = [dict(method="knn", shots=0, mean=0.75, std=0.0), dict(method="lora", shots=2, mean=0.5, std=0.1),
               dict(method="lora", shots=0, mean=0.9, std=0.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.plot_few_shot(summary[:1], tmp_path / "a.png")
        plots.plot_few_shot(summary, tmp_path / "b.png")
    assert levels == [(75.0, "knn, all images"), (75.0, "knn, all images"), (90.0, "lora, all images")]


def test_script_refuses_a_naflex_checkpoint_in_one_sentence(tmp_path):
    """A data.naflex checkpoint was scored on images squashed to one square size (not how it was trained), exit 0."""
    from helpers import import_script, make_image_folder

    from vit.config import ConfigError, load_config
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    cfg = load_config(None, ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32",
                             "--model.depth=1", "--model.num_heads=2", "--data.naflex={max_num_patches: 16}"])
    save_checkpoint(tmp_path / "ck", build_model(cfg, 2), cfg, ["a", "b"])
    img = make_image_folder(tmp_path / "img", classes=("a", "b"), n_train=2, n_val=1, size=32)
    with pytest.raises(ConfigError, match=r"^few_shot\.py holds the images as one batch of square tensors, and this "
                                          r"checkpoint reads each image at its own aspect ratio \(data\.naflex\); "):
        import_script("few_shot").main(["--checkpoint", str(tmp_path / "ck"), "--train", str(img / "train"), "--test",
                                        str(img / "val"), "--shots", "1", "--seeds", "0", "--methods", "knn", "--out",
                                        str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
