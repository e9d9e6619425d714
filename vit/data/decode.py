"""Reading image files as RGB uint8 arrays, and the pieces `vit.data.transforms.Pipeline.load` uses to decode a
JPEG at the smallest scale its crop allows.

Whatever a folder holds becomes RGB uint8 (H, W, 3): EXIF orientation applied, grayscale and 16-bit scaled to
8 bits, palette and alpha images converted; an unreadable file raises `BadImageError`. Complete JPEGs go
through OpenCV's libjpeg-turbo decoder (faster than PIL's, same pixels) and can be decoded at
1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling); everything else, and any JPEG OpenCV refuses, through PIL, whose
errors name the problem. A JPEG's size and orientation come from a small marker parser (~10 us).

Opening an image is one rule, whoever decodes it (training, predict.py, predict.py --onnx's reference
preprocessing, the demo's uploads): `read_bytes` opens only regular files (a FIFO would block, a device file
never end), at most MAX_FILE_BYTES of them, and `check_image` refuses, from the header alone, an image that
would take more than MAX_SAMPLE_BYTES decoded: PNG's and TIFF's compression makes a 500 KB file of
16000 x 16000 16-bit pixels, 7.6 GB and 24 s to decode. NumPy, Pillow and OpenCV only (no torch).
"""

from __future__ import annotations

import io
import math
import os
import re
import stat
import warnings
from contextlib import contextmanager
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageOps

__all__ = ["IMG_EXTENSIONS", "BadImageError", "decode_image", "to_rgb_array", "read_bytes", "is_complete_jpeg",
           "jpeg_size", "jpeg_reduction", "decode_bytes", "check_image"]

Image.MAX_IMAGE_PIXELS = 256_000_000  # very large images are decoded (cheaply, at reduced scale) not refused
# the suffixes a folder's image files have (a file named directly is decoded whatever its suffix)
IMG_EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
MAX_FILE_BYTES = 256 * 2**20  # an image file larger than this is refused unread
MAX_SAMPLE_BYTES = 512 * 2**20  # decoded: width * height * BYTES_PER_PIXEL; 8192 x 8192 fits, 16000^2 does not
BYTES_PER_PIXEL = 8  # PIL's 4-byte pixel, the RGB array (3) and a byte of conversion headroom
# OpenCV >= 4.11 decodes straight to RGB (IMREAD_COLOR_RGB, ORed with the reduced-scale flags); albumentations
# accepts older OpenCV releases, which decode to BGR: there the channels are flipped after decoding.
def _decode_flags(rgb: bool) -> dict[int, int]:
    """imdecode flags by reduction factor: RGB output, or OpenCV's BGR where it cannot decode to RGB."""
    if rgb:
        return {1: cv2.IMREAD_COLOR_RGB, 2: cv2.IMREAD_REDUCED_GRAYSCALE_2 | cv2.IMREAD_COLOR_RGB,
                4: cv2.IMREAD_REDUCED_GRAYSCALE_4 | cv2.IMREAD_COLOR_RGB,
                8: cv2.IMREAD_REDUCED_GRAYSCALE_8 | cv2.IMREAD_COLOR_RGB}
    return {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8}


_RGB_DECODE = hasattr(cv2, "IMREAD_COLOR_RGB")
_REDUCED = _decode_flags(_RGB_DECODE)


class BadImageError(ValueError):
    """The file is not an image we can decode."""


