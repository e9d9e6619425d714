"""Weights from elsewhere run no code and never load wrong: pickles, zip bombs, heads, dtypes and NaN refused."""

import json
import os
import pickle

import pytest
import torch
from helpers import TINY, hub_snapshot, make_image_folder, run_script
from safetensors.torch import save_file

import vit
from vit.hub import timm_config
from vit.models.vit_options import architecture_defaults


def test_checkpoint_from_another_architecture_for_fine_tuning(tmp_path):
    import timm
    from safetensors.torch import save_file

    save_file(timm.create_model("vit_small_patch16_224", depth=2).state_dict(), str(tmp_path / "w.safetensors"))
    r = run_script("train.py", f"--model.pretrained={tmp_path / 'w.safetensors'}", f"--run.output_dir={tmp_path}/r",
                   *TINY)
    assert r.returncode == 2 and "another architecture" in r.stderr and "Traceback" not in r.stderr


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_crafted_pickle_is_refused_everywhere(tmp_path):
    import vit

    marker = tmp_path / "pwned.txt"
    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        pickle.dump({"state_dict": {"x": _Evil(str(marker))}}, f)
    model = vit.create_model("vit_tiny_patch16_224", depth=1, img_size=32)
    with pytest.raises(ValueError, match="refusing to load"):
        vit.load_pretrained(model, evil)
    assert not marker.exists()
    data = make_image_folder(tmp_path / "f", classes=("a", "b"), n_train=1, n_val=1)
    r = run_script("evaluate.py", "--model", "vit_tiny_patch16_224", "--weights", str(evil),
                   "--data.dataset=imagefolder", f"--data.root={data}")
    assert r.returncode == 2 and "refusing to load" in r.stderr and not marker.exists()
    # a checkpoint folder whose weights file is a pickle: the rollout script refuses it too
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(evil.read_bytes())
    (ck / "config.yaml").write_text("model:\n  img_size: 32\n  depth: 1\n")
    (ck / "classes.json").write_text('["a", "b"]')
    r = run_script("visualize_attention.py", "--checkpoint", str(ck), str(data / "val"), "--out",
                   str(tmp_path / "a"))
    assert r.returncode == 2 and "unreadable" in r.stderr and not marker.exists()


def test_weights_that_inflate_far_beyond_their_file_or_hold_a_flat_pos_embed_are_refused(tmp_path):
    import zipfile

    from safetensors.torch import save_file

    import vit
    from vit.hub.weights import read_state_dict

    torch.save({"x": torch.zeros(2**22)}, tmp_path / "plain.pth")  # 16 MiB of zeros, stored as torch.save does
    bomb = tmp_path / "bomb.pth"
    with zipfile.ZipFile(tmp_path / "plain.pth") as zin, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))  # the same archive, deflated: torch.load inflates it in full
    assert bomb.stat().st_size < 2**17 and torch.load(bomb, weights_only=True)["x"].numel() == 2**22
    with pytest.raises(ValueError, match="inflates to .* bytes from"):
        read_state_dict(bomb)
    assert read_state_dict(tmp_path / "plain.pth")["x"].numel() == 2**22
    model = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=2)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["pos_embed"] = state["pos_embed"].flatten()
    save_file(state, str(tmp_path / "flat.safetensors"))
    with pytest.raises(ValueError, match=r"position embeddings of shape \(960,\) cannot be resampled"):
        vit.load_pretrained(model, tmp_path / "flat.safetensors")


ARCH = "vit_tiny_patch16_224"


SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)


DATA = dict(mean=[0.5] * 3, std=[0.5] * 3, crop_pct=1.0, interpolation="bilinear")


def make_folder(path, num_classes=3, weights_classes=None, edit=None, in_chans=3):
    """A local-dir folder (config.json + model.safetensors) of a tiny model; `weights_classes`: a head of another
    size in the weights than config.json says; `edit(state)` changes the weights before they are written."""
    torch.manual_seed(0)
    model = vit.create_model(ARCH, num_classes=num_classes, in_chans=in_chans, **SMALL)
    data = {**DATA, "mean": [0.5] * in_chans, "std": [0.5] * in_chans}
    cfg = timm_config(model, ARCH, [f"c{i}" for i in range(num_classes)], data, architecture_defaults(ARCH))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if weights_classes is not None:
        state["head.weight"], state["head.bias"] = torch.randn(weights_classes, 32), torch.randn(weights_classes)
    if edit is not None:
        edit(state)
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return path, model


@pytest.fixture
def offline(offline_hub, tmp_path):
    return offline_hub(tmp_path / "hub")


def put_in_cache(cache, repo_id, folder):
    """`folder`'s files as one snapshot of `repo_id` in huggingface_hub's cache layout."""
    snap = hub_snapshot(cache, repo_id)
    for f in folder.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())


