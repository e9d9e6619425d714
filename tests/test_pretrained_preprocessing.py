"""Preprocessing from the weights passes the config's checks; the pipeline follows the model's channels."""

# Preprocessing that comes with the weights (pretrained_cfg) passes the config's checks, and the pipeline follows
# the model's input channels.

import json

import numpy as np
import pytest
from helpers import import_script
from PIL import Image
from test_untrusted_weights import make_folder

from vit.config import ConfigError
from vit.data.transforms import build_transform
from vit.eval.inference import load_model_and_config


def _load(folder):
    return load_model_and_config(model_name=f"local-dir:{folder}")


@pytest.mark.parametrize("key,value,match", [
    ("std", [0.0, 0.5, 0.5], r"'std'.*at least"),
    ("mean", ["NaN", 0.5, 0.5], r"'mean'.*finite"),
    ("std", [0.5, "Infinity", 0.5], r"'std'.*finite"),
    ("crop_pct", 1e-6, r"'crop_pct'.*between"),
    ("crop_pct", 0, r"'crop_pct'.*between"),
    ("mean", [0.5, 0.5], r"'mean'.*3 values"),
    ("std", "0.5", r"'std'.*list"),
])
def test_bad_preprocessing_from_the_weights_is_refused(tmp_path, key, value, match):
    folder, _ = make_folder(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["pretrained_cfg"][key] = value
    (folder / "config.json").write_text(json.dumps(cfg).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity"))
    with pytest.raises(ConfigError, match=match) as e:
        _load(folder)
    assert "\n" not in str(e.value) and "--aug." in str(e.value)


def test_the_config_refuses_a_crop_that_blows_the_image_up():
    from vit.config import load_config

    with pytest.raises(ConfigError, match=r"aug\.eval_crop_pct"):
        load_config(None, {"aug.eval_crop_pct": 1e-6})


def test_a_grey_model_by_name_gets_a_grey_pipeline(tmp_path):
    folder, ref = make_folder(tmp_path / "grey", in_chans=1)
    model, cfg, _, _ = _load(folder)
    assert model.in_chans == 1 and cfg.model.in_chans == 1 and len(cfg.aug.mean) == 1
    x = build_transform(cfg.aug, cfg.model.img_size, train=False).load  # noqa: F841 (the pipeline builds)
    images = tmp_path / "img"
    images.mkdir()
    Image.fromarray(np.full((40, 40, 3), 100, np.uint8)).save(images / "a.png")
    predict = import_script("predict")
    assert predict.main(["--model", f"local-dir:{folder}", "--pretrained", str(images), "--out",
                         str(tmp_path / "out"), "--num-workers", "0"]) == 0
    rows = (tmp_path / "out" / "predictions.csv").read_text()
    assert "a.png" in rows and "nan" not in rows
