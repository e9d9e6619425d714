"""Pretrained weights by name (vit.hub) against timm's own create_model(pretrained=True), offline."""

# Pretrained weights by name (vit/hub/names.py) against timm's own create_model(pretrained=True), the oracle.
#
# A Hugging Face hub cache is built offline in a temporary folder with huggingface_hub's real layout
# (models--org--name/refs/main, snapshots/<commit>/...), holding repositories that timm's save_for_hf wrote from
# randomly initialised timm models; HF_HUB_OFFLINE=1 throughout, so nothing here can touch the network.

import json
import sys

import numpy as np
import pytest
import timm
import torch
from helpers import ROOT, TINY, hub_snapshot, run_script
from timm.models import save_for_hf

import vit
from vit.config import load_config
from vit.data import resolve_data_config
from vit.data.transforms import build_transform
from vit.models.build import pretrained_cfg_of
from vit.models.checkpoint import load_checkpoint, save_checkpoint

ARCH = "vit_tiny_patch16_224"
SMALL = dict(embed_dim=32, depth=2, num_heads=2)  # the registry's vit_tiny, narrowed: weights of a few kB
MAIN, OTHER = "a" * 40, "b" * 40  # two commits of org/tiny; refs/main points at MAIN
IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def _put(cache, repo_id, model, commit=MAIN, main=True, **kw):
    """One snapshot of a repository, laid out as huggingface_hub's cache keeps it."""
    folder = hub_snapshot(cache, repo_id, commit, main)
    save_for_hf(model, str(folder), **kw)
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf") / "hub"
    torch.manual_seed(0)
    _put(cache, f"timm/{ARCH}.augreg_in21k_ft_in1k", timm.create_model(ARCH, **SMALL), safe_serialization=True)
    # the in21k tag: 21843 classes, and only a pickled pytorch_model.bin (read with weights_only=True)
    _put(cache, f"timm/{ARCH}.augreg_in21k", timm.create_model(ARCH, num_classes=21843, **SMALL),
         safe_serialization=False)
    # a repository whose config.json carries the architecture (model_args) and ImageNet statistics
    tiny = dict(img_size=32, num_classes=5, mlp_ratio=2.0, **SMALL)
    _put(cache, "org/tiny", timm.create_model(ARCH, **tiny), safe_serialization=True, data_config=IMAGENET)
    _put(cache, "org/tiny", timm.create_model(ARCH, **tiny), OTHER, main=False, safe_serialization=True,
         data_config=IMAGENET)
    return cache


@pytest.fixture
def hub(cache, offline_hub):
    offline_hub(cache)
    return cache


def _same(ours, ref, channels=3, size=224, copy_head=False):
    """Same logits (1e-5) and the same pretrained_cfg as timm's model; returns the logits."""
    if copy_head:  # a replaced head is freshly initialised on both sides: compare what was loaded
        ours.head.load_state_dict(ref.head.state_dict())
    x = torch.randn(2, channels, size, size)
    with torch.no_grad():
        a, b = ours.eval()(x), ref.eval()(x)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert a.abs().max() > 1e-3  # a zero head would make the comparison vacuous
    assert ours.pretrained_cfg == ref.pretrained_cfg
    return a


@pytest.mark.parametrize("overrides", [{}, dict(num_classes=10), dict(img_size=160), dict(in_chans=1)],
                         ids=["as-saved", "num_classes", "img_size", "in_chans"])
def test_default_tag_matches_timm(hub, overrides):
    ours = vit.create_model(ARCH, pretrained=True, **SMALL, **overrides)
    ref = timm.create_model(ARCH, pretrained=True, cache_dir=hub, **SMALL, **overrides)
    assert ours.pretrained_cfg["hf_hub_id"] == f"timm/{ARCH}.augreg_in21k_ft_in1k"
    _same(ours, ref, overrides.get("in_chans", 3), overrides.get("img_size", 224), "num_classes" in overrides)
    # and the weights really came from the cache, not from two identical initialisations
    fresh = timm.create_model(ARCH, **SMALL, **overrides)
    assert not torch.equal(ours.blocks[0].attn.qkv.weight, fresh.blocks[0].attn.qkv.weight)


def test_tag_from_pytorch_model_bin_matches_timm(hub):
    ours = vit.create_model(f"{ARCH}.augreg_in21k", pretrained=True, **SMALL)
    ref = timm.create_model(f"{ARCH}.augreg_in21k", pretrained=True, cache_dir=hub, **SMALL)
    assert ours.num_classes == 21843 and ours.pretrained_cfg["tag"] == "augreg_in21k"
    _same(ours, ref)


