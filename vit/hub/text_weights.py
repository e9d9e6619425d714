"""Hugging Face text checkpoints -> `TextEncoder` names: the state-dict adapter for BERT-shaped, DistilBERT and
CLIP-text weights (as vit/models/vision_weights.py is the ViT's). Nothing is computed here, only renamed and fused.

    ours                 BERT, RoBERTa, ELECTRA          DistilBERT                CLIP text tower
    token_embed          embeddings.word_embeddings      (as BERT)                 embeddings.token_embedding
    pos_embed (1, P, D)  embeddings.position_embeddings  (as BERT)                 embeddings.position_embedding
    type_embed           embeddings.token_type_embed...  -                         -
    norm_pre             embeddings.LayerNorm            embeddings.LayerNorm      -
    blocks.i.attn.qkv    L.attention.self.query|key|...  T.attention.q|k|v_lin     E.self_attn.q|k|v_proj (fused)
    blocks.i.attn.proj   L.attention.output.dense        T.attention.out_lin       E.self_attn.out_proj
    blocks.i.norm1       L.attention.output.LayerNorm    T.sa_layer_norm           E.layer_norm1
    blocks.i.mlp.fc1     L.intermediate.dense            T.ffn.lin1                E.mlp.fc1
    blocks.i.mlp.fc2     L.output.dense                  T.ffn.lin2                E.mlp.fc2
    blocks.i.norm2       L.output.LayerNorm              T.output_layer_norm       E.layer_norm2
    norm / pooler.fc     - / pooler.dense                -                         final_layer_norm / -
with L = encoder.layer.i, T = transformer.layer.i, E = encoder.layers.i.

Checkpoints of task models carry the base model under a prefix (`bert.`, `roberta.`, `distilbert.`, `electra.`,
CLIP's `text_model.`): the prefix is stripped and the task's own layers (MLM / classification heads, CLIP's vision
tower and projections) are dropped. TensorFlow-era names (`LayerNorm.gamma` / `.beta`) read as weight / bias.
A *ForSequenceClassification checkpoint's head is read by `head_state_dict`; `hf_state_dict` writes ours back
in transformers' names (q/k/v split again), so that its from_pretrained loads what we fine-tuned.

    ours          BERT                 RoBERTa, ELECTRA        DistilBERT
    head.dense    -                    classifier.dense        pre_classifier
    head.fc       classifier           classifier.out_proj     classifier
"""

from __future__ import annotations

import re
from typing import Any

import torch

from .qkv import fuse_qkv
from .weights import check_weights

__all__ = ["FAMILIES", "HEAD_KEYS", "PREFIXES", "head_state_dict", "hf_state_dict", "text_state_dict"]

