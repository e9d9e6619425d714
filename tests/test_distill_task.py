"""The distillation task (vit/train/tasks/distillation.py): picked by distill.teacher, its loss the inner task's plus
the weighted kd term (checked against float64 formulas on the task's own loss method), feature kd's projection an
extra module, a resumed run with another teacher refused in one sentence, the model card naming the teacher; and
train.py end to end: a plain student folder (no projection keys, strict loads) and the refused resume."""

import contextlib
import copy
import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY, make_image_folder, perturb, run_script

from vit.config import load_config
from vit.models.build import build_model
from vit.models.checkpoint import load_checkpoint, save_checkpoint
from vit.models.model_card import model_card
from vit.train.runfolder import RunFolderError
from vit.train.tasks import ClassificationTask, DistillationTask, MultiLabelTask, task_for, task_name
from vit.train.teacher import weights_hash

IN_MEAN, IN_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
STUDENT = ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=2",
           "--model.num_heads=2", f"--aug.mean={IN_MEAN}", f"--aug.std={IN_STD}"]


def _teacher(folder, seed=0, classes=3, width=48):
    """A train.py checkpoint folder of a 48-wide teacher that normalised with CLIP's mean and std."""
    cfg = load_config(None, ["--model.img_size=32", "--model.patch_size=8", f"--model.embed_dim={width}",
                             "--model.depth=1", "--model.num_heads=2", f"--aug.mean={CLIP_MEAN}",
                             f"--aug.std={CLIP_STD}", "--aug.eval_crop_pct=1.0"])
    torch.manual_seed(seed)
    save_checkpoint(folder, perturb(build_model(cfg, classes)), cfg, [f"c{i}" for i in range(classes)])
    return folder


def _task(tmp_path, *over, classes=3):
    cfg = load_config(None, [*STUDENT, f"--distill.teacher={_teacher(tmp_path / 'teacher')}", *over])
    torch.manual_seed(1)
    student = perturb(build_model(cfg, classes)).train()
    return task_for(cfg, [f"c{i}" for i in range(classes)], None, student), student


def _run(student, extras=None):
    """What the task's loss reads of a Run: the (unprepared) model, extras, an accelerator's autocast."""
    return SimpleNamespace(model=student, extras=extras or {}, accelerator=SimpleNamespace(
        autocast=contextlib.nullcontext))


def _batch(n=6, classes=3):
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, classes, (n,), generator=g)


def _teacher_input(x):
    """float64: the student's batch (ImageNet-normalised) as the teacher's own (CLIP) normalisation gives it."""
    m_s, s_s = torch.tensor(IN_MEAN).double().view(1, 3, 1, 1), torch.tensor(IN_STD).double().view(1, 3, 1, 1)
    m_t, s_t = torch.tensor(CLIP_MEAN).double().view(1, 3, 1, 1), torch.tensor(CLIP_STD).double().view(1, 3, 1, 1)
    return (x.double() * s_s + m_s - m_t) / s_t


def test_a_teacher_picks_the_distillation_task_around_the_runs_own(tmp_path):
    task, _ = _task(tmp_path)
    assert task_name(task.cfg) == "distillation" and type(task) is DistillationTask
    assert type(task.inner) is ClassificationTask and task.select_by == "top1" and task.extra_modules() == {}
    labels = ["--data.dataset=imagefolder", "--data.root=x", "--data.labels_file=l.csv", "--distill.kind=feature"]
    multi, _ = _task(tmp_path, *labels)
    assert type(multi.inner) is MultiLabelTask and multi.select_by == "map"  # feature kd takes multi-hot targets


