"""Distillation with data.naflex (vit/train/teacher.py, vit/train/tasks/distillation.py): a NaFlex teacher trained
in CLIP's mean and std scores an ImageNet-normalised NaFlex student batch exactly as its own NaFlex transform of the
same raw images (each at its own aspect ratio), the task's loss is the float64 formula on those inputs, and what
cannot join a NaFlex run (a square teacher, another patch size, the token kind, patch features) is one sentence
before a step; a tiny train.py run end to end."""

import contextlib
import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import make_image_folder, perturb, run_script

from vit.config import AugConfig, ConfigError, load_config
from vit.data.naflex import build_naflex_transform, collate_naflex
from vit.models.build import build_model
from vit.models.checkpoint import load_checkpoint, save_checkpoint
from vit.train.tasks import DistillationTask, task_for

IN_MEAN, IN_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
NAFLEX = "--data.naflex={max_num_patches: 16}"
STUDENT = ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=2",
           "--model.num_heads=2", f"--aug.mean={IN_MEAN}", f"--aug.std={IN_STD}", NAFLEX]


def _teacher(folder, naflex=True, patch=8, classes=3):
    """A train.py checkpoint folder of a 48-wide NaFlex teacher (a square one with naflex=False) normalising with
    CLIP's mean and std."""
    cfg = load_config(None, ["--model.img_size=32", f"--model.patch_size={patch}", "--model.embed_dim=48",
                             "--model.depth=1", "--model.num_heads=2", f"--aug.mean={CLIP_MEAN}",
                             f"--aug.std={CLIP_STD}", *([NAFLEX] if naflex else [])])
    torch.manual_seed(0)
    save_checkpoint(folder, perturb(build_model(cfg, classes)), cfg, [f"c{i}" for i in range(classes)])
    return folder


def _task(tmp_path, *over, teacher=None):
    cfg = load_config(None, [*STUDENT, f"--distill.teacher={teacher or _teacher(tmp_path / 'teacher')}", *over])
    torch.manual_seed(1)
    student = perturb(build_model(cfg, 3)).train()
    return task_for(cfg, ["c0", "c1", "c2"], None, student), student


def _batches():
    """One NaFlex batch of three images of other aspect ratios (padded), as the student's transform (ImageNet
    mean / std) and as the teacher's own (CLIP mean / std) make it from the same raw pixels."""
    rng = np.random.default_rng(0)
    raw = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in ((24, 40), (40, 16), (32, 32))]
    make = [build_naflex_transform(AugConfig(mean=m, std=s), 8, 16, train=False)
            for m, s in ((IN_MEAN, IN_STD), (CLIP_MEAN, CLIP_STD))]
    return [collate_naflex([(t(img), 0) for img in raw])[0] for t in make]


def _run(student):
    return SimpleNamespace(model=student, extras={}, accelerator=SimpleNamespace(autocast=contextlib.nullcontext))


def test_a_clip_normalised_naflex_teacher_sees_its_own_patches(tmp_path):
    task, _ = _task(tmp_path)
    student_batch, own = _batches()
    valid = own["patch_valid"]
    assert not valid.all()  # padded: the images have other patch counts
    assert (student_batch["patches"] - own["patches"])[valid].abs().max() > 0.05  # not vacuous
    seen = task.teacher.prepare(student_batch)
    torch.testing.assert_close(seen["patches"][valid], own["patches"][valid], atol=1e-6, rtol=0)
    assert seen["patch_coord"] is student_batch["patch_coord"] and seen["patch_valid"] is student_batch["patch_valid"]
    with torch.no_grad():  # padding never reaches an output, so the logits are the teacher's on its own batch
        torch.testing.assert_close(task.teacher.logits(student_batch), task.teacher.model(own), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["logit", "feature"])
def test_the_naflex_loss_is_the_float64_formula(tmp_path, kind):
    """CE + KL(teacher || student at T=2) * 4 for logit kd, CE + mse(P(pooled student), pooled teacher) for
    feature kd, each model on its own normalisation of the batch, in float64."""
    over = ["--distill.temperature=2"] if kind == "logit" else []  # feature kd reads no temperature
    task, student = _task(tmp_path, f"--distill.kind={kind}", *over, "--aug.label_smoothing=0")
    assert type(task) is DistillationTask
    x, own = _batches()
    y = torch.tensor([0, 2, 1])
    projection = task.extra_modules().get("projection")
    run = _run(student)
    run.extras = {"projection": projection} if projection is not None else {}
    got = task.loss(run, x, y)
    s64, t64 = copy.deepcopy(student).double().eval(), copy.deepcopy(task.teacher.model).double()
    d64 = {k: v.double() if v.is_floating_point() else v for k, v in x.items()}
    o64 = {k: v.double() if v.is_floating_point() else v for k, v in own.items()}
    with torch.no_grad():
        s = s64(d64)
        ce = F.cross_entropy(s, y)
        if kind == "logit":
            p_t, log_p_s = F.softmax(t64(o64) / 2, -1), F.log_softmax(s / 2, -1)
            kd = (p_t * (p_t.log() - log_p_s)).sum(-1).mean() * 4
        else:
            f_s = s64.forward_head(s64.forward_features(d64), pre_logits=True)
            f_t = t64.forward_head(t64.forward_features(o64), pre_logits=True)
            kd = ((copy.deepcopy(projection).double()(f_s) - f_t) ** 2).mean()
    assert kd > 1e-3 and ce > 1e-3
    torch.testing.assert_close(got.double(), ce + kd, atol=1e-5, rtol=0)


def test_what_cannot_join_a_naflex_run_is_one_sentence(tmp_path):
    with pytest.raises(ValueError) as err:
        _task(tmp_path, teacher=_teacher(tmp_path / "square", naflex=False))
    assert "give a NaFlex teacher of the student's patch size" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"batches of 8x8 patches, and the teacher .* \(patch size \(4, 4\)\)"):
        _task(tmp_path, teacher=_teacher(tmp_path / "p4", patch=4))
    for over, key in ((["--distill.kind=token"], "'distill.kind' is token"),
                      (["--distill.kind=feature", "--distill.features=patch"], "'distill.features' is patch")):
        with pytest.raises(ConfigError, match=key):
            load_config(None, [*STUDENT, "--distill.teacher=t", *over])


@pytest.mark.slow
def test_train_py_distils_a_naflex_student_from_a_naflex_teacher(tmp_path):
    data = make_image_folder(tmp_path / "data", size=40)
    teacher = _teacher(tmp_path / "teacher")
    args = [*STUDENT, "--data.dataset=imagefolder", f"--data.root={data}", "--run.epochs=1", "--data.batch_size=8",
            "--data.num_workers=0", f"--run.output_dir={tmp_path / 'runs'}", "--run.name=kd",
            f"--distill.teacher={teacher}", "--distill.temperature=2"]
    done = run_script("train.py", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    model, cfg, _, _ = load_checkpoint(tmp_path / "runs" / "kd" / "last")
    assert cfg.data.naflex is not None and type(model).__name__ == "NaFlexVit"
