"""Text models by name (vit.create_text_model) against transformers' own models built from the same weights.

Each family is made by transformers from a small config with random (and then perturbed) weights, saved with
save_pretrained into a Hugging Face hub cache built in a temporary folder (models--org--name/refs/main,
snapshots/<commit>/) and as a plain folder, and loaded by name with HF_HUB_OFFLINE=1: nothing touches the network.
"""

import json

import pytest
import torch
from helpers import hub_snapshot

import vit
from vit.models.text_build import DEFAULTS

transformers = pytest.importorskip("transformers")

V, D, LAYERS, HEADS, FF, P = 99, 32, 2, 4, 37, 40  # FF = 37: an MLP width that is no multiple of D
BERTISH = dict(vocab_size=V, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
               max_position_embeddings=P)
CLIP_TEXT = dict(BERTISH, eos_token_id=V - 2, bos_token_id=V - 3, pad_token_id=1)


def _configs():
    T = transformers
    return {
        "bert": (T.BertModel, T.BertConfig(**BERTISH, type_vocab_size=3, hidden_act="gelu_new")),
        "roberta": (T.RobertaModel, T.RobertaConfig(**{**BERTISH, "max_position_embeddings": P + 2}, pad_token_id=1)),
        "xlm-roberta": (T.XLMRobertaModel, T.XLMRobertaConfig(**{**BERTISH, "max_position_embeddings": P + 2},
                                                            pad_token_id=1)),
        "camembert": (T.CamembertModel, T.CamembertConfig(**{**BERTISH, "max_position_embeddings": P + 2},
                                                          pad_token_id=1)),
        "electra": (T.ElectraModel, T.ElectraConfig(**BERTISH, embedding_size=D)),
        "distilbert": (T.DistilBertModel, T.DistilBertConfig(vocab_size=V, dim=D, n_layers=LAYERS, n_heads=HEADS,
                                                             hidden_dim=FF, max_position_embeddings=P)),
        "clip_text": (T.CLIPTextModel, T.CLIPTextConfig(**CLIP_TEXT)),
        # the original OpenAI configs: eos_token_id 2, end-of-text found as the row's highest id
        "clip_text_legacy": (T.CLIPTextModel, T.CLIPTextConfig(**{**CLIP_TEXT, "eos_token_id": 2})),
    }


FAMILIES = list(_configs())
TYPED = {"bert", "electra"}  # families with token types in use (RoBERTa's type vocabulary has one entry)


def _perturb(model):
    """Away from transformers' init (LayerNorm 1/0, std 0.02), so that every parameter matters to the outputs."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.1 if p.dim() == 1 else 0.15))
    return model.eval()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("text_hf")
    cache, refs = root / "hub", {}
    torch.manual_seed(0)
    for family, (cls, config) in _configs().items():
        model = _perturb(cls(config))
        model.save_pretrained(hub_snapshot(cache, f"org/{family}"))
        model.save_pretrained(root / "dirs" / family)
        refs[family] = model
    return root, refs


@pytest.fixture
def hub(cache, offline_hub):
    offline_hub(cache[0] / "hub")
    return cache


def _inputs(family, B=3, N=9):
    """Ids with padding at the end of two rows, two segments where the family has them, and CLIP's end-of-text
    token closing each row (the legacy configs find it as the row's highest id)."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, V - 3, (B, N), generator=g)
    lengths = [N, N - 3, 4]
    mask = torch.zeros(B, N, dtype=torch.long)
    types = torch.zeros(B, N, dtype=torch.long)
    pad = 1 if family in ("roberta", "xlm-roberta", "camembert", "clip_text", "clip_text_legacy") else 0
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, n:] = pad
        types[i, n // 2 : n] = 1 + (i % 2 if family == "bert" else 0)  # BERT here has 3 types
        if family.startswith("clip"):
            ids[i, n - 1] = V - 2 if family == "clip_text" else V - 1
    return ids, mask, (types if family in TYPED else None)


def _compare(ours, ref, family):
    ids, mask, types = _inputs(family)
    kw = {} if types is None else {"token_type_ids": types}
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask, **kw)
        got = ours(ids, attention_mask=mask, **kw)
    real = mask.bool()  # padded rows are not compared: they are whatever each model makes of padding
    torch.testing.assert_close(got.last_hidden_state[real], expected.last_hidden_state[real], atol=1e-5, rtol=0)
    if getattr(expected, "pooler_output", None) is not None:
        torch.testing.assert_close(got.pooler_output, expected.pooler_output, atol=1e-5, rtol=0)
    else:  # DistilBERT, ELECTRA: no pooler; ours pools the first token
        torch.testing.assert_close(got.pooler_output, expected.last_hidden_state[:, 0], atol=1e-5, rtol=0)
    # not vacuous: the outputs vary by token and by sample
    assert expected.last_hidden_state[real].std(0).mean() > 0.05
    return got


