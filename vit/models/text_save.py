"""A fine-tuned `TextClassifier` saved as a transformers repository: one folder that both
`vit.create_text_model("local-dir:<folder>", num_classes=N)` and transformers'
`AutoModelForSequenceClassification.from_pretrained(<folder>)` load with the same logits, and that
`huggingface_hub.upload_folder` can publish as it is.

    config.json          the source's config.json with architectures [<Family>ForSequenceClassification],
                         id2label, label2id and num_labels
    model.safetensors    the weights in transformers' names (vit/hub/text_weights.py: hf_state_dict)
    tokenizer files      copied from the repository the model was loaded from (tokenizer.json, its config, ...)

The folder is written beside its final place and swapped in whole (vit/utils/atomic.py), so a kill mid-save
leaves the previous folder complete.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save

from ..hub.names import repo_file
from ..hub.text_weights import hf_state_dict
from ..hub.weights import check_finite
from ..utils.atomic import atomic_write_bytes, atomic_write_text, staged_dir
from .text_build import FAMILIES
from .text_classifier import TextClassifier

__all__ = ["ARCHITECTURES", "TOKENIZER_FILES", "hf_classifier_config", "save_text_model"]

ARCHITECTURES = {"bert": "BertForSequenceClassification", "roberta": "RobertaForSequenceClassification",
                 "xlm-roberta": "XLMRobertaForSequenceClassification",
                 "camembert": "CamembertForSequenceClassification", "electra": "ElectraForSequenceClassification",
                 "distilbert": "DistilBertForSequenceClassification"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "sentencepiece.bpe.model", "spiece.model")


def hf_classifier_config(model: TextClassifier, classes: list[str]) -> dict:
    """config.json for transformers' *ForSequenceClassification: the source's fields, this head's labels."""
    if len(classes) != model.num_classes:
        raise ValueError(f"{len(classes)} class names for a {model.num_classes}-class model; pass one per class.")
    config = {k: v for k, v in model.config.items() if k not in ("_num_labels", "_name_or_path")}
    config.update(architectures=[ARCHITECTURES[model.model_type]], num_labels=len(classes),
                  id2label={str(i): c for i, c in enumerate(classes)}, label2id={c: i for i, c in enumerate(classes)},
                  problem_type="single_label_classification")
    return config


def save_text_model(folder: str | Path, model: TextClassifier, classes: list[str], tokenizer: str | None = None,
                    extra: dict[str, str] | None = None, state_dict: dict | None = None) -> Path:
    """Write `model` into `folder` as a transformers repository (the module docstring), atomically.
    `tokenizer`: the name whose tokenizer files are copied (default: the one the model was loaded from; a file
    it lacks is skipped). `extra`: more text files for the folder (train.py's config.yaml, classes.json, ...).
    `state_dict`: the weights to write instead of `model.state_dict()` (an EMA's, or FSDP's gathered copy)."""
    if not isinstance(model, TextClassifier):
        raise TypeError(f"save_text_model saves a TextClassifier (vit.create_text_model(name, num_classes=N)), "
                        f"not a {type(model).__name__}.")
    folder = Path(folder)
    config = hf_classifier_config(model, classes)
    weights = model.state_dict() if state_dict is None else state_dict
    state = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
    check_finite(state, f"refusing to save {folder}", "lower optim.lr or enable optim.clip_grad.")
    state = hf_state_dict(state, FAMILIES[model.model_type][1], model.model_type)
    source = tokenizer or getattr(model, "source", None)
    with staged_dir(folder) as tmp:
        atomic_write_bytes(tmp / "model.safetensors", save(state, metadata={"format": "pt"}))
        atomic_write_text(tmp / "config.json", json.dumps(config, indent=2))
        for name in TOKENIZER_FILES if source else ():
            try:
                path = repo_file(source, (name,))
            except FileNotFoundError:
                continue
            atomic_write_bytes(tmp / name, path.read_bytes())
        for name, text in (extra or {}).items():
            atomic_write_text(tmp / name, text)
    return folder