def test_the_logit_loss_is_the_task_loss_plus_the_weighted_kd_in_float64(tmp_path):
    """task_weight * smoothed CE + distill_weight * KL(teacher || student at T) * T^2, the teacher on the batch in
    its own normalisation; checked in float64 against the task's loss on the same batch."""
    over = ["--distill.temperature=2.0", "--distill.task_weight=0.3", "--distill.distill_weight=2.5",
            "--aug.label_smoothing=0.1"]
    task, student = _task(tmp_path, *over)
    x, y = _batch()
    got = task.loss(_run(student), x, y)
    s64, t64 = copy.deepcopy(student).double(), copy.deepcopy(task.teacher.model).double()
    with torch.no_grad():
        s, t = s64(x.double()), t64(_teacher_input(x))
        logp = F.log_softmax(s, -1)
        ce = (0.9 * -logp.gather(1, y[:, None]).squeeze(1) - 0.1 * logp.mean(-1)).mean()
        p_t, log_p_s = F.softmax(t / 2, -1), F.log_softmax(s / 2, -1)
        kd = (p_t * (p_t.log() - log_p_s)).sum(-1).mean() * 4
    assert kd > 1e-3 and ce > 1e-3  # neither term vacuous
    torch.testing.assert_close(got.double(), 0.3 * ce + 2.5 * kd, atol=1e-5, rtol=0)
    got.backward()
    assert all(p.grad is not None for p in student.parameters()) and task.teacher.model.patch_embed.proj.weight.grad \
        is None  # the student learns, the teacher is frozen


def test_feature_kd_trains_a_projection_that_is_an_extra_module(tmp_path):
    """The student's pre-logits (32) projected to the teacher's width (48): the projection is the task's extra
    module, the loss CE + mse(P(f_s), f_t) in float64, and the student's state dict holds no projection key."""
    task, student = _task(tmp_path, "--distill.kind=feature", "--aug.label_smoothing=0")
    (name, proj), = task.extra_modules().items()
    assert name == "projection" and (proj.in_features, proj.out_features) == (32, 48)
    x, y = _batch()
    got = task.loss(_run(student, {"projection": proj}), x, y)
    s64, t64, p64 = (copy.deepcopy(m).double().eval() for m in (student, task.teacher.model, proj))
    with torch.no_grad():
        feats = s64.forward_features(x.double())
        f_s, f_t = p64(s64.forward_head(feats, pre_logits=True)), t64.forward_head(
            t64.forward_features(_teacher_input(x)), pre_logits=True)
        want = F.cross_entropy(s64.forward_head(feats), y) + F.mse_loss(f_s, f_t)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    got.backward()
    assert proj.weight.grad is not None and proj.weight.grad.abs().sum() > 0
    assert not any("projection" in k for k in student.state_dict())


def test_a_resume_with_another_teacher_is_refused_in_one_sentence(tmp_path):
    task, _ = _task(tmp_path / "a")
    values, tensors = task.task_state()
    assert values["teacher_sha256"] == task.teacher.digest and tensors == {}
    task.load_task_state(json.loads(json.dumps(values)), {})  # the same teacher: resumes
    other = DistillationTask.from_config(task.cfg, task.classes, None, build_model(task.cfg, 3))
    other.teacher.digest = "0" * 64  # as a teacher folder retrained in place would hash
    with pytest.raises(RunFolderError) as e:
        other.load_task_state(values, {})
    msg = str(e.value)
    assert msg.startswith("cannot resume: the teacher ") and "has other weights" in msg and "\n" not in msg
    assert msg.endswith("start a new --run.name.")


def _card(*over):
    cfg = load_config(None, list(over))
    return model_card(dataclasses.replace(cfg, aug=cfg.aug.resolved(None, 3)), ["a", "b"], {}, 1000)


def test_the_model_card_names_the_teacher_by_its_public_name_only(tmp_path):
    card = _card("--distill.teacher=hf-hub:org/big-vit", "--distill.kind=logit", "--distill.temperature=4")
    assert "- distilled from: hf\\-hub\\:org\\/big\\-vit (logit distillation: class scores at temperature 4)" in card
    local = _card(f"--distill.teacher={tmp_path}")
    assert str(tmp_path) not in local and "distilled from: a local teacher" in local
    assert "distilled" not in _card()


