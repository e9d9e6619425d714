"""timm's model API on our ViT, checked against timm's own model with the same weights."""

# timm's model API on our ViT, checked against timm's own model with the same weights: forward_intermediates,
# pruning, features_only, FX and TorchScript, masks, classifier resets, layer-decay groups, input resizing,
# gradient checkpointing and pretrained_cfg. Models are tiny (3 blocks, 2x3 patch grid) so the file runs in seconds.

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import timm
import timm.optim
import torch
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import vit

NAME = "vit_tiny_patch16_224"
SMALL = dict(img_size=(32, 48), depth=3, embed_dim=64, num_heads=2)  # a 2x3 grid: a transposed reshape would show
D = SMALL["embed_dim"]


def _pair(**overrides):
    """Our model and timm's with the same weights (timm's random init copied into ours)."""
    kw = {**SMALL, **overrides}
    ref = timm.create_model(NAME, pretrained=False, **kw).eval()
    ours = vit.create_model(NAME, **kw).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ours, ref


def _x(batch=2):
    return torch.randn(batch, 3, 32, 48)


def _close(a, b, atol=1e-6):
    """Tensors, or nested lists/tuples/dicts of them, equal within atol."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k], atol)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for u, v in zip(a, b):
            _close(u, v, atol)
    else:
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(indices=2, norm=True),
        dict(indices=[0, -1], output_fmt="NLC", return_prefix_tokens=True),
        dict(indices=[1], stop_early=True, intermediates_only=True),
        dict(indices=[0, 2], output_dict=True, return_prefix_tokens=True),
    ],
)
def test_forward_intermediates_match_timm(kwargs):
    ours, ref = _pair()
    x = _x()
    with torch.no_grad():
        a, b = ours.forward_intermediates(x, **kwargs), ref.forward_intermediates(x, **kwargs)
    _close(a, b)
    if not kwargs:  # every block, (B, D, h, w) on the 2x3 grid, and the final output equals forward_features
        final, inter = a
        assert len(inter) == 3 and inter[0].shape == (2, D, 2, 3)
        assert (inter[0] - inter[2]).abs().max() > 1e-2  # distinct blocks, not one tensor three times
        _close(final, ours.forward_features(x))


def test_get_intermediate_layers_matches_timm():
    ours, ref = _pair()
    x = _x()
    with torch.no_grad():
        for kw in (dict(n=2), dict(n=[0, 1], reshape=True, norm=True)):
            _close(ours.get_intermediate_layers(x, **kw), ref.get_intermediate_layers(x, **kw))


def test_prune_intermediate_layers_matches_timm():
    ours, ref = _pair()
    assert ours.prune_intermediate_layers([0, -2]) == ref.prune_intermediate_layers([0, -2]) == [0, 1]
    assert len(ours.blocks) == len(ref.blocks) == 2 and isinstance(ours.blocks, vit.Encoder)
    assert ours.state_dict().keys() == ref.state_dict().keys()  # block 2 and the head are gone from both
    x = _x()
    with torch.no_grad():
        out = ours(x)  # no head, no pooling: every token of the last kept block, normalized
        _close(out, ref(x))
        _close(ours.forward_intermediates(x, [0, 1]), ref.forward_intermediates(x, [0, 1]))
    assert out.shape == (2, 7, D)


def test_features_only_matches_timm():
    for kw in (dict(), dict(out_indices=(0, 2))):
        ref = timm.create_model(NAME, pretrained=False, features_only=True, **SMALL, **kw).eval()
        ours = vit.create_model(NAME, features_only=True, **SMALL, **kw).eval()
        assert type(ours) is type(ref)  # timm's own FeatureGetterNet, around our model
        assert isinstance(ours.model, vit.VisionTransformer)
        ours.load_state_dict(ref.state_dict(), strict=True)
        for attr in ("channels", "reduction", "module_name"):
            assert getattr(ours.feature_info, attr)() == getattr(ref.feature_info, attr)()
        assert ours.pretrained_cfg == ref.pretrained_cfg and "classifier" not in ours.pretrained_cfg
        x = _x()
        with torch.no_grad():
            a, b = ours(x), ref(x)
        _close(a, b)
        assert len(a) == len(kw.get("out_indices", range(3))) and a[0].shape == (2, D, 2, 3)
    with pytest.raises(ValueError, match="feature_cls 'hook' is not supported"):
        vit.create_model(NAME, features_only=True, feature_cls="hook", **SMALL)
    with pytest.raises(ValueError, match="block index 5 is out of range for 3 blocks"):
        vit.create_model(NAME, features_only=True, out_indices=(0, 5), **SMALL)


def _masks():
    pad = torch.ones(2, 7, dtype=torch.bool)
    pad[1, 5:] = False  # the second image's last two patches are padding
    return {"none": (None, False), "padding": (pad[:, None, None, :], False), "causal": (None, True)}


def test_masks_match_timm():
    """forward(x, attn_mask, is_causal) as timm's: the same SDPA mask gives the same logits and features (ours
    computes the last block for [CLS] only, with the mask's [CLS] row)."""
    ours, ref = _pair(num_classes=5)
    x = _x()
    with torch.no_grad():
        unmasked = ours(x)
        for name, (attn_mask, causal) in _masks().items():
            out = ours(x, attn_mask, causal)
            _close(out, ref(x, attn_mask=attn_mask, is_causal=causal))
            _close(ours.forward_features(x, attn_mask, causal), ref.forward_features(x, attn_mask, causal))
            if name != "none":
                assert (out - unmasked).abs().max() > 1e-4, name  # the mask changes something


