"""The model's input channels follow the data unless a config pins them, and the model line names them."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from helpers import TINY, make_image_folder, run_script
from PIL import Image

from vit.config import load_config
from vit.data import choose_channels, data_channels


def _grey_folder(root, n=4):
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / "train" / c).mkdir(parents=True)
        for i in range(n):
            img = Image.fromarray(rng.integers(0, 255, (20, 20), dtype=np.uint8), mode="L")
            img.save(root / "train" / c / f"{i}.png")
    return root


@pytest.mark.slow
def test_default_recipe_on_an_rgb_folder_trains_an_rgb_model_and_says_so(tmp_path):
    data = make_image_folder(tmp_path / "data", n_train=4, n_val=2)
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={data}", f"--run.output_dir={tmp_path}",
                   "--run.epochs=1", *TINY)
    assert r.returncode == 0, r.stderr
    assert "as built: 3 channels (RGB)," in r.stdout + r.stderr
    saved = yaml.safe_load((tmp_path / "default" / "config.yaml").read_text())
    assert saved["model"]["in_chans"] == 3 and len(saved["aug"]["mean"]) == 3
    assert "thrown away" not in r.stdout + r.stderr


@pytest.mark.slow
def test_a_pinned_grey_model_on_colour_data_says_once_that_colour_is_thrown_away(tmp_path):
    data = make_image_folder(tmp_path / "data", n_train=4, n_val=2)
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={data}", f"--run.output_dir={tmp_path}",
                   "--run.epochs=1", "--model.in_chans=1", *TINY)
    out = r.stdout + r.stderr
    assert r.returncode == 0, r.stderr
    assert out.count("the colour of this imagefolder data is thrown away") == 1
    assert "as built: 1 channel (grey)," in out


def test_the_channels_follow_each_dataset(tmp_path):
    assert choose_channels(load_config(None))[0].model.in_chans == 1  # digits: grey
    assert choose_channels(load_config(None, {"data.dataset": "synthetic"}))[0].model.in_chans == 3
    grey = _grey_folder(tmp_path / "grey")
    cfg, note = choose_channels(load_config(None, {"data.dataset": "imagefolder", "data.root": str(grey)}))
    assert (cfg.model.in_chans, note) == (1, None)
    # one colour image among grey ones makes the folder colour
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(grey / "train" / "b" / "z.png")
    assert data_channels(load_config(None, {"data.dataset": "imagefolder", "data.root": str(grey)}))[0] == 3


@pytest.mark.parametrize("pinned", [1, 3])
def test_a_pinned_count_or_preprocessing_statistics_decide(tmp_path, pinned):
    grey = _grey_folder(tmp_path / "grey")
    base = {"data.dataset": "imagefolder", "data.root": str(grey)}
    assert choose_channels(load_config(None, {**base, "model.in_chans": pinned}))[0].model.in_chans == pinned
    stats = {**base, "aug.mean": [0.5] * pinned, "aug.std": [0.5] * pinned}
    assert choose_channels(load_config(None, stats))[0].model.in_chans == pinned
