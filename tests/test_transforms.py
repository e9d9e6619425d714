"""The augmentation pipeline against oracles: torchvision's colour ops in float64, PIL, resize + crop."""

# The augmentation pipeline against oracles: torchvision's colour ops in float64, PIL's JPEG header reader,
# torchvision's resize + centre crop, and our own full-scale decode for the crop-aware reduced decode.

import io
import itertools
import math
import random

import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

import vit.data.decode as D
import vit.data.transforms as T
from vit.config import AugConfig
from vit.data.decode import decode_image
from vit.data.synthetic import photo_like
from vit.data.transforms import build_transform


def _smooth(h, w, seed=0):
    """Photo-like detail at every scale, most energy at low frequencies (a 1/f^1.5 amplitude spectrum)."""
    return photo_like(np.random.default_rng(seed), w, h, slope=1.5, contrast=45)


def test_color_jitter_matches_torchvision_in_float64():
    """Every op order and factors on both sides of 1 (the >1 ones clip): within rounding of torchvision's
    adjust_brightness / adjust_contrast / adjust_saturation computed in float64 and clipped after each op."""
    img = cv2.resize(_smooth(96, 96), (48, 48))
    jitter = T._ColorJitter(0.4, 0.4, 0.4, p=1.0)
    fns = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation]
    for order in itertools.permutations(range(3)):
        for factors in itertools.product([0.6, 1.0, 1.4], repeat=3):
            out, table = jitter.apply(img.copy(), list(order), list(factors))
            if table is not None:
                out = cv2.LUT(out, table)
            ref = torch.from_numpy(img).permute(2, 0, 1).double() / 255
            for op in order:
                ref = fns[op](ref, factors[op]).clamp(0, 1)
            diff = np.abs(out - ref.permute(1, 2, 0).numpy() * 255)
            assert diff.max() <= 2.5 and diff.mean() < 0.6, (order, factors, diff.max(), diff.mean())
    # the hand-off: a pending table is folded into the normalization exactly as if it had been applied
    aug = AugConfig(random_resized_crop=False, hflip=0.0, color_jitter=0.4)
    pipe = build_transform(aug, 48, train=True)
    for seed in range(20):
        pipe.reseed(seed)
        params = pipe.steps[0].params(pipe.py_rng)
        if params is not None and params[0][-1] != 2:  # saturation not last: a table is handed on
            break
    base = cv2.resize(img, (48, 48))
    out, table = pipe.steps[0].apply(base.copy(), *params)
    expect = (cv2.LUT(out, table).astype(np.float32) / 255 - 0.5) / 0.5
    got = pipe(img, seed=seed).permute(1, 2, 0).numpy()
    np.testing.assert_allclose(got, expect, atol=1e-6)


def test_random_resized_crop_boxes_follow_the_sampling_rule():
    crop = T._RandomResizedCrop(32, (0.08, 1.0), (3 / 4, 4 / 3), cv2.INTER_LINEAR)
    rng = random.Random(0)
    for w, h in ((500, 375), (64, 64), (1000, 12), (7, 900)):
        fractions = []
        for _ in range(300):
            x, y, cw, ch = crop.box(w, h, rng)
            assert 0 <= x and 0 <= y and 0 < cw and 0 < ch and x + cw <= w and y + ch <= h
            fractions.append(cw * ch / (w * h))
            if (w, h) == (500, 375):  # room for every draw: area and aspect ratio within range, up to rounding
                assert 0.08 * 0.9 <= cw * ch / (w * h) <= 1.0
                assert 3 / 4 * 0.95 <= cw / ch <= 4 / 3 * 1.05
        if (w, h) == (500, 375):
            assert 0.4 < np.mean(fractions) < 0.6  # uniform in [0.08, 1] has mean 0.54, minus rejected draws
    # no draw fits a 1000x12 strip: the centre crop with the ratio clamped to 4/3
    assert crop.box(1000, 12, rng) == ((1000 - 16) // 2, 0, 16, 12)


def test_eval_pipeline_matches_torchvision_resize_and_centre_crop():
    img = _smooth(120, 200)
    aug = AugConfig(eval_crop_pct=0.875, mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3])
    got = build_transform(aug, 64, train=False)(img)
    t = torch.from_numpy(img).permute(2, 0, 1)
    ref = F.center_crop(F.resize(t, [73], antialias=False), [64, 64]).float() / 255  # 73 = round(64 / 0.875)
    ref = (ref - torch.tensor([0.5, 0.4, 0.3]).view(3, 1, 1)) / torch.tensor([0.2, 0.25, 0.3]).view(3, 1, 1)
    assert got.shape == (3, 64, 64)
    diff = ((got - ref) * torch.tensor([0.2, 0.25, 0.3]).view(3, 1, 1) * 255).abs()  # in grey levels
    assert diff.max() <= 2 and diff.mean() < 0.5


