"""Segmentation data: the folder and CSV layouts, palette and index masks, mask-less good parts, alignment of image
and mask through every augmentation, and one sentence per bad input naming its file."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from PIL import Image

from vit.data.base import DataError
from vit.data.segmentation import (
    IGNORE_INDEX,
    SegmentationDataset,
    find_pairs,
    palette_classes,
    read_class_names,
    seg_transform,
)

COLOURS = np.array([[20, 20, 20], [220, 40, 40], [40, 200, 60], [50, 80, 230]], np.uint8)  # class -> colour


def _blocky(rng: np.random.Generator, size: int = 64, cell: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """An image of flat colour cells and its mask derived from its own pixels (the class whose colour it is)."""
    cells = rng.integers(0, len(COLOURS), size=(size // cell, size // cell))
    mask = np.kron(cells, np.ones((cell, cell), int)).astype(np.uint8)
    return COLOURS[mask], mask


def _derived(image: np.ndarray) -> np.ndarray:
    """The class of each pixel from its colour: the nearest of COLOURS."""
    d = ((image[:, :, None, :].astype(int) - COLOURS[None, None].astype(int)) ** 2).sum(-1)
    return d.argmin(-1)


@pytest.mark.parametrize("seed", range(6))
def test_image_and_mask_stay_aligned_through_every_augmentation(seed):
    """Flips, crops, resizes and rotations move the mask with the image: with nearest interpolation for the image
    too, the mask equals the class read back from the augmented pixels; with bilinear, inside the cells."""
    rng = np.random.default_rng(seed)
    image, mask = _blocky(rng)
    for interp in (cv2.INTER_NEAREST, None):
        t = seg_transform(48, True, None, None, scale=(0.3, 1.0), rotate=30, jitter=0.0, interpolation=interp)
        t.set_random_seed(seed)
        out = t(image=image, mask=mask)
        img, m = out["image"], out["mask"]
        assert img.shape[:2] == m.shape == (48, 48)
        valid = m != IGNORE_INDEX
        derived = _derived(img)
        if interp == cv2.INTER_NEAREST:
            assert (derived[valid] == m[valid]).all()
            border = (img == 0).all(-1)  # a rotation's border: black in the image, ignored in the mask
            assert (~valid == border).all()
        else:  # away from cell edges (no colour blending), the classes agree
            interior = cv2.erode(valid.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
            same = np.ones_like(valid)
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    same &= np.roll(np.roll(m, dy, 0), dx, 1) == m
            keep = interior & same
            assert keep.sum() > 500 and (derived[keep] == m[keep]).all()
    assert set(np.unique(m[valid])) <= set(range(len(COLOURS)))  # nearest: no blended class values


def test_geometry_happens_at_all():
    """Guard: the augmentation above really moves pixels (an identity transform would pass it trivially)."""
    image, mask = _blocky(np.random.default_rng(0))
    t = seg_transform(64, True, None, None, scale=(0.3, 0.5), rotate=30, jitter=0.0, interpolation=cv2.INTER_NEAREST)
    t.set_random_seed(3)
    assert (t(image=image, mask=mask)["mask"] != mask).mean() > 0.2


def _position_image(size: int) -> np.ndarray:
    """Each pixel's own (row, column) in its red and green channels (blue 255 marks an image pixel)."""
    yy, xx = np.mgrid[:size, :size]
    return np.stack([yy, xx, np.full_like(yy, 255)], -1).astype(np.uint8)


def _moves_whole_pixels(img: np.ndarray, m: np.ndarray, mask: np.ndarray) -> bool:
    """True when every image pixel of `img` is an input pixel (read from its position code) whose 4 neighbours
    are input pixels one step away, and the mask carries each pixel's own class: a flip, quarter turn or
    whole-pixel shift, nothing interpolated."""
    inside = img[..., 2] == 255
    if not (m[~inside] == IGNORE_INDEX).all() or not (m[inside] == mask[img[inside, 0], img[inside, 1]]).all():
        return False
    pos = img[..., :2].astype(int)
    down, right = (np.abs(pos[1:] - pos[:-1]).sum(-1), np.abs(pos[:, 1:] - pos[:, :-1]).sum(-1))
    return bool((down[inside[1:] & inside[:-1]] == 1).all() and (right[inside[:, 1:] & inside[:, :-1]] == 1).all())


