"""Image decoding: fuzzed JPEG headers and EXIF orientations give an image or one clean BadImageError."""

# Fuzzing that reaches the JPEG header parser (vit.data.decode._jpeg_header) and `Pipeline.load`: generated JPEGs
# with EXIF orientations, extra segments and fill bytes against PIL as the oracle, and mutated headers that must
# give an image or one clean BadImageError, never another exception.

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from vit.config import AugConfig
from vit.data.decode import BadImageError, _jpeg_header, jpeg_size
from vit.data.transforms import build_transform

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
PIPES = {"eval": build_transform(AugConfig(), 16, train=False), "train": build_transform(AugConfig(), 16, train=True)}


def _jpeg(w: int, h: int, orientation: int, progressive: bool, seed: int) -> bytes:
    img = Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=80, progressive=progressive, exif=exif.tobytes())
    return buf.getvalue()


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload


@settings(max_examples=60, **SETTINGS)
@given(w=st.integers(1, 96), h=st.integers(1, 96), orientation=st.integers(1, 8), progressive=st.booleans(),
       extra=st.lists(st.tuples(st.sampled_from([0xE2, 0xE5, 0xEC, 0xEE, 0xFE]), st.binary(max_size=80)), max_size=3),
       fill=st.integers(0, 3), seed=st.integers(0, 9))
def test_generated_jpegs_header_matches_pil_and_load_works(tmp_path, w, h, orientation, progressive, extra, fill,
                                                           seed):
    data = _jpeg(w, h, orientation, progressive, seed)
    # after SOI: extra APPn / COM segments, then fill bytes (0xFF) before the next marker, as the standard allows
    data = data[:2] + b"".join(_segment(m, p) for m, p in extra) + b"\xff" * fill + data[2:]
    pil = Image.open(io.BytesIO(data))
    assert pil.size == (w, h)  # the oracle reads the file as we built it
    assert _jpeg_header(data) == (w, h, pil.getexif().get(0x0112, 1)) == (w, h, orientation)
    assert jpeg_size(data, "x.jpg") == ImageOps.exif_transpose(pil).size  # sides as displayed
    path = tmp_path / f"{w}x{h}.jpg"
    path.write_bytes(data)
    for pipe in PIPES.values():
        x = pipe.load(path, seed=seed)
        assert x.shape == (3, 16, 16) and bool(x.isfinite().all())
    # the eval pipeline at full decoding scale equals decode-then-transform (small images are never reduced)
    if min(w, h) < 32:
        np.testing.assert_allclose(PIPES["eval"].load(path).numpy(),
                                   PIPES["eval"](np.asarray(ImageOps.exif_transpose(pil).convert("RGB"))).numpy(),
                                   atol=0.05)


BASE = _jpeg(40, 30, 6, False, 0)
HEADER_END = BASE.index(b"\xff\xda") + 12  # through the start of scan: markers, lengths, EXIF, tables, frame


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")  # PIL's "Corrupt EXIF data": expected here, and harmless
@settings(max_examples=300, **SETTINGS)
@given(edits=st.lists(st.tuples(st.integers(2, HEADER_END - 1), st.integers(0, 255)), min_size=1, max_size=6),
       cut=st.one_of(st.none(), st.tuples(st.integers(2, HEADER_END), st.integers(1, 40))))
def test_mutated_jpeg_headers_give_an_image_or_one_clean_error(tmp_path, edits, cut):
    data = bytearray(BASE)
    for i, v in edits:
        data[i] = v
    if cut is not None:  # drop a run of header bytes; the file still ends with EOI, so the JPEG path is taken
        del data[cut[0]:cut[0] + cut[1]]
    data = bytes(data)
    head = _jpeg_header(data)  # the parser itself never raises
    assert head is None or (head[0] >= 1 and head[1] >= 1 and 1 <= head[2] <= 8)
    path = tmp_path / "m.jpg"
    path.write_bytes(data)
    for pipe in PIPES.values():
        try:
            x = pipe.load(path, seed=0)
        except BadImageError as e:
            assert str(e).startswith("cannot decode image") and "\n" not in str(e)
        else:
            assert x.shape == (3, 16, 16) and bool(x.isfinite().all())


@pytest.mark.parametrize("data", [b"\xff\xd8\xff", b"\xff\xd8\xff\xc0\x00\x11\x08", b"\xff\xd8" + b"\xff" * 50,
                                  b"\xff\xd8\xff\xe1\xff\xffExif\x00\x00MM\x00*\x00\x00\x00\x08\xff\xff"])
def test_header_parser_on_truncated_markers(data):
    assert _jpeg_header(data) is None
    assert _jpeg_header(BASE) == (40, 30, 6)  # the mutations above start from a header the parser reads