def test_fx_and_torchscript_equal_eager_also_with_masks():
    ours, _ = _pair(num_classes=5)
    pad = _masks()["padding"][0]
    graph = torch.fx.symbolic_trace(ours)
    scripted = torch.jit.script(ours)
    # deployment: torchvision's FX feature extractor, then compiled (needs real annotations on forward)
    train_nodes, eval_nodes = get_graph_node_names(ours)
    last = eval_nodes[-1]
    extractor = create_feature_extractor(ours, train_return_nodes=train_nodes[-1:], eval_return_nodes=[last])
    extractor = torch.jit.script(extractor.eval())
    x = _x()
    with torch.no_grad():
        for args in ((x,), (x, pad), (x, None, True)):
            eager = ours(*args)
            for model in (graph, scripted):
                _close(model(*args), eager)
        _close(extractor(x)[last], ours(x))
    # the traced graph has no Python branch left on the mask: the same graph serves all three calls above
    assert "sdpa_mask" in graph.code and "check_img_size" in graph.code
    with pytest.raises(ValueError, match="input size 32x32 differs from the model's 32x48"):
        graph(torch.randn(1, 3, 32, 32))


def test_backward_matches_timm_in_eager_and_fx():
    ours, ref = _pair(num_classes=5)
    ours.train(), ref.train()  # no dropout configured: train mode is deterministic
    x = _x()
    ref(x).square().mean().backward()
    traced = torch.fx.symbolic_trace(ours)
    for model in (ours, traced):
        ours.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        grads = dict(ours.named_parameters())
        for name, p in ref.named_parameters():
            assert grads[name].grad is not None, name
            torch.testing.assert_close(grads[name].grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_reset_classifier_and_pooling_match_timm():
    ours, ref = _pair()
    x = _x()
    for pool in ("token", "avg", "max", "avgmax", ""):
        for num_classes in (4, 0):
            ours.reset_classifier(num_classes, pool)
            ref.reset_classifier(num_classes, pool)
            ours.load_state_dict(ref.state_dict(), strict=True)
            assert ours.get_classifier().__class__ is ref.get_classifier().__class__
            with torch.no_grad():
                out = ours(x)
                _close(out, ref(x))
            width = num_classes or D
            expected = (2, 7, width) if pool == "" else (2, width)  # '': the head applies to every token, as timm
            assert out.shape == expected and ours.num_classes == num_classes and ours.global_pool == pool
    with pytest.raises(ValueError, match="unknown global_pool 'mean'"):
        ours.reset_classifier(3, "mean")


def test_create_model_without_head_and_pooling_matches_timm():
    ours, ref = _pair(num_classes=0, global_pool="")
    x = _x()
    with torch.no_grad():
        _close(ours(x), ref(x))


def test_layer_decay_groups_match_timm():
    """timm's optimizer factory reads group_matcher and no_weight_decay: same lr scale and decay per tensor."""
    ours, ref = _pair()

    def groups(model):
        opt = timm.optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.75)
        names = {id(p): n for n, p in model.named_parameters()}
        return {names[id(p)]: (g["lr_scale"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}

    a, b = groups(ours), groups(ref)
    assert a == b
    assert len({s for s, _ in a.values()}) == 3 + 2  # stem, 3 blocks, head: a real per-depth decay


def test_set_input_size_matches_timm():
    ours, ref = _pair(patch_size=8)  # 8 -> 4 below: resizing a 16x16 projection takes seconds (a 256-wide pinv)
    ours.set_input_size(img_size=(48, 64))
    ref.set_input_size(img_size=(48, 64))
    x = torch.randn(2, 3, 48, 64)
    with torch.no_grad():
        _close(ours.pos_embed, ref.pos_embed)
        _close(ours(x), ref(x), atol=1e-5)
    ours.set_input_size(patch_size=4)
    ref.set_input_size(patch_size=4)
    assert ours.patch_embed.grid_size == (12, 16) and ours.feature_info[0]["reduction"] == 4
    with torch.no_grad():
        _close(ours.patch_embed.proj.weight, ref.patch_embed.proj.weight, atol=1e-5)
        _close(ours.pos_embed, ref.pos_embed, atol=1e-5)
        _close(ours(x), ref(x), atol=1e-5)


def test_grad_checkpointing_same_gradients(monkeypatch):
    import vit.models.encoder

    calls = []
    real = vit.models.encoder.checkpoint
    monkeypatch.setattr(vit.models.encoder, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = vit.create_model(NAME, **SMALL, num_classes=5, drop_path_rate=0.0).train()
    x = _x()
    grads = []
    for enable in (False, True):
        model.zero_grad(set_to_none=True)
        model.set_grad_checkpointing(enable)
        model(x).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert len(calls) == 3  # every block was checkpointed in the second pass, none in the first
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-6, rtol=0, msg=name)


def test_attributes_and_pretrained_cfg_match_timm():
    ours, ref = _pair()
    for attr in ("num_features", "head_hidden_size", "embed_dim", "num_prefix_tokens", "num_classes",
                 "global_pool", "feature_info"):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    assert ours.no_weight_decay() <= ref.no_weight_decay()
    assert ours.group_matcher() == ref.group_matcher()
    # without weights, the registry's default for the name, exactly as timm sets it
    assert ours.pretrained_cfg == ref.pretrained_cfg and ours.default_cfg is ours.pretrained_cfg
    assert ours.pretrained_cfg["tag"] == "augreg_in21k_ft_in1k"
    for name in ("vit_small_patch16_224", "vit_base_patch32_224"):
        a = vit.create_model(name, depth=1).pretrained_cfg
        assert a == timm.create_model(name, pretrained=False, depth=1).pretrained_cfg and a["architecture"] == name
    # a model built by hand describes itself; a cfg set by weights replaces the default
    own = vit.VisionTransformer(img_size=32, patch_size=8, depth=1, embed_dim=32, num_heads=2, num_classes=3)
    assert own.pretrained_cfg["input_size"] == (3, 32, 32) and own.pretrained_cfg["num_classes"] == 3
    own.pretrained_cfg = {"tag": "mine"}
    assert own.default_cfg == {"tag": "mine"}


def test_forward_with_attention_has_a_fixed_return_type():
    ours, _ = _pair()
    x = _x()
    with torch.no_grad():
        logits, maps = ours.forward_with_attention(x)
        _close(logits, ours(x), atol=1e-5)
    assert len(maps) == 3 and maps[0].shape == (2, 2, 7, 7)
    ours.set_fused_attn(False)  # the explicit path computes maps anyway; they are returned only when asked
    with torch.no_grad():
        assert ours.blocks(ours._embed(x))[1] == [] and len(ours.forward_with_attention(x)[1]) == 3
    with pytest.raises(TypeError):
        ours(x, return_attention=True)  # the old flag is gone, not silently read as a mask


TIMM_TESTS = os.environ.get("VIT_TIMM_TESTS")  # path to timm's tests/test_models.py (not in timm's wheel)
NAMES = ["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224", "vit_base_patch32_224"]


@pytest.mark.slow
@pytest.mark.skipif(not TIMM_TESTS, reason="set VIT_TIMM_TESTS to timm's tests/test_models.py to run timm's suite")
def test_timm_model_suite_passes_on_our_model(tmp_path):
    """timm's own model tests for four names, with timm's factory redirected to vit.create_model (every keyword
    passed through) and its model lists narrowed to these names: forward, backward, default cfgs, TorchScript,
    FX (forward, backward, scripted), forward_intermediates and features_only. All must pass."""
    (tmp_path / "test_models.py").write_text(Path(TIMM_TESTS).read_text())
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import timm, timm.models, vit
        NAMES = {NAMES!r}
        _list = timm.list_models
        def list_models(*args, **kwargs):  # tagged names count once, as the architecture
            found = {{m.split(".")[0] for m in _list(*args, **kwargs)}}
            return [m for m in NAMES if m in found]
        timm.list_models = timm.models.list_models = list_models
        timm.create_model = timm.models.create_model = vit.create_model
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = ignore\n")
    select = ("(test_model_forward or test_model_backward or test_model_default_cfgs_non_std) "
              "and not forward_features and not with_features_fx")
    env = {**os.environ, "PYTHONPATH": str(Path(vit.__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", select,
                           "test_models.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "36 passed" in proc.stdout, proc.stdout[-3000:]


def test_a_scripted_dynamic_size_model_runs_at_other_sizes():
    """With dynamic_img_size, TorchScript calls back into Python for the resampled positions (as timm's model
    scripts and runs at any size); outputs equal eager's."""
    torch.manual_seed(0)
    m = vit.create_model("vit_tiny_patch16_224", dynamic_img_size=True, img_size=32, embed_dim=32, depth=2,
                         num_heads=2).eval()
    scripted = torch.jit.script(m)
    for hw in ((32, 32), (48, 32)):
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            assert torch.equal(scripted(x), m(x))