def to_rgb_array(img: Image.Image) -> np.ndarray:
    """Any PIL image -> RGB uint8 (H, W, 3)."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        a = np.asarray(img, dtype=np.float64)
        hi = 65535.0 if img.mode.startswith("I;16") or a.max() > 255 else 255.0
        a = np.clip(a / hi * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return np.repeat(a[..., None], 3, axis=2)
    if img.mode == "F":
        a = np.asarray(img, dtype=np.float64)
        a = np.clip(a * (255.0 if a.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
        return np.repeat(a[..., None], 3, axis=2)
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA"):
        img = img.convert("RGBA")
        bg = Image.new("RGBA", img.size, (255, 255, 255, 255))
        img = Image.alpha_composite(bg, img)  # transparent areas become white, not black
    return np.asarray(img if img.mode == "RGB" else img.convert("RGB"))


def is_complete_jpeg(data: bytes) -> bool:
    """A baseline/progressive JPEG that is complete (ends with EOI, maybe padded); anything else goes through
    PIL, whose errors name truncated files instead of filling them with grey as libjpeg's warnings do. Only
    the tail is stripped: stripping `data` itself would copy the whole file."""
    return data[:3] == b"\xff\xd8\xff" and data[-64:].rstrip(b"\x00\r\n ")[-2:] == b"\xff\xd9"


@contextmanager
def _pil_errors(path):
    """Around PIL calls: a decompression bomb is an error, and every PIL failure a `BadImageError`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    except BadImageError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        # PIL names the in-memory buffer it read ("<_io.BytesIO object at 0x...>"): the file is named already
        why = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", str(e))
        raise BadImageError(f"cannot decode image {path}: {why}") from None


def read_bytes(path: str | Path) -> bytes:
    """The file's bytes, if it is a regular file (symlinks followed) of at most MAX_FILE_BYTES."""
    try:  # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer; no effect on files
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise BadImageError(f"cannot decode image {path}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BadImageError(f"cannot decode image {path}: not a regular file (a folder, FIFO or device)")
        if st.st_size > MAX_FILE_BYTES:
            raise BadImageError(f"cannot decode image {path}: {st.st_size} bytes is over the limit of "
                                f"{MAX_FILE_BYTES} (vit.data.decode.MAX_FILE_BYTES)")
        try:
            return f.read(MAX_FILE_BYTES + 1)
        except OSError as e:
            raise BadImageError(f"cannot decode image {path}: {e.strerror or e}") from None


def check_decoded_size(w: int, h: int, path) -> None:
    """Refuse, before decoding, an image that would take more than MAX_SAMPLE_BYTES of memory."""
    if w * h * BYTES_PER_PIXEL > MAX_SAMPLE_BYTES:
        raise BadImageError(f"cannot decode image {path}: {w}x{h} pixels would take "
                            f"{w * h * BYTES_PER_PIXEL / 2**30:.1f} GiB decoded, over the "
                            f"{MAX_SAMPLE_BYTES // 2**20} MiB a sample may cost (vit.data.decode.MAX_SAMPLE_BYTES)")


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}  # not C4/C8/CC


def _exif_orientation(tiff: bytes) -> int:
    """The Orientation tag (0x0112) of IFD0 in an EXIF TIFF block; 1 if absent or unreadable."""
    order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    ifd = int.from_bytes(tiff[4:8], order)
    if ifd + 2 > len(tiff):
        return 1
    for k in range(int.from_bytes(tiff[ifd:ifd + 2], order)):
        e = ifd + 2 + 12 * k
        if e + 12 > len(tiff):
            break
        if int.from_bytes(tiff[e:e + 2], order) == 0x0112:
            v = int.from_bytes(tiff[e + 8:e + 10], order)
            return v if 1 <= v <= 8 else 1
    return 1


def _jpeg_header(data: bytes) -> tuple[int, int, int] | None:
    """(width, height, EXIF orientation) from a JPEG's markers, without decoding (~10 us against ~150 us for
    PIL's parser); None if the markers are not as expected, and the caller asks PIL."""
    i, n, orientation = 2, len(data), 1
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if marker == 0xE1 and data[i + 4:i + 10] == b"Exif\x00\x00":
            orientation = _exif_orientation(data[i + 10:i + 2 + length])
        elif marker in _SOF:
            if i + 9 > n:
                return None
            h, w = int.from_bytes(data[i + 5:i + 7], "big"), int.from_bytes(data[i + 7:i + 9], "big")
            return (w, h, orientation) if w and h else None
        elif marker == 0xDA:  # scan data before any frame header
            return None
        i += 2 + length
    return None


