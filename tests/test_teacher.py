"""The distillation teacher (vit/train/teacher.py): built from a train.py checkpoint folder or a CLIP repository,
frozen and in eval mode whatever it is told, scoring a student's batch in its own preprocessing (checked against
its own transform of the raw images, and against open_clip), hashed by its weights; and every bad setting one
sentence before a step."""

import json

import numpy as np
import pytest
import torch
from helpers import perturb
from PIL import Image
from safetensors.torch import save_file
from torch import nn

import vit
from vit.config import AugConfig, ConfigError, load_config
from vit.data.transforms import build_transform
from vit.models.build import build_model
from vit.models.checkpoint import save_checkpoint
from vit.train.distill import Distiller
from vit.train.teacher import build_teacher, weights_hash

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
IN_MEAN, IN_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
TINY = ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=2",
        "--model.num_heads=2"]


def _checkpoint(folder, classes=3, mean=CLIP_MEAN, std=CLIP_STD, extra=()):
    """A train.py checkpoint folder whose run normalised with `mean` / `std`."""
    cfg = load_config(None, [*TINY, f"--aug.mean={mean}", f"--aug.std={std}", "--aug.eval_crop_pct=1.0", *extra])
    torch.manual_seed(0)
    save_checkpoint(folder, perturb(build_model(cfg, classes)), cfg, [f"c{i}" for i in range(classes)])
    return folder


def _raw(n=4, size=40, seed=0, smooth=False):
    """RGB uint8 images; `smooth`: noise 5 x 5 enlarged (bicubic), so that two resamplings nearly agree."""
    rng = np.random.default_rng(seed)
    if smooth:
        return [np.asarray(Image.fromarray(rng.integers(0, 256, size=(5, 5, 3), dtype=np.uint8)).resize(
            (size + 6, size), Image.BICUBIC)) for _ in range(n)]
    return [rng.integers(0, 256, size=(size, size + 6, 3), dtype=np.uint8) for _ in range(n)]


def _transform(mean, std, size=32):
    return build_transform(AugConfig(mean=mean, std=std, eval_crop_pct=1.0, interpolation="bicubic"), size,
                           train=False)


