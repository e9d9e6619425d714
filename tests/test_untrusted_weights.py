"""Weights from elsewhere run no code: crafted pickles, zip bombs and foreign architectures get one sentence."""

# Weights from elsewhere run no code: crafted pickles, archives that inflate far beyond their file and
# foreign architectures get one sentence.

import pickle

import pytest
import torch
from helpers import TINY, make_image_folder, run_script


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
