"""Sequence classification on the text encoder: `TextEncoder` -> the family's head -> (B, num_classes) logits,
computed as transformers' *ForSequenceClassification models compute them, so that their weights load and ours
save into their layout (vit/hub/text_weights.py: `head_state_dict`, `hf_state_dict`).

    family                               head on the first token's state h (B, D)
    bert                                 fc(drop(tanh(pooler(h))))      the pooler lives in the encoder
    roberta, xlm-roberta, camembert      fc(drop(tanh(dense(drop(h)))))
    electra                              fc(drop(gelu(dense(drop(h)))))
    distilbert                           fc(drop(relu(dense(h))))

A disabled part is `nn.Identity()`, so `forward` has no branches. Built by `vit.create_text_model(name,
num_classes=N)`; saved for transformers by `vit.models.text_save.save_text_model`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .text_encoder import TextEncoder

__all__ = ["HEADS", "SequenceClassificationHead", "TextClassifier"]

# model_type -> (activation after head.dense, or None: no dense; a dropout before the dense)
HEADS: dict[str, tuple[str | None, bool]] = {
    "bert": (None, False),
    "roberta": ("tanh", True),
    "xlm-roberta": ("tanh", True),
    "camembert": ("tanh", True),
    "electra": ("gelu", True),
    "distilbert": ("relu", False),
}
_ACTS = {"tanh": nn.Tanh, "gelu": nn.GELU, "relu": nn.ReLU}


class SequenceClassificationHead(nn.Module):
    """(B, D) pooled state -> (B, num_classes): [drop ->] [dense -> act ->] drop -> fc (the table above)."""

    def __init__(self, dim: int, num_classes: int, act: str | None, drop_first: bool, drop: float) -> None:
        super().__init__()
        self.drop_in = nn.Dropout(drop) if drop_first else nn.Identity()
        self.dense = nn.Linear(dim, dim) if act else nn.Identity()
        self.act = _ACTS[act]() if act else nn.Identity()
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(self.act(self.dense(self.drop_in(x)))))


class TextClassifier(nn.Module):
    """A `TextEncoder` with a sequence-classification head. `model(input_ids, attention_mask=None,
    token_type_ids=None)` -> logits (B, num_classes). Without an attention_mask the padding id
    (`pad_token_id`) is masked, so a batch of ids padded with it (train.py's text data) needs nothing else.
    `config`: the transformers config.json it was built from (as a dict), what `save_text_model` writes back."""

    def __init__(self, encoder: TextEncoder, num_classes: int, model_type: str, config: dict[str, Any],
                 drop: float = 0.1, pad_token_id: int | None = None) -> None:
        super().__init__()
        if model_type not in HEADS:
            raise ValueError(f"model_type {model_type!r} has no sequence-classification head in transformers; "
                             f"use one of {', '.join(HEADS)}.")
        if type(num_classes) is not int or num_classes < 1:
            raise ValueError(f"num_classes={num_classes!r} is not a positive whole number; pass the class count.")
        self.encoder = encoder
        self.head = SequenceClassificationHead(encoder.embed_dim, num_classes, *HEADS[model_type], drop)
        self.num_classes, self.model_type, self.config = num_classes, model_type, config
        self.pad_token_id = pad_token_id
        self.num_features = self.embed_dim = encoder.embed_dim

    def forward_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                         token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, N) ids -> (B, D): the first token's state, through BERT's pooler where the family has one."""
        if attention_mask is None and self.pad_token_id is not None:
            attention_mask = input_ids != self.pad_token_id
        return self.encoder(input_ids, attention_mask, token_type_ids).pooler_output

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_head(self.forward_features(input_ids, attention_mask, token_type_ids))