def jpeg_size(data: bytes, path) -> tuple[int, int]:
    """(width, height) of a JPEG as displayed (EXIF orientation applied), from its header alone."""
    head = _jpeg_header(data)
    if head is not None:
        w, h, orientation = head
    else:
        with _pil_errors(path):
            img = Image.open(io.BytesIO(data))
            (w, h), orientation = img.size, img.getexif().get(0x0112, 1)
    if w * h > Image.MAX_IMAGE_PIXELS:
        raise BadImageError(f"cannot decode image {path}: {w}x{h} pixels is over the limit of "
                            f"{Image.MAX_IMAGE_PIXELS} (PIL.Image.MAX_IMAGE_PIXELS); shrink it or raise the limit.")
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)  # a quarter turn swaps the sides


def _check_scaled(w: int, h: int, reduction: int, path) -> None:
    check_decoded_size(math.ceil(w / reduction), math.ceil(h / reduction), path)


def _check_opened(img: Image.Image, reduction: int, path) -> None:
    """The size check on an image PIL has opened (its header read, nothing decoded): only a JPEG is reduced."""
    _check_scaled(*img.size, reduction if img.format == "JPEG" else 1, path)


def check_image(data: bytes, path, reduction: int = 1) -> None:
    """Refuse (BadImageError) image bytes whose header says they would take more than MAX_SAMPLE_BYTES decoded
    at 1/`reduction` scale (a JPEG's DCT scaling; other formats decode whole), before anything is decoded.
    `decode_bytes` applies the same check; call this where another decoder follows (the ONNX reference)."""
    head = _jpeg_header(data) if is_complete_jpeg(data) else None
    if head is not None:
        return _check_scaled(head[0], head[1], reduction, path)
    with _pil_errors(path):
        with Image.open(io.BytesIO(data)) as img:  # reads the header only
            _check_opened(img, reduction, path)


def decode_bytes(data: bytes, path, reduction: int = 1) -> np.ndarray:
    """Bytes -> RGB uint8 (H, W, 3); a JPEG at 1/`reduction` scale (1, 2, 4 or 8); `check_image`'s rule first."""
    if is_complete_jpeg(data):
        head = _jpeg_header(data)
        if head is not None:
            _check_scaled(head[0], head[1], reduction, path)
        try:
            arr = cv2.imdecode(np.frombuffer(data, np.uint8), _REDUCED[reduction])
        except cv2.error:
            arr = None
        if arr is not None and arr.ndim == 3 and arr.shape[2] == 3 and arr.size:
            return arr if _RGB_DECODE else np.ascontiguousarray(arr[..., ::-1])
    with _pil_errors(path):  # anything cv2 did not take: PIL names the problem
        img = Image.open(io.BytesIO(data))
        _check_opened(img, reduction, path)  # PIL has read the header only: nothing decoded yet
        if reduction > 1 and img.format == "JPEG":
            w, h = img.size
            img.draft("RGB", (math.ceil(w / reduction), math.ceil(h / reduction)))
        arr = to_rgb_array(ImageOps.exif_transpose(img))
    if arr.ndim != 3 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise BadImageError(f"cannot decode image {path}: empty image")
    return arr


def jpeg_reduction(w: int, h: int, need_w: float, need_h: float) -> int:
    """The largest JPEG scale divisor (8, 4, 2 or 1) that keeps a w x h region at least need_w x need_h."""
    for r in (8, 4, 2):
        if w // r >= need_w and h // r >= need_h:
            return r
    return 1


def decode_image(path: str | Path, max_side: int | None = None) -> np.ndarray:
    """Read an image file as RGB uint8 (H, W, 3). With `max_side`, a large JPEG is decoded at a reduced
    scale (libjpeg's DCT scaling) so that its shorter side stays at least `max_side` pixels."""
    data = read_bytes(path)
    r = 1
    if max_side and is_complete_jpeg(data):
        r = jpeg_reduction(*jpeg_size(data, path), max_side, max_side)
    return decode_bytes(data, path, r)
