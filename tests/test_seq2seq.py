"""Decoder and encoder-decoder: nn.Transformer as the oracle, KV cache vs full forward, beam vs exhaustive search."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import vit
from vit.layers import CachedSelfAttention, CrossAttention
from vit.models import Seq2Seq, TextDecoder, beam_search

D, H = 32, 4
PAD, BOS, EOS = 0, 1, 2
# nn.Transformer's own notes on its nested-tensor fast path, not about our code
NESTED = pytest.mark.filterwarnings("ignore:enable_nested_tensor", "ignore:The PyTorch API of nested tensors")


def _pair(norm_first: bool, seed: int = 0) -> tuple[nn.Transformer, Seq2Seq]:
    torch.manual_seed(seed)
    torch_model = nn.Transformer(D, H, 2, 2, 2 * D, dropout=0.0, activation="gelu", batch_first=True,
                                 norm_first=norm_first).eval()
    with torch.no_grad():  # decoder norms unlike one another (all start at 1 and 0): one in the wrong place shows
        for name, p in torch_model.named_parameters():
            if name.startswith("decoder.") and "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    ours = Seq2Seq.text(11, 13, D, 2, H, mlp_ratio=2, max_src_len=16, max_tgt_len=16, norm_first=norm_first,
                        final_norm=True, norm_eps=1e-5).eval()
    ours.load_torch_transformer(torch_model)
    return torch_model, ours


def _source(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 11, (3, 7), generator=g)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    return src, mask


def _model(norm_first: bool = True, seed: int = 1, vocab: int = 13, dtype=torch.float32) -> Seq2Seq:
    torch.manual_seed(seed)
    m = Seq2Seq.text(11, vocab, D, 2, H, mlp_ratio=2, max_src_len=16, max_tgt_len=16, norm_first=norm_first)
    for p in m.parameters():  # larger weights than the init, so that the distributions are far from uniform
        if p.dim() > 1:
            p.data.normal_(0, 0.3)
    return m.to(dtype).eval()


@pytest.mark.parametrize("norm_first", [True, False])
@NESTED
def test_matches_torch_transformer(norm_first):
    """Source padding, causal target mask: our encoder-decoder loaded with nn.Transformer's weights gives its
    decoder outputs (every target position) and its memory (real source tokens) to 1e-5."""
    torch_model, ours = _pair(norm_first)
    src, mask = _source()
    tgt = torch.randint(3, 13, (3, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        src_emb = ours.encoder.token_embed(src) + ours.encoder.pos_embed[:, :7]
        tgt_emb = ours.decoder.embed(tgt)
        pad = mask == 0  # torch's key-padding convention: True = ignore
        ref = torch_model(src_emb, tgt_emb, tgt_mask=nn.Transformer.generate_square_subsequent_mask(6),
                          src_key_padding_mask=pad, memory_key_padding_mask=pad, tgt_is_causal=True)
        ref_memory = torch_model.encoder(src_emb, src_key_padding_mask=pad)
        memory, memory_mask = ours.encode(src, mask)
        out = ours.decoder.forward_features(tgt, memory, memory_mask)[0]
        unmasked = ours.decoder.forward_features(tgt, memory, None)[0]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    real = mask.bool()
    torch.testing.assert_close(memory[real], ref_memory[real], atol=1e-5, rtol=0)
    assert (out - unmasked).abs().max() > 1e-2  # the padding mask matters: the comparison above is not vacuous
    if not norm_first:  # the pinned quirk: torch's post-norm fast path in eval zeroes padded encoder positions
        assert (ref_memory[~real] == 0).all() and (memory[~real] != 0).all()


@NESTED
def test_torch_transformer_mismatch_is_refused_and_copies_nothing():
    torch.manual_seed(0)
    relu = nn.Transformer(D, H, 2, 2, 2 * D, dropout=0.0, batch_first=True)  # PyTorch's default ReLU
    ours = Seq2Seq.text(11, 13, D, 2, H, mlp_ratio=2, norm_eps=1e-5)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(ValueError, match="activation='gelu'"):
        ours.load_torch_transformer(relu)
    post = nn.Transformer(D, H, 2, 2, 2 * D, dropout=0.0, activation="gelu", batch_first=True)
    post_ours = Seq2Seq.text(11, 13, D, 2, H, mlp_ratio=2, norm_first=False, norm_eps=1e-5)  # no final norms
    with pytest.raises(ValueError, match="final_norm=True"):
        post_ours.load_torch_transformer(post)
    gelu = nn.Transformer(D, H, 2, 2, 2 * D, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
    with pytest.raises(ValueError, match="norm_eps=1e-05"):
        Seq2Seq.text(11, 13, D, 2, H, mlp_ratio=2).load_torch_transformer(gelu)  # our default eps is 1e-6
    assert all(torch.equal(before[k], v) for k, v in ours.state_dict().items())


@pytest.mark.parametrize("norm_first", [True, False])
def test_cached_decoding_equals_full_forward(norm_first):
    """A prefix of 3 tokens, then one token per step through the cache == one teacher-forced forward, <= 1e-5."""
    m = _model(norm_first)
    src, mask = _source()
    tgt = torch.randint(3, 13, (3, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        memory, memory_mask = m.encode(src, mask)
        full = m.decoder(tgt, memory, memory_mask)
        cache = m.decoder.init_cache(memory, memory_mask)
        steps = [m.decoder(tgt[:, :3], None, cache=cache)]  # a chunk: the bottom-right aligned causal mask
        steps += [m.decoder(tgt[:, t : t + 1], None, cache=cache) for t in range(3, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert cache.length == 9 and cache.layers[0].self_kv[0].shape == (3, H, 9, D // H)
    assert full.std() > 0.5  # logits that differ across positions and tokens: a comparison that could fail


def test_greedy_with_cache_equals_without():
    m = _model()
    src, mask = _source()
    cached = m.generate(src, mask, max_new_tokens=12)
    full = m.generate(src, mask, max_new_tokens=12, use_cache=False)
    assert torch.equal(cached.sequences, full.sequences)
    torch.testing.assert_close(cached.scores, full.scores, atol=1e-5, rtol=0)
    assert len(set(map(tuple, cached.sequences.tolist()))) == 3  # three different sources, three different outputs


@pytest.mark.parametrize("seed", range(6))
def test_beam_search_with_cache_equals_without(seed):
    """4 beams over 12 tokens: the cache must follow each survivor's parent beam (DecoderCache.reorder), so the
    cached search returns the uncached one's sequences and scores; a cache left in place gives other beams."""
    m = _model(seed=seed, vocab=12)
    src, mask = _source(seed + 10)
    cached = m.generate(src, mask, max_new_tokens=8, num_beams=4)
    full = m.generate(src, mask, max_new_tokens=8, num_beams=4, use_cache=False)
    assert torch.equal(cached.sequences, full.sequences)
    torch.testing.assert_close(cached.scores, full.scores, atol=1e-5, rtol=0)
    assert cached.sequences.shape[1] > 2  # hypotheses long enough for beams to have been reordered