@pytest.mark.parametrize("form", ["hf-hub", "hf-hub@revision", "local-dir"])
def test_hf_hub_and_local_dir_match_timm(hub, form):
    name = {"hf-hub": "hf-hub:org/tiny", "hf-hub@revision": f"hf-hub:org/tiny@{OTHER}",
            "local-dir": f"local-dir:{hub / 'models--org--tiny' / 'snapshots' / MAIN}"}[form]
    ours = vit.create_model(name, pretrained=True)
    ref = timm.create_model(name, pretrained=True, cache_dir=hub)
    assert ours.num_classes == 5 and ours.patch_embed.img_size == (32, 32)  # from config.json's model_args
    logits = _same(ours, ref, size=32)
    if form == "hf-hub@revision":  # the other commit really is other weights
        with torch.no_grad():
            torch.manual_seed(0)
            main = vit.create_model("hf-hub:org/tiny", pretrained=True).eval()
            assert not torch.allclose(main(torch.randn(2, 3, 32, 32)), logits)


def test_pretrained_in_every_config_form(hub, tmp_path):
    x = torch.randn(2, 3, 32, 32)
    want = vit.create_model("hf-hub:org/tiny", pretrained=True).eval()(x)
    folder = hub / "models--org--tiny" / "snapshots" / MAIN
    for pretrained in ("hf-hub:org/tiny", str(folder), f"local-dir:{folder}", str(folder / "model.safetensors")):
        model = vit.create_model(ARCH, pretrained=pretrained, img_size=32, num_classes=5, mlp_ratio=2.0, **SMALL)
        torch.testing.assert_close(model.eval()(x), want, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="are a vit_tiny_patch16_224, but the model is vit_small_patch16_224"):
        vit.create_model("vit_small_patch16_224", pretrained="hf-hub:org/tiny")
    with pytest.raises(ValueError, match="unknown pretrained tag 'nope' for vit_tiny_patch16_224; its tags are"):
        vit.create_model(f"{ARCH}.nope", pretrained=True)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        vit.create_model(ARCH, pretrained=str(tmp_path / "missing.safetensors"))


def test_missing_model_offline_names_repository_cache_and_command(hub):
    for name, repo in ((("vit_small_patch16_224", "timm/vit_small_patch16_224.augreg_in21k_ft_in1k")),
                       ("hf-hub:org/absent", "org/absent")):
        with pytest.raises(FileNotFoundError) as e:
            vit.create_model(name, pretrained=True)
        msg = str(e.value)
        assert f"model {repo} " in msg and str(hub) in msg and "HF_HUB_OFFLINE=1" in msg
        assert f"`hf download {repo}`" in msg and "\n" not in msg
    assert not (hub / "models--org--absent").exists()  # looked, wrote nothing


def test_pretrained_cfg_drives_preprocessing(hub):
    def told(c):  # as train.py: the data is told the weights' preprocessing, it looks nothing up
        return resolve_data_config(c, pretrained_cfg_of(c.model))

    cfg = told(load_config(None, ["--model.pretrained=hf-hub:org/tiny", "--model.img_size=32"]))
    assert cfg.aug.mean == list(IMAGENET["mean"]) and cfg.aug.std == list(IMAGENET["std"])
    assert (cfg.aug.eval_crop_pct, cfg.aug.interpolation) == (0.9, "bicubic")  # the repository's pretrained_cfg
    # what the config sets wins, as in timm's resolve_data_config; without weights: the old fallbacks
    own = told(load_config(None, ["--model.pretrained=hf-hub:org/tiny", "--aug.mean=[0.1,0.2,0.3]"]))
    assert own.aug.mean == [0.1, 0.2, 0.3] and own.aug.std == list(IMAGENET["std"])
    plain = told(load_config(None, []))
    assert (plain.aug.mean, plain.aug.eval_crop_pct, plain.aug.interpolation) == ([0.5] * 3, 1.0, "bilinear")
    # the eval pipeline normalizes with them: a flat image (v/255 - mean) / std per channel
    pipe = build_transform(cfg.aug, 32, train=False)
    rgb = np.array([10, 128, 250], dtype=np.uint8)
    out = pipe(np.broadcast_to(rgb, (40, 48, 3)).copy())
    want = (rgb / 255.0 - np.array(IMAGENET["mean"])) / np.array(IMAGENET["std"])
    np.testing.assert_allclose(out.mean((1, 2)).numpy(), want, atol=1e-5)
    assert pipe.geometry.resize == 36  # shorter side to 32 / 0.9, then the centre 32


