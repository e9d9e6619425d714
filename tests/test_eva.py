"""Eva's blocks and the other optional block parts (vit.layers.block_parts) against timm: EVA02 (rotary positions,
q / v-only bias, separate q / k / v names, SwiGLU with its NormFormer norms), EVA, DINOv3 `_qkvb`, AIMv2, BEiT-3,
DINOv2-giant's packed SwiGLU and Perception Encoder's pooling, each as a tiny instance with timm's random weights;
and an Eva tag loaded by name from an offline hub cache."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file
from timm.models import save_for_hf

import vit
from vit.layers import Attention, BlockParts, GluMlp, Rope, RotaryEmbedding

TINY = dict(embed_dim=64, depth=2, num_heads=2, num_classes=5)
CASES = {  # arch: what it exercises
    "eva02_tiny_patch14_224": "rope + learned table, fused qkv with q_bias / v_bias, packed SwiGLU, avg + fc_norm",
    "eva02_base_patch16_clip_224": "q_proj / k_proj / v_proj, SwiGLU's mlp.norm, attn.norm, [CLS]",
    "eva_giant_patch14_224": "EVA: q_bias / v_bias, no rope",
    "vit_small_patch16_dinov3_qkvb": "DINOv3 rope with q_bias / v_bias, gamma_1 / gamma_2",
    "vit_small_patch16_rope_ape_224": "RoPE-ViT: (column, row) rope on a table without prefix rows",
    "vit_small_patch16_rope_mixed_224": "RoPE-Mixed: learned frequencies per block and head (rope.freqs)",
    "vit_pe_core_tiny_patch16_384": "PE: pre-norm, offset rope, 8-head attention pooling over [CLS] too",
    "aimv2_large_patch14_224": "AIMv2: RMSNorm (patch tokens too), no projection biases",
    "beit3_base_patch16_224": "BEiT-3: attn.norm and mlp.norm",
    "vit_giant_patch14_reg4_dinov2": "DINOv2-giant: packed SwiGLU (one fc1)",
    "vit_base_patch16_rpn_224": "res-post-norm: x + Norm(f(x)) (timm's ResPostBlock)",
    "eva02_enormous_patch14_clip_224": "res-post-norm with Eva's q / v biases, [CLS]",
}


def _timm_and_ours(arch: str, **kw):
    """timm's tiny model with its weights moved away from init (biases, LayerScale near 1, sharp attention, so every
    part matters), and ours loaded strictly from its state dict."""
    torch.manual_seed(0)
    patch = 14 if "patch14" in arch else 16
    kw = dict(TINY, img_size=4 * patch, **kw)
    if "giant_patch14" in arch and "dinov2" in arch:
        kw["embed_dim"] = 96  # timm's packed fc1 is int(D * 5.33334) wide and must be even
    ref = timm.create_model(arch, pretrained=False, **kw).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.normal_(1.0 if ("gamma" in name or "norm" in name) and p.dim() == 1 else 0.0,
                      0.3 if "qkv" in name or "_proj" in name else 0.1)
    ours = vit.create_model(arch, **kw).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours, torch.randn(2, 3, 4 * patch, 4 * patch)


FAST = ("eva02_tiny_patch14_224", "eva02_base_patch16_clip_224", "vit_small_patch16_dinov3_qkvb",
        "vit_small_patch16_rope_mixed_224")


@pytest.mark.parametrize("arch", [a if a in FAST else pytest.param(a, marks=pytest.mark.slow) for a in CASES],
                         ids=list(CASES))
def test_loads_timms_weights_and_gives_its_features_and_logits(arch):
    ref, ours, x = _timm_and_ours(arch)
    assert set(ours.state_dict()) == set(ref.state_dict())  # timm's names both ways, nothing extra
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), rtol=0, atol=1e-5)
        logits = ours(x)
        torch.testing.assert_close(logits, ref(x), rtol=0, atol=1e-5)
    assert logits.std() > 1e-2  # a comparison that could not pass on constant outputs
    assert ours.no_weight_decay() == ref.no_weight_decay() & set(ours.state_dict())  # rope.freqs too (RoPE-Mixed)


def test_every_part_changes_the_output():
    """Guard for the parity test above: the parts it checks are in the computation (rope, q_bias, attn.norm,
    mlp.norm), so a model that dropped one would not pass by luck."""
    _, ours, x = _timm_and_ours("eva02_base_patch16_clip_224")
    with torch.no_grad():
        base = ours(x)
        blk = ours.blocks[0]
        for name, tensor in [("q_bias", blk.attn.q_bias), ("attn.norm", blk.attn.norm.weight),
                             ("mlp.norm", blk.mlp.norm.weight)]:
            kept = tensor.clone()
            tensor.mul_(0.5)
            assert (ours(x) - base).abs().max() > 1e-4, name
            tensor.copy_(kept)
        ours.rope = None
        assert (ours(x) - base).abs().max() > 1e-4, "rope"


@pytest.mark.parametrize("rope", [Rope(ref_grid=(6, 6)), Rope("dinov3", temperature=100.0, rotate_half=True)],
                         ids=["eva02", "dinov3"])
def test_qv_bias_rotary_attention_fused_equals_explicit(rope):
    """q / v-only bias, separate names, inner norm and rotary positions: SDPA and the explicit path (the one that
    returns attention maps) agree within 1e-6, on a non-square grid after a [CLS] token."""
    torch.manual_seed(0)
    parts = BlockParts(qkv_fused=False, scale_attn_norm=True)
    attn = Attention(32, 2, qkv_bias="qv", rope=rope, parts=parts).eval()
    with torch.no_grad():
        attn.q_bias.normal_()
        attn.v_bias.normal_()
    x, table = torch.randn(2, 1 + 12, 32), RotaryEmbedding(rope, 16)((3, 4))
    with torch.no_grad():
        fused, _ = attn(x, rope=table)
        explicit, probs = attn(x, return_attention=True, rope=table)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-6)
    assert probs.shape == (2, 2, 13, 13)


def test_zero_k_bias_is_fixed_and_unsaved():
    """Eva's k bias is a zero buffer: not a parameter (no optimizer moves it, as with rotary positions its
    gradient is not zero), not in the state dict; q / v biases are learned and do receive gradients."""
    attn = Attention(32, 2, qkv_bias="qv", rope=Rope())
    assert attn.qkv.bias is None and "k_bias" not in dict(attn.named_parameters())
    assert set(attn.state_dict()) == {"qkv.weight", "q_bias", "v_bias", "proj.weight", "proj.bias"}
    x = torch.randn(2, 1 + 4, 32)
    attn(x, rope=RotaryEmbedding(Rope(), 16)((2, 2)))[0].sum().backward()
    assert attn.q_bias.grad.abs().sum() > 0 and attn.v_bias.grad.abs().sum() > 0
    assert torch.equal(attn.k_bias, torch.zeros(32))


def test_separate_qkv_saves_timms_names_as_safetensors_and_loads_back(tmp_path):
    """q_proj / k_proj / v_proj come out as separate tensors (safetensors refuses shared memory) and load back
    into the fused projection; a checkpoint missing k_proj is refused by name, the model untouched."""
    attn = Attention(32, 2, qkv_bias="qv", parts=BlockParts(qkv_fused=False))
    state = attn.state_dict()
    assert set(state) == {"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "v_proj.bias",
                          "proj.weight", "proj.bias"}
    save_file(state, tmp_path / "a.safetensors")
    other = Attention(32, 2, qkv_bias="qv", parts=BlockParts(qkv_fused=False))
    other.load_state_dict(load_file(tmp_path / "a.safetensors"), strict=True)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(other(x)[0], attn(x)[0], rtol=0, atol=0)
    broken = {k: v for k, v in state.items() if k != "k_proj.weight"}
    before = other.qkv.weight.clone()
    with pytest.raises(RuntimeError, match="Missing key"):
        other.load_state_dict(broken)
    assert torch.equal(other.qkv.weight, before)


@pytest.mark.parametrize("make,message", [
    (lambda: Attention(32, 2, qkv_bias="qk"), "qkv_bias must be true, false or 'qv'"),
    (lambda: BlockParts(qkv_fused="no"), "qkv_fused must be true or false"),
    (lambda: vit.create_model("eva02_tiny_patch14_224", depth=1, attn_pool_num_heads=0), "attn_pool_num_heads"),
])
def test_bad_part_settings_say_what_is_wrong(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_packed_swiglu_is_swiglu_with_one_fc1():
    """GluMlp (gate and value packed in fc1) computes what SwiGLU computes with the halves as fc1_g and fc1_x."""
    torch.manual_seed(0)
    packed = GluMlp(16, 24)
    plain = vit.layers.SwiGLU(16, 24)
    g, v = packed.fc1.weight.chunk(2)
    bg, bv = packed.fc1.bias.chunk(2)
    plain.load_state_dict({"fc1_g.weight": g, "fc1_g.bias": bg, "fc1_x.weight": v, "fc1_x.bias": bv,
                           "fc2.weight": packed.fc2.weight, "fc2.bias": packed.fc2.bias})
    x = torch.randn(3, 16)
    torch.testing.assert_close(packed(x), plain(x), rtol=0, atol=1e-6)


def test_an_eva_tag_loads_by_name_from_an_offline_hub_cache(tmp_path, offline_hub):
    """timm's layout on the hub (config.json + model.safetensors, saved by timm's save_for_hf) loads by
    `hf-hub:` name and by tag with HF_HUB_OFFLINE=1, giving timm's logits."""
    from helpers import hub_snapshot

    repo_id = "timm/eva02_tiny_patch14_224.mim_in22k"
    ref, _, x = _timm_and_ours("eva02_tiny_patch14_224")
    save_for_hf(ref, str(hub_snapshot(tmp_path / "hub", repo_id, "c" * 40)), safe_serialization=True)
    offline_hub(tmp_path / "hub")
    by_repo = vit.create_model(f"hf-hub:{repo_id}", pretrained=True).eval()
    by_tag = vit.create_model("eva02_tiny_patch14_224.mim_in22k", pretrained=True, **TINY, img_size=56).eval()
    with torch.no_grad():
        expected = ref(x)
        torch.testing.assert_close(by_repo(x), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(by_tag(x), expected, rtol=0, atol=1e-5)
