"""vit.load_tokenizer against transformers' tokenizers loaded from the same folder, on generated multilingual text.

Vocabularies are trained here with the tokenizers library on the generated sentences (WordPiece for BERT and
DistilBERT, byte-level BPE for RoBERTa and CLIP), handed to transformers' tokenizer classes and saved with
save_pretrained, so tokenizer.json and tokenizer_config.json are what transformers writes for such models.
"""

import json
import random

import pytest
import torch
from helpers import hub_snapshot

import vit

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers  # noqa: E402

WORDS = ["the", "cat", "sat", "on", "a", "mat", "running", "unbelievable", "tokenizer", "Hello", "WORLD", "don't",
         "it's", "3.14", "2026", "e-mail", "co-operate", "#tag", "@user", "x²"]
ACCENTED = ["café", "naïve", "Ångström", "São", "Zürich", "résumé", "façade", "Ελληνικά", "Москва", "Łódź",
            "e\u0301t\u0301e\u0301", "niño", "straße", "ĳssel"]
CJK = ["我爱AI", "東京タワー", "한국어", "中文分词", "漢字かな", "北京", "「引用」"]
EMOJI = ["😀", "👍🏽", "🇯🇵", "👨‍👩‍👧", "🤖!", "❤️", "🎉🎉"]
PUNCT = [",", ".", "!", "?", ";", "…", "—", "(", ")", "\"", "'"]


def _sentences(n=300, seed=0):
    rng = random.Random(seed)
    pools = [WORDS] * 4 + [ACCENTED] * 2 + [CJK, EMOJI, PUNCT]
    out = []
    for _ in range(n):
        words = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 14))]
        seps = [rng.choice([" ", " ", " ", "  ", "\t", ""]) for _ in words]
        out.append("".join(w + s for w, s in zip(words, seps)).strip() or "a")
    return out


SENTENCES = _sentences()
TRAIN = _sentences(200, seed=1)  # the vocabulary is learnt from other sentences: unknown pieces happen


def _wordpiece_vocab(lowercase):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(TRAIN, trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    return tok.get_vocab()


def _bpe(specials, **model_kwargs):
    """A byte-level BPE vocabulary and its merges (pairs), as RoBERTa's and CLIP's files hold them."""
    tok = Tokenizer(models.BPE(**model_kwargs))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    suffix = {"end_of_word_suffix": model_kwargs["end_of_word_suffix"]} if model_kwargs else {}
    tok.train_from_iterator(TRAIN, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), **suffix))
    merges = json.loads(tok.to_str())["model"]["merges"]
    return tok.get_vocab(), [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]


def _tokenizers():
    T = transformers
    bpe_vocab, bpe_merges = _bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    clip_vocab, clip_merges = _bpe(["<|startoftext|>", "<|endoftext|>"], end_of_word_suffix="</w>")
    for ch in list(clip_vocab):  # CLIP's vocabulary holds every byte also as a word end
        if len(ch) == 1 and ch + "</w>" not in clip_vocab:
            clip_vocab[ch + "</w>"] = len(clip_vocab)
    return {
        "bert-uncased": T.BertTokenizer(vocab=_wordpiece_vocab(True)),
        "bert-cased": T.BertTokenizer(vocab=_wordpiece_vocab(False), do_lower_case=False),
        "distilbert": T.DistilBertTokenizer(vocab=_wordpiece_vocab(True)),
        "roberta": T.RobertaTokenizer(vocab=bpe_vocab, merges=bpe_merges),
        "clip": T.CLIPTokenizer(vocab=clip_vocab, merges=clip_merges),
    }


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    out = {}
    for name, tok in _tokenizers().items():
        tok.save_pretrained(root / name)
        tok.save_pretrained(hub_snapshot(root / "hub", f"org/{name}"))
        out[name] = root / name
    return out


CALLS = [
    dict(),
    dict(padding=True),
    dict(padding=True, truncation=True, max_length=12),
    dict(padding="max_length", truncation=True, max_length=16),
]


@pytest.mark.parametrize("name", ["bert-uncased", "bert-cased", "distilbert", "roberta", "clip"])
def test_same_ids_as_transformers(folders, name):
    ref = transformers.AutoTokenizer.from_pretrained(folders[name])
    ours = vit.load_tokenizer(f"local-dir:{folders[name]}")
    assert ours.vocab_size == len(ref) and ours.pad_token_id == ref.pad_token_id
    firsts, seconds = SENTENCES[:150], SENTENCES[150:]
    for kw in CALLS:
        for args in ((SENTENCES,), (firsts, seconds)):
            expected, got = dict(ref(*args, **kw)), ours(*args, **kw)
            assert got.keys() == expected.keys(), (got.keys(), expected.keys())
            for key in expected:
                assert got[key] == expected[key], f"{name} {kw} {key}: first difference at row " \
                    f"{next(i for i, (a, b) in enumerate(zip(got[key], expected[key])) if a != b)}"
    assert ("token_type_ids" in got) == name.startswith("bert")
    if name.startswith("bert"):  # pairs really have two segments
        assert any(1 in row for row in got["token_type_ids"])
    # tensors, one string, and the text is really split (not one id per character, not all unknown)
    pt, ref_pt = ours(firsts, seconds, padding=True, return_tensors="pt"), ref(firsts, seconds, padding=True,
                                                                               return_tensors="pt")
    for key in ref_pt:
        assert torch.equal(pt[key], ref_pt[key])
    assert ours(SENTENCES[0]) == dict(ref(SENTENCES[0]))
    plain = ours(SENTENCES, add_special_tokens=False)["input_ids"]
    assert plain == ref(SENTENCES, add_special_tokens=False)["input_ids"]
    total, unknown = sum(map(len, plain)), sum(ids.count(ref.unk_token_id) for ids in plain)
    assert len(SENTENCES) * 3 < total < sum(map(len, SENTENCES)) and unknown < total / 10