def test_a_clip_normalised_teacher_sees_its_own_preprocessing(tmp_path):
    """An ImageNet-normalised student batch, re-normalised for a teacher trained in CLIP's mean and std, equals
    the teacher's own transform of the same raw images (1e-6), and so do its logits."""
    teacher = build_teacher(_checkpoint(tmp_path / "ck"), IN_MEAN, IN_STD)
    assert list(teacher.model.pretrained_cfg["mean"]) == CLIP_MEAN  # read from the folder's config.json
    raw = _raw()
    student_batch = torch.stack([_transform(IN_MEAN, IN_STD)(img) for img in raw])
    own = torch.stack([_transform(CLIP_MEAN, CLIP_STD)(img) for img in raw])
    assert (student_batch - own).abs().max() > 0.05  # the two normalisations differ: the check is not vacuous
    torch.testing.assert_close(teacher.prepare(student_batch), own, atol=1e-6, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(teacher.logits(student_batch), teacher.model(own), atol=1e-5, rtol=0)


def test_a_teacher_at_another_size_gets_the_batch_resized(tmp_path):
    """A 48-pixel teacher of a 32-pixel student: re-normalised, then resized (bilinear), close to its own
    transform of the raw image at 48 (two resamplings instead of one)."""
    teacher = build_teacher(_checkpoint(tmp_path / "ck", extra=["--model.img_size=48"]), IN_MEAN, IN_STD)
    raw = _raw(smooth=True)
    batch = torch.stack([_transform(IN_MEAN, IN_STD)(img) for img in raw])  # (4, 3, 32, 32)
    x = teacher.prepare(batch)
    assert x.shape == (4, 3, 48, 48) and teacher.logits(batch).shape == (4, 3)
    own = torch.stack([_transform(CLIP_MEAN, CLIP_STD, 48)(img) for img in raw])  # resized from the raw image
    # within 4/255 of the pixel range on average (0.06 here), where another image is 10x as far
    assert (x - own).abs().mean() < 0.1 and (x - own.flip(0)).abs().mean() > 0.5


def test_the_teacher_stays_frozen_and_in_eval_mode(tmp_path):
    teacher = build_teacher(_checkpoint(tmp_path / "ck", extra=["--model.drop_rate=0.5"]), CLIP_MEAN, CLIP_STD)
    parent = nn.ModuleDict({"teacher": teacher, "student": nn.Linear(2, 2)})
    parent.train()
    assert not any(m.training for m in teacher.model.modules())
    assert not any(p.requires_grad for p in teacher.parameters())
    batch = torch.randn(2, 3, 32, 32, requires_grad=True)
    out = teacher.logits(batch)
    assert not out.requires_grad and torch.equal(out, teacher.logits(batch))  # no dropout: the same scores twice


def test_weights_hash_names_the_weights(tmp_path):
    folder = _checkpoint(tmp_path / "ck")
    a, b = build_teacher(folder, CLIP_MEAN, CLIP_STD), build_teacher(str(folder), IN_MEAN, IN_STD)
    assert a.digest == b.digest == weights_hash(a.model) and len(a.digest) == 64
    with torch.no_grad():
        next(b.model.parameters()).view(-1)[0] += 1e-6
    assert weights_hash(b.model) != a.digest
    assert weights_hash(a.model.to(torch.float64)) != a.digest  # the dtype is part of it


def test_a_clip_repository_teacher_is_its_image_tower_in_its_own_preprocessing(tmp_path):
    """An open_clip repository (random weights): the teacher's scores of an ImageNet-normalised batch are
    open_clip's image features of the same images in CLIP's normalisation (1e-5)."""
    open_clip = pytest.importorskip("open_clip")
    cfg = dict(embed_dim=24, quick_gelu=False, vision_cfg=dict(image_size=32, layers=2, width=32, head_width=8,
                                                              patch_size=8),
               text_cfg=dict(context_length=16, vocab_size=100, width=16, heads=2, layers=1))
    torch.manual_seed(1)
    ref = perturb(open_clip.model.CLIP(**cfg))
    src = tmp_path / "clip"
    src.mkdir()
    (src / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, src / "open_clip_model.safetensors")
    teacher = build_teacher(f"local-dir:{src}", IN_MEAN, IN_STD)
    assert teacher.num_features == 32 and teacher.num_classes == 24  # a tower's head is its projection
    raw = _raw()
    batch = torch.stack([_transform(IN_MEAN, IN_STD)(img) for img in raw])
    own = torch.stack([_transform(CLIP_MEAN, CLIP_STD)(img) for img in raw])
    with torch.no_grad():
        torch.testing.assert_close(teacher.logits(batch), ref.encode_image(own), atol=1e-5, rtol=0)


def _one_sentence(err):
    msg = str(err.value)
    assert "\n" not in msg and msg.endswith(".") and msg.count(". ") <= 1, msg
    return msg


def test_a_teacher_that_does_not_build_is_one_sentence(tmp_path):
    for source in ("vit_nonexistent_patch16_224", f"local-dir:{tmp_path / 'nothing'}", str(tmp_path)):
        with pytest.raises(ValueError) as err:
            build_teacher(source, IN_MEAN, IN_STD)
        assert source in _one_sentence(err)
    run = tmp_path / "run"  # a run folder, its weights file, a path that is not there: each named for what it is
    _checkpoint(run / "best")
    for source, words in ((run, f"is a run folder; name one of its checkpoints, {run / 'best'}"),
                          (run / "best" / "model.safetensors", "is a file; name the checkpoint folder"),
                          (tmp_path / "nope", "does not exist; name a train.py checkpoint folder")):
        with pytest.raises(ValueError, match=words) as err:
            build_teacher(str(source), IN_MEAN, IN_STD)
        _one_sentence(err)


def test_mismatches_and_bad_settings_are_one_sentence_before_a_step(tmp_path):
    teacher = build_teacher(_checkpoint(tmp_path / "ck", classes=7), IN_MEAN, IN_STD)
    student = vit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2,
                               num_heads=2, num_classes=5)
    for kind in ("logit", "token"):
        with pytest.raises(ValueError) as err:
            Distiller(student, teacher, nn.CrossEntropyLoss(), kind=kind)
        msg = _one_sentence(err)
        assert "has 7 outputs where the student has 5 classes" in msg and "distill.kind=feature" in msg
    Distiller(student, teacher, nn.CrossEntropyLoss(), kind="feature")  # another class set: features still match
    same = build_teacher(_checkpoint(tmp_path / "ck5", classes=5), IN_MEAN, IN_STD)
    with pytest.raises(ValueError, match="distillation token") as err:
        Distiller(student, same, nn.CrossEntropyLoss(), kind="token")  # a student without [DIST]
    _one_sentence(err)
    with pytest.raises(ValueError, match="1-channel") as err:
        build_teacher(same.model, [0.5], [0.5])  # a grey student, an RGB teacher
    _one_sentence(err)
    bad = [(dict(temperature=0.0), "distill.temperature"), (dict(temperature=-2), "distill.temperature"),
           (dict(temperature=float("nan")), "distill.temperature"), (dict(task_weight=1.5), "distill.task_weight"),
           (dict(task_weight=-0.1, distill_weight=1.0), "distill.task_weight"),
           (dict(distill_weight=float("inf")), "distill.distill_weight"),
           (dict(task_weight=0.0, distill_weight=0.0), "both 0"), (dict(task_weight=0.0, distill_weight=None), None),
           (dict(kind="attention"), "distill.kind"), (dict(token_mode="medium"), "distill.token_mode"),
           (dict(feature_loss="l1"), "distill.feature_loss"), (dict(features="maps"), "distill.features")]
    for settings, named in bad:
        if named is None:  # task_weight 0 alone: complementary, distillation alone weighs 1 (allowed)
            assert Distiller(student, same, nn.CrossEntropyLoss(), **settings).distill_weight == 1.0
            continue
        with pytest.raises(ConfigError) as err:
            Distiller(student, same, nn.CrossEntropyLoss(), **settings)
        assert named in _one_sentence(err)