@pytest.mark.parametrize("seed", range(4))
def test_exact_geometry_moves_whole_pixels_only(seed):
    """seg.geometry=exact (thin defects): flips, quarter turns and shifts, image and mask by the same whole pixels;
    resample (the default) interpolates, so the same check fails for it."""
    size = 48
    image, mask = _position_image(size), _blocky(np.random.default_rng(seed))[1][:size, :size]
    moved = 0
    for geometry, expected in (("exact", True), ("resample", False)):
        t = seg_transform(size, True, None, None, jitter=0.0, geometry=geometry)
        t.set_random_seed(seed)
        outs = [t(image=image, mask=mask) for _ in range(6)]
        ok = [_moves_whole_pixels(o["image"], o["mask"], mask) for o in outs]
        assert all(ok) if expected else not all(ok)
        moved += sum((o["mask"] != mask).any() for o in outs) if expected else 0
    assert moved >= 3  # exact moves pixels too: not an identity


def _position_image_hw(h: int, w: int) -> np.ndarray:
    yy, xx = np.mgrid[:h, :w]
    return np.stack([yy, xx, np.full_like(yy, 255)], -1).astype(np.uint8)


@pytest.mark.parametrize("shape", [(48, 80), (16, 90), (20, 20)])
def test_exact_geometry_reads_a_larger_image_at_its_own_scale(shape):
    """exact on an image larger than the input: a random input-size window at the image's own scale (as predict.py's
    sliding windows read it; a short side padded, the ignore index in the mask); a smaller one is resized to it."""
    rng = np.random.default_rng(sum(shape))
    image, mask = _position_image_hw(*shape), rng.integers(0, 4, shape).astype(np.uint8)
    t = seg_transform(32, True, None, None, jitter=0.0, geometry="exact")
    t.set_random_seed(1)
    outs = [t(image=image, mask=mask) for _ in range(8)]
    assert all(o["image"].shape == (32, 32, 3) and o["mask"].shape == (32, 32) for o in outs)
    if max(shape) > 32:
        assert all(_moves_whole_pixels(o["image"], o["mask"], mask) for o in outs)
        seen = {tuple(o["image"][..., :2][o["image"][..., 2] == 255].min(0)) for o in outs}
        assert len(seen) > 1  # the window moves over the image
        if shape[0] < 32:  # the strip's rows below the image: padding, not scored
            assert all((o["mask"][o["image"][..., 2] != 255] == IGNORE_INDEX).all() for o in outs)
            assert all((o["image"][..., 2] != 255).sum() >= 32 * (32 - shape[0]) for o in outs)
    else:
        assert not any(_moves_whole_pixels(o["image"], o["mask"], mask) for o in outs)  # resized, as predict.py


def test_a_native_windows_padding_is_the_fill_and_the_ignore_index():
    from vit.data.seg_window import NativeWindow

    image, mask = np.full((10, 50, 3), 200, np.uint8), np.ones((10, 50), np.uint8)
    out = NativeWindow(16, fill=(128, 64, 32), p=1.0)(image=image, mask=mask)
    assert out["image"].shape == (16, 16, 3) and (out["image"][10:] == (128, 64, 32)).all()
    assert (out["image"][:10] == 200).all() and (out["mask"][:10] == 1).all()
    assert (out["mask"][10:] == IGNORE_INDEX).all()


def test_geometry_none_and_a_bad_choice():
    image, mask = _blocky(np.random.default_rng(2))
    out = seg_transform(64, True, None, None, jitter=0.0, geometry="none")(image=image, mask=mask)
    np.testing.assert_array_equal(out["mask"], mask)
    np.testing.assert_array_equal(out["image"], image)
    with pytest.raises(ValueError, match="seg.geometry is resample, exact or none, not 'crop'"):
        seg_transform(64, True, None, None, geometry="crop")


def test_photometric_touches_the_image_only():
    image, mask = _blocky(np.random.default_rng(1))
    t = seg_transform(64, True, None, None, scale=(1.0, 1.0), rotate=0, jitter=0.4)
    t.set_random_seed(5)
    seen = set()
    for _ in range(8):
        out = t(image=image, mask=mask)
        if (out["mask"] == mask).all() or (out["mask"] == mask[:, ::-1]).all() or (out["mask"] == mask[::-1]).all() \
                or (out["mask"] == mask[::-1, ::-1]).all():
            seen.add(bool(np.abs(out["image"].astype(int) - image.astype(int)).max() > 0))
    assert True in seen  # the colours changed while the mask stayed one of the flips of the original


