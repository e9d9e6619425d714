"""The input pipeline's speed: images/s of one worker (one thread) on generated photo-like JPEGs, decoding alone
(our decoder, and PIL's), our training pipeline, and the same recipe in torchvision-v2, timed pass by pass in
turn with ratios per pass."""

from __future__ import annotations

import statistics
import time

import torch

from ..utils.timing import ratio_stats

__all__ = ["jpeg_files", "bench_data", "format_data_report"]

# ours against each of these, as the report words it
REFERENCES = (("torchvision_v2", "x torchvision-v2 from PIL images"),
              ("torchvision_v2_tensor", "x torchvision-v2 from torchvision.io tensors"),
              ("decode_only", "x decoding alone (our decoder)"),
              ("decode_only_pil", "x decoding alone (PIL)"))


def jpeg_files(rng, n: int, width: int, height: int, folder: str) -> list[str]:
    """Photo-like JPEGs (1/f spectrum, quality 90: ~120 KB at 500x375, decoding as slowly as a photo of that
    size; a smooth or blank image decodes 2-3x faster and would flatter any pipeline's ratio to decoding)."""
    from PIL import Image

    from ..data.synthetic import photo_like

    paths = []
    for i in range(n):
        p = f"{folder}/{width}x{height}-{i:04d}.jpg"
        Image.fromarray(photo_like(rng, width, height)).save(p, format="JPEG", quality=90)
        paths.append(p)
    return paths


def _pipelines() -> dict:
    """name -> f(path, seed): decoding alone (ours, PIL), our training pipeline, and torchvision-v2's same recipe
    (decode, random resized crop 224, flip, colour jitter 0.4 with p=0.8, normalize) from PIL and from tensors."""
    import numpy as np
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg, read_file
    from torchvision.transforms import v2

    from ..config import AugConfig
    from ..data.decode import decode_image
    from ..data.transforms import build_transform

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    aug = AugConfig(random_resized_crop=True, hflip=0.5, color_jitter=0.4, mean=mean, std=std)
    ours = build_transform(aug, 224, train=True)
    recipe = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
              v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4)], p=0.8)]
    tv_pil = v2.Compose([*recipe, v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    tv_tensor = v2.Compose([*recipe, v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    return {
        "decode_only": lambda p, i: decode_image(p),
        "decode_only_pil": lambda p, i: np.asarray(Image.open(p).convert("RGB")),
        "ours": lambda p, i: ours.load(p, seed=i),
        "torchvision_v2": lambda p, i: tv_pil(Image.open(p).convert("RGB")),
        "torchvision_v2_tensor": lambda p, i: tv_tensor(decode_jpeg(read_file(p), mode=ImageReadMode.RGB)),
    }


def bench_data(images: int = 100, repeats: int = 5, large: int = 20) -> dict:
    """Images/s of one worker (one thread) on `images` photo-like JPEGs of 500x375 (an ImageNet-sized photo)
    and, unless `large` is 0, `large` of 2000x1500 (a phone photo): decoding alone (our decoder, and PIL's), our
    training pipeline (decode, random resized crop 224, flip, colour jitter 0.4 with p=0.8, normalize), and
    the same recipe in torchvision-v2, from PIL images (what ImageFolder's loader gives it) and from tensors
    decoded by torchvision.io. Every pipeline gets a fresh seed per image; the `repeats` passes are interleaved
    (each pass times every image after one untimed image)."""
    import tempfile

    import numpy as np

    pipelines = _pipelines()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cv2 = __import__("cv2")
    cv2_threads = cv2.getNumThreads()
    cv2.setNumThreads(1)

    def run(fn, paths):  # images/s of one pass, its first image untimed
        fn(paths[0], 0)
        t = time.perf_counter()
        for i, p in enumerate(paths):
            fn(p, i)
        return len(paths) / (time.perf_counter() - t)

    rng = np.random.default_rng(0)
    out = {}
    with tempfile.TemporaryDirectory(prefix="vit-bench-") as tmp:
        sets = {"500x375": jpeg_files(rng, images, 500, 375, tmp)}
        if large:
            sets["2000x1500"] = jpeg_files(rng, large, 2000, 1500, tmp)
        try:
            for size, paths in sets.items():
                results: dict[str, list[float]] = {}
                for _ in range(repeats):
                    for name, fn in pipelines.items():
                        results.setdefault(name, []).append(run(fn, paths))
                rows = {k: dict(images_per_s=statistics.median(v), all=v) for k, v in results.items()}
                for ref, _ in REFERENCES:
                    # ratio per pass (the two timed back to back), then the median and spread of those
                    rows["ours"][f"vs_{ref}"] = ratio_stats(results[ref], results["ours"])  # img/s: ours / ref
                out[size] = rows
        finally:
            torch.set_num_threads(threads)
            cv2.setNumThreads(cv2_threads)
    return out


def format_data_report(res: dict) -> str:
    """`bench_data`'s result as the table benchmark.py prints."""
    lines = []
    for size, rows in res.items():
        lines.append(f"\ninput pipeline, one worker, {size} JPEG -> 224 training tensor (median of passes):")
        lines += [f"  {k:<24}{v['images_per_s']:>8.0f} img/s" for k, v in rows.items()]
        for ref, what in REFERENCES:
            r = rows["ours"][f"vs_{ref}"]
            lines.append(f"  ours = {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}) {what}")
    return "\n".join(lines)
