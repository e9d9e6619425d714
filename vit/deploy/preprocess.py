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

Before step 1 the file is opened by `vit.data.decode`'s rule, the one training and predict.py follow: a regular
file of at most MAX_FILE_BYTES (`read_bytes`), refused from its header if it would decode to more than
MAX_SAMPLE_BYTES (`check_image`: a 250 KB PNG can hold 16000 x 16000 pixels). `read_preprocessing` reads a
preprocessing.json of at most MAX_JSON_BYTES and `ReferencePreprocessing.from_dict` checks every number it uses,
so a tampered file (std 0, an unknown or repeated step, a size of a million, a layout or filter other than the
one it runs) is one sentence, never NaN probabilities.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageOps

from ..data.decode import check_image, jpeg_reduction, jpeg_size, read_bytes

__all__ = ["ReferencePreprocessing", "decode", "read_preprocessing", "STEPS", "MAX_JSON_BYTES", "MAX_SIDE"]

FILTERS = {"bicubic": cv2.INTER_CUBIC, "bilinear": cv2.INTER_LINEAR}
FILTER_NAMES = {"bicubic": "INTER_CUBIC", "bilinear": "INTER_LINEAR"}  # the resize step's "filter" for each
MIN_STD = 1e-6  # a smaller std overflows float32 ((v - 255 mean) / (255 std) past 3.4e38): inf, then NaN scores
# the layout step's fields: what __call__ gives (a runtime reading another value would feed other numbers)
LAYOUT = {"layout": "NCHW", "dtype": "float32"}
STEPS = ("decode", "resize", "center_crop", "to_grey", "normalize", "layout")  # what this reference runs
MAX_JSON_BYTES = 2**20  # export.py writes ~3 KB; a larger file is not one of its
MAX_SIDE = 8192  # resize and crop sides; a larger one is a tampered file (the crop alone would be 800 MB)
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


def decode(data: bytes, resize: int, name: str | Path = "the image") -> np.ndarray:
    """Step 1: image bytes -> RGB uint8 (H, W, 3), a JPEG at the reduced size `resize` allows; BadImageError
    (`name` in its sentence) for bytes over the decoded-size limit, checked before decoding."""
    r = 1
    if _complete_jpeg(data):  # displayed sides (a quarter turn swaps them); a header of 10**9 pixels is refused
        w, h = jpeg_size(data, name)
        s = resize / min(w, h)
        r = jpeg_reduction(w, h, w * s, h * s)
    check_image(data, name, r)
    if _complete_jpeg(data):
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), _REDUCED_BGR[r])
        if bgr is not None and bgr.ndim == 3 and bgr.shape[2] == 3 and bgr.size:
            return np.ascontiguousarray(bgr[..., ::-1])
    img = Image.open(io.BytesIO(data))
    if r > 1 and img.format == "JPEG":
        img.draft("RGB", (math.ceil(img.size[0] / r), math.ceil(img.size[1] / r)))
    return _pil_rgb(ImageOps.exif_transpose(img))


def read_preprocessing(path: str | Path) -> dict:
    """preprocessing.json's fields; ValueError (one sentence) for a path that is not a regular file (a FIFO is
    not waited on, a link to /dev/zero not read), a file over MAX_JSON_BYTES, or text that is not a JSON object."""
    try:  # O_NONBLOCK: a FIFO opens at once instead of waiting for a writer; no effect on a regular file
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist; keep the preprocessing.json export.py wrote beside the "
                                "model.") from None
    except OSError as e:
        raise ValueError(f"cannot read {path} ({e.strerror or e}); keep the preprocessing.json export.py wrote "
                         "beside the model.") from None
    st = os.fstat(fd)  # before fdopen, which refuses a folder with IsADirectoryError
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError(f"{path} is not a regular file (a folder, FIFO or device); keep the preprocessing.json "
                         "export.py wrote beside the model.")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_JSON_BYTES:
            raise ValueError(f"{path} is {st.st_size} bytes, over the {MAX_JSON_BYTES} a preprocessing.json may "
                             "have (export.py writes a few KB); export the model again.")
        data = f.read(MAX_JSON_BYTES + 1)
    try:
        info = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path} is not valid JSON ({str(e).splitlines()[0]}); export the model again.") from None
    if not isinstance(info, dict):
        raise ValueError(f"{path} holds a JSON {type(info).__name__}, not the object export.py writes; export the "
                         "model again.")
    return info


def _side(value, what: str, low: int = 1) -> int:
    """A whole number of pixels in [low, MAX_SIDE], or ValueError naming the field."""
    if type(value) is not int or not low <= value <= MAX_SIDE:
        raise ValueError(f"{what} is {value!r}, not a whole number of pixels from {low} to {MAX_SIDE}")
    return value


def _channels(value, what: str) -> list[float]:
    """One or three finite numbers (grey or RGB), or ValueError naming the field."""
    if not isinstance(value, list) or len(value) not in (1, 3) or not all(
            type(v) in (int, float) and math.isfinite(v) for v in value):
        raise ValueError(f"{what} is {value!r}, not a list of 1 or 3 finite numbers")
    return [float(v) for v in value]


