"""The attention seam: AttentionOptions passed whole, an attention class and options per block, the contract a
subclass keeps (through create_model, forward_with_attention, forward_intermediates), the one table of features
that do not combine, and NaFlexVit as the square model's subclass."""

import ast
import inspect
import textwrap

import pytest
import timm
import torch

import vit
from vit.config import AttentionOptions, SparseOptions
from vit.layers import CONFLICTS, Attention, check_combination
from vit.models import Block, Encoder, NaFlexVit, VisionTransformer

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3)


class ScaledAttention(Attention):
    """The minimal subclass the contract promises works: queries scaled by a fixed temperature, i.e. logits
    t * QK^T / sqrt(d). Nothing else is overridden, and no other file knows this class."""

    temperature = 3.0

    def _qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = super()._qk(q, k)
        return q * self.temperature, k


def _scaled_reference(model: torch.nn.Module, t: float) -> torch.nn.Module:
    """The oracle for ScaledAttention: the plain model with W_q and b_q multiplied by t (q = t (W_q x + b_q))."""
    ref = vit.create_model("vit_tiny_patch16_224", **TINY).double().eval()
    ref.load_state_dict(model.state_dict())
    D = ref.embed_dim
    with torch.no_grad():
        for blk in ref.blocks:
            blk.attn.qkv.weight[:D] *= t
            blk.attn.qkv.bias[:D] *= t
    return ref