def _count_calls(module: nn.Module, calls: list) -> torch.utils.hooks.RemovableHandle:
    return module.register_forward_hook(lambda mod, args, out: calls.append(tuple(args[0].shape)))


@pytest.mark.parametrize("num_beams", [1, 3])
def test_cross_attention_keys_and_values_are_computed_once_per_source(num_beams):
    """Each block's memory keys/values: one projection of the B sources per generate (not per step, not per
    beam); the self-attention projects one new token per step."""
    m = _model()
    src, mask = _source()
    kv_calls, qkv_calls = [], []
    handles = [_count_calls(blk.cross_attn.kv, kv_calls) for blk in m.decoder.blocks]
    handles += [_count_calls(m.decoder.blocks[0].attn.qkv, qkv_calls)]
    out = m.generate(src, mask, max_new_tokens=6, num_beams=num_beams)
    for h in handles:
        h.remove()
    steps = out.sequences.shape[1]
    assert kv_calls == [(3, 7, D)] * len(m.decoder.blocks)
    assert qkv_calls == [(3 * num_beams, 1, D)] * steps and steps > 1


def test_beam_one_equals_greedy():
    m = _model()
    src, mask = _source()
    for penalty in (0.0, 1.0):
        greedy = m.generate(src, mask, max_new_tokens=10, length_penalty=penalty)
        beam = beam_search(m.decoder, *m.encode(src, mask), BOS, EOS, PAD, 10, num_beams=1, length_penalty=penalty)
        assert torch.equal(greedy.sequences, beam.sequences)
        torch.testing.assert_close(greedy.scores, beam.scores, atol=1e-6, rtol=0)


