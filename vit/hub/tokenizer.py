"""The tokenizer that comes with a text model's weights: its repository's tokenizer.json, run by the `tokenizers`
library (Hugging Face's own Rust tokenizer, the backend of transformers' fast tokenizers), so the ids are those
transformers' tokenizer gives, without transformers.

    tok = vit.load_tokenizer("hf-hub:google-bert/bert-base-uncased")      # same names as vit.create_text_model
    batch = tok(["a sentence", "another one"], padding=True, truncation=True, return_tensors="pt")
    model(**batch)                                                          # input_ids, attention_mask, token_type_ids

tokenizer.json holds the whole pipeline (normaliser, pre-tokeniser, WordPiece / BPE / Unigram model, the
[CLS] ... [SEP] template, which decides the special tokens: transformers 5 ignores tokenizer_config.json's
`add_bos_token` / `add_eos_token` beside a tokenizer.json, and so does this); tokenizer_config.json gives what
transformers adds around it: the padding token and side (the class's default side when it sets none: left for
Gemma's), `model_max_length` (the default truncation length) and which inputs the model takes (token types for
BERT and ELECTRA, not for RoBERTa, DistilBERT or CLIP). A repository with only vocab.txt or vocab.json +
merges.txt is refused with the command that writes its tokenizer.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..utils.files import read_regular_file
from .names import read_json, repo_file

__all__ = ["Tokenizer", "load_tokenizer"]

# tokenizer classes whose models take no token_type_ids (transformers' `model_input_names` for them); the others
# (BERT's, ELECTRA's and the default) return them
_NO_TOKEN_TYPES = {"DistilBertTokenizer", "RobertaTokenizer", "XLMRobertaTokenizer", "CamembertTokenizer",
                   "CLIPTokenizer", "GPT2Tokenizer", "BartTokenizer", "LongformerTokenizer", "MPNetTokenizer"}
# tokenizer classes that pad on the left unless tokenizer_config.json says otherwise (their `padding_side`)
_LEFT_PADDED = {"GemmaTokenizer", "Siglip2Tokenizer", "LlamaTokenizer", "CodeLlamaTokenizer", "CohereTokenizer",
                "XLNetTokenizer"}
_HUGE = 10**20  # transformers' "no limit" model_max_length is 1e30
MAX_LENGTH = 2**20  # tokens per text at most: past any model's positions, and far below what Rust aborts on
TOKENIZER_LIMIT = 256 * 2**20  # bytes of a tokenizer.json read at most
CONFIG_LIMIT = 16 * 2**20  # of tokenizer_config.json (its added-token table can be long)


def _bad_config(key: str, value: Any, want: str) -> None:
    raise ValueError(f"tokenizer_config.json sets {key}={value!r:.60}, which is not {want}; fix or remove that "
                     "field (transformers' save_pretrained writes a valid one).")


def _token(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict with 'content'."""
    return value.get("content") if isinstance(value, dict) else value


