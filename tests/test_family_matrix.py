"""The downstream matrix: every pretrained family (CLIP, SigLIP2, DINOv2 with registers, DeiT3, distilled DeiT) works
with everything downstream of the model, each checked against an oracle on a tiny instance of the family's own
timm name: timm's twin holding the same weights (features, intermediates, attention maps, layer-decay groups, the
checkpoint timm loads back), float64 formulas (rollout), eager PyTorch (ONNX), the registry (preprocessing).

The families differ in their prefix tokens (0, 1, 2 or 5: [CLS], [DIST], registers) and pooling ([CLS], both
heads averaged, attention pooling): what code written for one [CLS] token gets wrong."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from helpers import import_script

import vit
from vit.config import load_config
from vit.explain.rollout import attention_maps
from vit.models.build import build_model
from vit.models.checkpoint import load_checkpoint, save_checkpoint
from vit.train.optim import param_groups

OPENAI_CLIP = dict(mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711))
IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
HALF = dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
# family: (timm architecture, a published tag, prefix tokens, that tag's preprocessing)
FAMILIES = {
    "clip": ("vit_base_patch16_clip_224", "openai", 1, OPENAI_CLIP),
    "siglip2": ("vit_base_patch16_siglip_224", "v2_webli", 0, HALF),
    "dinov2_reg4": ("vit_small_patch14_reg4_dinov2", "lvd142m", 5, IMAGENET),
    "deit3": ("deit3_small_patch16_224", "fb_in1k", 1, IMAGENET),
    "deit_distilled": ("deit_tiny_distilled_patch16_224", "fb_in1k", 2, IMAGENET),
}
# the tiny instance: 4x4 patches of 8 px, width 32, 2 blocks; the family's own options come from its name
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
TINY_ARGS = ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=2",
             "--model.num_heads=2"]
CLASSES = [str(i) for i in range(10)]  # the config's data: digits, whose split export.py verifies on


def _tiny(family: str, seed: int = 0) -> torch.nn.Module:
    """The family's tiny model in eval mode, its prefix tokens and positions far from zero (registers and [DIST]
    then change every output) and its heads peaked (top-1 decided by clear margins)."""
    torch.manual_seed(seed)
    model = vit.create_model(FAMILIES[family][0], **TINY).eval()
    with torch.no_grad():
        for name in ("cls_token", "reg_token", "dist_token", "pos_embed"):
            if isinstance(getattr(model, name, None), torch.nn.Parameter):
                getattr(model, name).normal_()
        model.head.weight.mul_(50.0)
        if model.head_dist is not None:
            model.head_dist.weight.mul_(50.0)
    return model


def _twin(model: torch.nn.Module, family: str) -> torch.nn.Module:
    """timm's model of the same name and options, holding `model`'s weights (strict)."""
    twin = timm.create_model(FAMILIES[family][0], pretrained=False, **TINY).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def _images(n: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def fast_for(*fast: str) -> list:
    """Every family as a parameter, those not in `fast` marked slow (the fast run keeps the multi-prefix ones)."""
    return [pytest.param(f, marks=() if f in fast else pytest.mark.slow) for f in FAMILIES]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def pair(family):
    model = _tiny(family)
    return family, model, _twin(model, family)


# --- the model itself: prefix tokens as the family has them, logits, features and intermediates as timm's ------

def test_logits_features_and_intermediates_equal_timms(pair):
    family, model, twin = pair
    assert model.num_prefix_tokens == twin.num_prefix_tokens == FAMILIES[family][2]
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(model.forward_features(x), twin.forward_features(x), atol=1e-5, rtol=0)
        feats = model.forward_features(x)
        torch.testing.assert_close(model.forward_head(feats, pre_logits=True),
                                   twin.forward_head(twin.forward_features(x), pre_logits=True), atol=1e-5, rtol=0)
        for kw in (dict(indices=2), dict(indices=[0], return_prefix_tokens=True, norm=True),
                   dict(indices=[1], output_fmt="NLC", intermediates_only=True)):
            got, want = model.forward_intermediates(x, **kw), twin.forward_intermediates(x, **kw)
            flat = lambda out: [t for o in (out if isinstance(out, (list, tuple)) else [out])  # noqa: E731
                                for t in (o if isinstance(o, (list, tuple)) else [o])]
            assert len(flat(got)) == len(flat(want)), kw
            for g, w in zip(flat(got), flat(want)):
                torch.testing.assert_close(g, w, atol=1e-5, rtol=0, msg=str(kw))
    # the prefix tokens handed back are the family's own (registers and [DIST] apart from the patch grid)
    if FAMILIES[family][2]:
        _, inter = model.forward_intermediates(x, indices=[1], return_prefix_tokens=True)
        assert inter[0][0].shape == (3, 32, 4, 4) and inter[0][1].shape == (3, FAMILIES[family][2], 32)


def test_features_only_model_equals_timms(pair):
    family, model, _ = pair
    ours = vit.create_model(FAMILIES[family][0], features_only=True, out_indices=(0, 1), **TINY).eval()
    ours.load_state_dict(model.state_dict(), strict=False)
    theirs = timm.create_model(FAMILIES[family][0], features_only=True, out_indices=(0, 1), **TINY).eval()
    theirs.load_state_dict(ours.state_dict())
    x = _images()
    with torch.no_grad():
        for g, w in zip(ours(x), theirs(x), strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=0)


# --- the weights' own preprocessing ------------------------------------------------------------------------------

def test_the_weights_preprocessing_reaches_the_data_pipeline(family):
    from vit.data.resolve import resolve_data_config

    arch, tag, _, want = FAMILIES[family]
    cfg = load_config(None, [f"--model.name={arch}.{tag}", *TINY_ARGS])
    pre = build_model(cfg, 10).pretrained_cfg  # the tag's, from the registry (no weights read)
    registry = timm.models.get_pretrained_cfg(f"{arch}.{tag}").to_dict()
    for key in ("mean", "std"):
        np.testing.assert_allclose(pre[key], registry[key], rtol=0, atol=0)
        np.testing.assert_allclose(pre[key], want[key], rtol=0, atol=1e-8)
    aug = resolve_data_config(cfg, pre).aug
    np.testing.assert_allclose(aug.mean, want["mean"], atol=1e-8)
    np.testing.assert_allclose(aug.std, want["std"], atol=1e-8)
    assert aug.interpolation == registry["interpolation"] and aug.eval_crop_pct == registry["crop_pct"]


# --- fine-tuning: a new head and layer-wise lr decay, grouped as timm groups the same model -----------------

def test_new_head_and_layer_decay_groups_equal_timms(pair):
    family, model, twin = pair
    import copy

    model, twin = copy.deepcopy(model), copy.deepcopy(twin)
    model.reset_classifier(7)
    twin.reset_classifier(7)
    twin.load_state_dict(model.state_dict())  # the new head(s) have timm's shapes: strict
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x), atol=1e-5, rtol=0)
    assert model(x).shape == (3, 7)

    def by_name(groups):
        return {n: (g["lr_scale"], g["weight_decay"]) for g in groups for n in g["names"]}

    from timm.optim import param_groups_layer_decay

    ours = by_name(param_groups(model, 0.05, layer_decay=0.75))
    names = {id(p): n for n, p in twin.named_parameters()}
    theirs = {names[id(p)]: (g["lr_scale"], g["weight_decay"])
              for g in param_groups_layer_decay(twin, 0.05, no_weight_decay_list=tuple(twin.no_weight_decay()),
                                                layer_decay=0.75) for p in g["params"]}
    assert ours == theirs
    depth = len(model.blocks)
    stem = [n for n in ours if n.split(".")[0] in ("cls_token", "reg_token", "dist_token", "pos_embed")]
    assert stem and all(ours[n] == (0.75 ** (depth + 1), 0.0) for n in stem)  # prefix tokens: the embeddings'
    heads = [n for n in ours if n.split(".")[0] in ("head", "head_dist", "attn_pool")]
    assert all(ours[n][0] == 1.0 for n in heads)  # the new head(s) and attention pool learn at the full rate


# --- explanations: rollout over every token, the grid read without prefix tokens ---------------------------

def _timm_attentions(twin, x, target=None):
    """timm's attention probabilities (B, H, N, N) per block (explicit softmax path, read at attn_drop), and with
    `target` their gradients of the target logits' sum."""
    maps, hooks = [], []

    def keep(module, inputs, out):
        if out.requires_grad:
            out.retain_grad()
        maps.append(out)

    for blk in twin.blocks:
        blk.attn.fused_attn = False
        hooks.append(blk.attn.attn_drop.register_forward_hook(keep))
    try:
        with torch.enable_grad():
            logits = twin(x)
            if target is not None:
                logits.gather(1, target[:, None]).sum().backward()
    finally:
        for h in hooks:
            h.remove()
    return logits, maps


