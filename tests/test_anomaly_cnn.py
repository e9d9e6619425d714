"""CNN backbones for the anomaly methods (vit/models/cnn_backbone.py through timm's features_only): PatchCore's
features and nearest distances on a ResNet against anomalib's PatchcoreModel with the same weights copied in, the
levels against timm's own feature model, and anomaly.py fit / score with --model resnet18 --weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vit.config import ConfigError
from vit.data.synthetic import inspection_part
from vit.eval.anomaly import PatchCore, backbone_layers, nearest_distance, patch_features
from vit.models.cnn_backbone import CnnBackbone, is_cnn_name, load_cnn_backbone

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """A random ResNet-18 (4 classes) and its timm weights file."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = timm.create_model("resnet18", num_classes=4).eval()
    for m in net.modules():  # batch-norm statistics away from (0, 1), so that a skipped buffer shows
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2.0)
    path = tmp_path_factory.mktemp("resnet") / "r18.safetensors"
    save_file(net.state_dict(), str(path))
    return net, path


def test_levels_are_timms_features_and_stop_at_the_deepest(resnet):
    import timm

    net, path = resnet
    model, lines = load_cnn_backbone("resnet18", weights=path, img_size=96)
    assert "weights from" in lines[0] and model.depth == 5 and backbone_layers(model) == (2, 3)
    ref = timm.create_model("resnet18", features_only=True).eval()
    ref.load_state_dict({k: v for k, v in net.state_dict().items() if not k.startswith("fc.")})
    x = torch.randn(2, 3, 96, 80)
    want = ref(x)
    with torch.no_grad():
        got = model.forward_intermediates(x, [3, 1, -1])
    for g, i in zip(got, [3, 1, 4]):
        torch.testing.assert_close(g, want[i], rtol=0, atol=0)
    assert model.grid_size((96, 80)) == tuple(want[2].shape[-2:]) == (12, 10)
    assert model.grid_size((96, 80), 3) == (6, 5)
    calls = []
    model.body.layer4.register_forward_hook(lambda *a: calls.append(1))
    model.forward_intermediates(x, [2, 3])
    assert not calls  # layer4 never ran
    assert is_cnn_name("resnet18.a1_in1k") and not is_cnn_name("vit_tiny_patch16_224")
    assert not is_cnn_name("local-dir:/x") and not is_cnn_name("no_such_model")


