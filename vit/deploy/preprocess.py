"""The evaluation preprocessing, written from preprocessing.json alone: NumPy, Pillow and OpenCV, no torch.

    pre = ReferencePreprocessing.from_file("exported/preprocessing.json")
    x = pre.load("photo.jpg")          # (C, S, S) float32, what the exported model's input "x" expects per image

A reference anyone can port: each step is the one `vit.data.transforms.Pipeline.load` runs for evaluation, in the
words preprocessing.json uses (`steps`), and tests/test_reference_preprocessing.py proves it equal to ours
pixel for pixel on JPEG, PNG, grey and odd sizes. The steps:

1. decode. A complete JPEG (starts FF D8 FF, ends FF D9) goes through OpenCV (`cv2.imdecode`, libjpeg-turbo,
   EXIF orientation applied) at a reduced size when the resize allows it: 1/r with r the largest of 8, 4, 2
   such that floor(w / r) >= w * s and floor(h / r) >= h * s, s = resize / min(w, h) (libjpeg's DCT scaling;
   PIL's `Image.draft` is the same decoder option). Anything else, or a JPEG OpenCV refuses, through Pillow:
   EXIF orientation applied, 16-bit grey scaled to 8 bits, transparency composited over white, then RGB.
2. resize with OpenCV (`cv2.resize`, INTER_CUBIC for bicubic, INTER_LINEAR for bilinear): the shorter side to
   `resize`, the longer to int(resize * longer / shorter) (truncated, as torchvision's Resize(int)).
3. centre crop S x S, offsets int(round((side - S) / 2)) (Python's round: half to even).
4. a grey model (one channel): OpenCV's RGB -> grey (0.299 R + 0.587 G + 0.114 B, rounded to uint8).
5. normalize each channel: (v - 255 mean) / (255 std) in float64, stored as float32; layout C, H, W
   (the model takes N, C, H, W), channels in RGB order.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageOps

__all__ = ["ReferencePreprocessing", "decode"]

FILTERS = {"bicubic": cv2.INTER_CUBIC, "bilinear": cv2.INTER_LINEAR}
_REDUCED_BGR = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
                8: cv2.IMREAD_REDUCED_COLOR_8}


def _complete_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff" and data[-64:].rstrip(b"\x00\r\n ")[-2:] == b"\xff\xd9"


def _pil_rgb(img: Image.Image) -> np.ndarray:
    """Pillow image -> RGB uint8 (H, W, 3) as step 1 says."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        a = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or a.max() > 255 else 255.0
        return np.repeat(np.clip(a / top * 255.0 + 0.5, 0, 255).astype(np.uint8)[..., None], 3, axis=2)
    if img.mode == "F":
        a = np.asarray(img, dtype=np.float64)
        return np.repeat(np.clip(a * (255.0 if a.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)[..., None], 3, 2)
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA"):
        img = Image.alpha_composite(Image.new("RGBA", img.size, (255, 255, 255, 255)), img.convert("RGBA"))
    return np.asarray(img.convert("RGB"))


def decode(data: bytes, resize: int) -> np.ndarray:
    """Step 1: image bytes -> RGB uint8 (H, W, 3), a JPEG at the reduced size `resize` allows."""
    r = 1
    if _complete_jpeg(data):
        with Image.open(io.BytesIO(data)) as probe:
            w, h = probe.size
            if probe.getexif().get(0x0112, 1) in (5, 6, 7, 8):  # a quarter turn: displayed sides swap
                w, h = h, w
        s = resize / min(w, h)
        r = next((k for k in (8, 4, 2) if w // k >= w * s and h // k >= h * s), 1)
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), _REDUCED_BGR[r])
        if bgr is not None and bgr.ndim == 3 and bgr.shape[2] == 3 and bgr.size:
            return np.ascontiguousarray(bgr[..., ::-1])
    img = Image.open(io.BytesIO(data))
    if r > 1 and img.format == "JPEG":
        img.draft("RGB", (math.ceil(img.size[0] / r), math.ceil(img.size[1] / r)))
    return _pil_rgb(ImageOps.exif_transpose(img))


class ReferencePreprocessing:
    """Steps 2-5 with the numbers of one preprocessing.json."""

    def __init__(self, size: int, resize: int, interpolation: str, mean, std) -> None:
        if interpolation not in FILTERS:
            raise ValueError(f"interpolation {interpolation!r} is not one of {', '.join(FILTERS)}.")
        self.size, self.resize, self.filter = int(size), int(resize), FILTERS[interpolation]
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]

    @classmethod
    def from_dict(cls, info: dict) -> ReferencePreprocessing:
        steps = {s["step"]: s for s in info["steps"]}
        return cls(steps["center_crop"]["size"][0], steps["resize"]["shorter_side"], info["interpolation"],
                   steps["normalize"]["mean"], steps["normalize"]["std"])

    @classmethod
    def from_file(cls, path: str | Path) -> ReferencePreprocessing:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def load(self, path: str | Path) -> np.ndarray:
        return self(decode(Path(path).read_bytes(), self.resize))

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        """RGB uint8 (H, W, 3) -> (C, S, S) float32."""
        h, w = rgb.shape[:2]
        nw, nh = (self.resize, int(self.resize * h / w)) if w <= h else (int(self.resize * w / h), self.resize)
        img = cv2.resize(rgb, (nw, nh), interpolation=self.filter)
        y, x = int(round((nh - self.size) / 2)), int(round((nw - self.size) / 2))
        img = img[y:y + self.size, x:x + self.size]
        if len(self.mean) == 1:
            img = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)[..., None]
        out = (img.astype(np.float64) - 255.0 * np.array(self.mean)) / (255.0 * np.array(self.std))
        return np.ascontiguousarray(out.transpose(2, 0, 1), dtype=np.float32)
