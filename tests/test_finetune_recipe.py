"""The fine-tune recipe: configs/finetune_imagefolder.yaml runs as shipped (weights from a local hub cache), and
model.pretrained naming a hub model sets the architecture (model.name left unset)."""

from __future__ import annotations

import shutil

import pytest
import timm
import torch
import yaml
from helpers import ROOT, hub_snapshot, make_image_folder, run_script
from timm.models import save_for_hf

from vit.config import load_config
from vit.models.build import build_model, resolve_name

REPO = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"  # what the recipe names
SMALL = dict(embed_dim=32, depth=2, num_heads=2)  # the weights narrowed to a few kB; their config.json says so


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A Hugging Face cache (models--org--name/refs/main, snapshots/<commit>/) holding the recipe's repository."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    torch.manual_seed(0)
    save_for_hf(timm.create_model("vit_tiny_patch16_224", **SMALL), str(hub_snapshot(cache, REPO, "c" * 40)),
                safe_serialization=True)
    return cache


@pytest.fixture
def hub_offline(hub, offline_hub):
    return offline_hub(hub)


def test_the_architecture_comes_from_the_weights_pretrained_names(hub_offline, tmp_path):
    cfg = resolve_name(load_config(ROOT / "configs/finetune_imagefolder.yaml"))
    assert load_config(ROOT / "configs/finetune_imagefolder.yaml").model.name is None  # one key, not two
    assert cfg.model.name == "vit_tiny_patch16_224"
    model = build_model(cfg, 3, pretrained=True)
    assert (model.embed_dim, len(model.blocks)) == (32, 2)  # the weights' own config.json, not the registry's 192
    assert resolve_name(load_config(None)).model.name == "vit_tiny_patch16_224"  # nothing named: the default
    with pytest.raises(ValueError, match="are a vit_tiny_patch16_224, but the model is vit_small_patch16_224; leave"):
        build_model(load_config(ROOT / "configs/finetune_imagefolder.yaml", {"model.name": "vit_small_patch16_224"}),
                    3, pretrained=True)  # a second key that disagrees: one sentence, as before
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ValueError, match="is a weights file, which does not say its architecture; set model.name"):
        resolve_name(load_config(None, {"model.pretrained": str(weights)}))


@pytest.mark.slow
def test_the_shipped_recipe_fine_tunes_a_flat_folder_offline(hub, tmp_path):
    """The README's box, made small: a flat folder, the recipe as shipped except size and length."""
    split = make_image_folder(tmp_path / "split", n_train=6, n_val=0, size=40)
    shutil.copytree(split / "train", tmp_path / "photos")
    r = run_script("train.py", "--config", "configs/finetune_imagefolder.yaml", f"--data.root={tmp_path / 'photos'}",
                   "--model.img_size=32", "--data.batch_size=8", "--data.num_workers=0", "--run.epochs=1",
                   "--data.val_fraction=0.5", f"--run.output_dir={tmp_path}",
                   env={"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"loaded hf-hub:{REPO}" in r.stderr
    assert "vit_tiny_patch16_224 as built: 3 channels (RGB), width 32" in r.stdout
    saved = yaml.safe_load((tmp_path / "finetune" / "config.yaml").read_text())
    assert saved["model"]["name"] == "vit_tiny_patch16_224" and saved["model"]["pretrained"] == f"hf-hub:{REPO}"
    p = run_script("predict.py", "--checkpoint", str(tmp_path / "finetune" / "best"), str(tmp_path / "photos"),
                   "--out", str(tmp_path / "pred"), "--num-workers", "0")
    assert p.returncode == 0, p.stderr
    assert len((tmp_path / "pred" / "predictions.csv").read_text().splitlines()) == 1 + 18