@pytest.mark.parametrize("family", FAMILIES)
def test_family_by_name_equals_transformers(hub, family):
    ours = vit.create_text_model(f"hf-hub:org/{family}")
    assert not ours.training and type(ours.blocks[0]) is vit.Block  # the ViT's own blocks
    _compare(ours, hub[1][family], family)


@pytest.mark.parametrize("family", ["bert", "roberta", "clip_text"])
def test_local_dir_and_revision_load_the_same(hub, family):
    ref = hub[1][family]
    _compare(vit.create_text_model(f"local-dir:{hub[0] / 'dirs' / family}"), ref, family)
    _compare(vit.create_text_model(f"hf-hub:org/{family}@{'a' * 40}"), ref, family)



def test_task_checkpoints_and_pickles_load_their_base_model(hub, tmp_path):
    """BertForSequenceClassification's `bert.` prefix and classifier, a full CLIP repository (text_model. beside
    vision_model.), and a pytorch_model.bin (read with weights_only=True) all load the base text model."""
    T = transformers
    cfg = _configs()["bert"][1]
    task = _perturb(T.BertForSequenceClassification(cfg))
    task.save_pretrained(tmp_path / "task")
    ours = vit.create_text_model(f"local-dir:{tmp_path / 'task'}")
    assert "dropped the checkpoint's classifier" in str(ours.load_report)
    _compare(ours, task.bert, "bert")

    clip = _perturb(T.CLIPModel(T.CLIPConfig(text_config=_configs()["clip_text"][1].to_dict(), vision_config=dict(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24, image_size=32,
        patch_size=16))))
    clip.save_pretrained(tmp_path / "clip")
    assert json.loads((tmp_path / "clip" / "config.json").read_text())["model_type"] == "clip"
    _compare(vit.create_text_model(f"local-dir:{tmp_path / 'clip'}"), clip.text_model, "clip_text")

    roberta = hub[1]["roberta"]
    (tmp_path / "bin").mkdir()
    roberta.config.save_pretrained(tmp_path / "bin")
    # as the first releases saved them: TensorFlow's LayerNorm gamma / beta, the position_ids buffer, a prefix
    old = {f"roberta.{k}".replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in roberta.state_dict().items()}
    old["roberta.embeddings.position_ids"] = torch.arange(P + 2)[None]
    assert any(k.endswith("LayerNorm.gamma") for k in old)
    torch.save(old, tmp_path / "bin" / "pytorch_model.bin")
    _compare(vit.create_text_model(f"local-dir:{tmp_path / 'bin'}"), roberta, "roberta")


