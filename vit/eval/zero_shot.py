"""Zero-shot classification with a CLIP / SigLIP model (Radford et al., 2021, section 3.1.4): class names become
captions through prompt templates, their text embeddings the weights of a linear classifier over the image
embeddings, built once.

    model = vit.create_clip_model("hf-hub:timm/ViT-B-16-SigLIP2")
    clf = ZeroShotClassifier(model, class_names("data/parts/val"))   # the text side, computed here once
    probs = clf.probabilities(clf(images))                             # (B, C): softmax (CLIP), sigmoid (SigLIP)

The classifier weight of class c is the normalised mean of the normalised embeddings of its prompts (open_clip's
`build_zero_shot_classifier`); logits are exp(logit_scale) * image_features @ W.T (+ logit_bias for SigLIP).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..data.base import DataError, class_folders, image_files
from ..utils.files import read_regular_file

__all__ = ["DEFAULT_TEMPLATES", "LIST_SUFFIXES", "MAX_LIST_BYTES", "ZeroShotClassifier", "class_names",
           "evaluate_zero_shot", "load_zero_shot", "looks_like_path", "predict_zero_shot", "read_templates",
           "split_class_names", "zero_shot_accuracy"]

LIST_SUFFIXES = (".txt", ".lst", ".csv", ".json")  # a --classes value ending so is a file, never a class name
MAX_LIST_BYTES = 16 * 2**20  # a class list or templates file (ImageNet-21k's 21,843 names take under 1 MB)

# a short set of our own wording: the object named plainly, in a few photographic conditions
DEFAULT_TEMPLATES = (
    "a photo of a {}.",
    "a close-up photo of a {}.",
    "a blurry photo of a {}.",
    "a bright photo of a {}.",
    "a photo of the {}, seen from the side.",
    "a cropped photo of a {}.",
    "a drawing of a {}.",
)


def class_names(spec: str | Path | Sequence[str]) -> list[str]:
    """Class names from a list, a folder (its class subfolders, sorted: a dataset's split folder), a file (one name
    per line; a .json file a list of names, as a checkpoint's classes.json) or names separated by commas ("cat,dog,
    scratched part"). A string is a path when `looks_like_path` says so, and must then be a readable folder or
    regular file (a typo is refused, never one class named after it); otherwise it is names."""
    if not isinstance(spec, (str, Path)):
        return _checked([str(n).strip() for n in spec], spec)
    if isinstance(spec, Path) or looks_like_path(spec):
        return _checked(_names_at(Path(spec)), spec)
    return split_class_names(spec)


def split_class_names(text: str) -> list[str]:
    """Names separated by commas, taken as text only: never looked up as a file or folder, whatever they spell
    (the demo's typed labels, which may come from anyone who can reach the page)."""
    return _checked([n.strip() for n in text.split(",")], text)


def looks_like_path(value: str) -> bool:
    """The rule `class_names` reads a string by: a path when it holds a path separator, ends in one of
    LIST_SUFFIXES, or names something that exists; names otherwise. Never raises (a name too long for the file
    system is text)."""
    seps = {"/", os.sep, os.altsep} - {None}
    return any(s in value for s in seps) or value.lower().endswith(LIST_SUFFIXES) or os.path.lexists(value)


def _names_at(path: Path) -> list[str]:
    """The names a folder or a regular file holds; DataError or ValueError (one sentence) for anything else."""
    try:
        is_dir = stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        raise DataError(f"there is no file or folder at {str(path)!r:.80}; pass a folder of class subfolders, a "
                        "file of names or names separated by commas (a value with a '/' or ending in "
                        f"{', '.join(LIST_SUFFIXES)} is read as a path: put a name with a '/' in a file, one per "
                        "line).") from None
    except OSError as e:  # too long a name, a looping link, no permission
        raise DataError(f"the class list {str(path)!r:.80} cannot be read ({e.strerror or e}); pass a folder "
                        "of class subfolders, a file of names or names separated by commas.") from None
    if is_dir:
        try:
            return class_folders(path)
        except PermissionError as e:
            raise DataError(f"the class folder {path} cannot be listed ({e.strerror}); check its "
                            "permissions.") from None
    data = read_regular_file(path, MAX_LIST_BYTES, "the class list")  # a FIFO or a device: named, never opened
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"the class list {path} is not UTF-8 text; save it as UTF-8, one name per line.") from None
    if path.suffix.lower() != ".json":
        return [line.strip() for line in text.splitlines() if line.strip()]
    try:
        names = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:  # RecursionError: lists nested beyond Python's stack
        where = f"{e.msg}, line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "nested too deep"
        raise DataError(f"the class list {path} is not JSON ({where}); a .json class list is a list of names, as a "
                        "checkpoint's classes.json.") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise DataError(f"the class list {path} is not a JSON list of names (strings), as a checkpoint's "
                        "classes.json is; write it so, or one name per line in a .txt file.")
    return [n.strip() for n in names]


def _checked(names: list[str], spec) -> list[str]:
    if not names or any(not n for n in names):
        raise DataError(f"no class names in {str(spec)!r:.80} (or an empty one); pass a folder of class subfolders, "
                        "a text file with one name per line, or names separated by commas.")
    if len(set(names)) != len(names):
        raise DataError(f"class names repeat in {str(spec)!r:.80}; give each class once.")
    return names


def read_templates(path: str | Path) -> list[str]:
    """Prompt templates from a text file, one per line, each with one `{}` where the class name goes; a regular
    file of at most MAX_LIST_BYTES (a FIFO or /dev/zero is refused, never read)."""
    data = read_regular_file(path, MAX_LIST_BYTES, "the prompt templates file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"the prompt templates file {path} is not UTF-8 text; save it as UTF-8, one prompt per "
                        "line.") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    bad = [t for t in lines if not _one_field(t)]
    if not lines or bad:
        raise DataError(f"{path}: every line must be a prompt with one {{}} for the class name (e.g. 'a photo of a "
                        f"{{}}.'); {'it has none' if not lines else f'this one is not: {bad[0]!r:.80}'}.")
    return lines


def _one_field(template: str) -> bool:
    """Whether `template` formats with one class name: a single plain `{}` (no name, index, conversion or format
    spec, which str.format reads as another argument, an attribute or a width) and no stray brace."""
    import string

    try:
        fields = [f for _, f, spec, conv in string.Formatter().parse(template) if f is not None
                  for f in [(f, spec, conv)]]
    except ValueError:  # a single '{' or '}'
        return False
    return fields == [("", "", None)]


class ZeroShotClassifier(nn.Module):
    """Images (B, 3, H, W) -> (B, C) logits against `classes`; the (C, E) text weights are computed at
    construction (under no_grad, `batch_size` prompts at a time) and kept as a buffer, so classifying many images
    runs the image tower only."""

    def __init__(self, model: nn.Module, classes: Sequence[str], templates: Sequence[str] = DEFAULT_TEMPLATES,
                 tokenizer=None, batch_size: int = 256) -> None:
        super().__init__()
        tokenizer = tokenizer or getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("the model has no tokenizer (its repository holds no tokenizer.json); pass tokenizer=.")
        self.model, self.classes, self.templates = model, list(classes), list(templates)
        bad = [t for t in self.templates if not _one_field(t)]
        if not self.templates or bad:
            raise DataError(f"a prompt template needs one {{}} for the class name (e.g. 'a photo of a {{}}.'), "
                            f"{'and there are none' if not bad else f'not {bad[0]!r:.80}'}.")
        self.sigmoid = getattr(model, "logit_bias", None) is not None  # SigLIP: one yes/no per class
        if not self.sigmoid and len(self.classes) < 2:  # softmax over one class: 1.0 for every image
            raise DataError(f"a CLIP model's softmax over {len(self.classes)} class ({', '.join(self.classes):.60}) "
                            "is 1.0 for every image, so it says nothing; give two or more class names (a SigLIP "
                            "model scores one class on its own).")
        self.register_buffer("weights", self._text_weights(tokenizer, batch_size), persistent=False)

    @torch.no_grad()
    def _text_weights(self, tokenizer, batch_size: int) -> torch.Tensor:
        prompts = [t.format(c) for c in self.classes for t in self.templates]  # class-major: (C * T,)
        device = next(self.model.parameters()).device
        ids = torch.cat([tokenizer(prompts[i:i + batch_size]) for i in range(0, len(prompts), batch_size)])
        _same_tokens(self.classes, ids.reshape(len(self.classes), len(self.templates), -1))
        feats = torch.cat([self.model.encode_text(ids[i:i + batch_size].to(device), normalize=True)
                           for i in range(0, len(prompts), batch_size)])  # (C * T, E)
        mean = feats.reshape(len(self.classes), len(self.templates), -1).mean(1)  # (C, E)
        return F.normalize(mean, dim=-1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self._logits(self.model.encode_image(images, normalize=True))

    def _logits(self, image: torch.Tensor) -> torch.Tensor:
        """Normalised image features (B, E) -> (B, C) logits."""
        logits = self.model.logit_scale.exp() * image @ self.weights.T  # (B, C)
        return logits + self.model.logit_bias if self.sigmoid else logits

    # what vit.explain.rollout.attention_maps reads: the classifier's logits and the image tower's attention
    def forward_with_attention(self, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(B, C) logits and the image tower's attention probabilities, one (B, H, N, N) map per block."""
        feats, attentions = self.model.visual.forward_with_attention(images)  # (B, E), [(B, H, N, N)]
        return self._logits(F.normalize(feats, dim=-1)), attentions

    def grid_size(self, img_size: tuple[int, int] | None = None) -> tuple[int, int]:
        return self.model.visual.grid_size(img_size)

    @property
    def num_prefix_tokens(self) -> int:
        return self.model.visual.num_prefix_tokens

    @property
    def global_pool(self) -> str:
        return self.model.visual.global_pool

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Softmax over the classes for CLIP; SigLIP's sigmoid, each class scored on its own."""
        return torch.sigmoid(logits) if self.sigmoid else logits.softmax(-1)


def _same_tokens(classes: list[str], ids: torch.Tensor) -> None:
    """DataError naming two classes whose prompts are the same token ids (C, T, L) in every template: the tokenizer
    lowercased, normalised or cut them alike, so they would get one weight and the second never be chosen."""
    _, key = torch.unique(ids.flatten(1), dim=0, return_inverse=True)
    seen: dict[int, int] = {}
    for i, k in enumerate(key.tolist()):
        if k in seen:
            raise DataError(f"the classes {classes[seen[k]][:60]!r} and {classes[i][:60]!r} are the same tokens in "
                            "every prompt (the tokenizer lowercases, normalises spaces and accents, and keeps "
                            f"{ids.shape[-1]} tokens a prompt), so the second could never be chosen; tell them apart "
                            "early in the name.")
        seen[k] = i


@torch.no_grad()
def zero_shot_accuracy(classifier: ZeroShotClassifier, folder: str | Path, transform, batch_size: int = 64) -> dict:
    """Top-1 accuracy of `classifier` on `folder`/<class>/*.jpg (the subfolders named as the classifier's classes);
    `transform`: a vit.data.transforms.Pipeline (its `load(path)` gives a (C, S, S) tensor). Returns accuracy,
    count, chance (1 / C) and the per-image logits and labels."""
    folder = Path(folder)
    files = [(p, classifier.classes.index(c)) for c in class_folders(folder) if c in classifier.classes
             for p in sorted(image_files(folder / c))]
    if not files:
        named = ", ".join(classifier.classes[:5])
        raise DataError(f"{folder} holds no images in subfolders named as the classes ({named}, ...); put each "
                        "class's images in <folder>/<class name>/.")
    device = classifier.weights.device
    logits = torch.cat([classifier(torch.stack([transform.load(p) for p, _ in files[i:i + batch_size]]).to(device))
                        for i in range(0, len(files), batch_size)]).cpu()
    labels = torch.tensor([y for _, y in files])
    return {"accuracy": (logits.argmax(1) == labels).float().mean().item(), "count": len(files),
            "chance": 1 / len(classifier.classes), "logits": logits, "labels": labels}


def load_zero_shot(name: str, classes: str | Sequence[str], templates: str | Path | None = None):
    """(classifier, preprocessing) for the CLIP / SigLIP model `name` (vit.create_clip_model) over `classes` (see
    `class_names`) with `templates` (a file; default: DEFAULT_TEMPLATES); the preprocessing is the image tower's
    own (its mean, std, size), a vit.data.transforms.Pipeline."""
    from ..config import AugConfig
    from ..data.transforms import build_transform
    from ..models.clip import create_clip_model

    names = class_names(classes)
    prompts = read_templates(templates) if templates else DEFAULT_TEMPLATES
    model = create_clip_model(name)
    size = model.visual.patch_embed.img_size[0]
    transform = build_transform(AugConfig().resolved(model.visual.pretrained_cfg), size, train=False)
    return ZeroShotClassifier(model, names, prompts), transform


def evaluate_zero_shot(name: str, classes: str | Sequence[str], folder: str | Path,
                       templates: str | Path | None = None, batch_size: int = 64) -> dict:
    """What `evaluate.py --clip NAME --classes ...` runs: `zero_shot_accuracy` on `folder`/<class>/ images with
    `load_zero_shot`'s classifier and preprocessing."""
    clf, transform = load_zero_shot(name, classes, templates)
    return dict(zero_shot_accuracy(clf, folder, transform, batch_size), classes=clf.classes, templates=clf.templates)


@torch.no_grad()
def predict_zero_shot(name: str, classes: str | Sequence[str], paths: Sequence[Path],
                      templates: str | Path | None = None, batch_size: int = 64) -> tuple[list[str], torch.Tensor,
                                                                                           torch.Tensor]:
    """What `predict.py --clip NAME --classes ...` runs: (class names, (N, C) probabilities, (N,) readable flags)
    for image files; an unreadable file gets a zero row and False, never stops the run."""
    from .inference import ImageFiles

    clf, transform = load_zero_shot(name, classes, templates)
    files = ImageFiles(list(paths), transform)
    probs, ok = [], []
    for start in range(0, len(files), batch_size):
        items = [files[i] for i in range(start, min(start + batch_size, len(files)))]
        ok += [bool(item[1]) for item in items]
        probs.append(clf.probabilities(clf(torch.stack([item[0] for item in items]))))
    return clf.classes, torch.cat(probs), torch.tensor(ok)
