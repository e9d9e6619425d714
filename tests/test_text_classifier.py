"""Text classification (vit.create_text_model(name, num_classes=N), vit.models.text_save) against transformers'
*ForSequenceClassification models on the same weights: logits loaded from their checkpoints, and logits of
what we save loaded back by transformers' AutoModelForSequenceClassification, each within 1e-5.

transformers builds each family from a tiny config with random, perturbed weights, saved with save_pretrained
into a hub cache built in a temporary folder and loaded by name with HF_HUB_OFFLINE=1.
"""

import csv
import json

import pytest
import torch
from helpers import hub_snapshot

import vit
from vit.models.text_save import save_text_model

transformers = pytest.importorskip("transformers")

V, D, LAYERS, HEADS, FF, P, C = 99, 32, 2, 4, 37, 40, 3
BERTISH = dict(vocab_size=V, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FF,
               max_position_embeddings=P, num_labels=C)
ROBERTISH = dict(BERTISH, max_position_embeddings=P + 2, pad_token_id=1)


def _configs():
    T = transformers
    return {
        "bert": (T.BertForSequenceClassification, T.BertConfig(**BERTISH, type_vocab_size=3)),
        "roberta": (T.RobertaForSequenceClassification, T.RobertaConfig(**ROBERTISH)),
        "xlm-roberta": (T.XLMRobertaForSequenceClassification, T.XLMRobertaConfig(**ROBERTISH)),
        "electra": (T.ElectraForSequenceClassification, T.ElectraConfig(**BERTISH, embedding_size=D)),
        "distilbert": (T.DistilBertForSequenceClassification, T.DistilBertConfig(
            vocab_size=V, dim=D, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FF, max_position_embeddings=P,
            num_labels=C)),
    }


FAMILIES = list(_configs())