def _rollout64(attns, alpha=0.5):
    """Abnar & Zuidema in float64 numpy, mean head fusion: R = A_L' ... A_1', A' = rownorm(alpha A + (1-alpha) I)."""
    B, _, N, _ = attns[0].shape
    R = np.broadcast_to(np.eye(N), (B, N, N))
    for a in attns:
        m = alpha * a.double().mean(1).numpy() + (1 - alpha) * np.eye(N)
        R = (m / m.sum(-1, keepdims=True)) @ R
    return R


def _gradient_rollout64(attns, grads):
    """Chefer et al. in float64 numpy: R <- R + mean_h[(grad * A)^+] R."""
    B, _, N, _ = attns[0].shape
    R = np.broadcast_to(np.eye(N), (B, N, N))
    for a, g in zip(attns, grads):
        cam = np.clip(g.double().numpy() * a.double().numpy(), 0, None).mean(1)
        R = R + cam @ R
    return R


def _grid(R, p, pooled_by_token):
    """(B, N, N) -> (B, 4, 4): the [CLS] row over the patch columns, or the patch rows' mean (no [CLS])."""
    row = R[:, 0, p:] if pooled_by_token else R[:, p:, p:].mean(1)
    return row.reshape(-1, 4, 4)


@pytest.mark.parametrize("name", fast_for("dinov2_reg4", "deit_distilled"))
def test_attention_and_gradient_rollout_leave_prefix_tokens_out_of_the_grid(name):
    family, model = name, _tiny(name)
    twin = _twin(model, family)
    p = FAMILIES[family][2]
    x = _images()
    logits, attns = _timm_attentions(twin, x)
    with torch.no_grad():
        _, ours = model.forward_with_attention(x)
    assert len(ours) == len(attns)
    for a, b in zip(ours, attns):
        torch.testing.assert_close(a, b.detach(), atol=1e-5, rtol=0)  # the maps themselves are timm's
    by_token = model.global_pool == "token"
    grid, _ = attention_maps(model, x, "rollout")
    np.testing.assert_allclose(grid.double().numpy(), _grid(_rollout64([a.detach() for a in attns]), p, by_token),
                               atol=1e-5)
    target = logits.argmin(1)  # not the predicted class, so the target really is passed through
    _, attns = _timm_attentions(twin, x, target)
    want = _grid(_gradient_rollout64([a.detach() for a in attns], [a.grad for a in attns]), p, by_token)
    grid, _ = attention_maps(model, x, "grad_rollout", target_class=target)
    np.testing.assert_allclose(grid.double().numpy(), want, atol=1e-5, rtol=1e-4)