_LAYER = r"blocks.\1."
# family -> (regex on the checkpoint's key after its prefix, our name); the first that matches renames
_RULES: dict[str, list[tuple[str, str]]] = {
    "bert": [
        (r"embeddings\.word_embeddings\.", "token_embed."),
        (r"embeddings\.position_embeddings\.weight$", "pos_embed"),
        (r"embeddings\.token_type_embeddings\.", "type_embed."),
        (r"embeddings\.LayerNorm\.", "norm_pre."),
        (r"encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.", _LAYER + r"attn.\2."),
        (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.", _LAYER + "attn.proj."),
        (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", _LAYER + "norm1."),
        (r"encoder\.layer\.(\d+)\.intermediate\.dense\.", _LAYER + "mlp.fc1."),
        (r"encoder\.layer\.(\d+)\.output\.dense\.", _LAYER + "mlp.fc2."),
        (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.", _LAYER + "norm2."),
        (r"pooler\.dense\.", "pooler.fc."),
    ],
    "distilbert": [
        (r"embeddings\.word_embeddings\.", "token_embed."),
        (r"embeddings\.position_embeddings\.weight$", "pos_embed"),
        (r"embeddings\.LayerNorm\.", "norm_pre."),
        (r"transformer\.layer\.(\d+)\.attention\.(q|k|v)_lin\.", _LAYER + r"attn.\2."),
        (r"transformer\.layer\.(\d+)\.attention\.out_lin\.", _LAYER + "attn.proj."),
        (r"transformer\.layer\.(\d+)\.sa_layer_norm\.", _LAYER + "norm1."),
        (r"transformer\.layer\.(\d+)\.ffn\.lin1\.", _LAYER + "mlp.fc1."),
        (r"transformer\.layer\.(\d+)\.ffn\.lin2\.", _LAYER + "mlp.fc2."),
        (r"transformer\.layer\.(\d+)\.output_layer_norm\.", _LAYER + "norm2."),
    ],
    "clip_text": [
        (r"embeddings\.token_embedding\.", "token_embed."),
        (r"embeddings\.position_embedding\.weight$", "pos_embed"),
        (r"encoder\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.", _LAYER + r"attn.\2."),
        (r"encoder\.layers\.(\d+)\.self_attn\.out_proj\.", _LAYER + "attn.proj."),
        (r"encoder\.layers\.(\d+)\.layer_norm1\.", _LAYER + "norm1."),
        (r"encoder\.layers\.(\d+)\.mlp\.(fc1|fc2)\.", _LAYER + r"mlp.\2."),
        (r"encoder\.layers\.(\d+)\.layer_norm2\.", _LAYER + "norm2."),
        (r"final_layer_norm\.", "norm."),
    ],
}
FAMILIES = tuple(_RULES)
# the base model's prefix in a task model's checkpoint, per model_type family
PREFIXES = {"bert": ("bert.", "roberta.", "electra."), "distilbert": ("distilbert.",), "clip_text": ("text_model.",)}
# model_type -> (the base model's prefix in its *ForSequenceClassification checkpoint, {our head prefix: theirs})
_ROBERTA_HEAD = {"head.dense.": "classifier.dense.", "head.fc.": "classifier.out_proj."}
HEAD_KEYS: dict[str, tuple[str, dict[str, str]]] = {
    "bert": ("bert.", {"head.fc.": "classifier."}),
    "roberta": ("roberta.", _ROBERTA_HEAD),
    "xlm-roberta": ("roberta.", _ROBERTA_HEAD),
    "camembert": ("roberta.", _ROBERTA_HEAD),
    "electra": ("electra.", _ROBERTA_HEAD),
    "distilbert": ("distilbert.", {"head.dense.": "pre_classifier.", "head.fc.": "classifier."}),
}
_BUFFERS = re.compile(r"(.*\.)?position_ids$")  # persisted by older transformers; recomputed here
_QKV = {"query": 0, "key": 1, "value": 2, "q": 0, "k": 1, "v": 2}


def _strip_prefix(state: dict[str, torch.Tensor], family: str, report: Any) -> dict[str, torch.Tensor]:
    """A task model's checkpoint (`bert.encoder...` beside `cls.predictions...`) -> its base model's keys."""
    for prefix in PREFIXES[family]:
        if any(k.startswith(prefix) for k in state):
            dropped = sorted({k.split(".")[0] for k in state if not k.startswith(prefix)})
            if dropped:
                report.actions.append(f"kept the {prefix[:-1]} base model; dropped the checkpoint's "
                                      f"{', '.join(dropped)} (task heads or other towers)")
            return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    return state


def text_state_dict(state: dict[str, torch.Tensor], family: str, report: Any) -> dict[str, torch.Tensor]:
    """A Hugging Face checkpoint of `family` ('bert' | 'distilbert' | 'clip_text') in `TextEncoder`'s names, with
    q/k/v fused into `qkv` (rows in that order, as `Attention` splits them). Keys no rule knows are kept under
    their own names, so that the loader's strict check names them. `report.actions` (a LoadReport) records what
    was dropped. Every tensor is checked (`check_weights`: floating point, finite) before q/k/v are fused, and
    q/k/v of unequal shapes are refused in one sentence."""
    state = _strip_prefix(state, family, report)
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, list[torch.Tensor | None]] = {}  # 'blocks.0.attn.qkv.weight' -> [q, k, v]
    for key, value in state.items():
        if _BUFFERS.fullmatch(key):
            continue
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
        for pattern, name in _RULES[family]:
            renamed, hit = re.subn("^" + pattern, name, key, count=1)
            if hit:
                key = renamed
                break
        m = re.fullmatch(r"(blocks\.\d+\.attn)\.(query|key|value|q|k|v)\.(weight|bias)", key)
        if m:
            parts.setdefault(f"{m[1]}.qkv.{m[3]}", [None, None, None])[_QKV[m[2]]] = value
        elif key == "pos_embed":
            out[key] = value[None]  # (P, D) -> (1, P, D)
        else:
            out[key] = value
    # dtypes and finiteness before fusing: torch.cat would cast a bool or int8 part to the others' float in silence
    separate = {key.replace(".qkv.", f".{n}."): p for key, qkv in parts.items()
                for n, p in zip(("q", "k", "v"), qkv) if p is not None}
    check_weights({**out, **separate}, report.path)
    return {**out, **fuse_qkv(parts, report.path)}


def head_state_dict(state: dict[str, torch.Tensor], model_type: str) -> dict[str, torch.Tensor]:
    """A *ForSequenceClassification checkpoint's head in our names (`head.dense.*`, `head.fc.*`); {} when the
    checkpoint has none (a base or masked-LM model)."""
    theirs = {v: k for k, v in HEAD_KEYS[model_type][1].items()}
    out = {}
    for key, value in state.items():
        for prefix, ours in theirs.items():
            if key.startswith(prefix) and key[len(prefix):] in ("weight", "bias"):
                out[ours + key[len(prefix):]] = value
    return out


def _inverse(pattern: str, name: str) -> tuple[str, str]:
    """A rename rule (checkpoint regex -> our name) turned round: (regex on our name, the checkpoint's name).
    The rules' regexes are literal text with `\\.` escapes, an optional `$` and groups; group i is \\i in both."""
    groups = re.findall(r"\(([^)]*)\)", pattern)
    back = re.escape(name)
    for i, body in enumerate(groups, 1):
        back = back.replace(re.escape(f"\\{i}"), f"({body})")
    target, i = pattern.rstrip("$"), 0
    for body in groups:
        i += 1
        target = target.replace(f"({body})", f"\\{i}", 1)
    return back + ("$" if pattern.endswith("$") else ""), target.replace("\\.", ".")


def hf_state_dict(state: dict[str, torch.Tensor], family: str, model_type: str) -> dict[str, torch.Tensor]:
    """The inverse of `text_state_dict` for a classifier (`encoder.*`, `head.*` keys, vit.models.TextClassifier):
    transformers' *ForSequenceClassification names, the base model under its prefix (`bert.`, `roberta.`, ...),
    `qkv` split into query, key and value, positions (1, P, D) -> (P, D). A key no rule knows is a ValueError
    (it would be dropped in silence by from_pretrained)."""
    prefix, head = HEAD_KEYS[model_type]
    rules = [_inverse(p, n) for p, n in _RULES[family]]
    qkv = next(re.findall(r"\(([^)]*)\)", p)[1].split("|") for p, _ in _RULES[family] if "(query|" in p or "(q|" in p)
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.startswith("head."):
            part = next((p for p in head if key.startswith(p)), None)
            if part is None:
                raise ValueError(f"{key} has no place in transformers' {model_type} classifier.")
            out[head[part] + key[len(part):]] = value
            continue
        key = key.removeprefix("encoder.")
        m = re.fullmatch(r"(blocks\.\d+\.attn)\.qkv\.(weight|bias)", key)
        parts = [(f"{m[1]}.{n}.{m[2]}", v) for n, v in zip(qkv, value.chunk(3, dim=0))] if m else [(key, value)]
        for name, v in parts:
            if name == "pos_embed":
                v = v[0]  # (1, P, D) -> (P, D)
            for pattern, theirs in rules:
                renamed, hit = re.subn("^" + pattern, theirs, name, count=1)
                if hit:
                    out[prefix + renamed] = v.contiguous()
                    break
            else:
                raise ValueError(f"{name} has no place in transformers' {model_type} model.")
    return out