@pytest.mark.slow
def test_train_py_distils_saves_a_plain_student_and_refuses_another_teacher_on_resume(tmp_path):
    """A tiny feature-distilled run: last/ is the student alone (its keys a fresh model's, loaded strictly by vit
    and timm), the projection in the training state only; resuming after the teacher's weights changed stops in
    one sentence."""
    import timm

    data, teacher = make_image_folder(tmp_path / "data"), _teacher(tmp_path / "teacher")
    args = [*TINY, "--data.dataset=imagefolder", f"--data.root={data}", "--run.epochs=1", "--model.patch_size=8",
            f"--run.output_dir={tmp_path / 'runs'}", "--run.name=kd", f"--distill.teacher={teacher}",
            "--distill.kind=feature"]
    done = run_script("train.py", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "runs" / "kd"
    model, cfg, classes, _ = load_checkpoint(run / "last")  # strict
    assert cfg.distill.teacher == str(teacher) and model.state_dict().keys() == build_model(cfg, 3).state_dict().keys()
    assert "distilled from: a local teacher" in (run / "last" / "README.md").read_text()
    timm.create_model(f"local-dir:{run / 'last'}", pretrained=True)  # timm reads it as its own (strict)
    (state,) = (run / "state").glob("step-*")
    assert json.loads((state / "task_state.json").read_text())["teacher_sha256"] == weights_hash(
        load_checkpoint(teacher)[0])
    _teacher(teacher, seed=5)  # the teacher retrained in place
    again = run_script("train.py", *args, "--run.epochs=2", "--run.resume=auto")
    assert again.returncode != 0
    (line,) = [ln for ln in again.stderr.splitlines() if "cannot resume" in ln]
    assert "the teacher" in line and "has other weights" in line, again.stderr[-2000:]


@pytest.mark.parametrize("kind", [["--distill.temperature=2"], ["--distill.kind=feature"],
                                  ["--distill.kind=token", "--model.dist_token=true"]],
                         ids=["logit", "feature", "token"])
def test_bf16_autocast_on_a_cpu_keeps_the_losses_and_gradients_of_float32(tmp_path, kind):
    """run.mixed_precision=bf16 on a CPU: Accelerate's autocast is torch.autocast('cpu', bfloat16) around the task's
    step (teacher and student). The loss and its parts stay float32 tensors within 2% of the float32 step's (the
    oracle, itself held to timm's in test_distill.py), and the student's and projection's gradients stay float32,
    finite, and point where float32's do (cosine > 0.99)."""
    task, student = _task(tmp_path, *kind)
    extras = task.extra_modules()
    x, y = _batch()
    results = []
    for autocast in (contextlib.nullcontext, lambda: torch.autocast("cpu", dtype=torch.bfloat16)):
        run = _run(student, extras)
        run.accelerator.autocast = autocast
        parts = task.parts(run, x, y)
        parts["loss"].backward()
        params = [p for m in (student, *extras.values()) for p in m.parameters()]
        results.append((parts, torch.cat([p.grad.flatten() for p in params])))
        for p in params:
            p.grad = None
    (full, g_full), (half, g_half) = results
    assert half["output"].dtype == torch.bfloat16  # autocast did run the student in bf16
    for key in ("loss", "task_loss", "kd_loss"):
        assert half[key].dtype == torch.float32, key
        torch.testing.assert_close(half[key], full[key], rtol=2e-2, atol=0, msg=key)
    assert g_half.dtype == torch.float32 and torch.isfinite(g_half).all()
    cos = F.cosine_similarity(g_half, g_full, dim=0)
    assert cos > 0.99
    assert task.teacher.model.patch_embed.proj.weight.dtype == torch.float32  # the teacher's weights untouched


def test_a_student_with_a_distillation_token_saves_a_folder_timm_loads(tmp_path):
    """model.dist_token=true on a plain ViT name: config.json names timm's VisionTransformerDistilled (a DeiT
    distilled architecture, sizes in model_args), so timm loads the folder strictly and gives our logits (the
    mean of the two heads)."""
    import timm

    cfg = load_config(None, [*STUDENT, "--model.dist_token=true"])
    torch.manual_seed(0)
    model = perturb(build_model(cfg, 3)).eval()
    save_checkpoint(tmp_path / "ck", model, cfg, ["a", "b", "c"])
    theirs = timm.create_model(f"local-dir:{tmp_path / 'ck'}", pretrained=True).eval()
    assert type(theirs).__name__ == "VisionTransformerDistilled"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model(x), atol=1e-5, rtol=1e-5)
    ours, *_ = load_checkpoint(tmp_path / "ck")  # and we read it back
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x), model(x), atol=1e-6, rtol=0)
