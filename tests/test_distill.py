"""Knowledge distillation (vit/train/distill.py) against timm 1.0.31's own tasks (timm.task), the oracle: the same
tiny random student and teacher in both libraries, the same batch and settings give the same loss, the same parts
and the same student (and projection) gradients, within 1e-6."""

import pytest
import torch
from helpers import perturb
from torch import nn

import vit
from vit.train.distill import Distiller
from vit.train.teacher import build_teacher

timm = pytest.importorskip("timm")
from timm.task import FeatureDistillationTask, LogitDistillationTask, TokenDistillationTask  # noqa: E402

TINY = dict(img_size=32, patch_size=8, depth=2, num_classes=5)
STUDENT = ("vit_tiny_patch16_224", dict(TINY, embed_dim=32, num_heads=2))
DEIT = ("deit_tiny_distilled_patch16_224", dict(TINY, embed_dim=32, num_heads=2))
TEACHER = ("vit_small_patch16_224", dict(TINY, embed_dim=48, num_heads=3))
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)


def _pair(spec, seed):
    """(timm's model, ours with its weights), both moved off their init, in training mode."""
    name, kw = spec
    torch.manual_seed(seed)
    ref = perturb(timm.create_model(name, pretrained=False, **kw))
    ours = vit.create_model(name, **kw)
    ours.load_state_dict(ref.state_dict())
    return ref.train(), ours.train()


def _batch(n=6):
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 5, (n,), generator=g)


def _teachers(student, mean=CLIP_MEAN, std=CLIP_STD):
    """timm's teacher with its pretrained_cfg saying `mean` / `std`, and ours from the same weights, told the
    student's normalisation (its pretrained_cfg's, which timm's tasks read)."""
    ref, ours = _pair(TEACHER, seed=7)
    ref.pretrained_cfg = dict(ref.pretrained_cfg, mean=mean, std=std)
    cfg = student.pretrained_cfg
    return ref.eval(), build_teacher(ours, cfg["mean"], cfg["std"], mean=mean, std=std)