def _sequence_log_prob(m: Seq2Seq, src, mask, seq: list[int]) -> float:
    """log p(seq | src) from one teacher-forced forward (float64), the ban on <pad>/<bos> applied as generation
    does."""
    tgt = torch.tensor([[BOS] + seq])
    logits = m(src, tgt[:, :-1], mask)[0]
    logits[:, [PAD, BOS]] = float("-inf")
    return logits.log_softmax(-1).gather(1, tgt[0, 1:, None]).sum().item()


@pytest.mark.parametrize("penalty", [0.0, 1.0])
def test_beam_search_is_exhaustive_when_wide_enough_float64(penalty):
    """Tokens {<eos>, a, b}, at most 4 new: 31 hypotheses. 32 beams keep them all, so beam search must return
    the best of an exhaustive enumeration, with its score; a narrow beam returns a real hypothesis whose score is
    its own log-probability recomputed by a full forward (the cache followed each beam's parents)."""
    m = _model(vocab=5, dtype=torch.float64, seed=4)
    src, mask = _source()
    src, mask = src[1:2], mask[1:2]
    hyps = [list(s) + [EOS] for n in range(4) for s in itertools.product((3, 4), repeat=n)]
    hyps += [list(s) for s in itertools.product((3, 4), repeat=4)]
    with torch.no_grad():
        scored = [(_sequence_log_prob(m, src, mask, h) / len(h) ** penalty, h) for h in hyps]
        best_score, best = max(scored)
        out = m.generate(src, mask, max_new_tokens=4, num_beams=32, length_penalty=penalty)
        seq = [t for t in out.sequences[0].tolist() if t != PAD]
        assert seq == best
        assert abs(out.scores.item() - best_score) < 1e-10
        narrow = m.generate(src, mask, max_new_tokens=4, num_beams=2, length_penalty=penalty)
        seq = [t for t in narrow.sequences[0].tolist() if t != PAD]
        assert abs(narrow.scores.item() - _sequence_log_prob(m, src, mask, seq) / len(seq) ** penalty) < 1e-10
    assert len({round(s, 6) for s, _ in scored}) == len(scored)  # no ties: "the best" is one hypothesis


def _beam_by_hand(m: Seq2Seq, src, mask, beams: int, steps: int, penalty: float) -> tuple[list[int], float]:
    """Beam search written out for one source, each prefix through a full forward: every unfinished hypothesis
    extended by every token (<pad>, <bos> banned), finished ones carried as they are, the `beams` best by
    log p / length**penalty kept; the best of the last beams is returned with its score."""
    hyps = [([], 0.0, False)]  # (tokens, summed log-probability, finished)
    for _ in range(steps):
        cands = []
        for seq, score, done in hyps:
            if done:
                cands.append((seq, score, True))
                continue
            logits = m(src, torch.tensor([[BOS] + seq]), mask)[0, -1]
            logits[[PAD, BOS]] = float("-inf")
            logp = logits.log_softmax(-1)
            cands += [(seq + [t], score + logp[t].item(), t == EOS) for t in range(len(logp)) if t not in (PAD, BOS)]
        hyps = sorted(cands, key=lambda c: -c[1] / len(c[0]) ** penalty)[:beams]
        if all(done for _, _, done in hyps):
            break
    seq, score, _ = max(hyps, key=lambda c: c[1] / len(c[0]) ** penalty)
    return seq, score / len(seq) ** penalty


@pytest.mark.parametrize("penalty", [0.0, 1.0, 2.0])
def test_beam_search_equals_beam_search_by_hand_float64(penalty):
    """3 beams over 8 tokens, 5 steps, three sources: the hypotheses kept at each step are ranked by the
    length-normalised score, as the hand-written search does, so the same sequence wins with the same score."""
    m = _model(vocab=8, dtype=torch.float64, seed=2)
    src, mask = _source()
    with torch.no_grad():
        out = m.generate(src, mask, max_new_tokens=5, num_beams=3, length_penalty=penalty)
        for i in range(3):
            seq, score = _beam_by_hand(m, src[i : i + 1], mask[i : i + 1], 3, 5, penalty)
            assert [t for t in out.sequences[i].tolist() if t != PAD] == seq
            assert abs(out.scores[i].item() - score) < 1e-10


