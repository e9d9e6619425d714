"""TextEncoder: the ViT's own blocks on token ids, checked against nn.TransformerEncoder."""

import pytest
import torch
from torch import nn

import vit
from vit.models.encoder import Block, Encoder


def _pair(D, H, depth, norm_first, final_norm):
    layer = nn.TransformerEncoderLayer(D, H, 4 * D, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=norm_first)
    ref = nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(D) if final_norm else None,
                                enable_nested_tensor=False).eval()
    for p in ref.parameters():  # non-trivial norms too
        nn.init.normal_(p, std=0.2) if p.dim() == 1 else None
    ours = vit.TextEncoder(100, D, depth, H, max_len=32, pos_embed="none", norm_first=norm_first,
                           norm_eps=1e-5).eval()
    ours.load_torch_encoder(ref)
    return ours, ref


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("B,N,D,H,depth", [(2, 7, 32, 4, 2), (3, 12, 48, 6, 3), (1, 5, 16, 1, 1)])
def test_parity_with_torch_encoder_under_padding(norm_first, B, N, D, H, depth):
    ours, ref = _pair(D, H, depth, norm_first, final_norm=norm_first)
    ids = torch.randint(0, 100, (B, N))
    mask = torch.ones(B, N, dtype=torch.long)
    mask[0, N - 2 :] = 0  # sample 0 ends in padding
    with torch.no_grad():
        emb = ours.token_embed(ids)
        expected = ref(emb, src_key_padding_mask=~mask.bool())
        got = ours(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)


def test_padded_tokens_do_not_change_real_outputs():
    m = vit.TextEncoder(50, 32, 2, 4, max_len=16, class_token=True, global_pool="token").eval()
    ids = torch.randint(0, 50, (2, 10))
    mask = torch.ones(2, 10)
    mask[:, 7:] = 0
    ids2 = ids.clone()
    ids2[:, 7:] = torch.randint(0, 50, (2, 3))
    with torch.no_grad():
        a, b = m(ids, mask), m(ids2, mask)
    torch.testing.assert_close(a.last_hidden_state[:, :8], b.last_hidden_state[:, :8], atol=1e-6, rtol=0)
    torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-6, rtol=0)


def test_masked_mean_pooling_ignores_padding():
    m = vit.TextEncoder(50, 16, 1, 2, max_len=8, global_pool="avg").eval()
    ids = torch.randint(0, 50, (1, 6))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        out = m(ids, mask)
        short = m(ids[:, :4])
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state[0, :4].mean(0, keepdim=True))
    torch.testing.assert_close(out.pooler_output, short.pooler_output, atol=1e-6, rtol=0)


def test_causal_outputs_do_not_see_the_future():
    m = vit.TextEncoder(50, 16, 2, 2, max_len=8, causal=True).eval()
    ids = torch.randint(0, 50, (1, 6))
    ids2 = ids.clone()
    ids2[0, 4:] = (ids2[0, 4:] + 1) % 50
    with torch.no_grad():
        a, b = m(ids).last_hidden_state, m(ids2).last_hidden_state
    torch.testing.assert_close(a[0, :4], b[0, :4], atol=1e-6, rtol=0)
    assert not torch.allclose(a[0, 4:], b[0, 4:])
    # causal + padding together still agree between the fused and explicit paths
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    with torch.no_grad():
        fused = m(ids, mask).last_hidden_state
        out = m(ids, mask, return_attention=True)
    torch.testing.assert_close(fused, out.last_hidden_state, atol=1e-5, rtol=0)
    assert torch.all(out.attentions[0][0, :, :, 5] == 0)


def test_text_and_vision_share_the_same_classes():
    t = vit.TextEncoder(10, 32, 2, 4, max_len=8, norm_layer="rmsnorm", mlp_layer="swiglu", norm_first=False)
    v = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=2)
    assert type(t.blocks) is type(v.blocks) is Encoder
    assert all(type(b) is Block for b in list(t.blocks) + list(v.blocks))
    assert type(t.blocks[0].attn) is type(v.blocks[0].attn)


def test_sincos_positions_and_errors():
    m = vit.TextEncoder(10, 16, 1, 2, max_len=6, pos_embed="sincos")
    torch.testing.assert_close(m.pos_embed[0], vit.layers.sincos_1d(6, 16))
    with pytest.raises(ValueError, match="longer than max_len=6"):
        m(torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="needs class_token=True"):
        vit.TextEncoder(10, 16, 1, 2, global_pool="token")


def test_pool_names_other_than_timms_are_refused_naming_the_choices():
    for name in ("cls", "mean"):
        with pytest.raises(ValueError, match=f"unknown global_pool '{name}'; choose one of 'token', 'avg'"):
            vit.TextEncoder(20, 16, 1, 2, global_pool=name)


def _torch_encoder(D=16, H=2, depth=1, norm_first=True, final_norm=True, **layer_kwargs):
    kw = dict(dim_feedforward=4 * D, dropout=0.0, activation="gelu", batch_first=True, norm_first=norm_first)
    layer = nn.TransformerEncoderLayer(D, H, **{**kw, **layer_kwargs})
    return nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(D) if final_norm else None,
                                 enable_nested_tensor=False).eval()


