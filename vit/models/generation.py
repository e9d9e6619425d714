"""Autoregressive decoding for a `TextDecoder`: greedy search and beam search, with or without the KV cache.

Both start from <bos>, pick tokens from log p(y_t | y_<t, source) and stop a sequence at <eos> (the rows after
it are <pad>), or after `max_new_tokens`. <pad> and <bos> are never generated. A sequence's score is its
summed log-probability divided by length**length_penalty (length counting <eos>; 0 = the plain sum, 1 = the
mean per token, Hugging Face's default).

Beam search keeps the K best hypotheses per source, finished or not, ranked by that same score: at every step
each unfinished beam is extended by every token and each finished one is carried over unchanged, and the best
K candidates survive. With K = 1 this is greedy search; with K at least the number of all hypotheses it is
exhaustive search (both checked in tests). The self-attention cache follows each survivor's parent beam
(`DecoderCache.reorder`); the memory's keys and values are computed once per source and shared by its beams.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from .decoder import DecoderCache, TextDecoder

__all__ = ["GenerateOutput", "beam_search", "check_generate_args", "check_special_ids", "greedy_search"]


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # (B, L) generated ids without <bos>: <eos> ends a sequence, <pad> fills the rest
    scores: torch.Tensor  # (B,) sum of log-probabilities / length**length_penalty


def _log_probs(
    decoder: TextDecoder, ids: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None,
    cache: DecoderCache | None, banned: list[int],
) -> torch.Tensor:
    """log p(next token) (B, V) for prefixes ids (B, t): the last id through the cache, or the whole prefix."""
    if cache is not None:
        logits = decoder(ids[:, -1:], None, cache=cache)[:, -1]
    else:
        logits = decoder(ids, memory, memory_mask)[:, -1]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logits[:, banned] = float("-inf")
    return logits.log_softmax(dim=-1)


def check_special_ids(bos_id: int, eos_id: int, pad_id: int, vocab_size: int) -> None:
    """Refuse, in one sentence, special ids that are not distinct ids of the decoder's vocabulary: an <eos> past
    it can never be generated (decoding never stops), a <pad> of -1 would ban the last real token."""
    for key, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
        if type(value) is not int or not 0 <= value < vocab_size:
            raise ValueError(f"{key}={value!r} is not a token id of the decoder's vocabulary (0 .. {vocab_size - 1}); "
                             "pass the tokenizer's id for it.")
    if len({bos_id, eos_id, pad_id}) < 3:
        raise ValueError(f"bos_id, eos_id and pad_id must differ, got {bos_id}, {eos_id} and {pad_id}.")


def check_generate_args(decoder: TextDecoder, bos_id: int, eos_id: int, pad_id: int, max_new_tokens: int,
                        num_beams: int = 1, length_penalty: float = 1.0) -> None:
    """Every decoding argument, type and range, before anything is computed (one sentence each)."""
    for key, value in (("max_new_tokens", max_new_tokens), ("num_beams", num_beams)):
        if type(value) is not int or value < 1:
            raise ValueError(f"{key} must be at least 1 (a whole number of tokens or beams), got {value!r}.")
    if type(length_penalty) not in (int, float) or not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number (0: the summed log-probability, 1: per token), "
                         f"got {length_penalty!r}.")
    bound = 80 / math.log(max(max_new_tokens, 2))  # length**penalty within float32 (e**88) for every length
    if abs(length_penalty) > bound:  # past it the scores are divided by inf or 0: -inf or 0 for every hypothesis
        raise ValueError(f"length_penalty={length_penalty!r} makes length**length_penalty overflow for up to "
                         f"{max_new_tokens} tokens (every score would be -inf or 0); use a value between "
                         f"{-bound:.0f} and {bound:.0f} (e.g. 1).")
    check_special_ids(bos_id, eos_id, pad_id, decoder.head.out_features)


def _check_beam_memory(decoder: TextDecoder, memory: torch.Tensor, num_beams: int, max_new_tokens: int) -> None:
    """Bound what beam search allocates before it allocates it: B*K rows of the memory and its cross-attention
    keys and values (M tokens), of the self-attention cache and ids (up to max_new_tokens + 1 tokens), and of
    float32 scores over the vocabulary; more than the device holds is one sentence, not an allocator error."""
    B, M, D = memory.shape
    rows, L, V = B * num_beams, max_new_tokens + 1, decoder.head.out_features
    depth, item = len(decoder.blocks), memory.element_size()
    need = rows * ((1 + 2 * depth) * M * D * item + 2 * depth * L * D * item + 8 * L + 4 * 4 * V)
    if memory.device.type == "cuda":
        have = torch.cuda.get_device_properties(memory.device).total_memory
    else:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        raise ValueError(f"beam search with num_beams={num_beams} over {B} sources of {M} tokens, up to "
                         f"{max_new_tokens} new tokens each, needs about {need / 2**30:.0f} GB, more than the "
                         f"{have / 2**30:.0f} GB of this {memory.device.type} device; use fewer beams, fewer "
                         "sources per call or fewer new tokens.")


def _empty(memory: torch.Tensor) -> GenerateOutput:
    """No sources (B = 0): no sequences, no scores."""
    return GenerateOutput(torch.zeros(0, 0, dtype=torch.long, device=memory.device),
                          torch.zeros(0, dtype=memory.dtype, device=memory.device))


@torch.no_grad()
def greedy_search(
    decoder: TextDecoder,
    memory: torch.Tensor,
    memory_mask: torch.Tensor | None,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    use_cache: bool = True,
) -> GenerateOutput:
    """The most likely next token, step by step, for every source in memory (B, M, D)."""
    check_generate_args(decoder, bos_id, eos_id, pad_id, max_new_tokens, 1, length_penalty)
    B = memory.shape[0]
    if B == 0:
        return _empty(memory)
    ids = torch.full((B, 1), bos_id, dtype=torch.long, device=memory.device)
    score = torch.zeros(B, dtype=memory.dtype, device=memory.device)
    length = torch.zeros(B, dtype=torch.long, device=memory.device)
    done = torch.zeros(B, dtype=torch.bool, device=memory.device)
    cache = decoder.init_cache(memory, memory_mask) if use_cache else None
    for _ in range(max_new_tokens):
        logp = _log_probs(decoder, ids, memory, memory_mask, cache, [pad_id, bos_id])  # (B, V)
        token = logp.argmax(dim=-1)
        score = score + torch.where(done, 0.0, logp.gather(1, token[:, None])[:, 0]).to(score.dtype)
        length = length + (~done).long()
        token = token.masked_fill(done, pad_id)
        ids = torch.cat([ids, token[:, None]], dim=1)
        done = done | (token == eos_id)
        if done.all():
            break
    return GenerateOutput(ids[:, 1:], score / length.to(score.dtype) ** length_penalty)


@torch.no_grad()
def beam_search(
    decoder: TextDecoder,
    memory: torch.Tensor,
    memory_mask: torch.Tensor | None,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    num_beams: int = 4,
    length_penalty: float = 1.0,
    use_cache: bool = True,
) -> GenerateOutput:
    """The best of `num_beams` hypotheses per source in memory (B, M, D); see the module docstring."""
    check_generate_args(decoder, bos_id, eos_id, pad_id, max_new_tokens, num_beams, length_penalty)
    B, K, dev = memory.shape[0], num_beams, memory.device
    if B == 0:
        return _empty(memory)
    _check_beam_memory(decoder, memory, K, max_new_tokens)
    cache = None
    if use_cache:
        cache = decoder.init_cache(memory, memory_mask)  # the memory's keys and values: once per source
        cache.repeat_interleave(K)  # ... shared by its K beams (rows b*K .. b*K + K-1)
    memory = memory.repeat_interleave(K, 0)
    memory_mask = None if memory_mask is None else memory_mask.repeat_interleave(K, 0)
    ids = torch.full((B * K, 1), bos_id, dtype=torch.long, device=dev)
    scores = torch.zeros(B, K, dtype=memory.dtype, device=dev)
    scores[:, 1:] = float("-inf")  # K copies of one start: only the first may be extended at step 1
    length = torch.zeros(B, K, dtype=torch.long, device=dev)
    done = torch.zeros(B, K, dtype=torch.bool, device=dev)
    offsets = torch.arange(B, device=dev)[:, None] * K  # (B, 1): first row of each source's beams
    for _ in range(max_new_tokens):
        logp = _log_probs(decoder, ids, memory, memory_mask, cache, [pad_id, bos_id]).view(B, K, -1)  # (B, K, V)
        V = logp.shape[-1]
        # a finished beam has exactly one continuation, itself (+ <pad>), at no cost
        logp = logp.masked_fill(done[..., None], float("-inf"))
        logp[..., pad_id] = torch.where(done, 0.0, float("-inf")).to(logp.dtype)
        cand = scores[..., None] + logp.to(scores.dtype)  # (B, K, V) summed log-probabilities
        new_length = length + (~done).long()  # (B, K), the same for every token of a beam
        ranked = cand / new_length[..., None].clamp(min=1).to(cand.dtype) ** length_penalty
        top = ranked.view(B, K * V).topk(K, dim=-1).indices  # (B, K)
        parent, token = top // V, top % V
        scores = cand.view(B, K * V).gather(1, top)
        length = new_length.gather(1, parent)
        # a hypothesis at -inf (fewer candidates than beams so far) can never win: treat it as finished
        done = done.gather(1, parent) | (token == eos_id) | scores.isneginf()
        rows = (offsets + parent).view(-1)  # (B*K,) each survivor's parent row
        if cache is not None:
            cache.reorder(rows)
        ids = torch.cat([ids[rows], token.view(-1, 1)], dim=1)
        if done.all():
            break
    final = scores / length.clamp(min=1).to(scores.dtype) ** length_penalty  # (B, K)
    best = final.argmax(dim=-1)  # (B,)
    seqs = ids.view(B, K, -1)[torch.arange(B, device=dev), best, 1:]
    return GenerateOutput(seqs, final.gather(1, best[:, None])[:, 0])
