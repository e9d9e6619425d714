"""Backbone options (prefix tokens, pooling heads, pre-norm, activations) against timm's ViT on the same weights."""

from functools import partial

import pytest
import torch
from timm.layers import LayerNorm
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer as TimmViT
from timm.models.vision_transformer import global_pool_nlc

import vit
from vit.explain.rollout import attention_maps
from vit.layers import Pooling, PrefixTokens, pool_tokens

SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5)

# (our create_model keywords, timm VisionTransformer's keywords): one feature each, then the families
CASES = {
    "pre_norm": (dict(pre_norm=True), dict(pre_norm=True)),
    "fc_norm_false_avg": (dict(global_pool="avg", fc_norm=False, class_token=False),
                          dict(global_pool="avg", fc_norm=False, class_token=False)),
    "fc_norm_true_token": (dict(fc_norm=True), dict(fc_norm=True)),
    "avgmax": (dict(global_pool="avgmax", class_token=False), dict(global_pool="avgmax", class_token=False)),
    "no_embed_class": (dict(no_embed_class=True), dict(no_embed_class=True)),
    "reg_tokens": (dict(reg_tokens=3), dict(reg_tokens=3)),
    "map": (dict(global_pool="map"), dict(global_pool="map")),
    "final_norm_false": (dict(final_norm=False), dict(final_norm=False)),
    "quick_gelu": (dict(mlp_layer="quick_gelu"), dict(act_layer="quick_gelu")),
    "gelu_tanh": (dict(mlp_layer="gelu_tanh"), dict(act_layer="gelu_tanh")),
    "qkv_bias_false": (dict(qkv_bias=False), dict(qkv_bias=False)),
    # the families, each option composed as its checkpoints use it
    "clip": (dict(pre_norm=True, mlp_layer="quick_gelu", norm_eps=1e-5),
             dict(pre_norm=True, act_layer="quick_gelu", norm_layer=partial(LayerNorm, eps=1e-5))),
    "siglip2": (dict(class_token=False, global_pool="map", mlp_layer="gelu_tanh"),
                dict(class_token=False, global_pool="map", act_layer="gelu_tanh")),
    "dinov2_reg4": (dict(patch_size=14, img_size=28, reg_tokens=4, no_embed_class=True, init_values=1e-5),
                    dict(patch_size=14, img_size=28, reg_tokens=4, no_embed_class=True, init_values=1e-5)),
    "deit3": (dict(no_embed_class=True, init_values=1e-6), dict(no_embed_class=True, init_values=1e-6)),
    "map_with_registers": (dict(class_token=False, reg_tokens=2, global_pool="map", no_embed_class=True),
                           dict(class_token=False, reg_tokens=2, global_pool="map", no_embed_class=True)),
    "avg_with_registers": (dict(reg_tokens=4, global_pool="avg"), dict(reg_tokens=4, global_pool="avg")),
}


def _randomized(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter drawn at random, so tiny initial tokens or unit norms cannot hide a wrong order."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def _pair(ours_kw: dict, timm_kw: dict, timm_cls=TimmViT):
    ref = _randomized(timm_cls(**{**SMALL, **timm_kw}))
    ours = vit.create_model("vit_tiny_patch16_224", **{**SMALL, **ours_kw}).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)  # timm's names and shapes, nothing left over
    return ours, ref