# --- token merging never merges a prefix token; sparse attention on every family -----------------------------

def test_token_merging_keeps_every_prefix_token_itself(pair):
    family, model, _ = pair
    import copy

    p = FAMILIES[family][2]
    model = copy.deepcopy(model)
    model.set_token_reduction("merge:3")
    x = _images()
    with torch.no_grad():
        plain = model(x)
        logits, _ = model.forward_with_attention(x)  # tracks which input tokens each token stands for
        torch.testing.assert_close(plain, logits, atol=1e-5, rtol=0)
    source = model.blocks.last_tokens.source  # (B, N, N0): which input tokens each token stands for
    N0 = p + 16
    assert source.shape == (3, N0 - 3 * len(model.blocks), N0)  # 3 tokens merged away per block
    torch.testing.assert_close(source[:, :p], torch.eye(N0)[:p].expand(3, p, N0))  # prefix k is input token k
    assert source[:, p:, :p].sum() == 0 and source.sum() == 3 * N0  # no patch took a prefix token in


# FlexAttention compiles its kernel per shape on CPU: the family with the most prefix tokens in the fast run
@pytest.mark.parametrize("name", fast_for("dinov2_reg4"))
def test_sparse_attention_on_every_family(name):
    """MoBA over 4-token key blocks: keeping every block is dense attention (timm's logits); keeping 2 of them, the
    kernel computes what the explicit softmax does (every query of the last block: a pruned one attends densely,
    see vit.layers.attention), and each query attends to at most those 2 blocks, prefix tokens included."""
    family, model = name, _tiny(name)
    twin = _twin(model, family)
    x = _images()
    N = FAMILIES[family][2] + 16
    blocks = -(-N // 4)
    for topk, dense in ((blocks, True), (2, False)):
        sparse = vit.create_model(FAMILIES[family][0], **TINY, sparse_attention=dict(
            method="moba", block_size=4, topk_blocks=topk, min_tokens=0)).eval()
        sparse.load_state_dict(model.state_dict())
        sparse.prune_last_block = False
        with torch.no_grad():
            got = sparse(x)
            explicit, maps = sparse.forward_with_attention(x)
            want = twin(x)
        torch.testing.assert_close(got, explicit, atol=1e-5, rtol=0)
        kept = (maps[0] > 0).sum(-1)  # (B, H, N) keys each query attends to
        if dense:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
            assert kept.min() == N
        else:
            assert kept.max() <= 8 and kept.min() >= 4  # its own block and at most one more


# --- checkpoints: ours, and timm loading ours back through local-dir: ------------------------------------------

def _checkpoint(family, folder):
    cfg = load_config(None, [f"--model.name={FAMILIES[family][0]}", *TINY_ARGS])
    model = build_model(cfg, len(CLASSES))
    model.load_state_dict(_tiny(family).state_dict())
    save_checkpoint(folder, model, cfg, CLASSES)
    return model.eval()


@pytest.mark.parametrize("family", fast_for("dinov2_reg4", "deit_distilled"))
def test_timm_loads_our_checkpoint_of_every_family(family, tmp_path):
    model = _checkpoint(family, tmp_path / "best")
    theirs = timm.create_model(f"local-dir:{tmp_path / 'best'}", pretrained=True).eval()
    assert type(theirs).__name__ == type(_twin(model, family)).__name__
    x = _images()
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(theirs(x), want, atol=1e-5, rtol=0)
        torch.testing.assert_close(load_checkpoint(tmp_path / "best")[0](x), want, atol=1e-5, rtol=0)


# --- deployment: ONNX (and INT8) against eager, predict.py --onnx ---------------------------------------------

@pytest.mark.slow
def test_onnx_and_int8_exports_of_every_family(pair, tmp_path):
    from vit.deploy.export import ExportableClassifier, export_model, load_exported
    from vit.deploy.quantize import OnnxModel, quantize, softmax

    family, model, _ = pair
    x = _images(8)
    src = export_model(ExportableClassifier(model), "onnx", tmp_path, x[:2])
    with torch.no_grad():
        ref = model(x)
    assert (load_exported(src, "onnx")(x) - ref).abs().max() <= 1e-4
    q = quantize(src, tmp_path / "int8.onnx", "dynamic")
    logits = OnnxModel(q)(x.numpy())
    assert np.abs(logits - ref.numpy()).max() > 1e-4  # quantized, not the float model under another name
    p, r = softmax(logits), softmax(ref.numpy())
    assert np.abs(p - r).max() <= 0.15 and (p.argmax(-1) == r.argmax(-1)).mean() >= 0.75


@pytest.mark.slow
def test_predict_onnx_runs_every_family(family, tmp_path):
    from PIL import Image

    _checkpoint(family, tmp_path / "best")
    assert import_script("export").main(["--checkpoint", str(tmp_path / "best"), "--format", "onnx",
                                         "--out", str(tmp_path / "exp")]) == 0
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(images / f"{i}.png")
    assert import_script("predict").main(["--onnx", str(tmp_path / "exp" / "model.onnx"), str(images), "--out",
                                          str(tmp_path / "onnx")]) == 0
    assert import_script("predict").main(["--checkpoint", str(tmp_path / "best"), str(images), "--out",
                                          str(tmp_path / "torch"), "--num-workers", "0"]) == 0
    onnx_rows = (tmp_path / "onnx" / "predictions.csv").read_text().splitlines()
    torch_rows = (tmp_path / "torch" / "predictions.csv").read_text().splitlines()
    assert len(onnx_rows) == len(torch_rows) == 4
    assert [r.split(",")[:2] for r in onnx_rows] == [r.split(",")[:2] for r in torch_rows]  # file, top-1


# --- fine-tuning through train.py from a hub cache, by the tag's name -----------------------------------------

@pytest.mark.slow
def test_train_fine_tunes_clip_by_its_tag_from_a_hub_cache(tmp_path):
    """The fine-tune recipe (layer decay 0.75) with `--model.pretrained=vit_base_patch16_clip_224.openai` (tiny
    weights under that repository in an offline cache; a registry tag's options are the registry's, so the config
    gives the tiny sizes): the architecture and CLIP's mean and std come from the weights, the 1000-way head is
    replaced, and timm loads the run's best/ back with the same logits."""
    import json

    import yaml
    from helpers import hub_snapshot, make_image_folder, run_script
    from timm.models import save_for_hf

    arch, tag = FAMILIES["clip"][:2]
    torch.manual_seed(0)
    save_for_hf(timm.create_model(arch, **{**TINY, "num_classes": 1000}),
                str(hub_snapshot(tmp_path / "hub", f"timm/{arch}.{tag}", "c" * 40)), safe_serialization=True)
    root = make_image_folder(tmp_path / "data", n_train=6, n_val=3, size=40)
    r = run_script("train.py", "--config", "configs/finetune_imagefolder.yaml", f"--model.pretrained={arch}.{tag}",
                   *TINY_ARGS, f"--data.root={root}", "--data.batch_size=6", "--data.num_workers=0",
                   "--run.epochs=1", "--optim.warmup_epochs=0", "--run.name=clip",
                   f"--run.output_dir={tmp_path / 'runs'}",
                   env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    best = tmp_path / "runs" / "clip" / "best"
    saved = yaml.safe_load((best / "config.yaml").read_text())
    assert saved["model"]["name"] == arch
    np.testing.assert_allclose(saved["aug"]["mean"], OPENAI_CLIP["mean"], atol=1e-8)
    np.testing.assert_allclose(saved["aug"]["std"], OPENAI_CLIP["std"], atol=1e-8)
    assert json.loads((best / "config.json").read_text())["num_classes"] == 3  # the head was replaced
    model = load_checkpoint(best)[0]
    theirs = timm.create_model(f"local-dir:{best}", pretrained=True).eval()
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model(x), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_benchmark_takes_a_family_by_its_tag(capsys):
    """benchmark.py --model with a tag (random weights either way) compares against timm's twin of that family."""
    assert import_script("benchmark").main(["--model", "deit_tiny_distilled_patch16_224.fb_in1k", "--img-size", "32",
                                            "--batch-size", "2", "--repeats", "1", "--warmup", "0",
                                            "--peak-size", "64", "--device", "cpu"]) == 0
    assert "deit_tiny_distilled_patch16_224.fb_in1k  batch 2  32 px" in capsys.readouterr().out


def test_a_config_sets_the_family_options_by_timms_names():
    """model.reg_tokens / class_token / global_pool: map / no_embed_class / pre_norm in a config build what timm
    builds from the same keywords (same logits on the same weights); left out, they are the name's."""
    opts = dict(reg_tokens=2, class_token=False, global_pool="map", no_embed_class=True, pre_norm=True)
    cfg = load_config(None, ["--model.name=vit_small_patch16_224", *TINY_ARGS,
                             *(f"--model.{k}={str(v).lower()}" for k, v in opts.items())])
    model = build_model(cfg, 10).eval()
    twin = timm.create_model("vit_small_patch16_224", **TINY, **opts).eval()
    twin.load_state_dict(model.state_dict())
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x), atol=1e-5, rtol=0)
    plain = build_model(load_config(None, ["--model.name=vit_small_patch14_reg4_dinov2", *TINY_ARGS]), 10)
    assert plain.num_reg_tokens == 4 and plain.no_embed_class  # the name's