def _perturb(model):
    """Away from transformers' init, so that every parameter (pooler and head included) matters to the logits."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.1 if p.dim() == 1 else 0.15))
    return model.eval()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("text_cls")
    refs = {}
    torch.manual_seed(0)
    for family, (cls, config) in _configs().items():
        model = _perturb(cls(config))
        model.save_pretrained(hub_snapshot(root / "hub", f"org/{family}"))
        refs[family] = model
    base = _perturb(transformers.BertModel(transformers.BertConfig(**BERTISH)))  # no head: a new one is made
    base.save_pretrained(hub_snapshot(root / "hub", "org/bert-base"))
    return root, refs


@pytest.fixture
def hub(cache, offline_hub):
    offline_hub(cache[0] / "hub")
    return cache


def _inputs(family, B=3, N=9):
    """Ids with padding at the end of two rows (the family's pad id) and two segments where BERT has them."""
    g = torch.Generator().manual_seed(2)
    pad = 1 if "roberta" in family else 0
    ids = torch.randint(3, V, (B, N), generator=g)
    mask = torch.ones(B, N, dtype=torch.long)
    mask[1, 6:], mask[2, 4:] = 0, 0
    ids[mask == 0] = pad
    kw = dict(input_ids=ids, attention_mask=mask)
    if family in ("bert", "electra"):
        kw["token_type_ids"] = (torch.arange(N) >= 3).long().expand(B, N).contiguous()
    return kw


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers_and_survive_a_save(hub, tmp_path, family):
    root, refs = hub
    ours = vit.create_text_model(f"hf-hub:org/{family}", num_classes=C)
    assert ours.num_features == ours.embed_dim == ours.encoder.num_features == D
    assert f"loaded its {C}-class head" in str(ours.load_report)  # the checkpoint's own head
    kw = _inputs(family)
    with torch.no_grad():
        want = refs[family](**kw).logits
        got = ours(**kw)
    assert want.abs().max() > 0.1 and (want[0] - want[1]).abs().max() > 1e-3  # a comparison that can fail
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # saved by us -> transformers and we load the same logits; the labels travel in config.json
    labels = ["neg", "neutral", "pos"]
    folder = save_text_model(tmp_path / "out", ours, labels)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert type(theirs) is type(refs[family])
    again = vit.create_text_model(f"local-dir:{folder}", num_classes=C)
    with torch.no_grad():
        torch.testing.assert_close(theirs(**kw).logits, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(again(**kw), want, atol=1e-5, rtol=0)
    assert theirs.config.id2label == dict(enumerate(labels)) and theirs.config.num_labels == C


def test_padding_is_masked_without_an_attention_mask(hub):
    """train.py's text batches are ids padded with the pad id and no mask: the classifier masks the pad id."""
    ours = vit.create_text_model("hf-hub:org/roberta", num_classes=C)
    kw = _inputs("roberta")
    with torch.no_grad():
        torch.testing.assert_close(ours(kw["input_ids"]), hub[1]["roberta"](**kw).logits, atol=1e-5, rtol=0)


def test_a_base_model_gets_a_new_head_and_a_head_of_another_size_is_replaced(hub):
    base = vit.create_text_model("hf-hub:org/bert-base", num_classes=5)
    assert base.head.fc.out_features == 5 and "initialised a new 5-class head" in str(base.load_report)
    # the base model's pooler is loaded (BERT's classifier reads it), the head is new: std 0.02, bias 0
    assert 0.01 < base.head.fc.weight.std() < 0.04 and not base.head.fc.bias.any()
    other = vit.create_text_model("hf-hub:org/distilbert", num_classes=2)
    assert "the checkpoint's has 3 classes" in str(other.load_report)
    assert isinstance(vit.create_text_model("hf-hub:org/bert"), vit.TextEncoder)  # no num_classes: the encoder


def test_classifier_refusals_are_one_sentence(hub, tmp_path):
    with pytest.raises(ValueError, match="num_classes=0 is not a positive whole number"):
        vit.create_text_model("hf-hub:org/bert", num_classes=0)
    model = vit.create_text_model("hf-hub:org/bert", num_classes=C)
    with pytest.raises(ValueError, match="2 class names for a 3-class model"):
        save_text_model(tmp_path / "x", model, ["a", "b"])
    assert not (tmp_path / "x").exists()


def test_config_json_is_the_families_with_labels(hub, tmp_path):
    model = vit.create_text_model("hf-hub:org/distilbert", num_classes=C)
    saved = json.loads((save_text_model(tmp_path / "d", model, ["a", "b", "c"]) / "config.json").read_text())
    assert saved["architectures"] == ["DistilBertForSequenceClassification"] and saved["model_type"] == "distilbert"
    assert saved["label2id"] == {"a": 0, "b": 1, "c": 2} and saved["num_labels"] == 3


# --- the round trip: a CSV through train.py, the checkpoint loaded by us and by transformers -----------------------
WORDS = {"pos": ["good", "great", "fine", "nice"], "neg": ["bad", "awful", "poor", "sad"]}
FILLER = ["the", "film", "was", "a", "day", "very", "and", "plot", "it"]


def _text_csv(path, n=48, seed=0):
    import random

    rng = random.Random(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(n):
            label = ("pos", "neg")[i % 2]
            words = [rng.choice(FILLER) for _ in range(rng.randint(2, 7))] + [rng.choice(WORDS[label])]
            rng.shuffle(words)
            w.writerow([" ".join(words), label])
    return path


def _tiny_bert(folder):
    """A tiny BERT (no head) and its WordPiece tokenizer, as save_pretrained writes them."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *FILLER, *WORDS["pos"], *WORDS["neg"]]
    tok = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(vocab)})
    tok.save_pretrained(folder)
    cfg = transformers.BertConfig(**{**BERTISH, "vocab_size": len(vocab)})
    transformers.BertModel(cfg).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_text_csv_through_train_py_then_transformers_loads_the_checkpoint(tmp_path):
    from helpers import run_script

    from vit.models import load_checkpoint

    base = _tiny_bert(tmp_path / "bert")
    data = _text_csv(tmp_path / "reviews.csv")
    r = run_script("train.py", "--data.dataset=text_csv", f"--data.root={data}", f"--model.pretrained=local-dir:{base}",
                   f"--run.output_dir={tmp_path}", "--run.name=t", "--run.epochs=2", "--data.batch_size=8",
                   "--optim.lr=1e-3", "--optim.warmup_epochs=0", "--data.num_workers=0")
    assert r.returncode == 0, r.stderr[-3000:]
    best = tmp_path / "t" / "best"
    ours, cfg, classes, meta = load_checkpoint(best)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(best).eval()
    tok = transformers.AutoTokenizer.from_pretrained(best)  # the tokenizer files travelled with the weights
    batch = tok(["the film was good", "a bad day and a very poor plot", "nice"], padding=True, return_tensors="pt")
    with torch.no_grad():
        want = theirs(**batch).logits
        torch.testing.assert_close(ours(**batch), want, atol=1e-5, rtol=0)
    fresh = vit.create_text_model(f"local-dir:{base}", num_classes=2)
    with torch.no_grad():
        moved = (fresh.encoder(**batch).pooler_output - ours.encoder(**batch).pooler_output).abs().max()
    assert moved > 1e-4  # the encoder was fine-tuned, not only the head
    assert classes == ["neg", "pos"] and theirs.config.id2label == {0: "neg", 1: "pos"} and meta["step"] > 0

    # evaluate.py and predict.py on the checkpoint: the probabilities transformers gives for the same sentences
    def softmax(texts):
        with torch.no_grad():
            return theirs(**tok(texts, padding=True, return_tensors="pt")).logits.softmax(1)

    r = run_script("evaluate.py", "--checkpoint", str(best), "--out", str(tmp_path / "eval"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "eval" / "predictions.csv")))
    assert len(rows) == 10  # a stratified fifth of 48 rows
    probs = softmax([row["sample"] for row in rows])
    assert [float(row["prob1"]) for row in rows] == pytest.approx(probs.max(1).values.tolist(), abs=1e-5)
    (tmp_path / "new.txt").write_text("the film was good\n\na bad day\n")
    r = run_script("predict.py", "--checkpoint", str(best), str(tmp_path / "new.txt"), "--out", str(tmp_path / "p"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "p" / "predictions.csv")))
    assert [(row["path"].rsplit(":", 1)[1], row["text"]) for row in rows] == [("1", "the film was good"),
                                                                             ("3", "a bad day")]
    probs = softmax(["the film was good", "a bad day"])
    assert [float(row["prob1"]) for row in rows] == pytest.approx(probs.max(1).values.tolist(), abs=1e-5)
    assert [row["pred1_name"] for row in rows] == [classes[i] for i in probs.argmax(1)]


# --- the data mode and the checkpoint folder, without a training run -------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return _tiny_bert(tmp_path_factory.mktemp("tiny_bert") / "bert")


def _text_config(csv_path, base, **data):
    from vit.config import load_config

    return load_config(None, {"data.dataset": "text_csv", "data.root": str(csv_path),
                              "model.pretrained": f"local-dir:{base}", **{f"data.{k}": v for k, v in data.items()}})


def test_text_csv_batches_are_the_tokenizers_own_padding(tiny_bert, tmp_path):
    from vit.data import build_datasets, build_loaders

    cfg = _text_config(_text_csv(tmp_path / "r.csv", n=20), tiny_bert, batch_size=4, num_workers=0)
    train, val, classes = build_datasets(cfg)
    assert classes == ["neg", "pos"] and (len(train), len(val)) == (16, 4)
    assert sorted(val.labels) == [0, 0, 1, 1]  # stratified
    x, y = next(iter(build_loaders(cfg, train, val)[1]))  # val: in order
    tok = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    want = tok(val.texts[:4], padding=True, return_tensors="pt")
    assert torch.equal(x, want["input_ids"]) and (want["attention_mask"] == 0).any()  # padded rows in the batch
    assert y.tolist() == val.labels[:4]
    # the pad id is the tokenizer's, not 0 (RoBERTa's is 1); an index column (evaluate.py's) is stacked too
    from vit.data.text import TextDataset

    x, y, i = TextDataset([[5, 6, 7], [8]], [1, 0], ["a", "b"], 1, ["s", "t"]).collate(
        [(torch.tensor([5, 6, 7]), 1, 0), (torch.tensor([8]), 0, 1)])
    assert x.tolist() == [[5, 6, 7], [8, 1, 1]] and y.tolist() == [1, 0] and i.tolist() == [0, 1]


def test_text_csv_split_column_and_bad_files_are_one_sentence(tiny_bert, tmp_path):
    from vit.data import DataError
    from vit.data.text import build_text_datasets

    path = tmp_path / "s.csv"
    path.write_text("sentence,label,split\ngood film,2,train\nbad film,10,train\nnice,2,val\nsad,10,test\n")
    cfg = _text_config(path, tiny_bert, text_column="sentence")
    train, val, classes = build_text_datasets(cfg)
    assert classes == ["2", "10"] and train.texts == ["good film", "bad film"] and val.texts == ["nice"]
    assert build_text_datasets(cfg, ("test",))[1].texts == ["sad"]
    with pytest.raises(DataError, match="has no column 'text' .*data.text_column"):
        build_text_datasets(_text_config(path, tiny_bert))
    path.write_text("text,label,split\ngood,a,train\nbad,b,holdout\n")
    with pytest.raises(DataError, match="split column holds 'holdout'; use train, val or test"):
        build_text_datasets(_text_config(path, tiny_bert))


def test_a_text_checkpoint_is_ours_and_transformers(hub, tmp_path):
    from vit.config import load_config
    from vit.models import load_checkpoint, save_checkpoint
    from vit.models.checkpoint import is_text_checkpoint

    model = vit.create_text_model("hf-hub:org/roberta", num_classes=C)
    cfg = load_config(None, {"data.dataset": "text_csv", "data.root": "x.csv",
                             "model.pretrained": "hf-hub:org/roberta"})
    folder = save_checkpoint(tmp_path / "best", model, cfg, ["a", "b", "c"], {"step": 3})
    assert is_text_checkpoint(folder) and not is_text_checkpoint(tmp_path)
    again, saved_cfg, classes, meta = load_checkpoint(folder)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    kw = _inputs("roberta")
    with torch.no_grad():
        want = hub[1]["roberta"](**kw).logits
        torch.testing.assert_close(again(**kw), want, atol=1e-5, rtol=0)
        torch.testing.assert_close(theirs(**kw).logits, want, atol=1e-5, rtol=0)
    assert classes == ["a", "b", "c"] and meta == {"step": 3}
    assert saved_cfg.model.pretrained == f"local-dir:{folder}"  # its tokenizer: the folder's own copy