def test_evaluate_takes_hub_weights_and_their_preprocessing(hub, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from vit.eval.inference import load_model_and_config

    model, cfg, classes, _ = load_model_and_config(model_name="hf-hub:org/tiny")
    assert cfg.model.img_size == 32 and cfg.aug.mean == list(IMAGENET["mean"]) and classes is None
    _same(model, timm.create_model("hf-hub:org/tiny", pretrained=True, cache_dir=hub), size=32)


def test_checkpoint_folder_is_a_timm_hub_folder(hub, tmp_path):
    """Options beyond the variant's (avg pooling, layer scale) travel in config.json's model_args."""
    cfg = resolve_data_config(load_config(None, ["--model.img_size=48", "--model.global_pool=avg",
                                                 "--model.init_values=0.1", "--model.depth=2"]))
    from vit.models.build import build_model

    model = build_model(cfg, num_classes=3)
    save_checkpoint(tmp_path / "best", model, cfg, ["cat", "dog", "fox"], {"epoch": 1})
    hub_cfg = json.loads((tmp_path / "best" / "config.json").read_text())
    assert hub_cfg["model_args"] == dict(img_size=[48, 48], in_chans=3, num_classes=3, global_pool="avg",
                                         depth=2, init_values=0.1)
    ref = timm.create_model(f"local-dir:{tmp_path / 'best'}", pretrained=True)
    assert ref.pretrained_cfg["label_names"] == ["cat", "dog", "fox"] and ref.pretrained_cfg["mean"] == [0.5] * 3
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        want = model.eval()(x)
        torch.testing.assert_close(ref.eval()(x), want, atol=1e-5, rtol=0)
        torch.testing.assert_close(load_checkpoint(tmp_path / "best")[0](x), want, atol=1e-5, rtol=0)


@pytest.mark.slow  # a train.py process: about 5 s of imports
def test_train_with_a_missing_model_exits_2(tmp_path):
    r = run_script("train.py", "--model.pretrained=true", f"--run.output_dir={tmp_path}", *TINY,
                   env={"HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "model timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k (its weights) is not in the Hugging Face cache" \
        in r.stderr and "hf download" in r.stderr
    assert not (tmp_path / "default").exists()


@pytest.mark.slow
def test_finetune_from_the_cache_writes_a_folder_timm_loads(hub, tmp_path):
    """accelerate launch train.py --model.pretrained=hf-hub:...: 2 epochs, then best/ through timm's local-dir."""
    config = tmp_path / "ft.yaml"  # no architecture overrides: they come from the repository's config.json
    config.write_text("model: {name: vit_tiny_patch16_224, img_size: 32}\n"
                      "data: {dataset: synthetic, synthetic_train_size: 16, synthetic_val_size: 8, batch_size: 8}\n"
                      "aug: {random_resized_crop: false}\noptim: {warmup_epochs: 0.5}\nrun: {epochs: 2, name: ft}\n")
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no"]
    r = run_script("train.py", "--config", str(config), "--model.pretrained=hf-hub:org/tiny",
                   f"--run.output_dir={tmp_path}", launcher=launcher,
                   env={"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    best = tmp_path / "ft" / "best"
    assert "loaded hf-hub:org/tiny" in r.stderr and "dropped the 5-class head" in r.stderr
    ref = timm.create_model(f"local-dir:{best}", pretrained=True).eval()
    ours = vit.create_model(f"local-dir:{best}", pretrained=True).eval()
    evaluated = load_checkpoint(best)[0]  # what evaluate.py loads
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = ours(x)
        torch.testing.assert_close(ref(x), want, atol=1e-5, rtol=0)
        torch.testing.assert_close(evaluated(x), want, atol=1e-5, rtol=0)
    assert ref.pretrained_cfg == ours.pretrained_cfg
    assert ref.pretrained_cfg["label_names"] == json.loads((best / "classes.json").read_text())
    assert ref.pretrained_cfg["mean"] == list(IMAGENET["mean"])  # the statistics the run used, from the weights
    assert load_config(best / "config.yaml").aug.mean == list(IMAGENET["mean"])


@pytest.fixture
def unreachable(cache, monkeypatch):
    """Online (HF_HUB_OFFLINE unset) with a hub endpoint that refuses connections (a closed local port), and a
    spy on hf_hub_download: a call that would go to the network raises at once, as the real one does after its
    5 retries (~30 s), and is counted."""
    import huggingface_hub
    import huggingface_hub.constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # what HF_ENDPOINT sets
    real, online = huggingface_hub.hf_hub_download, []

    def download(*args, local_files_only=False, **kwargs):
        if not local_files_only:
            online.append(args)
            raise LocalEntryNotFoundError("connection refused, after retrying (the real call's ~30 s)")
        return real(*args, local_files_only=True, **kwargs)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    return online


def test_an_unreachable_hub_is_found_out_once_and_the_cache_answers_at_once(unreachable, monkeypatch):
    import huggingface_hub.constants

    from vit.hub.cache import hub_reachable

    assert not hub_reachable()
    with pytest.raises(FileNotFoundError) as e:
        vit.create_model("hf-hub:org/absent", pretrained=True)
    msg = str(e.value)
    assert msg.startswith("model org/absent (its config.json) is not in the Hugging Face cache") and "\n" not in msg
    assert "the hub could not be reached" in msg and "`hf download org/absent`" in msg
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():  # a cached repository loads without a network call, as it does offline
        got = vit.create_model("hf-hub:org/tiny", pretrained=True).eval()(x)
    assert unreachable == []  # no download went to the network: no retry loop
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # the oracle: the same repository offline
    with torch.no_grad():
        torch.testing.assert_close(got, vit.create_model("hf-hub:org/tiny", pretrained=True).eval()(x))