def test_a_head_that_does_not_fit_its_own_config_is_refused(tmp_path, offline):
    folder, _ = make_folder(tmp_path / "m", num_classes=3, weights_classes=5)
    with pytest.raises(ValueError, match=r"5-class head.*config\.json.*3") as e:
        vit.create_model(f"local-dir:{folder}", pretrained=True)
    assert "\n" not in str(e.value)
    put_in_cache(offline, "org/wrong-head", folder)
    with pytest.raises(ValueError, match=r"5-class head"):
        vit.create_model("hf-hub:org/wrong-head", pretrained=True)
    # asking for the class count config.json already has is not asking for a new head
    with pytest.raises(ValueError, match=r"5-class head"):
        vit.create_model(f"local-dir:{folder}", pretrained=True, num_classes=3)


def test_another_num_classes_asked_for_still_gets_a_fresh_head(tmp_path):
    folder, ref = make_folder(tmp_path / "m", num_classes=3)
    model = vit.create_model(f"local-dir:{folder}", pretrained=True, num_classes=7)
    assert model.head.weight.shape == (7, 32)
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, ref.blocks[0].attn.qkv.weight, rtol=0, atol=0)
    same = vit.create_model(f"local-dir:{folder}", pretrained=True)  # as it is: every tensor, the head's too
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(same.state_dict()[k], v, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int64, torch.complex64])
def test_weights_of_a_non_float_dtype_are_refused(tmp_path, dtype):
    def edit(state):
        w = state["blocks.0.mlp.fc1.weight"]
        state["blocks.0.mlp.fc1.weight"] = (w * 10).to(dtype) if dtype != torch.bool else w > 0

    folder, _ = make_folder(tmp_path / "m", edit=edit)
    with pytest.raises(ValueError, match=rf"blocks\.0\.mlp\.fc1\.weight.*{str(dtype).split('.')[-1]}") as e:
        vit.create_model(f"local-dir:{folder}", pretrained=True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_weights_of_any_float_dtype_load(tmp_path, dtype):
    folder, ref = make_folder(tmp_path / "m", edit=lambda s: s.update({k: v.to(dtype) for k, v in s.items()}))
    model = vit.create_model(f"local-dir:{folder}", pretrained=True)
    torch.testing.assert_close(model.head.weight, ref.head.weight.to(dtype).float(), rtol=0, atol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused(tmp_path, bad):
    def edit(state):
        state["blocks.1.attn.proj.weight"][0, 0] = bad

    folder, _ = make_folder(tmp_path / "m", edit=edit)
    with pytest.raises(FloatingPointError, match=r"blocks\.1\.attn\.proj\.weight.*non-finite"):
        vit.create_model(f"local-dir:{folder}", pretrained=True)
    with pytest.raises(FloatingPointError, match=r"blocks\.1\.attn\.proj\.weight"):  # a plain weights file too
        vit.create_model(ARCH, pretrained=str(folder / "model.safetensors"), num_classes=3, **SMALL)


def test_a_checkpoint_with_non_finite_weights_is_refused(tmp_path):
    from vit.config import load_config
    from vit.models.checkpoint import load_checkpoint, save_checkpoint

    cfg = load_config(None, {"model.img_size": 32, "model.patch_size": 8, "model.embed_dim": 32, "model.depth": 2,
                             "model.num_heads": 2})
    model = vit.create_model(ARCH, num_classes=2, **SMALL)
    folder = save_checkpoint(tmp_path / "best", model, cfg, ["a", "b"])
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    state["head.bias"][1] = float("nan")
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(Exception, match=r"head\.bias.*non-finite"):
        load_checkpoint(folder)


def test_a_fifo_config_and_a_device_weights_file_are_not_regular_files(tmp_path):
    folder, _ = make_folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    os.symlink("/dev/zero", folder / "model.safetensors")
    with pytest.raises(Exception, match=r"model\.safetensors is not a regular file"):
        vit.create_model(f"local-dir:{folder}", pretrained=True)
    with pytest.raises(Exception, match=r"model\.safetensors is not a regular file"):
        vit.create_model(ARCH, pretrained=str(folder / "model.safetensors"))
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    with pytest.raises(Exception, match=r"config\.json is not a regular file"):
        vit.create_model(f"local-dir:{folder}", pretrained=True)


def test_a_huge_config_json_is_refused_unread(tmp_path, monkeypatch):
    folder, _ = make_folder(tmp_path / "m")
    with open(folder / "config.json", "r+b") as f:  # 300 MB, sparse: costs no disk
        f.seek(300 * 2**20)
        f.write(b" ")
    read = []
    monkeypatch.setattr("pathlib.Path.read_text", lambda self, *a, **k: read.append(self) or "")
    with pytest.raises(ValueError, match=r"config\.json is .*MB.*larger than"):
        vit.create_model(f"local-dir:{folder}", pretrained=True)
