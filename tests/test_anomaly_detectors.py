"""Several anomaly detectors beside one checkpoint, one per part type (vit.eval.anomaly_settings.detector_folder):
anomaly.py fit / score --detector NAME, predict.py and the demo choosing one by name, each scoring as its own bank
does, and the names and folders refused in one sentence."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from vit.config import ConfigError
from vit.data.synthetic import PART_KINDS, inspection_part


@pytest.fixture(scope="module")
def two_parts(tmp_path_factory):
    """An untrained 32-px, patch-8 model saved as a checkpoint; good weave and good knurl parts, and test parts of
    both (good and stained)."""
    from PIL import Image

    from vit.config import load_config
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    tmp = tmp_path_factory.mktemp("detectors")
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs/default.yaml",
                      ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=2",
                       "--model.num_heads=2", "--model.mlp_ratio=2", "--aug.eval_crop_pct=1.0"])
    torch.manual_seed(0)
    save_checkpoint(tmp / "ck", build_model(cfg, 4).eval(), cfg, list(PART_KINDS))
    rng = np.random.default_rng(0)
    for kind in ("weave", "knurl"):
        for split, names in (("good", {"good": 6}), ("test", {"good": 2, "stain": 2})):
            for name, n in names.items():
                (tmp / kind / split / name).mkdir(parents=True)
                for i in range(n):
                    img, _ = inspection_part(rng, 32, kind, None if name == "good" else name)
                    Image.fromarray(img).save(tmp / kind / split / name / f"{i}.png")
    return tmp


def test_named_detectors_fit_side_by_side_and_score_as_their_own_banks(two_parts, tmp_path):
    from helpers import import_script

    from vit.eval.anomaly import load_patchcore
    from vit.explain.demo import Demo
    from vit.models.checkpoint import load_checkpoint

    ck = str(two_parts / "ck")
    anomaly, predict = import_script("anomaly").main, import_script("predict").main
    for kind in ("weave", "knurl"):
        assert anomaly(["fit", "--checkpoint", ck, "--detector", kind, "--good", str(two_parts / kind / "good"),
                        "--ratio", "0.5"]) == 0
    assert sorted(p.name for p in (two_parts / "ck" / "anomaly").iterdir()) == ["knurl", "weave"]
    banks = {k: load_patchcore(two_parts / "ck" / "anomaly" / k) for k in ("weave", "knurl")}
    assert not torch.equal(banks["weave"].bank, banks["knurl"].bank)
    model, cfg, _, _ = load_checkpoint(ck)
    from vit.data.transforms import build_transform

    transform = build_transform(cfg.aug, 32, train=False)
    test = two_parts / "knurl" / "test"
    for kind in ("weave", "knurl"):
        out = tmp_path / kind
        assert predict(["--checkpoint", ck, "--detector", kind, str(test), "--out", str(out)]) == 0
        rows = list(csv.DictReader((out / "predictions.csv").open()))
        want, _ = banks[kind].score(model, torch.stack([transform.load(r["path"]) for r in rows]))
        np.testing.assert_allclose([float(r["anomaly_score"]) for r in rows], want.numpy(), rtol=1e-5)
        assert anomaly(["score", "--checkpoint", ck, "--detector", kind, str(test), "--out", str(out / "s")]) == 0
        scored = {r["path"]: float(r["score"]) for r in csv.DictReader((out / "s" / "scores.csv").open())}
        np.testing.assert_allclose([scored[r["path"]] for r in rows], want.numpy(), rtol=1e-5)
    demo = Demo(ck, detector="knurl")
    assert torch.equal(demo.patchcore.bank, banks["knurl"].bank)


def test_a_detector_name_that_is_not_there_or_not_a_name_is_one_sentence(two_parts, tmp_path):
    from helpers import import_script

    from vit.eval.anomaly_settings import detector_folder

    ck = two_parts / "ck"
    if not (ck / "anomaly" / "weave").is_dir():  # the first test fits them; alone, fit one here
        import_script("anomaly").main(["fit", "--checkpoint", str(ck), "--detector", "weave", "--good",
                                       str(two_parts / "weave" / "good")])
    names = ", ".join(sorted(p.name for p in (ck / "anomaly").iterdir()))
    with pytest.raises(ValueError, match=rf"^{ck} holds \d named detectors \({names}\); choose one with --detector "
                                         r"NAME\.$"):
        detector_folder(ck)
    with pytest.raises(ValueError, match=rf"has no detector 'nuts' \(it holds {names}\); fit it with anomaly\.py "
                                         r"fit --detector nuts\.$"):
        detector_folder(ck, "nuts")
    for bad in ("../weave", ".hidden", "a/b", ""):
        with pytest.raises(ValueError, match=r"is not a detector name: use up to 100 letters, digits"):
            detector_folder(ck, bad)
    assert detector_folder(tmp_path) is None  # a plain classifier checkpoint: no detector, no error
    anomaly = import_script("anomaly").main
    with pytest.raises(ConfigError, match=r"^--bank is the detector's folder and --detector names one"):
        anomaly(["score", "--checkpoint", str(ck), "--detector", "weave", "--bank", str(tmp_path), "x.png"])
    with pytest.raises(ConfigError, match=r"holds \d named detectors"):
        anomaly(["score", "--checkpoint", str(ck), str(two_parts / "weave" / "test")])
    with pytest.raises(ValueError, match=r"has no detector 'nuts'"):
        import_script("predict").main(["--checkpoint", str(ck), "--detector", "nuts", str(two_parts / "weave" /
                                                                                          "test"), "--out",
                                       str(tmp_path / "p")])
    assert not (tmp_path / "p").exists()
    with pytest.raises(ValueError, match=r"^--detector names one of a --checkpoint's anomaly detectors"):
        import_script("predict").main(["--onnx", str(tmp_path / "model.onnx"), "--detector", "weave", "x.png"])


def test_a_detector_fitted_on_tiles_is_refused_where_images_are_read_whole(two_parts, tmp_path):
    """predict.py, the demo and export read each image whole; a detector of tiles (anomaly.py fit --tile) would be
    judged by a threshold of tiles there, so it is one sentence instead of silently wrong verdicts."""
    import json
    import shutil

    from vit.eval.anomaly import find_patchcore
    from vit.eval.dinomaly import find_detector
    from vit.explain.demo import Demo

    ck = tmp_path / "ck"
    shutil.copytree(two_parts / "ck", ck, ignore=shutil.ignore_patterns("anomaly"))
    from helpers import import_script

    assert import_script("anomaly").main(["fit", "--checkpoint", str(ck), "--good", str(two_parts / "weave" / "good"),
                                          "--ratio", "0.5", "--tile", "32"]) == 0
    assert json.loads((ck / "anomaly" / "patchcore.json").read_text())["tile"] == 32
    for read in (find_detector, find_patchcore, Demo):
        with pytest.raises(ValueError, match=r"was fitted on 32 x 32 tiles of images at their own scale, and this "
                                             r"reads each image whole, where its threshold does not hold; score with "
                                             r"anomaly\.py score"):
            read(ck)


@pytest.mark.slow
def test_export_takes_a_named_detector_and_the_onnx_rows_score_as_its_bank(two_parts, tmp_path):
    """export.py --detector NAME puts that detector in the export's anomaly/: predict.py --onnx scores with it."""
    from helpers import import_script

    from vit.data.transforms import build_transform
    from vit.eval.anomaly import load_patchcore
    from vit.models.checkpoint import load_checkpoint

    pytest.importorskip("onnxruntime")
    ck = two_parts / "ck"
    if not (ck / "anomaly" / "knurl").is_dir():
        import_script("anomaly").main(["fit", "--checkpoint", str(ck), "--detector", "knurl", "--good",
                                       str(two_parts / "knurl" / "good")])
    export = import_script("export").main
    with pytest.raises(ValueError, match=r"has no detector 'nuts'"):
        export(["--checkpoint", str(ck), "--detector", "nuts", "--format", "onnx", "--out", str(tmp_path / "x")])
    assert export(["--checkpoint", str(ck), "--detector", "knurl", "--format", "onnx", "--out",
                   str(tmp_path / "exp"), "--images", str(two_parts / "knurl" / "good")]) == 0
    test = two_parts / "knurl" / "test"
    assert import_script("predict").main(["--onnx", str(tmp_path / "exp"), str(test), "--out",  # the folder
                                          str(tmp_path / "rows")]) == 0
    rows = list(csv.DictReader((tmp_path / "rows" / "predictions.csv").open()))
    model, cfg, _, _ = load_checkpoint(ck)
    transform = build_transform(cfg.aug, 32, train=False)
    want, _ = load_patchcore(ck / "anomaly" / "knurl").score(model, torch.stack([transform.load(r["path"])
                                                                                for r in rows]))
    np.testing.assert_allclose([float(r["anomaly_score"]) for r in rows], want.numpy(), rtol=1e-4, atol=1e-5)