def test_a_minimal_attention_subclass_works_through_create_model_maps_and_intermediates():
    torch.manual_seed(0)
    ours = vit.create_model("vit_tiny_patch16_224", **TINY, attn_layer=ScaledAttention).double().eval()
    assert all(type(b.attn) is ScaledAttention for b in ours.blocks)
    ref = _scaled_reference(ours, ScaledAttention.temperature)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        logits = ours(x)
        torch.testing.assert_close(logits, ref(x), rtol=0, atol=1e-10)
        assert (logits - _scaled_reference(ours, 1.0)(x)).abs().max() > 1e-3  # the temperature matters
        maps_logits, maps = ours.forward_with_attention(x)  # the explicit path of the subclass
        ref_logits, ref_maps = ref.forward_with_attention(x)
        torch.testing.assert_close(maps_logits, logits, rtol=0, atol=1e-10)
        for got, want in zip(maps, ref_maps, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        final, inter = ours.forward_intermediates(x, indices=[0, 1])
        ref_final, ref_inter = ref.forward_intermediates(x, indices=[0, 1])
        torch.testing.assert_close(final, ref_final, rtol=0, atol=1e-10)
        for got, want in zip(inter, ref_inter, strict=True):
            assert got.shape == (2, 32, 4, 4)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_qk_norm_gives_timms_logits_and_keys():
    """AttentionOptions.qk_norm from create_model's timm keyword: timm's q_norm / k_norm names, timm's logits on
    both paths (and the [CLS]-only last block, which computes its queries apart)."""
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, qk_norm=True, **TINY).eval()
    ours = vit.create_model("vit_tiny_patch16_224", qk_norm=True, **TINY).eval()
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n.endswith(("q_norm.weight", "k_norm.weight", "q_norm.bias", "k_norm.bias")):
                p.normal_()  # away from the identity init, so a missing norm shows
    ours.load_state_dict(ref.state_dict(), strict=True)
    assert ours.blocks[0].attn.options == AttentionOptions(qk_norm=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = ref(x)
        torch.testing.assert_close(ours(x), want, rtol=0, atol=1e-5)
        torch.testing.assert_close(ours.forward_with_attention(x)[0], want, rtol=0, atol=1e-5)
        plain = vit.create_model("vit_tiny_patch16_224", **TINY).eval()
        plain.load_state_dict({k: v for k, v in ref.state_dict().items() if "_norm." not in k})
        assert (plain(x) - want).abs().max() > 1e-3


def test_per_block_classes_and_options_equal_a_hand_built_stack_in_float64():
    """Encoder(attention=(qk-norm, plain), attn_layer=(Attention, ScaledAttention)) is the same computation as the
    two blocks built one by one with those settings; a sequence of the wrong length is one sentence."""
    torch.manual_seed(0)
    enc = Encoder(2, 16, 2, attention=(AttentionOptions(qk_norm=True), AttentionOptions(qkv_bias=False)),
                  attn_layer=(Attention, ScaledAttention)).double().eval()
    hand = torch.nn.ModuleList([Block(16, 2, attention=AttentionOptions(qk_norm=True)),
                                Block(16, 2, attention=AttentionOptions(qkv_bias=False), attn_layer=ScaledAttention)])
    hand = hand.double().eval()
    hand.load_state_dict(enc.state_dict(), strict=True)
    assert type(enc[1].attn) is ScaledAttention and enc[1].attn.qkv.bias is None
    assert not isinstance(enc[1].attn.q_norm, torch.nn.LayerNorm) and isinstance(enc[0].attn.q_norm, torch.nn.LayerNorm)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        hand.load_state_dict(enc.state_dict(), strict=True)
        x = torch.randn(2, 7, 16, dtype=torch.float64)
        want = x
        for blk in hand:
            want = blk(want)[0]
        got, maps = enc(x, return_attention=True)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        assert len(maps) == 2
    with pytest.raises(ValueError, match="attn_layer has 3 values for 2 blocks; give one value, or one per block"):
        Encoder(2, 16, 2, attn_layer=(Attention,) * 3)


def test_attention_options_come_whole_or_as_timms_keywords_once():
    opts = (AttentionOptions(qk_norm=True), AttentionOptions())
    m = vit.create_model("vit_tiny_patch16_224", **TINY, attention=opts)
    assert [b.attn.options for b in m.blocks] == list(opts)
    sparse = vit.create_model("vit_tiny_patch16_224", **TINY, sparse_attention=dict(method="moba", block_size=4))
    assert sparse.blocks[0].attn.options.sparse_attention == SparseOptions("moba", block_size=4)
    with pytest.raises(ValueError, match="attention= is given whole and qk_norm set its fields too"):
        vit.create_model("vit_tiny_patch16_224", **TINY, attention=AttentionOptions(), qk_norm=True)
    with pytest.raises(ValueError, match="either as one AttentionOptions or as qkv_bias"):
        Attention(16, 2, qkv_bias=False, options=AttentionOptions())
    with pytest.raises(ValueError, match="'qk_norm' must be true or false"):
        AttentionOptions(qk_norm="yes")


@pytest.mark.parametrize("row", CONFLICTS, ids=[f"{a}+{b}" for a, b, _ in CONFLICTS])
def test_every_row_of_the_combination_table_refuses_its_pair_in_one_sentence(row):
    a, b, reason = row
    check_combination(**{a: True, b: False})
    check_combination(**{a: False, b: True})
    with pytest.raises(ValueError) as e:
        check_combination(**{a: True, b: True})
    assert str(e.value) == reason and reason.endswith(".") and reason.count(". ") == 0


def test_the_table_is_where_refusals_come_from():
    """A pair met in a model raises the table's sentence; a misspelled feature is refused rather than unchecked."""
    assert len({(a, b) for a, b, _ in CONFLICTS}) == len(CONFLICTS)
    with pytest.raises(TypeError, match="unknown feature"):
        check_combination(rotary=True)
    reason = {(a, b): r for a, b, r in CONFLICTS}
    with pytest.raises(ValueError) as e:
        Attention(16, 2, sparse_attention=SparseOptions("moba"), rel_pos=lambda: torch.nn.Identity())
    assert str(e.value) == reason["sparse_attention", "rel_pos"]
    rope_model = vit.create_model("vit_small_patch16_rope_224", img_size=32, depth=1, embed_dim=64, num_heads=2)
    with pytest.raises(ValueError) as e:
        rope_model.set_token_reduction("merge", r=2)
    assert str(e.value) == reason["token_reduction", "rope"]


def test_naflex_is_its_own_class_and_the_square_model_has_no_naflex_branch():
    naflex = vit.create_model("naflexvit_base_patch16_gap", **TINY)
    square = vit.create_model("vit_tiny_patch16_224", **TINY)
    assert type(naflex) is NaFlexVit and type(square) is VisionTransformer and square.embeds is None
    tree = ast.parse(textwrap.dedent(inspect.getsource(VisionTransformer)))
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)}
    names = read | {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for a in n.args.args}
    assert not {n for n in names if "naflex" in n.lower() or n in ("embeds", "patch_valid")}