def test_roberta_positions_count_from_the_padding_id(hub):
    """With naive 0..N-1 positions RoBERTa's outputs are far off: the comparison above can tell."""
    ours = vit.create_text_model("hf-hub:org/roberta")
    naive = vit.create_text_model("hf-hub:org/roberta")
    naive.position_padding_idx = None
    naive.max_len = P  # rows 0..N-1 of the same table
    ids, mask, _ = _inputs("roberta")
    with torch.no_grad():
        a, b = ours(ids, mask).last_hidden_state, naive(ids, mask).last_hidden_state
    assert (a - b)[mask.bool()].abs().max() > 0.1
    with pytest.raises(ValueError, match=f"longer than max_len={P}"):
        ours(torch.full((1, P + 1), 5))


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta"])
def test_roberta_positions_under_left_padding_equal_transformers(hub, family):
    """Padding before the tokens (a tokenizer with padding_side="left"): positions count real tokens only, so each
    row equals transformers' model on the same ids, and the right-padded row token for token."""
    ours, ref = vit.create_text_model(f"hf-hub:org/{family}"), hub[1][family]
    ids, mask, _ = _inputs(family)
    left = torch.stack([torch.cat([row[m == 0], row[m == 1]]) for row, m in zip(ids, mask)])  # padding first
    left_mask = mask.flip(1)
    assert (left_mask[:, 0] == 0).any()  # rows that really start with padding
    with torch.no_grad():
        expected = ref(input_ids=left, attention_mask=left_mask).last_hidden_state
        got = ours(left, attention_mask=left_mask)
        right = ours(ids, attention_mask=mask).last_hidden_state
    real = left_mask.bool()
    torch.testing.assert_close(got.last_hidden_state[real], expected[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(got.last_hidden_state[real], right[mask.bool()], atol=1e-5, rtol=0)


def test_missing_model_offline_is_the_image_sides_sentence(hub):
    with pytest.raises(FileNotFoundError) as e:
        vit.create_text_model("hf-hub:org/absent")
    msg = str(e.value)
    assert "model org/absent (its config.json) is not in the Hugging Face cache" in msg
    assert "HF_HUB_OFFLINE=1" in msg and "`hf download org/absent`" in msg and "\n" not in msg
    with pytest.raises(ValueError, match="names no repository; write hf-hub:org/name"):
        vit.create_text_model("bert-base-uncased")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        vit.create_text_model(f"local-dir:{hub[0] / 'nowhere'}")


@pytest.mark.parametrize("change,message", [
    (dict(model_type="gpt2"), "model_type 'gpt2' is not a text family this library loads; supported: bert"),
    (dict(position_embedding_type="relative_key"), "sets position_embedding_type='relative_key', which"),
    (dict(is_decoder=True), "sets is_decoder=true, which this library's TextEncoder does not compute"),
    (dict(add_cross_attention=True), "sets add_cross_attention=true"),
    (dict(hidden_act="relu"), "sets the activation 'relu' \\(supported: gelu"),
    (dict(model_type="electra", embedding_size=16), "embedding_size=16 != hidden_size=32"),
    (dict(model_type=["bert"]), "model_type \\['bert'\\] is not a text family"),  # TypeError: unhashable
    (dict(model_type="clip", text_config="x"), "sets text_config='x', which is not an object of the text tower"),
])
def test_unsupported_model_or_option_is_refused_by_name(hub, tmp_path, change, message):
    folder = tmp_path / "m"
    folder.mkdir()
    config = json.loads((hub[0] / "dirs" / "bert" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=message) as e:
        vit.create_text_model(f"local-dir:{folder}")
    assert "\n" not in str(e.value) and str(folder) in str(e.value)


def test_weights_of_another_shape_are_one_sentence(hub, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    config = json.loads((hub[0] / "dirs" / "bert" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    (folder / "model.safetensors").write_bytes((hub[0] / "dirs" / "bert" / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match=r"does not fit this model \(missing: blocks\.2\.norm1\.weight"):
        vit.create_text_model(f"local-dir:{folder}")


@pytest.mark.parametrize("model_type", sorted(DEFAULTS))
def test_config_defaults_are_transformers_own(model_type):
    """A config.json may leave fields out; ours fill in what transformers' config classes would."""
    T = transformers
    cls = T.CLIPTextConfig if model_type == "clip_text_model" else T.AutoConfig.for_model(model_type).__class__
    theirs = cls().to_dict()
    assert {k: theirs[k] for k in DEFAULTS[model_type]} == DEFAULTS[model_type]


def test_model_checks_ids_in_one_sentence():
    m = vit.TextEncoder(20, 16, 1, 2, max_len=8, type_vocab_size=2)
    with pytest.raises(ValueError, match="token id 20 is outside this model's vocabulary of 20 ids"):
        m(torch.tensor([[1, 20]]))
    with pytest.raises(ValueError, match="token_type_ids must lie in 0..1"):
        m(torch.tensor([[1, 2]]), token_type_ids=torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="must be integer token ids"):
        m(torch.zeros(1, 2))


@pytest.mark.slow
def test_example_fine_tunes_a_model_loaded_by_name(hub, tmp_path, capsys):
    """examples/text_classification.py --model local-dir:...: a BERT folder (weights + its tokenizer) fine-tuned
    for one epoch; the encoder starts from the folder's weights and training moves them."""
    import sys

    from helpers import ROOT

    sys.path.insert(0, str(ROOT / "examples"))
    import text_classification as ex

    words = sorted({w for text, _ in ex.make_sentences(__import__("random").Random(0)) for w in text.split()})
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)}
    assert len(vocab) <= V
    folder = tmp_path / "bert"
    hub[1]["bert"].save_pretrained(folder)
    transformers.BertTokenizer(vocab=vocab).save_pretrained(folder)
    before = vit.create_text_model(f"local-dir:{folder}").state_dict()
    seen = []
    real_run = ex.run
    ex.run = lambda model, *a, **k: (seen.append(model), real_run(model, *a, **k))[1]
    try:
        ex.main(["--model", f"local-dir:{folder}", "--epochs", "1", "--lr", "1e-3"])
    finally:
        ex.run = real_run
    out = capsys.readouterr().out
    assert f"local-dir:{folder}  epoch 1/1  train loss" in out and "test accuracy:" in out
    after = seen[0].encoder.state_dict()
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-4  # fine-tuned, from these weights
    ids = vit.load_tokenizer(f"local-dir:{folder}")(["the dog bites the man"])["input_ids"][0]
    assert ids[0] == vocab["[CLS]"] and vocab["[UNK]"] not in ids


def test_unreadable_config_is_one_sentence(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    for text, message in (("[1, 2]", "holds a JSON list, not an object"), ("{nope", "is not readable JSON"),
                          (" " * (2**20 + 1), "larger than such a file can be"),
                          ("[" * 10**5 + "]" * 10**5, "is not readable JSON \\(RecursionError")):
        (folder / "config.json").write_text(text)
        with pytest.raises(ValueError, match=message) as e:
            vit.create_text_model(f"local-dir:{folder}")
        assert "\n" not in str(e.value)


def _bert_folder(hub, tmp_path, change=None, edit=None):
    """A copy of the BERT folder with its config.json updated by `change` and its weights passed to `edit`."""
    from safetensors.torch import load_file, save_file

    src, folder = hub[0] / "dirs" / "bert", tmp_path / "m"
    folder.mkdir()
    config = json.loads((src / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **(change or {})}))
    state = load_file(str(src / "model.safetensors"))
    if edit is not None:
        edit(state)
    save_file(state, str(folder / "model.safetensors"))
    return folder


QKV = "encoder.layer.1.attention.self."


@pytest.mark.parametrize("bad,message", [
    (lambda w: w.to(torch.int8), "blocks.1.attn.k.weight is int8, not a floating-point tensor"),
    (lambda w: w > 0, "blocks.1.attn.k.weight is bool, not a floating-point tensor"),
    (lambda w: w.index_fill(0, torch.tensor([3]), float("nan")), "blocks.1.attn.k.weight holds non-finite"),
    (lambda w: torch.zeros(D, D + 1), r"shape mismatch: blocks\.1\.attn weight query, key, value \(32, 32\), "
                                      r"\(32, 33\), \(32, 32\)"),
    (lambda w: torch.zeros(2 * D, D), r"shape mismatch: blocks\.1\.attn weight query, key, value"),
])
def test_qkv_are_checked_before_they_are_fused(hub, tmp_path, bad, message):
    """An int8 or bool key projection would be cast by torch.cat to the query's float without a word, a key of
    another width would crash in torch.cat (or fuse into a (4D, D) matrix): each is one sentence naming it."""
    folder = _bert_folder(hub, tmp_path, edit=lambda s: s.update({QKV + "key.weight": bad(s[QKV + "key.weight"])}))
    with pytest.raises((ValueError, FloatingPointError), match=message) as e:
        vit.create_text_model(f"local-dir:{folder}")
    assert "\n" not in str(e.value) and str(folder) in str(e.value)


NAN = float("nan")


@pytest.mark.parametrize("change,message", [
    (dict(num_attention_heads=0), "num_attention_heads=0, which is not a positive integer"),
    (dict(hidden_size=0), "hidden_size=0, which is not a positive integer"),
    (dict(hidden_size=30), "hidden_size=30, which is not a multiple of num_attention_heads=4"),
    (dict(vocab_size="99"), "vocab_size='99', which is not a positive integer"),
    (dict(num_hidden_layers=-2), "num_hidden_layers=-2, which is not a positive integer"),
    (dict(num_hidden_layers=2.0), "num_hidden_layers=2.0, which is not a positive integer"),
    (dict(max_position_embeddings=True), "max_position_embeddings=True, which is not a positive integer"),
    (dict(intermediate_size=None), "intermediate_size=None, which is not a positive integer"),
    (dict(type_vocab_size=-1), "type_vocab_size=-1, which is not a count of token types"),
    (dict(layer_norm_eps=-1), "layer_norm_eps=-1, which is not a finite number between 0 and 1"),
    (dict(layer_norm_eps=NAN), "layer_norm_eps=nan, which is not a finite number"),
    (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob=1.5, which is not a probability"),
    (dict(hidden_act=["gelu"]), r"the activation \['gelu'\]"),
    (dict(vocab_size=10**13), r"would have about 3.2e\+14 parameters, more than 1e\+10 \(hidden_size=32"),
    (dict(num_hidden_layers=10**6, hidden_size=768, num_attention_heads=12), r"would have about 2.4e\+12 parameters"),
    (dict(vocab_size=10**8), r"shape mismatch: token_embed\.weight \(99, 32\) vs \(100000000, 32\)"),
    (dict(num_hidden_layers=10**5), r"missing: blocks\.2\.norm1\.weight, blocks\.3\.norm1\.weight"),
])
def test_a_hostile_config_is_one_sentence_before_anything_is_built(hub, tmp_path, monkeypatch, change, message):
    """Wrong types and ranges are named field by field; sizes past the image side's parameter bound are refused
    from the config alone, and sizes within it that the weights do not have before the model is allocated."""
    from vit.models import text_build

    folder = _bert_folder(hub, tmp_path, change)
    monkeypatch.setattr(text_build, "TextEncoder", lambda **kw: pytest.fail(f"a model was built: {kw}"))
    with pytest.raises(ValueError, match=message) as e:
        vit.create_text_model(f"local-dir:{folder}")
    assert "\n" not in str(e.value) and str(folder) in str(e.value)
    if "would have" in message:  # the same bound without weights
        with pytest.raises(ValueError, match="would have about"):
            vit.models.text_encoder_from_config(json.loads((folder / "config.json").read_text()))


def test_a_fifo_or_device_weights_file_is_named_not_missing(hub, tmp_path):
    import os

    folder = _bert_folder(hub, tmp_path)
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.safetensors is not a regular file \(it is a FIFO"):
        vit.create_text_model(f"local-dir:{folder}")
    (folder / "model.safetensors").unlink()
    os.symlink("/dev/zero", folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.safetensors is not a regular file \(it is a device"):
        vit.create_text_model(f"local-dir:{folder}")