def test_patch_features_and_distances_equal_anomalibs_patchcore(resnet):
    """anomalib's PatchcoreModel (layer2 + layer3, each AvgPool2d(3, 1, 1), layer3 brought to layer2's grid
    bilinearly) with the same ResNet weights: the same embedding to 1e-5, and with our bank as its memory bank the
    same nearest distance per patch."""
    from anomalib.models.image.patchcore.torch_model import PatchcoreModel

    net, path = resnet
    ours, _ = load_cnn_backbone("resnet18", weights=path, img_size=64)
    theirs = PatchcoreModel(layers=["layer2", "layer3"], backbone="resnet18", pre_trained=False)
    missing, _ = theirs.feature_extractor.feature_extractor.load_state_dict(net.state_dict(), strict=False)
    assert not missing
    theirs.train()
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        emb = theirs(x)  # (B * h * w, F), patches row-major per image
    feats = patch_features(ours, x, (2, 3))
    assert feats.shape == (3, 64, 128 + 256)
    torch.testing.assert_close(feats.flatten(0, 1), emb, rtol=1e-5, atol=1e-5)
    bank = torch.randn(50, 384) * emb.std() + emb.mean()
    theirs.memory_bank = bank
    d_theirs, _ = theirs.nearest_neighbors(emb, n_neighbors=1)
    _, maps = PatchCore(bank, (2, 3)).score(ours, x)
    torch.testing.assert_close(maps.flatten(), d_theirs.flatten(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(maps.flatten(), nearest_distance(feats.flatten(0, 1), bank), rtol=0, atol=0)


def test_command_fits_and_scores_with_a_timm_cnn(resnet, tmp_path):
    """anomaly.py fit / score --model resnet18 --weights FILE: the bank of layer2 + layer3 recorded with its
    backbone and weights, maps on layer2's grid, and the scores the bank gives in Python on the same tensors."""
    import csv

    from helpers import import_script
    from PIL import Image

    from vit.data.datasets import image_transform
    from vit.eval.anomaly import load_patchcore
    from vit.eval.inference import ImageFiles

    _, path = resnet
    rng = np.random.default_rng(0)
    for split, names in (("good", {"good": 6}), ("val", {"good": 3}), ("test", {"good": 2, "dent": 2})):
        for name, n in names.items():
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(n):
                img, _ = inspection_part(rng, 48, "grain", None if name == "good" else name)
                Image.fromarray(img).save(tmp_path / split / name / f"{i}.png")
    anomaly = import_script("anomaly").main
    src = ["--model", "resnet18", "--weights", str(path), "--img-size", "64", "--bank", str(tmp_path / "bank"),
           "--aug.eval_crop_pct=1.0"]
    assert anomaly(["fit", *src, "--good", str(tmp_path / "good"), "--val", str(tmp_path / "val")]) == 0
    settings = json.loads((tmp_path / "bank" / "patchcore.json").read_text())
    assert settings["layers"] == [2, 3] and settings["backbone"] == "resnet18" and settings["weights"] == str(path)
    assert settings["bank_size"] == round(0.1 * 6 * 8 * 8)  # 64 px: layer2's 8 x 8 grid per image
    assert anomaly(["score", str(tmp_path / "test"), *src, "--out", str(tmp_path / "out"), "--maps"]) == 0
    rows = list(csv.DictReader((tmp_path / "out" / "scores.csv").open()))
    assert all(np.load(Path(r["map"]).with_suffix(".npy"), allow_pickle=False).shape == (8, 8) for r in rows)
    model, _ = load_cnn_backbone("resnet18", weights=path, img_size=64)
    from vit.config import from_dict
    from vit.data.resolve import resolve_data_config

    cfg = resolve_data_config(from_dict({"model": {"name": "resnet18", "img_size": 64},
                                         "aug": {"eval_crop_pct": 1.0}}), model.pretrained_cfg, 3)
    files = ImageFiles([Path(r["path"]) for r in rows], image_transform(cfg, train=False), 3)
    want, _, _ = load_patchcore(tmp_path / "bank").score_files(model, files)
    np.testing.assert_allclose([float(r["score"]) for r in rows], want, rtol=1e-5)


@pytest.mark.parametrize("extra, match", [
    (["--method", "dinomaly"], r"^Dinomaly rebuilds a ViT's patch tokens .* and resnet18 is a CNN; use --method "),
    (["--layers", "7"], r"^--layers 7 is not one of the backbone's 5 blocks \(levels for a CNN\); use 0 to 4, or -1 "),
    (["--img-size", "16"], r"^--img-size 16 is smaller than resnet18's coarsest stride \(32 pixels\)"),
])
def test_what_a_cnn_cannot_do_is_one_sentence(resnet, tmp_path, extra, match):
    from helpers import import_script

    _, path = resnet
    (tmp_path / "good").mkdir()
    from PIL import Image

    Image.fromarray(inspection_part(np.random.default_rng(0), 32)[0]).save(tmp_path / "good" / "a.png")
    with pytest.raises((ConfigError, ValueError), match=match):
        import_script("anomaly").main(["fit", "--model", "resnet18", "--weights", str(path), "--bank",
                                       str(tmp_path / "bank"), "--good", str(tmp_path / "good"), *extra])
    assert not (tmp_path / "bank" / "patchcore.json").exists()


def test_weights_of_another_architecture_are_one_sentence(resnet, tmp_path):
    _, path = resnet
    with pytest.raises(ConfigError, match=r"is not a resnet34 weights file: 96 of its tensors are missing "
                                          r"\(layer1\.2\.conv1\.weight, .*\); pass the weights of this "
                                          r"architecture\.$"):
        load_cnn_backbone("resnet34", weights=path)
    import timm
    from safetensors.torch import save_file

    other = path.with_name("r34.safetensors")
    save_file(timm.create_model("resnet34", num_classes=4).state_dict(), str(other))
    with pytest.raises(ConfigError, match=r"is not a resnet18 weights file: it has 96 tensors resnet18 does not "):
        load_cnn_backbone("resnet18", weights=other)  # its first blocks would load, the rest dropped silently
    with pytest.raises(ConfigError, match=r"^--model resnet18 \(a timm CNN\) needs --weights FILE"):
        load_cnn_backbone("resnet18")
    model = CnnBackbone("resnet18")
    with pytest.raises(ValueError, match="gives its levels' maps only"):
        model.forward_intermediates(torch.zeros(1, 3, 32, 32), [2], output_fmt="NLC")


def test_a_timm_file_with_flattened_module_names_loads_as_timm_reads_it(tmp_path):
    """ConvNeXt's features_only model names its stem stem_0 (timm flattens it): the file saved from the full model
    loads, and the levels equal the full model's forward_intermediates."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(1)
    net = timm.create_model("convnext_atto", num_classes=3).eval()
    save_file(net.state_dict(), str(tmp_path / "c.safetensors"))
    model, _ = load_cnn_backbone("convnext_atto", weights=tmp_path / "c.safetensors", img_size=64)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = net.forward_intermediates(x, indices=[1, 2], intermediates_only=True)
        got = model.forward_intermediates(x, [1, 2])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_score_refuses_a_bank_fitted_on_other_weights_of_the_same_width(resnet, tmp_path):
    """Two ResNet-18 weight files give features of the same width: the bank records its backbone's fingerprint and
    score refuses the other one (its distances would be noise), while the fitted one scores; --layers -1 is saved
    as the level it names."""
    import timm
    from helpers import import_script
    from PIL import Image
    from safetensors.torch import save_file

    _, path = resnet
    torch.manual_seed(5)
    other = tmp_path / "other.safetensors"
    save_file(timm.create_model("resnet18", num_classes=4).state_dict(), str(other))
    (tmp_path / "good").mkdir()
    Image.fromarray(inspection_part(np.random.default_rng(0), 64)[0]).save(tmp_path / "good" / "a.png")
    anomaly = import_script("anomaly").main
    bank = ["--bank", str(tmp_path / "bank"), "--img-size", "64"]
    assert anomaly(["fit", "--model", "resnet18", "--weights", str(path), *bank, "--good", str(tmp_path / "good"),
                    "--layers", "2", "-1"]) == 0
    assert json.loads((tmp_path / "bank" / "patchcore.json").read_text())["layers"] == [2, 4]
    with pytest.raises(ConfigError, match=r"^the detector in .*bank was fitted on another backbone \(resnet18 with "
                                          r".*r18\.safetensors\), whose features this one's do not match; "):
        anomaly(["score", str(tmp_path / "good"), "--model", "resnet18", "--weights", str(other), *bank, "--out",
                 str(tmp_path / "o")])
    assert anomaly(["score", str(tmp_path / "good"), "--model", "resnet18", "--weights", str(path), *bank, "--out",
                    str(tmp_path / "o")]) == 0
