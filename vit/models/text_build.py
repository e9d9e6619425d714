"""Pretrained text models by name: a Hugging Face repository's config.json and weights -> our `TextEncoder`.

    vit.create_text_model("hf-hub:google-bert/bert-base-uncased")     # the hub cache (offline: HF_HUB_OFFLINE=1)
    vit.create_text_model("hf-hub:FacebookAI/roberta-base@main")      # at a branch, tag or commit
    vit.create_text_model("local-dir:/models/my-bert")                # a folder written by save_pretrained

Names, files and weights are found and read by the image side's code (`vit.hub.names.repo_file`,
`vit.hub.weights.read_state_dict`: model.safetensors, else pytorch_model.bin with weights_only=True), renamed by
`vit.hub.text_weights`; here the config's `model_type` and fields become `TextEncoder` options:

    model_type                           architecture around the shared blocks
    bert, electra                        post-norm; word + position + token-type embeddings, LayerNorm; [CLS]
                                         (first token) pooled, through BERT's dense + tanh pooler when the
                                         weights have one (ELECTRA's have none)
    roberta, xlm-roberta, camembert      BERT's, with positions counted from the padding id
    distilbert                           BERT's without token types or pooler
    clip_text_model, clip (text_config)  pre-norm, causal, final LayerNorm, pooled at the end-of-text token

ELECTRA loads when its embedding width equals the hidden width (the discriminators; small generators project
their embeddings and are refused). An option these architectures do not have (relative positions, a decoder,
cross-attention, an activation outside gelu / gelu_new / quick_gelu) is refused in one sentence naming it:
nothing is approximated. Training dropout differs in one place: timm's Mlp also drops after its activation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..hub.names import WEIGHT_FILES, read_json, repo_file
from ..hub.text_weights import head_state_dict, text_state_dict
from ..hub.weights import LoadReport, check_fit, check_weights, read_state_dict
from .model_size import MAX_PARAMS
from .text_classifier import HEADS, TextClassifier
from .text_encoder import TextEncoder

__all__ = ["FAMILIES", "build_text_model", "create_text_model", "text_classifier_from_config",
           "text_encoder_from_config", "text_model_args"]

# model_type -> (architecture, weights layout)
FAMILIES = {
    "bert": ("bert", "bert"),
    "electra": ("bert", "bert"),
    "roberta": ("roberta", "bert"),
    "xlm-roberta": ("roberta", "bert"),
    "camembert": ("roberta", "bert"),
    "distilbert": ("distilbert", "distilbert"),
    "clip_text_model": ("clip_text", "clip_text"),
    "clip": ("clip_text", "clip_text"),
}
# the defaults of transformers' config classes, for config.json files that leave a field out
# (tests/test_text_pretrained.py checks them against transformers)
_BERT = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
             hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
             type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0)
DEFAULTS: dict[str, dict[str, Any]] = {
    "bert": _BERT,
    "roberta": {**_BERT, "vocab_size": 50265, "pad_token_id": 1},
    "xlm-roberta": {**_BERT, "vocab_size": 30522, "pad_token_id": 1},
    "camembert": {**_BERT, "pad_token_id": 1},
    "electra": {**_BERT, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024,
                "embedding_size": 128},
    "distilbert": dict(vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072, activation="gelu",
                       dropout=0.1, attention_dropout=0.1, max_position_embeddings=512),
    "clip_text_model": dict(vocab_size=49408, hidden_size=512, num_hidden_layers=12, num_attention_heads=8,
                            intermediate_size=2048, hidden_act="quick_gelu", attention_dropout=0.0,
                            layer_norm_eps=1e-5, max_position_embeddings=77, eos_token_id=49407),
}
ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "quick_gelu": "quick_gelu"}


def _refuse(name: str, what: str) -> None:
    raise ValueError(f"{name}: its config.json sets {what}, which this library's TextEncoder does not compute; "
                     "use transformers for this model.")


def _act(value: str, name: str) -> str:
    if not isinstance(value, str) or value not in ACTIVATIONS:
        _refuse(name, f"the activation {value!r} (supported: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[value]


def _mlp_ratio(hidden: int, intermediate: int) -> float:
    """A ratio that `Block` turns back into exactly `intermediate` (int(dim * ratio))."""
    ratio = intermediate / hidden
    return ratio if int(hidden * ratio) == intermediate else (intermediate + 0.5) / hidden


# model_type -> (the config's field for width, depth, heads, MLP width); the other size fields are shared
_SIZE_FIELDS = {"distilbert": ("dim", "n_layers", "n_heads", "hidden_dim")}
_BERT_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def _bad(name: str, key: str, value: Any, want: str) -> None:
    raise ValueError(f"{name}: its config.json sets {key}={value!r:.60}, which is not {want}; fix that field "
                     "(transformers' save_pretrained writes a valid one).")


def _is_int(v: Any) -> bool:
    return type(v) is int  # not bool (True is an int to isinstance), not 12.0


def _check_config(c: dict[str, Any], arch: str, model_type: str, name: str) -> None:
    """Every field `text_model_args` reads, type and range, in one place, then the parameter count (the image
    side's bound, vit.models.model_size.MAX_PARAMS) before anything is allocated: a hostile or mistyped config.json
    is one sentence, never a TypeError or ZeroDivisionError from torch or a 10**13-row embedding."""
    width, depth, heads, ff = _SIZE_FIELDS.get(arch, _BERT_SIZES)
    for key in ("vocab_size", width, depth, heads, ff, "max_position_embeddings"):
        if not _is_int(c[key]) or c[key] < 1:
            _bad(name, key, c[key], "a positive integer")
    if c[width] % c[heads]:
        _bad(name, width, c[width], f"a multiple of {heads}={c[heads]} (each head takes an equal share)")
    drops = ("dropout", "attention_dropout") if arch == "distilbert" else (
        ("attention_dropout",) if arch == "clip_text" else ("hidden_dropout_prob", "attention_probs_dropout_prob"))
    for key in drops:
        if type(c[key]) not in (int, float) or not 0 <= c[key] < 1:  # `not`: NaN fails too
            _bad(name, key, c[key], "a probability in [0, 1)")
    if arch != "distilbert" and (type(c["layer_norm_eps"]) not in (int, float) or not 0 < c["layer_norm_eps"] < 1):
        _bad(name, "layer_norm_eps", c["layer_norm_eps"], "a finite number between 0 and 1 (e.g. 1e-12)")
    types = c.get("type_vocab_size", 0) if arch in ("bert", "roberta") else 0
    if not _is_int(types) or types < 0:
        _bad(name, "type_vocab_size", types, "a count of token types (0 or more)")
    if arch == "roberta" and (not _is_int(c["pad_token_id"]) or c["pad_token_id"] < 0):
        _bad(name, "pad_token_id", c["pad_token_id"], "a token id (0 or more)")
    if model_type == "electra" and not _is_int(c["embedding_size"]):
        _bad(name, "embedding_size", c["embedding_size"], "a positive integer")
    if arch == "clip_text" and c.get("eos_token_id") is not None and not (
            _is_int(c["eos_token_id"]) and 0 <= c["eos_token_id"] < c["vocab_size"]):
        _bad(name, "eos_token_id", c["eos_token_id"], f"a token id below vocab_size={c['vocab_size']}")
    D, F = c[width], c[ff]
    n = c[depth] * (4 * D * D + 2 * D * F + 9 * D + F) + (c["vocab_size"] + c["max_position_embeddings"] + types) * D
    if n > MAX_PARAMS:  # Python ints: exact, no overflow
        about = f"about {float(n):.2g}" if n < 1e300 else "over 1e+300"
        raise ValueError(f"{name} would have {about} parameters, more than {MAX_PARAMS:.0e} ({width}={D}, {depth}="
                         f"{c[depth]}, vocab_size={c['vocab_size']}); its config.json is wrong or hostile: check its "
                         "size fields.")


def text_model_args(config: dict[str, Any], name: str = "the model") -> tuple[str, dict[str, Any]]:
    """A transformers config.json (as a dict) -> (weights layout, `TextEncoder` keyword arguments); a model_type
    or option that the TextEncoder does not compute is a ValueError naming it. The pooler is left to the caller
    (it exists when the weights have one)."""
    model_type = config.get("model_type")
    if model_type == "clip":  # a full CLIP repository: its text tower
        tower = config.get("text_config") or {}
        if not isinstance(tower, dict):
            _bad(name, "text_config", tower, "an object of the text tower's fields")
        config, model_type = {"model_type": "clip_text_model", **tower}, "clip_text_model"
    if not isinstance(model_type, str) or model_type not in FAMILIES:  # a list is unhashable: no `in` test
        raise ValueError(f"{name}: model_type {model_type!r} is not a text family this library loads; supported: "
                         f"{', '.join(sorted(FAMILIES))}.")
    arch, layout = FAMILIES[model_type]
    c = {**DEFAULTS[model_type], **config}
    for key in ("is_decoder", "add_cross_attention"):
        if c.get(key):
            _refuse(name, f"{key}=true")
    if c.get("position_embedding_type", "absolute") != "absolute":
        _refuse(name, f"position_embedding_type={c['position_embedding_type']!r}")
    _check_config(c, arch, model_type, name)
    if arch == "distilbert":
        return layout, dict(
            vocab_size=c["vocab_size"], embed_dim=c["dim"], depth=c["n_layers"], num_heads=c["n_heads"],
            max_len=c["max_position_embeddings"], mlp_ratio=_mlp_ratio(c["dim"], c["hidden_dim"]), norm_first=False,
            norm_eps=1e-12, mlp_layer=_act(c["activation"], name), drop_rate=c["dropout"],
            attn_drop_rate=c["attention_dropout"], pre_norm=True, global_pool="first")
    common = dict(vocab_size=c["vocab_size"], embed_dim=c["hidden_size"], depth=c["num_hidden_layers"],
                  num_heads=c["num_attention_heads"], max_len=c["max_position_embeddings"],
                  mlp_ratio=_mlp_ratio(c["hidden_size"], c["intermediate_size"]), norm_eps=c["layer_norm_eps"],
                  mlp_layer=_act(c["hidden_act"], name))
    if arch == "clip_text":
        eos = c.get("eos_token_id")
        # configs from before transformers' fix (#24773) say 2; their end-of-text is the row's highest id
        return layout, dict(common, norm_first=True, causal=True, global_pool="eos",
                            eos_token_id=None if eos == 2 or eos is None else eos,
                            attn_drop_rate=c["attention_dropout"])
    if model_type == "electra" and c["embedding_size"] != c["hidden_size"]:
        _refuse(name, f"embedding_size={c['embedding_size']} != hidden_size={c['hidden_size']} (a projected "
                      "embedding, as ELECTRA's small generators have)")
    out = dict(common, norm_first=False, pre_norm=True, type_vocab_size=c["type_vocab_size"], global_pool="first",
               drop_rate=c["hidden_dropout_prob"], attn_drop_rate=c["attention_probs_dropout_prob"])
    if arch == "roberta":
        out["position_padding_idx"] = c["pad_token_id"]
    return layout, out


def text_encoder_from_config(config: dict[str, Any], pooler: bool | None = None, **overrides: Any) -> TextEncoder:
    """A `TextEncoder` with random weights shaped as `config` (a transformers config.json as a dict) says, e.g.
    a small BERT to train from scratch. `pooler`: BERT's dense + tanh (default: for BERT and RoBERTa)."""
    _, kwargs = text_model_args(config)
    if pooler is None:
        pooler = config.get("model_type") in ("bert", "roberta", "xlm-roberta", "camembert")
    return TextEncoder(**{**kwargs, "pooler": pooler, **overrides})


def text_classifier_from_config(config: dict[str, Any], num_classes: int, **overrides: Any) -> TextClassifier:
    """A `TextClassifier` with random weights shaped as `config` (a transformers config.json as a dict) says, its
    head initialised as transformers does: e.g. a small BERT to train from scratch, which `save_text_model` then
    writes for transformers too. `overrides`: TextEncoder options (e.g. pos_embed='none' for an experiment;
    such a model no longer saves into transformers' layout)."""
    model_type = config.get("model_type")
    encoder = text_encoder_from_config(config, pooler=model_type == "bert", **overrides)
    return _classifier(encoder, {}, config, num_classes, LoadReport("a new model"), "the config", "no weights")


def _check_sizes(state: dict[str, torch.Tensor], kwargs: dict[str, Any], where: str) -> None:
    """The config's vocabulary, positions, width and depth held against the weights' own before the model is
    built: a config.json claiming 10**8 tokens or 10**5 blocks (within the parameter bound at a small width)
    is check_fit's sentence, not gigabytes allocated and then refused."""
    V, D, P, T = kwargs["vocab_size"], kwargs["embed_dim"], kwargs["max_len"], kwargs.get("type_vocab_size", 0)
    own = {"token_embed.weight": (V, D), "pos_embed": (1, P, D), **({"type_embed.weight": (T, D)} if T else {})}
    held = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    own.update({f"blocks.{i}.norm1.weight": (D,) for i in range(min(kwargs["depth"], held + 4))})
    meta = {k: torch.empty(shape, device="meta") for k, shape in own.items()}  # shapes only: nothing allocated
    check_fit({k: state[k] for k in own if k in state}, meta, where)


def create_text_model(name: str, cache_dir: str | Path | None = None, num_classes: int | None = None,
                      **overrides: Any) -> TextEncoder | TextClassifier:
    """The text model `name` names (`hf-hub:org/repo[@revision]` or `local-dir:/folder`) as a `TextEncoder` with
    its weights, in eval mode (as transformers' from_pretrained): `model(input_ids, attention_mask=...,
    token_type_ids=...)` gives `last_hidden_state` and `pooler_output` as transformers' model does.
    `num_classes=N`: a `TextClassifier` instead, the encoder under the family's sequence-classification head
    (vit.models.text_classifier), whose logits are transformers' *ForSequenceClassification's; the head's weights
    load when the checkpoint has a head of N classes (a fine-tuned repository, or a folder `save_text_model`
    wrote), else a new head is initialised as transformers does (normal, std initializer_range; the report says so).
    `overrides`: TextEncoder options that leave the weights' shapes alone (drop rates, fused_attn).
    A model that is not cached while offline (HF_HUB_OFFLINE=1) raises one sentence saying how to fetch it."""
    config = read_json(repo_file(name, ("config.json",), cache_dir), name)
    layout, kwargs = text_model_args(config, name)
    model_type = config.get("model_type")
    if num_classes is not None and model_type not in HEADS:
        raise ValueError(f"{name}: model_type {model_type!r} has no sequence-classification head (transformers has "
                         f"none either); fine-tune one of {', '.join(HEADS)}, or use its TextEncoder's pooled output.")
    weights = repo_file(name, WEIGHT_FILES, cache_dir, "its weights")
    report = LoadReport(f"{name} ({weights})")
    raw = read_state_dict(weights)
    state = text_state_dict(raw, layout, report)  # checked: floating point and finite
    _check_sizes(state, kwargs, f"{name} ({weights.name})")
    pooler = "pooler.fc.weight" in state
    if num_classes is not None:  # BERT's head reads the pooler; the others' the first token's raw state
        pooler = model_type == "bert"
        if not pooler and "pooler.fc.weight" in state:
            state = {k: v for k, v in state.items() if not k.startswith("pooler.")}
            report.actions.append("dropped the pooler (this family's classifier does not use it)")
    model = TextEncoder(**{**kwargs, "pooler": pooler, **overrides})
    if pooler and "pooler.fc.weight" not in state:
        state.update(_new_linear(model.pooler.fc, config, "pooler.fc."))
        report.actions.append("initialised a new pooler (the checkpoint has none)")
    check_fit(state, model.state_dict(), f"{name} ({weights.name})")
    model.load_state_dict(state)
    model.load_report = report
    if num_classes is None:
        return model.eval()
    model = _classifier(model, raw, config, num_classes, report, name, weights.name)
    model.source = name  # where save_text_model copies the tokenizer from
    return model.eval()


def _new_linear(layer: torch.nn.Linear, config: dict[str, Any], prefix: str) -> dict[str, torch.Tensor]:
    """transformers' init for a new Linear: weight ~ N(0, initializer_range), bias 0."""
    std = config.get("initializer_range", 0.02)
    return {prefix + "weight": torch.randn_like(layer.weight) * std, prefix + "bias": torch.zeros_like(layer.bias)}


def _classifier(encoder: TextEncoder, raw: dict[str, torch.Tensor], config: dict[str, Any], num_classes: int,
                report: LoadReport, name: str, filename: str) -> TextClassifier:
    """`encoder` under a `num_classes`-way head: the checkpoint's own when it has one of that size."""
    model_type = config["model_type"]
    c = {**DEFAULTS[model_type], **config}
    drop = c.get("seq_classif_dropout", 0.2) if model_type == "distilbert" else (
        c.get("classifier_dropout") if c.get("classifier_dropout") is not None else c["hidden_dropout_prob"])
    model = TextClassifier(encoder, num_classes, model_type, config, drop, c.get("pad_token_id", 0))
    head = head_state_dict(raw, model_type)
    held = head["head.fc.weight"].shape[0] if "head.fc.weight" in head else None
    if held != num_classes:
        head = {}
        for part in ("dense", "fc"):
            if isinstance(getattr(model.head, part), torch.nn.Linear):
                head.update(_new_linear(getattr(model.head, part), config, f"head.{part}."))
        report.actions.append(f"initialised a new {num_classes}-class head" + (
            f" (the checkpoint's has {held} classes)" if held is not None else " (the checkpoint has none)"))
    else:
        report.actions.append(f"loaded its {num_classes}-class head (the classifier above)")
    own = {k: v for k, v in model.state_dict().items() if k.startswith("head.")}
    check_fit(head, own, f"{name} ({filename})")
    check_weights(head, f"{name} ({filename})")
    model.head.load_state_dict({k[len("head."):]: v for k, v in head.items()})
    model.load_report = report
    return model


def build_text_model(cfg: Any, num_classes: int) -> TextClassifier:
    """train.py's model for `data.dataset: text_csv` (vit.config.Config `cfg`): the text model model.pretrained
    names under a `num_classes`-way head, with its own dropout rates (as transformers fine-tunes it), in training
    mode. The image counterpart is vit.models.build.build_model."""
    return create_text_model(cfg.model.pretrained, num_classes=num_classes).train()