def _write(root, stems, masks: dict, palette=None):
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    rng = np.random.default_rng(0)
    for s in stems:
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(root / "images" / f"{s}.png")
    for s, m in masks.items():
        im = Image.fromarray(m.astype(np.uint8), "P" if palette else "L")
        if palette:
            im.putpalette(palette)
        im.save(root / "masks" / f"{s}.png")


def test_folder_layout_index_palette_and_good_parts(tmp_path):
    m = np.zeros((16, 16), np.uint8)
    m[4:8, 4:8], m[0, 0] = 2, IGNORE_INDEX
    palette = [0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * 3 * 252 + [255, 255, 255]  # 256 entries, 255: the border
    _write(tmp_path, ["a", "b"], {"a": m}, palette=palette)
    with pytest.raises(DataError, match=r"image .*b\.png has no mask .*b\.png"):
        find_pairs(tmp_path)
    pairs = find_pairs(tmp_path, missing="background")
    assert [p.mask is None for p in pairs] == [False, True]
    classes = palette_classes(pairs[0].mask)
    assert classes == ["#000000", "#ff0000", "#00ff00"]
    ds = SegmentationDataset(pairs, classes, seg_transform(16, False, (0.5,) * 3, (0.5,) * 3), palette=classes)
    x, y = ds[0]
    assert x.shape == (3, 16, 16) and (y.numpy() == m).all()
    assert (ds[1][1] == 0).all()  # the good part: all background


def test_csv_layout_and_class_names_file(tmp_path):
    m = np.ones((16, 16), np.uint8)
    _write(tmp_path, ["a", "b"], {"a": m})
    (tmp_path / "pairs.csv").write_text("image,mask\nimages/a.png,masks/a.png\nimages/b.png,\n")
    with pytest.raises(DataError, match=r"pairs\.csv line 3: image .*b\.png has no mask"):
        find_pairs(tmp_path / "pairs.csv")
    pairs = find_pairs(tmp_path / "pairs.csv", missing="background")
    assert [p.mask is None for p in pairs] == [False, True]
    (tmp_path / "classes.txt").write_text("background\ndefect\n")
    assert read_class_names(tmp_path / "classes.txt") == ["background", "defect"]
    (tmp_path / "classes.json").write_text('["good", "scratch", "dent"]')
    assert read_class_names(tmp_path / "classes.json") == ["good", "scratch", "dent"]


def test_bad_masks_are_one_sentence_naming_the_file(tmp_path):
    t = seg_transform(16, False, None, None)
    big = np.zeros((8, 16), np.uint8)
    _write(tmp_path / "size", ["a"], {"a": big})
    with pytest.raises(DataError, match=r"mask .*a\.png is 16x8 but its image .*a\.png is 16x16"):
        SegmentationDataset(find_pairs(tmp_path / "size"), ["bg", "x"], t)[0]
    out = np.zeros((16, 16), np.uint8)
    out[0, :3] = [3, 7, IGNORE_INDEX]
    _write(tmp_path / "values", ["a"], {"a": out})
    with pytest.raises(DataError, match=r"mask .*a\.png holds the values \[3, 7\] outside the 2 classes"):
        SegmentationDataset(find_pairs(tmp_path / "values"), ["bg", "x"], t)[0]
    pal = [0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255] + [0] * 3 * 251 + [255, 255, 255]
    _write(tmp_path / "palette", ["a"], {"a": np.zeros((16, 16))}, palette=pal)
    with pytest.raises(DataError, match=r"mask .*a\.png has a palette of 4 colours but the class list has 2"):
        SegmentationDataset(find_pairs(tmp_path / "palette"), ["bg", "x"], t, palette=["#000000", "#ff0000"])[0]
    (tmp_path / "rgb" / "images").mkdir(parents=True)
    (tmp_path / "rgb" / "masks").mkdir()
    Image.new("RGB", (16, 16)).save(tmp_path / "rgb" / "images" / "a.png")
    Image.new("RGB", (16, 16)).save(tmp_path / "rgb" / "masks" / "a.png")
    with pytest.raises(DataError, match=r"mask .*a\.png is a RGB image; save it as an index PNG"):
        SegmentationDataset(find_pairs(tmp_path / "rgb"), ["bg", "x"], t)[0]
    with pytest.raises(DataError, match=r"does not exist; the folder layout is"):
        find_pairs(tmp_path / "nothing")
    _write(tmp_path / "jpeg", ["a", "b"], {"a": np.zeros((16, 16))})  # b's mask saved as a JPEG
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(tmp_path / "jpeg" / "masks" / "b.jpg")
    with pytest.raises(DataError, match=r"mask .*b\.jpg is not a PNG; save it as b\.png"):
        find_pairs(tmp_path / "jpeg", missing="background")  # not read as a good part
    _write(tmp_path / "orphan", ["a"], {"a": np.zeros((16, 16)), "a_mask": np.zeros((16, 16))})
    with pytest.raises(DataError, match=r"mask .*a_mask\.png has no image .*images/a_mask\.<ext>"):
        find_pairs(tmp_path / "orphan", missing="background")
    (tmp_path / "orphan" / "masks" / "a_mask.png").unlink()
    (tmp_path / "orphan" / "masks" / ".DS_Store").write_bytes(b"x")  # hidden and non-image files: passed over
    (tmp_path / "orphan" / "masks" / "notes.txt").write_text("x")
    assert len(find_pairs(tmp_path / "orphan")) == 1


def test_seg_parts_script_writes_masks_of_their_own_classes(tmp_path):
    """scripts/seg_parts.py's data: good parts without a mask file, each defect its own class, read back through
    the folder layout."""
    from helpers import import_script

    script = import_script("scripts/seg_parts")
    script.write_seg_parts(tmp_path, seed=0, good=2, per_defect=1)
    pairs = find_pairs(tmp_path, missing="background")
    assert [p.mask is None for p in pairs] == [True, True, False, False, False]
    ds = SegmentationDataset(pairs, script.CLASSES, seg_transform(script.SIZE, False, None, None))
    found = [set(np.unique(ds.load(i)[1]).tolist()) for i in range(len(ds))]
    assert found == [{0}, {0}, {0, 1}, {0, 2}, {0, 3}]  # scratch, dent, stain in DEFECTS' order


def test_unreadable_masks_and_spreadsheet_csvs(tmp_path):
    """A mask that is not an image, is empty or cut short is one sentence naming it; a CSV saved by a spreadsheet
    (byte-order mark, spaces in the header) reads as any other, and a non-PNG mask there is refused as in folders."""
    from vit.data.seg_pairs import split_source
    from vit.data.segmentation import read_mask

    _write(tmp_path / "f", ["a"], {"a": np.ones((16, 16))})
    good = (tmp_path / "f" / "masks" / "a.png").read_bytes()
    for name, data in (("garbage", b"not a png"), ("empty", b""), ("cut", good[: len(good) // 2])):
        (tmp_path / f"{name}.png").write_bytes(data)
        with pytest.raises(DataError, match=rf"mask .*{name}\.png cannot be read \(.*\); save it again as an index"):
            read_mask(tmp_path / f"{name}.png", 2)
    with pytest.raises(DataError, match=r"mask .*garbage\.png cannot be read"):
        palette_classes(tmp_path / "garbage.png")
    (tmp_path / "f" / "pairs.csv").write_text("\ufeffImage, Mask\n images/a.png , masks/a.png\n", encoding="utf-8")
    pairs = find_pairs(tmp_path / "f" / "pairs.csv")
    assert [(p.image.name, p.mask.name) for p in pairs] == [("a.png", "a.png")]
    Image.fromarray(np.ones((16, 16), np.uint8)).save(tmp_path / "f" / "masks" / "a.bmp")
    (tmp_path / "f" / "bmp.csv").write_text("image,mask\nimages/a.png,masks/a.bmp\n")
    with pytest.raises(DataError, match=r"bmp\.csv line 2: mask .*a\.bmp is not a PNG; save it as PNG"):
        find_pairs(tmp_path / "f" / "bmp.csv")
    with pytest.raises(DataError, match=r"pairs\.txt is a file, not a CSV of pairs"):
        (tmp_path / "pairs.txt").write_text("x")
        find_pairs(tmp_path / "pairs.txt")
    with pytest.raises(DataError, match=r"the val split is missing: .* has neither val/ .* nor val\.csv"):
        split_source(tmp_path / "f", "val")
    assert split_source(tmp_path, "f") == tmp_path / "f"