def _jpeg(arr, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", **kw)
    return buf.getvalue()


def test_jpeg_header_parser_agrees_with_pil():
    rgb = _smooth(30, 50)
    for orientation, progressive, mode in itertools.product(range(1, 9), (False, True), ("RGB", "L", "CMYK")):
        exif = Image.Exif()
        exif[0x0112] = orientation
        exif[0x010F] = "camera"
        buf = io.BytesIO()
        Image.fromarray(rgb).convert(mode).save(buf, format="JPEG", exif=exif.tobytes(), progressive=progressive)
        data = buf.getvalue()
        pil = Image.open(io.BytesIO(data))
        assert D._jpeg_header(data) == (*pil.size, pil.getexif().get(0x0112, 1))
        decoded = D.decode_bytes(data, "x.jpg")
        assert decoded.shape[1::-1] == D.jpeg_size(data, "x.jpg")  # displayed size: EXIF rotation applied
    assert D._jpeg_header(b"\xff\xd8\xff\xe0\x00\x10JFIF") is None  # cut short: PIL is asked instead


def _psnr(a, b) -> float:
    return 10 * math.log10(255**2 / max(1e-12, float(np.mean((np.asarray(a, np.float64) - b) ** 2))))


@pytest.mark.parametrize("geometry", ["crop", "resize", "eval"])
def test_load_decodes_at_reduced_scale_when_the_crop_allows(tmp_path, monkeypatch, geometry):
    """A JPEG too small to reduce gives the same tensor, bit for bit, as decoding first. A large one is decoded
    at 1/2..1/8 scale and is at least as close to an antialiased (area-averaged) resize of the full-scale crop
    as the full decode resized by the pipeline's bilinear filter is: the DCT scaling low-passes what a direct
    10x bilinear downscale aliases."""
    small, large = tmp_path / "small.jpg", tmp_path / "large.jpg"
    small.write_bytes(_jpeg(_smooth(90, 120, seed=1), quality=95))
    large.write_bytes(_jpeg(_smooth(1200, 1600, seed=2), quality=95))
    aug = AugConfig(random_resized_crop=geometry == "crop", scale=[0.3, 1.0], hflip=0.0,
                    mean=[0.0, 0.0, 0.0], std=[1 / 255, 1 / 255, 1 / 255])  # output in grey levels
    pipe = build_transform(aug, 64, train=geometry != "eval")
    used = []
    decode = D.decode_bytes
    monkeypatch.setattr(T, "decode_bytes", lambda data, path, r=1: used.append(r) or decode(data, path, r))
    full_img = decode_image(large)
    for seed in range(4):
        assert torch.equal(pipe.load(small, seed), pipe(decode_image(small), seed))
        used.clear()
        fast, full = pipe.load(large, seed).permute(1, 2, 0).numpy(), pipe(full_img, seed).permute(1, 2, 0).numpy()
        assert used and used[0] > 1
        pipe.reseed(seed)
        x, y, w, h = pipe.geometry.box(1600, 1200, pipe.py_rng)
        if geometry == "eval":  # shorter side to 64 (crop_pct 1), centre 64 x 64
            truth = cv2.resize(full_img, (85, 64), interpolation=cv2.INTER_AREA)[:, 10:74]
        else:
            truth = cv2.resize(full_img[y:y + h, x:x + w], (64, 64), interpolation=cv2.INTER_AREA)
        assert _psnr(fast, truth) > 30 and _psnr(fast, truth) >= _psnr(full, truth) - 0.5, (
            _psnr(fast, truth), _psnr(full, truth))