class ReferencePreprocessing:
    """Steps 2-5 with the numbers of one preprocessing.json."""

    def __init__(self, size: int, resize: int, interpolation: str, mean, std) -> None:
        if interpolation not in FILTERS:
            raise ValueError(f"interpolation {interpolation!r} is not one of {', '.join(FILTERS)}")
        self.size = _side(size, "the crop size")
        self.resize = _side(resize, "the resize (shorter side)", low=self.size)
        self.filter = FILTERS[interpolation]
        self.mean, self.std = _channels(mean, "normalize's mean"), _channels(std, "normalize's std")
        if len(self.mean) != len(self.std):
            raise ValueError(f"normalize has {len(self.mean)} mean(s) but {len(self.std)} std(s); one per channel")
        if not min(self.std) >= MIN_STD:
            raise ValueError(f"normalize's std {self.std} has a value at or below 0 or under {MIN_STD:g} (dividing "
                             "by it gives NaN or flips the image)")

    @classmethod
    def from_dict(cls, info: dict) -> ReferencePreprocessing:
        """From preprocessing.json's fields; ValueError naming the first field that this reference cannot run
        as stated (a missing or unknown step, a size out of range, a std of 0, an interpolation it lacks)."""
        steps = info.get("steps")
        if not isinstance(steps, list) or not all(isinstance(s, dict) and isinstance(s.get("step"), str)
                                                  for s in steps):
            raise ValueError("'steps' is not a list of {\"step\": name, ...} objects")
        unknown = sorted({s["step"] for s in steps} - set(STEPS))
        if unknown:
            raise ValueError(f"step(s) {', '.join(map(repr, unknown))} are not ones this predictor runs "
                             f"({', '.join(STEPS)}), so it would preprocess differently from the export")
        twice = [n for n in STEPS[1:] if sum(s["step"] == n for s in steps) > 1]
        if twice:  # decode comes twice (OpenCV for complete JPEGs, Pillow for the rest); the others once
            raise ValueError(f"the {twice[0]} step comes more than once, so which one holds is unclear")
        by = {s["step"]: s for s in steps}
        missing = [k for k in ("resize", "center_crop", "normalize") if k not in by]
        if missing:
            raise ValueError(f"the {missing[0]} step is missing")
        crop = by["center_crop"].get("size")
        if not isinstance(crop, list) or len(crop) != 2 or crop[0] != crop[1]:
            raise ValueError(f"center_crop's size is {crop!r}, not [S, S]")
        interpolation = info.get("interpolation")
        if not isinstance(interpolation, str):
            raise ValueError(f"interpolation is {interpolation!r}, not one of {', '.join(FILTERS)}")
        pre = cls(crop[0], by["resize"].get("shorter_side"), interpolation, by["normalize"].get("mean"),
                  by["normalize"].get("std"))
        for key in ("mean", "std"):  # timm's keys beside the steps: a runtime may read either, so they must agree
            if key in info and info[key] != by["normalize"][key]:
                raise ValueError(f"'{key}' {info[key]!r} differs from normalize's {by['normalize'][key]!r}")
        flt = by["resize"].get("filter", FILTER_NAMES[interpolation])
        if flt != FILTER_NAMES[interpolation]:
            raise ValueError(f"the resize step's filter {flt!r} differs from interpolation {interpolation!r} "
                             f"({FILTER_NAMES[interpolation]})")
        want = {**LAYOUT, "channel_order": "RGB" if len(pre.mean) == 3 else "grey"}
        for key, value in want.items():  # a runtime reading these would feed other numbers than __call__ gives
            if key in by.get("layout", {}) and by["layout"][key] != value:
                raise ValueError(f"the layout step's {key} {by['layout'][key]!r} is not {value!r}, what this "
                                 "predictor gives the model")
        if "input_size" in info and info["input_size"] != [len(pre.mean), pre.size, pre.size]:
            raise ValueError(f"input_size {info['input_size']!r} differs from the {len(pre.mean)} channel(s) and "
                             f"{pre.size} x {pre.size} crop of the steps")
        if "to_grey" in by and len(pre.mean) != 1:
            raise ValueError(f"a to_grey step goes with one mean and std (a grey model), not {len(pre.mean)}")
        if "to_grey" not in by and len(pre.mean) == 1:
            raise ValueError("one mean and std (a grey model) needs a to_grey step")
        return pre

    @classmethod
    def from_file(cls, path: str | Path) -> ReferencePreprocessing:
        info = read_preprocessing(path)
        try:
            return cls.from_dict(info)
        except ValueError as e:
            raise ValueError(f"{path}: {e}; export the model again.") from None

    def load(self, path: str | Path) -> np.ndarray:
        """The image file at `path` opened by vit.data.decode's rule (`read_bytes`, `check_image`) -> (C, S, S)."""
        return self(decode(read_bytes(path), self.resize, path))

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