def test_generation_stops_at_eos_and_pads_after():
    m = _model()
    src, mask = _source()
    with torch.no_grad():
        m.decoder.head.weight.zero_()
        m.decoder.head.bias.fill_(0.0)
        m.decoder.head.bias[EOS] = 5.0
    out = m.generate(src, mask, max_new_tokens=8)
    assert out.sequences.tolist() == [[EOS]] * 3  # every source ended at once: no step after
    out = m.generate(src, mask, max_new_tokens=8, num_beams=3)  # runs on while other beams are unfinished
    assert (out.sequences[:, 0] == EOS).all() and (out.sequences[:, 1:] == PAD).all()
    with torch.no_grad():  # now <eos> is likeliest only after two steps' worth of position embedding
        m.decoder.head.bias[EOS] = 0.0
        m.decoder.head.bias[5] = 1.0
    out = m.generate(src, mask, max_new_tokens=8)
    assert out.sequences.tolist() == [[5] * 8] * 3 and PAD not in out.sequences


def test_generate_refuses_bad_requests():
    m = _model()
    src, mask = _source()
    assert m.generate(src, mask, max_new_tokens=16).sequences.shape[1] <= 16  # every position of max_len=16
    with pytest.raises(ValueError, match="at most 16"):
        m.generate(src, mask, max_new_tokens=17)
    with pytest.raises(ValueError, match="num_beams must be at least 1"):
        m.generate(src, mask, num_beams=0)
    with pytest.raises(ValueError, match="must differ"):
        Seq2Seq(m.encoder, m.decoder, bos_id=1, eos_id=1)
    image = Seq2Seq(vit.VisionTransformer(16, 8, 1, 0, embed_dim=D, depth=1, num_heads=H), m.decoder)
    with pytest.raises(ValueError, match="without src_mask"):
        image.generate(torch.zeros(1, 1, 16, 16), torch.ones(1, 5))



@pytest.mark.parametrize("kwargs,message", [
    (dict(max_new_tokens=4.0), "max_new_tokens must be at least 1 .*got 4.0"),
    (dict(max_new_tokens=True), "max_new_tokens must be at least 1 .*got True"),
    (dict(num_beams=2.0), "num_beams must be at least 1 .*got 2.0"),
    (dict(length_penalty=float("nan")), "length_penalty must be a finite number .*got nan"),
    (dict(length_penalty="1"), "length_penalty must be a finite number"),
    (dict(length_penalty=-1e308), r"length_penalty=-1e\+308 makes length\*\*length_penalty overflow for up to "
                                  r"16 tokens"),  # 16**-1e308 is 0: every score was -inf
    (dict(num_beams=10**8), r"beam search with num_beams=100000000 over 3 sources of 7 tokens, up to 16 new tokens "
                            r"each, needs about \d+ GB, more than the \d+ GB of this cpu device"),
])
def test_generate_refuses_bad_arguments_in_one_sentence(kwargs, message):
    """Floats, NaN and a beam count whose caches cannot fit are refused before anything is allocated (10**8
    beams asked the allocator for terabytes)."""
    m = _model()
    src, mask = _source()
    with pytest.raises(ValueError, match=message) as e:
        m.generate(src, mask, **kwargs)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("ids,message", [
    (dict(eos_id=100), r"eos_id=100 is not a token id of the decoder's vocabulary \(0 .. 12\)"),
    (dict(pad_id=-1), r"pad_id=-1 is not a token id of the decoder's vocabulary"),
    (dict(bos_id=1.0), r"bos_id=1.0 is not a token id"),
])
def test_special_ids_outside_the_vocabulary_are_refused(ids, message):
    """An <eos> of 100 on a 13-token vocabulary can never be generated (decoding never stops early); a <pad> of
    -1 would ban the last real token: refused when the model is made, and by the search functions."""
    m = _model()
    with pytest.raises(ValueError, match=message):
        Seq2Seq.text(11, 13, D, 1, H, **ids)
    memory = torch.randn(2, 3, D)
    args = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD, **ids}
    with pytest.raises(ValueError, match=message):
        beam_search(m.decoder, memory, None, args["bos_id"], args["eos_id"], args["pad_id"], 4, num_beams=2)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_an_empty_batch_generates_nothing(num_beams):
    m = _model()
    out = m.generate(torch.zeros(0, 7, dtype=torch.long), torch.zeros(0, 7, dtype=torch.long), num_beams=num_beams)
    assert out.sequences.shape == (0, 0) and out.sequences.dtype == torch.long and out.scores.shape == (0,)


