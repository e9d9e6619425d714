"""The demo page for a segmentation checkpoint (train.py with data.dataset=segmentation): an uploaded image's
classes drawn as predict.py draws them (each class but the background tinted over the image,
vit.data.mask_colours) and, in the list beside it, each class's share of the image, largest first, as the
classifier's page lists its top-5. The image is segmented as predict.py does (`vit.eval.segmentation.segment_image`:
resized to the model's input, or a larger one in sliding windows at its own scale)."""

from __future__ import annotations

import base64
import io
import threading
from pathlib import Path

import numpy as np
from PIL import Image

from ..data.decode import decode_bytes
from ..data.mask_colours import class_palette, tint_mask
from ..eval.segmentation import naflex_budget, segment_image
from ..models.checkpoint import load_checkpoint

__all__ = ["SegDemo"]

DISPLAY = 224  # the picture is drawn at least this wide, as the classifier page's overlay


class SegDemo:
    """A segmentation checkpoint ready to segment uploaded image bytes (the module docstring)."""

    typed_labels = False
    caption = "classes, tinted (background clear)"
    heading = "share of the image"

    def __init__(self, checkpoint: str | Path) -> None:
        self.folder = Path(checkpoint).resolve()
        self.model, self.cfg, self.classes, self.meta = load_checkpoint(checkpoint)
        self.model.eval()
        self.top = max(1, len(self.classes) - 1)  # every class but the background
        self.palette = class_palette(len(self.classes))
        self.lock = threading.Lock()

    def predict(self, data: bytes, name: str = "the upload") -> dict:
        """Image bytes -> {top: [{label, prob: the class's share of the pixels}], overlay: PNG data URL, size};
        BadImageError for bytes that are not a readable image."""
        image = decode_bytes(data, name)  # (H, W, 3) uint8
        aug = self.cfg.aug
        with self.lock:
            mask = segment_image(self.model, image, self.cfg.model.img_size, aug.mean or [0.5] * 3,
                                 aug.std or [0.5] * 3, self.cfg.seg.window,
                                 naflex_budget(self.cfg)).numpy().astype(np.intp)
        share = np.bincount(mask.ravel(), minlength=len(self.classes)) / mask.size
        order = sorted(range(1, len(self.classes)), key=lambda c: -share[c])
        picture = Image.fromarray(tint_mask(image, mask, self.palette))
        if picture.width < DISPLAY:  # a 32-pixel part would be a speck: enlarged, each pixel a block
            k = -(-DISPLAY // picture.width)
            picture = picture.resize((picture.width * k, picture.height * k), Image.NEAREST)
        buf = io.BytesIO()
        picture.save(buf, "PNG")
        return dict(top=[dict(label=self.classes[c], prob=float(share[c])) for c in order],
                    overlay="data:image/png;base64," + base64.b64encode(buf.getvalue()).decode(),
                    size=[picture.width, picture.height])

    def title(self) -> str:
        m = self.model.backbone if hasattr(self.model, "backbone") else self.model
        miou = self.meta.get("miou")
        scored = f", val mIoU {100 * miou:.1f}%" if isinstance(miou, (int, float)) else ""
        nf = self.cfg.data.naflex
        size = (f"each image at its own aspect ratio (at most {nf.max_num_patches} patches)" if nf is not None else
                f"{self.cfg.model.img_size}px input")
        return (f"{self.folder.parent.name}/{self.folder.name}: segmentation, {size}, "
                f"{type(m).__name__}: {len(self.classes)} classes{scored}")
