"""Captions -> the (B, context_length) token ids a CLIP or SigLIP text tower reads, as open_clip's tokenizers give
them, run by the `tokenizers` library from the repository's tokenizer.json (vit.hub.tokenizer).

    bpe   CLIP's byte-pair encoding (open_clip's `SimpleTokenizer`): text cleaned (ftfy when installed, HTML
          entities, whitespace) and lowercased; ids [start-of-text] + BPE + [end-of-text], cut to
          context_length with end-of-text kept last, padded with 0.
    hf    the repository's own tokenizer (open_clip's `HFTokenizer`, SigLIP's SentencePiece): text cleaned as
          the config says ('canonicalize': punctuation removed, lowercased; 'lower'; 'whitespace'), its own
          special tokens, padded with its padding id to context_length and cut there.

`word_tokenizer(captions, context_length)` makes an 'hf' one for a text tower trained from scratch: one id per
lower-cased word of the captions (punctuation split off), <unk> for any other, <start> ... <end> around each
caption, the end token the highest id (where CLIP's tower pools, as open_clip's `argmax` pooling finds it).
"""

from __future__ import annotations

import html
import string
from pathlib import Path
from typing import Any

import torch

from .tokenizer import Tokenizer, load_tokenizer

__all__ = ["ClipTokenizer", "clean_text", "load_clip_tokenizer", "repo_clip_tokenizer", "word_tokenizer"]

WORD_SPECIALS = ("<pad>", "<unk>")  # ids 0 and 1; <start> and <end> are the two highest ids

CLEANERS = ("lower", "whitespace", "canonicalize")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def clean_text(text: str, clean: str) -> str:
    """open_clip's text cleaning: `basic_clean` (ftfy's fixes, HTML entities twice, stripped), then 'lower':
    whitespace runs to one space, lowercased; 'whitespace': the same without lowercasing; 'canonicalize':
    underscores to spaces, punctuation removed, lowercased, whitespace runs to one space (big_vision's)."""
    try:
        import ftfy  # open_clip's own dependency; without it text with mojibake tokenizes as it is

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    if clean == "canonicalize":
        return " ".join(text.replace("_", " ").translate(_PUNCTUATION).lower().split())
    text = " ".join(text.split())
    return text.lower() if clean == "lower" else text


class ClipTokenizer:
    """`tok(["a photo of a cat", ...])` -> (B, context_length) int64 ids, open_clip's tokenizer's. `kind`: 'bpe'
    or 'hf' (see the module docstring); `tokenizer`: the repository's tokenizer.json as a vit.hub.Tokenizer."""

    def __init__(self, tokenizer: Tokenizer, context_length: int, kind: str = "bpe", clean: str = "lower") -> None:
        if kind not in ("bpe", "hf"):
            raise ValueError(f"unknown tokenizer kind {kind!r}; use 'bpe' (CLIP) or 'hf' (the repository's own).")
        if clean not in CLEANERS:
            raise ValueError(f"unknown text cleaning {clean!r}; use one of {', '.join(CLEANERS)}.")
        self.tokenizer, self.context_length, self.kind, self.clean = tokenizer, int(context_length), kind, clean
        if kind == "bpe":
            vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
            if "<|startoftext|>" not in vocab or "<|endoftext|>" not in vocab:
                raise ValueError("this tokenizer.json has no <|startoftext|> / <|endoftext|> tokens; it is not "
                                 "CLIP's BPE tokenizer.")
            self.sot_token_id, self.eot_token_id = vocab["<|startoftext|>"], vocab["<|endoftext|>"]

    def __call__(self, texts: str | list[str], context_length: int | None = None) -> torch.Tensor:
        texts = [texts] if isinstance(texts, str) else list(texts)
        n = context_length or self.context_length
        cleaned = [clean_text(t, self.clean) for t in texts]
        if self.kind == "hf":
            return self.tokenizer(cleaned, padding="max_length", truncation=True, max_length=n,
                                  return_tensors="pt")["input_ids"]
        out = torch.zeros(len(texts), n, dtype=torch.long)  # open_clip pads with 0 whatever the vocabulary
        for i, ids in enumerate(self.tokenizer(cleaned, add_special_tokens=False)["input_ids"]):
            ids = [self.sot_token_id, *ids, self.eot_token_id][:n]
            ids[-1] = self.eot_token_id  # a cut caption still ends at end-of-text, where CLIP pools
            out[i, : len(ids)] = torch.tensor(ids)
        return out


    def lengths(self, texts: list[str]) -> list[int]:
        """How many ids each text needs uncut (start and end tokens included): more than context_length means
        `__call__` cuts it."""
        cleaned = [clean_text(t, self.clean) for t in texts]
        if self.kind == "hf":
            return [len(ids) for ids in self.tokenizer(cleaned)["input_ids"]]
        return [len(ids) + 2 for ids in self.tokenizer(cleaned, add_special_tokens=False)["input_ids"]]