def test_loss_is_the_mean_over_real_tokens_and_zero_on_padding_only():
    """The loss is PyTorch's mean cross-entropy over non-padding labels (label smoothing too); a batch of only
    padding gives 0 with a graph (zero gradients) where a mean over no tokens is NaN (as transformers' is)."""
    m = _model().train()
    src, mask = _source()
    tgt = torch.randint(3, 13, (3, 6), generator=torch.Generator().manual_seed(3))
    tgt[1, 4:] = PAD
    logits = m(src, tgt[:, :-1], mask)
    for smoothing in (0.0, 0.1):
        expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD,
                                                     label_smoothing=smoothing)
        torch.testing.assert_close(m.loss(src, tgt, mask, label_smoothing=smoothing), expected)
    tgt[:, 1:] = PAD
    loss = m.loss(src, tgt, mask, label_smoothing=0.1)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in m.parameters())


def test_image_to_text_reads_patch_tokens():
    """A ViT's tokens as the memory: the decoder's cross-attention spans [CLS] + every patch, and the cache
    gives the full forward's logits there too."""
    torch.manual_seed(0)
    encoder = vit.VisionTransformer((16, 32), 8, 1, 0, embed_dim=D, depth=1, num_heads=H)
    m = Seq2Seq(encoder, TextDecoder(13, D, 2, H, max_len=8)).eval()
    x = torch.randn(2, 1, 16, 32)
    tgt = torch.randint(3, 13, (2, 5))
    with torch.no_grad():
        memory, _ = m.encode(x)
        states, _, cross = m.decoder.forward_features(tgt, memory, return_attention=True)
        cache = m.decoder.init_cache(memory)
        steps = torch.cat([m.decoder(tgt[:, t : t + 1], None, cache=cache) for t in range(5)], dim=1)
    assert memory.shape == (2, 1 + 2 * 4, D) and cross[0].shape == (2, H, 5, 9)
    torch.testing.assert_close(cross[0].sum(-1), torch.ones(2, H, 5))
    torch.testing.assert_close(steps, m.decoder.head(states), atol=1e-5, rtol=0)


def test_every_parameter_gets_a_gradient():
    m = _model().train()
    src, mask = _source()
    tgt = torch.randint(3, 13, (3, 6))
    m.loss(src, tgt, mask).backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert missing == []


def _attention_float64(q, k, v, mask):
    scores = (q.double() @ k.double().transpose(-2, -1)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~mask, float("-inf")) if mask is not None else scores
    p = scores.softmax(-1)
    return p @ v.double(), p


@pytest.mark.parametrize("fused", [True, False])
def test_cross_attention_matches_float64_formula(fused):
    """softmax(Q K^T / sqrt(d)) V with Q from x, K and V from the memory, padded memory keys masked; the batch
    size equals the query count on purpose (a (B, M) padding mask must not be read as a (Nq, M) mask)."""
    torch.manual_seed(0)
    attn = CrossAttention(D, H, fused_attn=fused).eval()
    x, memory = torch.randn(4, 4, D), torch.randn(4, 6, D)
    keep = torch.ones(4, 6, dtype=torch.long)
    keep[1, 2:] = 0
    keep[3, 5:] = 0
    out, probs = attn(x, memory, keep, return_attention=not fused)
    q = attn.q(x).view(4, 4, H, -1).transpose(1, 2)
    k, v = attn.kv(memory).view(4, 6, 2, H, -1).permute(2, 0, 3, 1, 4)
    ref, p = _attention_float64(q, k, v, keep.bool()[:, None, None, :])
    ref = attn.proj(ref.transpose(1, 2).reshape(4, 4, D).float())
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    if not fused:
        torch.testing.assert_close(probs.double(), p, atol=1e-6, rtol=0)
        assert (probs[1, :, :, 2:] == 0).all()


