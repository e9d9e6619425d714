"""A PatchCore bank's files as a careless or hostile hand leaves them (vit/eval/anomaly_settings.py): one reader and
one set of checks for the torch path (anomaly.py, predict.py, the demo) and the torch-free one (predict.py --onnx);
and the one line that says the preprocessing crops the border away."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vit import create_model
from vit.config import AugConfig
from vit.eval.anomaly import PatchCore, find_patchcore, load_patchcore, save_patchcore

NOT_FINITE = ["NaN", "Infinity", "-Infinity", '"0.5"', "true", "[0.5]"]


def _edit(path, **values) -> None:
    settings = json.loads(path.read_text())
    text = json.dumps({k: v for k, v in settings.items() if k not in values}, indent=1)[:-2]
    path.write_text(text + "".join(f',\n "{k}": {v}' for k, v in values.items()) + "\n}")


@pytest.mark.parametrize("bad", NOT_FINITE)
def test_a_threshold_that_is_not_a_finite_number_is_refused_where_the_bank_is_read(tmp_path, bad):
    """NaN compared with a score is False, so a NaN threshold called every image good; a string failed mid-run.
    Each is one sentence from the loader that anomaly.py, predict.py (find_patchcore) and the demo use."""
    folder = save_patchcore(tmp_path / "ck" / "anomaly", PatchCore(torch.randn(6, 4), (1, 2), threshold=0.5))
    _edit(folder / "patchcore.json", threshold=bad)
    for load in (lambda: load_patchcore(folder), lambda: find_patchcore(tmp_path / "ck")):
        with pytest.raises(ValueError, match=r"has threshold .*, not a finite number \(NaN would call every image "
                                             r"good\); rebuild it with anomaly.py fit\.$"):
            load()


def test_a_nan_threshold_is_never_saved():
    with pytest.raises(ValueError, match="not a finite number"):
        save_patchcore("/nonexistent-never-written", PatchCore(torch.randn(6, 4), (1,), threshold=float("nan")))


@pytest.mark.parametrize("key, bad, message", [
    ("layers", '"1"', "not a list of block indices"),
    ("layers", "[-1]", "not a list of block indices"),
    ("neighbourhood", "2", "not an odd whole number of patches"),
    ("grid", "[0, 4]", r"not \[rows, columns\] of whole numbers >= 1"),
])
def test_other_settings_are_checked_by_the_same_reader(tmp_path, key, bad, message):
    folder = save_patchcore(tmp_path / "anomaly", PatchCore(torch.randn(6, 4), (1, 2), threshold=0.5))
    _edit(folder / "patchcore.json", **{key: bad})
    with pytest.raises(ValueError, match=message):
        load_patchcore(folder)


def _onnx_folder(tmp_path, grid, threshold=0.5):
    """An exported folder as export.py lays it out (preprocessing.json of a 32-px, patch-8 model: a 4 x 4 grid),
    with a features.onnx that is not a model: every check here must come before ONNX Runtime opens it."""
    from vit.deploy.export import preprocessing, write_preprocessing

    model = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=2)
    write_preprocessing(tmp_path, preprocessing(model, AugConfig(), ["a", "b"]))
    folder = tmp_path / "anomaly"
    folder.mkdir()
    (folder / "features.onnx").write_bytes(b"not an onnx model")
    np.save(folder / "bank.npy", np.random.default_rng(0).normal(size=(6, 8)).astype(np.float32))
    (folder / "patchcore.json").write_text(json.dumps(dict(layers=[0], neighbourhood=3, grid=grid)))
    _edit(folder / "patchcore.json", threshold=threshold)
    return folder


@pytest.mark.parametrize("bad", NOT_FINITE)
def test_the_onnx_path_refuses_the_same_thresholds_with_the_same_sentence(tmp_path, bad):
    from vit.deploy.onnx_anomaly import OnnxPatchCore

    with pytest.raises(ValueError, match=r"not a finite number \(NaN would call every image good\); export the "
                                         r"checkpoint again with export.py\.$"):
        OnnxPatchCore(_onnx_folder(tmp_path, [4, 4], bad))


@pytest.mark.parametrize("grid", [[100000, 100000], [4, 5], [2, 2]])
def test_the_onnx_grid_is_checked_against_the_preprocessing_before_anything_is_allocated(tmp_path, grid):
    """A grid of 10^10 patches once became np.full((N, 100000, 100000)) at the first predict; now the grid must be
    the one the preprocessed images make (32 px in 8-px patches: 4 x 4), said before the model is even opened."""
    from vit.deploy.onnx_anomaly import OnnxPatchCore

    with pytest.raises(ValueError, match=r"has grid \[\d+, \d+\], but .*preprocessing.json's 32 x 32 images in "
                                         r"\[8, 8\]-pixel patches make a \(4, 4\) grid; export the checkpoint again"):
        OnnxPatchCore(_onnx_folder(tmp_path, grid))
    # the right grid passes every check and reaches ONNX Runtime, which refuses the placeholder file
    with pytest.raises(ValueError, match="ONNX Runtime cannot load"):
        OnnxPatchCore(_onnx_folder(tmp_path / "ok", [4, 4]))


def test_a_crop_is_one_line_and_no_crop_is_none():
    from vit.cli.images import crop_note

    note = crop_note(0.9, "anomaly.py score")
    assert note.startswith("note: anomaly.py score sees only the centre 90% of each image") and "\n" not in note
    assert "--aug.eval_crop_pct=1.0" in note
    assert crop_note(1.0, "predict.py") is None


@pytest.mark.parametrize("crop, noted", [(0.9, True), (1.0, False)])
def test_anomaly_and_predict_say_on_stderr_when_the_border_is_cropped(tmp_path, capsys, crop, noted):
    from helpers import import_script, make_image_folder

    from vit.config import load_config
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    cfg = load_config(None, ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32",
                             "--model.depth=2", "--model.num_heads=2", f"--aug.eval_crop_pct={crop}"])
    save_checkpoint(tmp_path / "ck", build_model(cfg, 2).eval(), cfg, ["a", "b"])
    images = make_image_folder(tmp_path / "img", classes=("a", "b"), n_train=2, n_val=1, size=32)
    note = "sees only the centre 90% of each image (eval_crop_pct 0.9)"
    assert import_script("anomaly").main(["fit", "--checkpoint", str(tmp_path / "ck"), "--good",
                                          str(images / "train")]) == 0
    err = capsys.readouterr().err
    assert (f"note: anomaly.py fit {note}" in err) == noted and err.count("\n") == int(noted)
    assert import_script("predict").main(["--checkpoint", str(tmp_path / "ck"), str(images / "val"), "--out",
                                          str(tmp_path / "p")]) == 0
    assert (f"note: predict.py {note}" in capsys.readouterr().err) == noted


def test_a_bank_of_integers_and_settings_nested_past_the_stack_are_one_sentence(tmp_path):
    """An int64 bank scored distances to integer vectors, exit 0 (the ONNX path refuses all but float32); a
    patchcore.json of 100000 nested lists was a RecursionError traceback. A float16 bank still loads."""
    from safetensors.torch import save_file

    folder = save_patchcore(tmp_path / "anomaly", PatchCore(torch.randn(6, 4), (1, 2), threshold=0.5))
    save_file({"bank": torch.ones(6, 4, dtype=torch.int64)}, folder / "bank.safetensors")
    with pytest.raises(ValueError, match=r"bank.safetensors is not a finite, floating-point \(K, F\) bank"):
        load_patchcore(folder)
    save_file({"bank": torch.randn(6, 4).half()}, folder / "bank.safetensors")
    assert load_patchcore(folder).bank.shape == (6, 4)
    (folder / "patchcore.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ValueError, match=r"patchcore.json is not a PatchCore settings file \(maximum recursion") as e:
        load_patchcore(folder)
    assert "\n" not in str(e.value)