@pytest.mark.parametrize("ref_kwargs,ours_kwargs,message", [
    (dict(activation="relu"), {}, "uses activation relu, this model's MLP uses GELU"),
    (dict(activation=nn.GELU(approximate="tanh")), {}, "uses activation GELU(approximate='tanh'), this"),
    ({}, dict(norm_eps=1e-6), "eps=1e-05, this model's 1e-06; build this model with norm_eps=1e-05"),
    (dict(norm_first=False, final_norm=False), {}, "has norm_first=False, this model norm_first=True"),
    ({}, dict(mlp_layer="swiglu"), "MLP is SwiGLU"),
    ({}, dict(mlp_layer="gelu_tanh"), "this model's MLP uses GELUTanh, nn.TransformerEncoderLayer's GELU is the erf"),
    ({}, dict(norm_layer="rmsnorm"), "LayerNorm, this model's is RMSNorm; build this model with norm_layer='layernorm"),
    (dict(H=4), {}, "4 attention heads, this model 2"),
    (dict(final_norm=False), {}, "has no final norm, this model has one"),
    (dict(bias=False), {}, "bias=False"),
])
def test_load_torch_encoder_refuses_what_would_compute_otherwise(ref_kwargs, ours_kwargs, message):
    ref = _torch_encoder(**ref_kwargs)
    ours = vit.TextEncoder(10, 16, 1, 2, max_len=8, pos_embed="none", **{"norm_eps": 1e-5, **ours_kwargs})
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ours.load_torch_encoder(ref)
    assert all(torch.equal(before[k], v) for k, v in ours.state_dict().items())  # nothing copied
    # and the matching encoder loads and agrees (the check is not vacuous: same shapes, other options)
    ok = _torch_encoder()
    ours = vit.TextEncoder(10, 16, 1, 2, max_len=8, pos_embed="none", norm_eps=1e-5).eval()
    ours.load_torch_encoder(ok)
    x = torch.randint(0, 10, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(ours(x).last_hidden_state, ok(ours.token_embed(x)), atol=1e-5, rtol=0)


EXAMPLE_EPOCHS = {"learn": 16, "none": 6}  # BERT with its pooler head plateaus ~10 epochs, then learns (99% at 16)


def _example():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import text_classification as ex

    return ex


@pytest.mark.slow
def test_example_positions_decide_who_did_what(tmp_path):
    """examples/text_classification.py, shortened: word order is learnable only with positions."""
    import random

    ex = _example()
    rng = random.Random(0)
    data = ex.make_sentences(rng)
    rng.shuffle(data)
    train, test = data[:1152], data[1152:]
    # a bag of words is exactly uninformative: each word multiset appears with both labels
    bags = {}
    for text, y in data:
        bags.setdefault(tuple(sorted(w for w in text.split() if w in ex.NOUNS)), set()).add(y)
    assert all(labels == {0, 1} for labels in bags.values())
    tok = ex.train_tokenizer([t for t, _ in train])
    assert all(len(tok(w, add_special_tokens=False)["input_ids"]) == 1 for w in ex.NOUNS + ex.VERBS)  # words = tokens
    for pos, bound in (("learn", 0.97), ("none", 0.62)):
        acc = ex.run(ex.small_model(tok, 0, pos_embed=pos), tok, list(train), test, EXAMPLE_EPOCHS[pos], 0, 1e-3, pos)
        assert acc >= bound if pos == "learn" else acc <= bound


def test_example_prints_one_line_per_epoch(capsys):
    """The example runs minutes: without a terminal (no progress bar) it still says how each epoch went."""
    import random

    ex = _example()
    data = ex.make_sentences(random.Random(0))[:96]
    tok = ex.train_tokenizer([t for t, _ in data])
    ex.run(ex.small_model(tok, 0), tok, data[:64], data[64:], 2, 0, 1e-3, "pos_embed=learn")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pos_embed=learn  epoch")]
    assert [line.split()[2] for line in lines] == ["1/2", "2/2"]
    assert all("train loss" in line and "test acc" in line for line in lines)


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_heads=0), "num_heads=0 is not a whole number of at least 1"),
    (dict(embed_dim=0), "embed_dim=0 is not a whole number of at least 1"),
    (dict(embed_dim=18), "embed_dim=18 is not a multiple of num_heads=4"),
    (dict(depth=-1), "depth=-1 is not a whole number of at least 0"),
    (dict(max_len=2.0), "max_len=2.0 is not a whole number"),
    (dict(norm_eps=float("nan")), "norm_eps=nan is not a finite number between 0 and 1"),
    (dict(norm_eps=-1.0), "norm_eps=-1.0 is not a finite number between 0 and 1"),
])
@pytest.mark.parametrize("cls", ["TextEncoder", "TextDecoder"])
def test_text_model_sizes_are_one_sentence(cls, kwargs, message):
    """A NaN or negative eps gave NaN outputs, zero heads or width a ZeroDivisionError from deep in torch."""
    args = {"vocab_size": 10, "embed_dim": 16, "depth": 1, "num_heads": 4, "max_len": 8, **kwargs}
    with pytest.raises(ValueError, match=f"{cls}: {message}"):
        getattr(vit.models, cls)(**args)