def test_by_hub_name_offline_and_the_errors(folders, tmp_path, offline_hub):
    offline_hub(folders["roberta"].parent / "hub")
    ours, local = vit.load_tokenizer("hf-hub:org/roberta"), vit.load_tokenizer(f"local-dir:{folders['roberta']}")
    assert ours(SENTENCES, padding=True) == local(SENTENCES, padding=True)
    with pytest.raises(FileNotFoundError, match=r"model org/absent \(its tokenizer.json\) is not in the Hugging Face"):
        vit.load_tokenizer("hf-hub:org/absent")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json .*save_pretrained"):
        vit.load_tokenizer(f"local-dir:{tmp_path / 'old'}")
    with pytest.raises(ValueError, match="different lengths; pass padding=True"):
        ours(["a", "a much longer sentence"], return_tensors="pt")
    with pytest.raises(ValueError, match="unknown padding 'left'"):
        ours("a", padding="left")
    with pytest.raises(ValueError, match="2 texts but 1 text pairs"):
        ours(["a", "b"], ["c"])


def test_tokenizer_feeds_the_model(folders):
    """model(**tok(...)) works as with transformers: the keys are the model's argument names."""
    tok = vit.load_tokenizer(f"local-dir:{folders['bert-uncased']}")
    model = vit.TextEncoder(tok.vocab_size, 16, 1, 2, max_len=64, type_vocab_size=2, global_pool="first").eval()
    batch = tok(SENTENCES[:4], SENTENCES[4:8], padding=True, truncation=True, max_length=32, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch)
    assert out.last_hidden_state.shape[:2] == batch["input_ids"].shape


@pytest.mark.parametrize("config,message", [
    (dict(pad_token=0), "sets pad_token=0, which is not a token string"),
    (dict(pad_token=["[PAD]"]), r"sets pad_token=\['\[PAD\]'\], which is not a token string"),
    (dict(pad_token={"content": 5}), "sets pad_token=.*which is not a token string"),
    (dict(model_input_names=5), "sets model_input_names=5, which is not a list of input names"),
    (dict(model_input_names=["input_ids", 3]), "sets model_input_names=.*which is not a list of input names"),
    (dict(model_max_length=-1), "sets model_max_length=-1, which is not a positive number of tokens"),
    (dict(model_max_length=float("nan")), "sets model_max_length=nan, which is not a positive number"),
    (dict(model_max_length="512"), "sets model_max_length='512', which is not a positive number"),
    (dict(model_max_length=1.9e19), "sets model_max_length=1.9e\\+19, which is not at most 1048576 tokens"),
    (dict(padding_side="up"), "sets padding_side='up', which is not 'left' or 'right'"),
])
def test_a_bad_tokenizer_config_is_one_sentence(folders, config, message):
    backend = vit.load_tokenizer(f"local-dir:{folders['bert-uncased']}").backend
    with pytest.raises(ValueError, match=message) as e:
        vit.hub.Tokenizer(backend, {"pad_token": "[PAD]", **config})("a", padding=True, truncation=True)
    assert "\n" not in str(e.value) and "fix or remove that field" in str(e.value)


def test_transformers_no_limit_length_still_means_none(folders):
    backend = vit.load_tokenizer(f"local-dir:{folders['bert-uncased']}").backend
    assert vit.hub.Tokenizer(backend, {"model_max_length": 1e30}).model_max_length is None
    assert vit.hub.Tokenizer(backend, {"model_max_length": 512}).model_max_length == 512


def test_a_huge_max_length_is_refused_before_the_rust_tokenizer_aborts(folders):
    """padding='max_length' with max_length=10**9 makes the Rust tokenizer abort the whole process (SIGABRT);
    each call runs in a forked child so that an abort fails this test instead of killing pytest."""
    import os

    tok = vit.load_tokenizer(f"local-dir:{folders['bert-uncased']}")
    for n in (10**9, 0, -1, 2.5, True):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report the refusal (or nothing) and leave without running pytest's teardown
            try:
                tok(["a b", "c"], padding="max_length", truncation=True, max_length=n)
            except ValueError as e:
                os.write(write, str(e).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            message = f.read()
        status = os.waitpid(pid, 0)[1]
        assert os.WIFEXITED(status), f"max_length={n!r}: the child died of signal {os.WTERMSIG(status)}"
        assert message == f"max_length={n!r} is not a number of tokens from 1 to 1048576; pass the model's " \
                          "maximum length (e.g. 512) or leave it out."


@pytest.mark.parametrize("filename", ["tokenizer.json", "tokenizer_config.json"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_fifo_or_device_tokenizer_file_is_named_not_missing(folders, tmp_path, filename, kind):
    """A FIFO would hang a read and /dev/zero never ends: each is refused by name, never taken for an absent file
    ("has no tokenizer.json") nor skipped (then "sets no pad_token")."""
    import os
    import shutil

    folder = shutil.copytree(folders["bert-uncased"], tmp_path / "tok")
    (folder / filename).unlink()
    os.mkfifo(folder / filename) if kind == "fifo" else os.symlink("/dev/zero", folder / filename)
    with pytest.raises(ValueError, match=f"{filename} is not a regular file") as e:
        vit.load_tokenizer(f"local-dir:{folder}")
    assert "\n" not in str(e.value)
