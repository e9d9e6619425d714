"""seg.geometry=exact's first step, `NativeWindow`: an image larger than the model's input is read at its own scale,
a random input-size window of it, as predict.py and evaluate.py read it in sliding windows; a smaller one is resized
to the input, as they resize it. Nothing is resampled for an image larger than the input, so a defect one pixel
wide keeps its edges in image and mask alike.

Its own module because it subclasses albumentations' DualTransform, which vit/data/segmentation.py imports only
when training (evaluate, predict and export never pay its import); a class at module level pickles into loader
workers started by spawn.
"""

from __future__ import annotations

import albumentations as A
import cv2
import numpy as np

__all__ = ["NativeWindow"]

IGNORE_INDEX = 255  # vit.data.segmentation's (which imports this module, so not imported back): a padded pixel


class NativeWindow(A.DualTransform):
    """An image with a side longer than `size`: a random size x size window at its own scale (a shorter side padded
    at the bottom or right, the image with `fill`, the mask with the ignore index); otherwise resized to `size`
    (the image with `interpolation`, the mask nearest)."""

    def __init__(self, size: int, interpolation: int = cv2.INTER_LINEAR, fill=0, p: float = 1.0) -> None:
        super().__init__(p=p)
        self.size, self.interpolation, self.fill = size, interpolation, fill

    def get_params_dependent_on_data(self, params: dict, data: dict) -> dict:
        h, w = params["shape"][:2]
        if max(h, w) <= self.size:
            return {"origin": None}
        return {"origin": (self.py_random.randint(0, max(0, h - self.size)),
                           self.py_random.randint(0, max(0, w - self.size)))}

    def _window(self, a: np.ndarray, origin, fill, interpolation: int) -> np.ndarray:
        if origin is None:
            return cv2.resize(a, (self.size, self.size), interpolation=interpolation)
        y, x = origin
        a = a[y:y + self.size, x:x + self.size]
        if a.shape[:2] == (self.size, self.size):
            return a
        out = np.empty((self.size, self.size, *a.shape[2:]), a.dtype)
        out[...] = fill
        out[:a.shape[0], :a.shape[1]] = a
        return out

    def apply(self, img: np.ndarray, origin=None, **params) -> np.ndarray:
        return self._window(img, origin, self.fill, self.interpolation)

    def apply_to_mask(self, mask: np.ndarray, origin=None, **params) -> np.ndarray:
        return self._window(mask, origin, IGNORE_INDEX, cv2.INTER_NEAREST)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("size", "interpolation", "fill")