def _image(model, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, *model.patch_embed.img_size, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", list(CASES))
def test_option_matches_timm(case):
    ours, ref = _pair(*CASES[case])
    x = _image(ours)
    with torch.no_grad():
        a, b = ours(x), ref(x)
        fa, fb = ours.forward_features(x), ref.forward_features(x)
        pa, pb = ours.forward_head(fa, pre_logits=True), ref.forward_head(fb, pre_logits=True)
    assert ours.num_prefix_tokens == ref.num_prefix_tokens
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    torch.testing.assert_close(fa, fb, atol=1e-5, rtol=0)
    torch.testing.assert_close(pa, pb, atol=1e-5, rtol=0)
    assert a.abs().max() > 1e-2 and (a[0] - a[1]).abs().max() > 1e-3  # not a constant output



@pytest.mark.parametrize("kind", ["token", "avg", "max", "avgmax", ""])
def test_pool_tokens_equals_timms_global_pool_nlc(kind):
    """The pooling function alone against timm's, with 3 prefix tokens: through a model, the fc_norm after 'avg',
    'max' and 'avgmax' is scale-invariant and would hide a pooled vector off by a factor."""
    x = torch.randn(2, 3 + 7, 16, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(pool_tokens(x, kind, 3), global_pool_nlc(x, kind, num_prefix_tokens=3), atol=0, rtol=0)

def test_distilled_deit_matches_timm_in_eval_and_in_distilled_training():
    ref = _randomized(VisionTransformerDistilled(**SMALL))
    ours = vit.create_model("vit_tiny_patch16_224", **SMALL, dist_token=True).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = _image(ours)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)  # the two heads averaged
        f = ref.forward_features(x)
        torch.testing.assert_close(ours.forward_head(f, pre_logits=True), ref.forward_head(f, pre_logits=True),
                                   atol=1e-5, rtol=0)
        assert (ref.head(f[:, 0]) - ref.head_dist(f[:, 1])).abs().max() > 1e-2  # averaging two different heads
    ours.set_distilled_training(True)
    ref.set_distilled_training(True)
    ours.train()
    ref.train()
    with torch.no_grad():
        (a, a_dist), (b, b_dist) = ours(x), ref(x)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    torch.testing.assert_close(a_dist, b_dist, atol=1e-5, rtol=0)
    ours.reset_classifier(3)
    assert ours.head.out_features == ours.head_dist.out_features == 3


def test_forward_intermediates_with_registers_match_timm():
    ours, ref = _pair(dict(reg_tokens=4, no_embed_class=True), dict(reg_tokens=4, no_embed_class=True))
    x = _image(ours)
    with torch.no_grad():
        mine = ours.forward_intermediates(x, indices=2, return_prefix_tokens=True, intermediates_only=True)
        theirs = ref.forward_intermediates(x, indices=2, return_prefix_tokens=True, intermediates_only=True)
    for (sp, pp), (tsp, tpp) in zip(mine, theirs, strict=True):
        assert pp.shape[1] == 5  # [CLS] and 4 registers, not mistaken for patches
        torch.testing.assert_close(sp, tsp, atol=1e-5, rtol=0)
        torch.testing.assert_close(pp, tpp, atol=1e-5, rtol=0)


def test_attention_map_with_registers_reads_cls_over_patches_only():
    """The raw attention map of a model with registers equals the [CLS] row over patch columns of timm's last
    attention, computed here from timm's own modules (registers are not patches)."""
    ours, ref = _pair(dict(reg_tokens=4), dict(reg_tokens=4))
    x = _image(ours, 1)
    maps, _ = attention_maps(ours, x, method="attention")
    with torch.no_grad():
        tokens = ref.forward_intermediates(x, indices=[0], intermediates_only=True, output_fmt="NLC",
                                           return_prefix_tokens=True)[0]
        t = torch.cat([tokens[1], tokens[0]], dim=1)  # (1, 5 + 16, D): block 0's output, prefix first
        blk = ref.blocks[1]
        B, N, D = t.shape
        qkv = blk.attn.qkv(blk.norm1(t)).reshape(B, N, 3, 4, D // 4).permute(2, 0, 3, 1, 4)
        q, k = qkv[0].double(), qkv[1].double()
        attn = (q @ k.transpose(-2, -1) * (D // 4) ** -0.5).softmax(-1).mean(1)  # (1, N, N), heads averaged
    expected = attn[:, 0, 5:].reshape(1, 4, 4).float()
    torch.testing.assert_close(maps, expected, atol=1e-5, rtol=0)


def test_options_objects_refuse_bad_settings_with_one_sentence():
    with pytest.raises(ValueError, match="reg_tokens must be a whole number"):
        PrefixTokens(reg_tokens=-1)
    with pytest.raises(ValueError, match="dist_token=True needs class_token=True"):
        PrefixTokens(class_token=False, dist_token=True)
    with pytest.raises(ValueError, match="unknown global_pool 'mean'"):
        Pooling(global_pool="mean")
    with pytest.raises(ValueError, match="global_pool='token' needs class_token=True"):
        vit.create_model("vit_tiny_patch16_224", class_token=False)
    with pytest.raises(ValueError, match="dist_token=True needs global_pool='token'"):
        vit.create_model("vit_tiny_patch16_224", dist_token=True, global_pool="avg")
    m = vit.create_model("vit_tiny_patch16_224", **SMALL)
    with pytest.raises(ValueError, match="global_pool='map' needs attention-pooling weights"):
        m.reset_classifier(3, "map")


def test_token_merging_never_merges_registers():
    """ToMe on a model with [CLS] and 4 registers: after every block merged tokens, the first 5 tokens still stand
    for exactly themselves (their rows of the source-membership matrix are the identity)."""
    ours, _ = _pair(dict(reg_tokens=4), dict(reg_tokens=4))
    ours.set_token_reduction("merge", r=4)
    with torch.no_grad():
        ours.forward_with_attention(_image(ours))
    source = ours.blocks.last_tokens.source  # (B, N', N0)
    assert source.shape[1] == 5 + 16 - 2 * 4  # two blocks merged 4 patch tokens each
    torch.testing.assert_close(source[:, :5], torch.eye(5 + 16)[:5].expand(2, -1, -1))


@pytest.mark.parametrize("options", [dict(dist_token=True), dict(class_token=False, reg_tokens=2, global_pool="map")])
def test_torchscript_equals_eager_with_prefix_tokens_and_pooling(options):
    ours = _randomized(vit.create_model("vit_tiny_patch16_224", **SMALL, **options))
    x = _image(ours)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(ours)(x), ours(x), atol=1e-6, rtol=0)


def test_registers_checkpoint_resampled_to_another_size_as_timm_loads_it(tmp_path):
    """DINOv2-reg4 weights at 28 px loaded at 56 px: positions of patches only (no_embed_class) resampled exactly as
    timm's own loader does, same features."""
    import timm
    from safetensors.torch import save_file

    arch, small = "vit_small_patch14_reg4_dinov2", dict(depth=1, embed_dim=64, num_heads=4, num_classes=3)
    ref28 = _randomized(timm.create_model(arch, img_size=28, **small))
    path = tmp_path / "model.safetensors"
    save_file(ref28.state_dict(), str(path))
    ours = vit.create_model(arch, img_size=56, **small).eval()
    report = vit.load_pretrained(ours, path)
    assert any("resampled pos_embed from a 2x2 grid to 4x4" in a for a in report.actions)
    ref56 = timm.create_model(arch, pretrained=True, img_size=56, pretrained_cfg_overlay=dict(file=str(path)),
                              **small).eval()
    x = _image(ours)
    with torch.no_grad():
        torch.testing.assert_close(ours.pos_embed, ref56.pos_embed, atol=1e-6, rtol=0)
        # timm's loader drops the head (DINOv2's pretrained config has no classes), so the features are compared
        torch.testing.assert_close(ours.forward_features(x), ref56.forward_features(x), atol=1e-5, rtol=0)