@pytest.mark.parametrize("fused", [True, False])
def test_cached_self_attention_is_attention_step_by_step(fused):
    """CachedSelfAttention holds Attention's weights; its chunked steps equal Attention's causal forward."""
    torch.manual_seed(0)
    full = vit.Attention(D, H).eval()
    cached = CachedSelfAttention(D, H, fused_attn=fused).eval()
    cached.load_state_dict(full.state_dict())
    x = torch.randn(2, 7, D)
    ref, _ = full(x, is_causal=True)
    a, past, _ = cached.step(x[:, :4])
    b, past, probs = cached.step(x[:, 4:], past, return_attention=True)
    torch.testing.assert_close(torch.cat([a, b], 1), ref, atol=1e-5, rtol=0)
    assert past[0].shape == (2, H, 7, D // H) and probs.shape == (2, H, 3, 7)
    assert (probs[:, :, 0, 5:] == 0).all() and (probs[:, :, 0, :5] > 0).all()  # token 4 sees keys 0..4


# --- the two examples -----------------------------------------------------------------------------------------


def _example(name: str):
    import importlib.util
    import sys
    from pathlib import Path

    if f"_example_{name}" not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"_example_{name}", path)
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[f"_example_{name}"]


def test_numerals_are_written_as_people_write_them():
    ex = _example("translate_numerals")
    known = {
        7: ("七", "seven"), 10: ("十", "ten"), 12: ("十二", "twelve"), 20: ("二十", "twenty"),
        101: ("一百零一", "one hundred one"), 110: ("一百一十", "one hundred ten"),
        321: ("三百二十一", "three hundred twenty one"), 1005: ("一千零五", "one thousand five"),
        1010: ("一千零一十", "one thousand ten"), 1100: ("一千一百", "one thousand one hundred"),
        10010: ("一万零一十", "ten thousand ten"), 11000: ("一万一千", "eleven thousand"),
        30000: ("三万", "thirty thousand"), 40506: ("四万零五百零六", "forty thousand five hundred six"),
        99999: ("九万九千九百九十九", "ninety nine thousand nine hundred ninety nine"),
    }
    assert {n: (ex.chinese(n), " ".join(ex.english(n))) for n in known} == known
    sources = {ex.chinese(n) for n in range(1, 100_000)}
    assert len(sources) == 99_999  # one numeral per number: the task is a function, exact match is reachable
    train, test = ex.split_numbers(999, 0.1, 0)
    assert not set(train) & set(test) and len(test) == 99


@pytest.mark.slow
def test_translate_numerals_learns_held_out_numbers():
    """examples/translate_numerals.py, test-sized: numbers below 1000, held-out numbers translated exactly."""
    ex = _example("translate_numerals")
    model, acc, _, n = ex.run(999, steps=300, batch_size=64, lr=3e-3, dim=32, depth=2, heads=2, beams=1, seed=0)
    assert acc >= 0.9
    walk = ex.walk_through(model, n)
    assert walk[0].startswith(f"source {ex.chinese(n)}") and "'<eos>'" in walk[-1]


@pytest.mark.slow
def test_image_to_text_reads_digits_and_looks_at_them(tmp_path):
    """examples/image_to_text.py, test-sized: the ViT encoder + decoder read held-out handwriting as words,
    each word's relevance lies mostly on its own digit, and the picture is written."""
    ex = _example("image_to_text")
    model, acc, _, test = ex.run(steps=300, batch_size=64, lr=3e-3, dim=64, depth=2, heads=4, seed=0, test_size=300)
    assert acc >= 0.75  # 90.3% here (the full run: 96.2%)
    rel, seqs = ex.word_relevance(model, test[0][:50])
    assert ex.own_digit_share(rel, seqs) > 0.3  # 0.40 here; a quarter of the patches or fewer lie on its own digit
    ex.draw(tmp_path / "x.png", test[0][:2], rel[:2], seqs[:2])
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