def _grads(model, prefix=""):
    return {prefix + k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _compare(theirs, ours, ref_params, our_params, keys=("task_loss", "kd_loss")):
    for key in ("loss", *keys):  # float32 sums of ~4: a few ulps apart with another summation order (threads)
        torch.testing.assert_close(ours[key], theirs[key], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ours["output"], theirs["output"], atol=1e-6, rtol=0)
    assert theirs["kd_loss" if "kd_loss" in theirs else "distill_loss"] > 1e-3  # not vacuous: the models disagree
    g_ref, g_ours = _grads(*ref_params), _grads(*our_params)
    assert g_ref.keys() == g_ours.keys() and len(g_ref) > 10
    for k in g_ref:
        torch.testing.assert_close(g_ours[k], g_ref[k], atol=1e-6, rtol=0, msg=k)
    assert all(g.abs().sum() > 0 for k, g in g_ours.items() if not k.endswith("head_dist.bias")), "a dead gradient"


WEIGHTS = {"complementary": dict(task_loss_weight=0.3), "independent": dict(task_loss_weight=0.4,
                                                                            distill_loss_weight=2.5),
           "default": {}}


def _ours(weights):
    return dict(task_weight=weights.get("task_loss_weight"), distill_weight=weights.get("distill_loss_weight"))


@pytest.mark.parametrize("mode", WEIGHTS)
def test_logit_distillation_equals_timm(mode):
    ref_s, our_s = _pair(STUDENT, seed=1)
    ref_t, our_t = _teachers(ref_s)
    images, target = _batch()
    task = LogitDistillationTask(ref_s, ref_t, criterion=nn.CrossEntropyLoss(), temperature=3.0, verbose=False,
                                 **WEIGHTS[mode])
    theirs = task.train()(images, target)
    theirs["loss"].backward()
    d = Distiller(our_s, our_t, nn.CrossEntropyLoss(), kind="logit", temperature=3.0, **_ours(WEIGHTS[mode]))
    ours = d(d.student, images, target)
    ours["loss"].backward()
    assert (d.task_weight, d.distill_weight) == (task.task_loss_weight, task.distill_loss_weight)
    _compare(theirs, ours, (ref_s,), (our_s,))


@pytest.mark.parametrize("features", ["pooled"])
def test_feature_distillation_equals_timm(features):
    """timm projects the student's pre-logits (32) to the teacher's width (48) with a learned Linear; ours starts
    from its weights, and both gradients (student and projection) agree."""
    ref_s, our_s = _pair(STUDENT, seed=1)
    ref_t, our_t = _teachers(ref_s)
    images, target = _batch()
    task = FeatureDistillationTask(ref_s, ref_t, criterion=nn.CrossEntropyLoss(), task_loss_weight=0.5,
                                   distill_loss_weight=4.0, verbose=False).train()
    d = Distiller(our_s, our_t, nn.CrossEntropyLoss(), kind="feature", task_weight=0.5, distill_weight=4.0)
    d.projection.load_state_dict(task.trainable_module.projection.state_dict())
    theirs = task(images, target)
    theirs["loss"].backward()
    ours = d(d.student, images, target)
    ours["loss"].backward()
    _compare(theirs, ours, (task.trainable_module,), (nn.ModuleDict(dict(student=our_s, projection=d.projection)),))


@pytest.mark.parametrize("token_mode", ["soft", "hard"])
def test_token_distillation_equals_timm(token_mode):
    """DeiT's [DIST] head against the teacher (soft: KL at T=2; hard: its argmax), [CLS] against the labels."""
    ref_s, our_s = _pair(DEIT, seed=2)
    ref_t, our_t = _teachers(ref_s)
    images, target = _batch()
    task = TokenDistillationTask(ref_s, ref_t, criterion=nn.CrossEntropyLoss(), distill_type=token_mode,
                                 temperature=2.0, task_loss_weight=0.6, verbose=False).train()
    theirs = task(images, target)
    theirs["loss"].backward()
    d = Distiller(our_s, our_t, nn.CrossEntropyLoss(), kind="token", token_mode=token_mode, temperature=2.0,
                  task_weight=0.6)
    ours = d(d.student, images, target)
    ours["loss"].backward()
    theirs["kd_loss"] = theirs["distill_loss"]
    _compare(theirs, ours, (ref_s,), (our_s,))
    our_s.eval()  # the saved student averages its two heads at inference, as timm's distilled model does
    ref_s.eval()
    with torch.no_grad():
        torch.testing.assert_close(our_s(images), ref_s(images), atol=1e-6, rtol=0)
        x = our_s.forward_features(images)
        both = (our_s.head(x[:, 0]) + our_s.head_dist(x[:, 1])) / 2  # [CLS] and [DIST] after the final norm
        torch.testing.assert_close(our_s(images), both, atol=1e-6, rtol=0)


def test_patch_features_cosine_against_a_float64_formula():
    """Patch tokens (B, 16, 32) projected to the teacher's width and compared with its tokens on its own 2x2 grid
    resized to the student's 4x4 (bilinear), by 1 - cosine, averaged over tokens; checked in float64."""
    _, student = _pair(STUDENT, seed=1)
    name, kw = TEACHER
    torch.manual_seed(7)
    teacher = build_teacher(perturb(vit.create_model(name, **dict(kw, patch_size=16))), HALF, HALF, HALF, HALF)
    images, target = _batch()
    d = Distiller(student, teacher, nn.CrossEntropyLoss(), kind="feature", features="patch", feature_loss="cosine")
    ours = d(d.student, images, target)
    with torch.no_grad():
        s = d.projection(student.forward_features(images)[:, 1:]).double()  # (B, 16, 48)
        t = teacher.model.forward_features(images)[:, 1:].double()  # (B, 4, 48): same normalisation, same size
        t = torch.nn.functional.interpolate(t.transpose(1, 2).reshape(6, 48, 2, 2), size=(4, 4), mode="bilinear",
                                            align_corners=False, antialias=True).flatten(2).transpose(1, 2)
        want = (1 - (s * t).sum(-1) / (s.norm(dim=-1) * t.norm(dim=-1))).mean()
    torch.testing.assert_close(ours["kd_loss"].double(), want, atol=1e-6, rtol=0)
    assert 0.1 < want < 1.9  # neither aligned nor opposite: the comparison is not vacuous


def test_feature_distillation_takes_multi_label_targets():
    """Feature kd never reads the targets: a BCE task loss on multi-hot targets, and the kd term unchanged."""
    _, student = _pair(STUDENT, seed=1)
    _, teacher = _teachers(student)
    images, target = _batch()
    multi = torch.nn.functional.one_hot(target, 5).float()
    multi[:, 0] = 1
    single = Distiller(student, teacher, nn.CrossEntropyLoss(), kind="feature")
    d = Distiller(student, teacher, nn.BCEWithLogitsLoss(), kind="feature")
    d.projection.load_state_dict(single.projection.state_dict())
    ours = d(d.student, images, multi)
    torch.testing.assert_close(ours["task_loss"], nn.BCEWithLogitsLoss()(student(images), multi))
    torch.testing.assert_close(ours["kd_loss"], single(single.student, images, target)["kd_loss"])