class Tokenizer:
    """Text -> model inputs, called as transformers' tokenizers are: `tok(text, text_pair=None, padding=False,
    truncation=False, max_length=None, return_tensors=None)` -> a dict with `input_ids`, `attention_mask` and,
    for models that take them, `token_type_ids` (lists of ids, or (B, N) int64 tensors with return_tensors="pt").
    `backend` is the `tokenizers.Tokenizer`; its padding and truncation settings are set per call."""

    def __init__(self, backend: Any, config: dict[str, Any] | None = None) -> None:
        config = config or {}
        self.backend = backend
        self.pad_token = _token(config.get("pad_token"))
        if self.pad_token is not None and not isinstance(self.pad_token, str):
            _bad_config("pad_token", config.get("pad_token"), "a token string (or an AddedToken with 'content')")
        self.pad_token_id = backend.token_to_id(self.pad_token) if self.pad_token is not None else None
        for key in ("padding_side", "truncation_side"):
            if config.get(key, "right") not in ("left", "right"):
                _bad_config(key, config[key], "'left' or 'right'")
        cls = str(config.get("tokenizer_class") or "").removesuffix("Fast")
        self.padding_side = config.get("padding_side", "left" if cls in _LEFT_PADDED else "right")
        self.truncation_side = config.get("truncation_side", "right")
        limit = config.get("model_max_length")
        if limit is not None and (type(limit) not in (int, float) or not limit >= 1):  # `not >=`: NaN too
            _bad_config("model_max_length", limit, "a positive number of tokens")
        if limit is not None and MAX_LENGTH < limit < _HUGE:
            _bad_config("model_max_length", limit, f"at most {MAX_LENGTH} tokens (or transformers' 'no limit', "
                        "1e30)")
        self.model_max_length = int(limit) if limit is not None and limit < _HUGE else None
        names = config.get("model_input_names")
        if names is None:
            names = ["input_ids", "attention_mask"] + ([] if cls in _NO_TOKEN_TYPES else ["token_type_ids"])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            _bad_config("model_input_names", names, "a list of input names such as ['input_ids', 'attention_mask']")
        self.model_input_names = list(names)

    @property
    def vocab_size(self) -> int:
        """The number of ids, added tokens included (the size of the model's embedding table)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def __call__(
        self,
        text: str | list[str],
        text_pair: str | list[str] | None = None,
        padding: bool | str = False,
        truncation: bool | str = False,
        max_length: int | None = None,
        add_special_tokens: bool = True,
        return_tensors: str | None = None,
    ) -> dict[str, Any]:
        """`padding`: False, True / "longest" (to the longest in the batch) or "max_length"; `truncation`: False,
        True / "longest_first" (pairs lose tokens from the longer side first), "only_first" or "only_second", to
        `max_length` (default: the model's `model_max_length`). A single string gives one row of ids (lists
        unbatched, as transformers), tensors are always (B, N)."""
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        pairs = None if text_pair is None else ([text_pair] if isinstance(text_pair, str) else list(text_pair))
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} text pairs; pass one pair per text.")
        self._configure(padding, truncation, max_length)
        try:
            encs = self.backend.encode_batch(list(zip(texts, pairs)) if pairs is not None else texts,
                                             add_special_tokens=add_special_tokens)
        except Exception as e:  # tokenizers raises plain Exceptions (e.g. max_length below the special tokens)
            raise ValueError(f"could not tokenize: {str(e).splitlines()[0]}.") from None
        out = {"input_ids": [e.ids for e in encs], "attention_mask": [e.attention_mask for e in encs]}
        if "token_type_ids" in self.model_input_names:
            out["token_type_ids"] = [e.type_ids for e in encs]
        if return_tensors == "pt":
            import torch

            if len({len(ids) for ids in out["input_ids"]}) > 1:
                raise ValueError("the texts tokenize to different lengths; pass padding=True to return tensors.")
            return {k: torch.tensor(v, dtype=torch.long) for k, v in out.items()}
        if return_tensors is not None:
            raise ValueError(f"return_tensors={return_tensors!r} is not supported; use 'pt' or None (lists).")
        return {k: v[0] for k, v in out.items()} if single else out

    def _configure(self, padding: bool | str, truncation: bool | str, max_length: int | None) -> None:
        """Set the backend's padding and truncation as transformers' fast tokenizer does for this call."""
        if padding not in (False, True, "longest", "max_length", "do_not_pad"):
            raise ValueError(f"unknown padding {padding!r}; use False, True ('longest') or 'max_length'.")
        if truncation not in (False, True, "longest_first", "only_first", "only_second", "do_not_truncate"):
            raise ValueError(f"unknown truncation {truncation!r}; use False, True ('longest_first'), 'only_first' "
                             "or 'only_second'.")
        if max_length is not None and (type(max_length) is not int or not 1 <= max_length <= MAX_LENGTH):
            # the Rust tokenizer aborts the whole process on a padding length it cannot allocate (10**9)
            raise ValueError(f"max_length={max_length!r} is not a number of tokens from 1 to {MAX_LENGTH}; pass "
                             "the model's maximum length (e.g. 512) or leave it out.")
        length = max_length if max_length is not None else self.model_max_length
        if truncation not in (False, "do_not_truncate") and length is not None:
            strategy = "longest_first" if truncation is True else truncation
            self.backend.enable_truncation(length, strategy=strategy, direction=self.truncation_side)
        else:
            self.backend.no_truncation()
        if padding in (False, "do_not_pad"):
            self.backend.no_padding()
            return
        if self.pad_token_id is None:
            raise ValueError("this tokenizer has no padding token (tokenizer_config.json sets no pad_token); pad "
                             "yourself or tokenize one text at a time.")
        if padding == "max_length" and length is None:
            raise ValueError("padding='max_length' needs max_length= (this tokenizer sets no model_max_length).")
        self.backend.enable_padding(direction=self.padding_side, pad_id=self.pad_token_id, pad_type_id=0,
                                    pad_token=self.pad_token, length=length if padding == "max_length" else None)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text (the backend's decoder: WordPiece's '##' joins, byte-level BPE's bytes)."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)


def load_tokenizer(name: str, cache_dir: str | Path | None = None) -> Tokenizer:
    """The tokenizer of the model `name` (`hf-hub:org/repo[@revision]` or `local-dir:/folder`, as
    `vit.create_text_model`): its tokenizer.json and tokenizer_config.json, from huggingface_hub's cache offline."""
    from tokenizers import Tokenizer as Backend

    try:
        path = repo_file(name, ("tokenizer.json",), cache_dir, kind="a repository with a tokenizer.json")
    except FileNotFoundError as e:
        if "holds none of" not in str(e) and "has none of" not in str(e):
            raise
        raise FileNotFoundError(f"{name} has no tokenizer.json (only the older vocabulary files); write one with "
                                "transformers: AutoTokenizer.from_pretrained(...).save_pretrained(folder), then load "
                                "local-dir:folder.") from None
    data = read_regular_file(path, TOKENIZER_LIMIT, f"{name}:")  # a FIFO or /dev/zero is named, never read
    try:
        backend = Backend.from_str(data.decode("utf-8"))
    except Exception as e:
        raise ValueError(f"{name}: {path} is not a tokenizer.json the tokenizers library reads "
                         f"({str(e).splitlines()[0]}).") from None
    config: dict[str, Any] = {}
    for filename in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins, as in transformers
        try:
            found = repo_file(name, (filename,), cache_dir)
        except FileNotFoundError:  # absent; one that is there but unreadable is refused by name
            continue
        config.update(read_json(found, name, limit=CONFIG_LIMIT))
    return Tokenizer(backend, config)