def load_clip_tokenizer(name: str, context_length: int, kind: str = "bpe", clean: str = "lower",
                        cache_dir: str | Path | None = None) -> ClipTokenizer:
    """The tokenizer of the CLIP / SigLIP repository `name` (`hf-hub:org/repo`, `local-dir:/folder`): its
    tokenizer.json, cleaned and laid out as open_clip does (see `ClipTokenizer`)."""
    tok: Any = load_tokenizer(name, cache_dir)
    return ClipTokenizer(tok, context_length, kind, clean)


def repo_clip_tokenizer(name: str, cache_dir: str | Path | None = None) -> ClipTokenizer | None:
    """The tokenizer of the CLIP / SigLIP repository `name` as its config says (None when it has no
    tokenizer.json; the model then takes ids only): open_clip's text_cfg (an hf_tokenizer_name: 'hf', cleaned
    as tokenizer_kwargs.clean says, default 'whitespace'; else CLIP's 'bpe', lowercased; context_length, 77), or
    transformers' CLIPModel ('bpe') / SiglipModel ('hf', canonicalized) / Siglip2Model ('hf', lowercased) with
    text_config's positions (77 / 64)."""
    from .names import read_json, repo_file

    try:
        config = read_json(repo_file(name, ("open_clip_config.json",), cache_dir), name)
        text = config.get("model_cfg", config).get("text_cfg") or {}
        hf = bool(text.get("hf_tokenizer_name"))
        kind, length = ("hf" if hf else "bpe"), text.get("context_length", 77)
        clean = (text.get("tokenizer_kwargs") or {}).get("clean", "whitespace" if hf else "lower")
    except FileNotFoundError:
        config = read_json(repo_file(name, ("config.json",), cache_dir), name)
        model_type = config.get("model_type")
        length = (config.get("text_config") or {}).get("max_position_embeddings",
                                                         64 if model_type in ("siglip", "siglip2") else 77)
        # SigLIP's SentencePiece, canonicalized as its SiglipTokenizer does; SigLIP2's Gemma tokenizer, lowercased as
        # transformers' Siglip2Tokenizer does (its tokenizer.json's template decides <bos> / <eos>, as there)
        kind, clean = {"siglip": ("hf", "canonicalize"), "siglip2": ("hf", "lower")}.get(model_type, ("bpe", "lower"))
    try:
        return load_clip_tokenizer(name, length, kind, clean, cache_dir)
    except FileNotFoundError:
        return None


def word_tokenizer(captions: list[str], context_length: int) -> ClipTokenizer:
    """A word-level 'hf' tokenizer over the words of `captions` (see the module docstring): ids 0 <pad>, 1 <unk>,
    then the words sorted, then <start> and <end>."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel

    split = pre_tokenizers.Whitespace()
    words = sorted({w for c in captions for w, _ in split.pre_tokenize_str(clean_text(c, "lower"))})
    vocab = {t: i for i, t in enumerate([*WORD_SPECIALS, *words, "<start>", "<end>"])}
    backend = Backend(WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer, backend.pre_tokenizer = normalizers.Lowercase(), split
    backend.post_processor = processors.TemplateProcessing(
        single="<start> $A <end>", special_tokens=[("<start>", vocab["<start>"]), ("<end>", vocab["<end>"])])
    backend.add_special_tokens(["<pad>", "<unk>", "<start>", "<end>"])
    tok = Tokenizer(backend, {"pad_token": "<pad>", "model_max_length": context_length,
                              "model_input_names": ["input_ids", "attention_mask"]})
    return ClipTokenizer(tok, context_length, "hf", "lower")
