"""vit/deploy/preprocess.py, written from preprocessing.json alone, equals vit.data.transforms' evaluation pipeline
pixel for pixel (<= 1/255) on JPEG (reduced-size decoding included), PNG, grey, 16-bit, RGBA, EXIF-rotated and
odd sizes, and imports no torch."""

import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT
from PIL import Image

import vit
from vit.config import AugConfig
from vit.data.transforms import build_transform
from vit.deploy.export import preprocessing
from vit.deploy.preprocess import ReferencePreprocessing


def _images(d):
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:600, 0:800]
    smooth = np.stack([(xx * 0.3) % 256, (yy * 0.4) % 256, ((xx + yy) * 0.2) % 256], -1)
    photo = np.clip(smooth + rng.normal(0, 20, smooth.shape), 0, 255).astype(np.uint8)  # (600, 800, 3)
    files = {}

    def save(name, img, **kw):
        files[name] = d / name
        img.save(files[name], **kw)

    save("big.jpg", Image.fromarray(photo), quality=90)  # decoded at 1/8 for a 32 px model
    save("odd.jpg", Image.fromarray(photo[:53, :37]), quality=85)  # odd sides, no reduction
    save("mid.jpg", Image.fromarray(photo[:150, :211]), quality=95)  # 1/2 or 1/4
    save("grey.jpg", Image.fromarray(photo[:301, :199, 1]), quality=90)  # single-channel JPEG
    save("rgb.png", Image.fromarray(photo[:61, :97]))
    save("grey.png", Image.fromarray(photo[:45, :33, 0]))
    save("grey16.png", Image.fromarray(photo[:40, :50, 0].astype(np.uint16) * 257))
    rgba = np.concatenate([photo[:70, :41], rng.integers(0, 256, (70, 41, 1), dtype=np.uint8)], -1)
    save("alpha.png", Image.fromarray(rgba, "RGBA"))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    save("rotated.jpg", Image.fromarray(photo[:120, :300]), quality=90, exif=exif)
    save("tiny.bmp", Image.fromarray(photo[:7, :9]))
    return files


@pytest.mark.parametrize("chans, interpolation, crop_pct", [(3, "bicubic", 0.875), (3, "bilinear", 1.0),
                                                            (1, "bicubic", 0.9)])
def test_reference_equals_our_pipeline(tmp_path, chans, interpolation, crop_pct):
    mean, std = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) if chans == 3 else ([0.5], [0.25])
    aug = AugConfig(mean=mean, std=std, interpolation=interpolation, eval_crop_pct=crop_pct)
    model = vit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2,
                             num_classes=3, in_chans=chans)
    info = preprocessing(model, aug, ["a", "b", "c"])
    ref = ReferencePreprocessing.from_dict(info)  # from the json alone
    ours = build_transform(aug, 32, train=False)
    worst = {}
    for name, path in _images(tmp_path).items():
        a, b = ours.load(path).numpy(), ref.load(path)
        assert a.shape == b.shape == (chans, 32, 32), name
        # in pixel units: normalized values times 255 * std
        worst[name] = float((np.abs(a - b) * np.array(std)[:, None, None] * 255).max())
    assert max(worst.values()) <= 1.0, worst
    # the comparison can fail: one pixel level off somewhere shows
    a = ours.load(tmp_path / "odd.jpg").numpy()
    a[0, 5, 5] += 2.0 / (255 * std[0])
    assert (np.abs(a - ref.load(tmp_path / "odd.jpg")) * std[0] * 255).max() > 1.0


def test_preprocessing_json_states_every_step():
    model = vit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2,
                             num_classes=3, in_chans=1)
    info = preprocessing(model, AugConfig(mean=[0.5], std=[0.5], interpolation="bicubic", eval_crop_pct=0.8),
                         ["a", "b", "c"])
    steps = [s["step"] for s in info["steps"]]
    assert steps == ["decode", "decode", "resize", "center_crop", "to_grey", "normalize", "layout"]
    by = {s["step"]: s for s in info["steps"]}
    assert by["resize"]["library"] == "opencv" and by["resize"]["filter"] == "INTER_CUBIC"
    assert by["resize"]["shorter_side"] == 40 and by["center_crop"]["size"] == [32, 32]
    assert "reduced_size_decoding" in info["steps"][0] and by["layout"]["layout"] == "NCHW"


def test_reference_imports_no_torch():
    code = ("import sys; import vit.deploy.preprocess; "
            "print(sorted(m for m in ('torch', 'timm', 'accelerate', 'albumentations') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
