"""vit.create_clip_model (our VisionTransformer + TextEncoder) against open_clip's and transformers' own CLIP / SigLIP.

Tiny random models of each library are saved in their repository layouts (open_clip_config.json +
open_clip_model.safetensors; transformers' save_pretrained) into a hub cache built in a temporary folder and read
by `hf-hub:org/name` with HF_HUB_OFFLINE=1. Oracles: open_clip's encode_image / encode_text / forward, transformers'
get_image_features / get_text_features / logits_per_image; the tokenizer against open_clip's SimpleTokenizer on
generated prompts (CLIP's BPE vocabulary ships in open_clip's wheel; its tokenizer.json is written here with the
`tokenizers` library as transformers' converter lays it out).
"""

import json
import random

import pytest
import torch
from helpers import hub_snapshot, perturb
from safetensors.torch import save_file

import vit

open_clip = pytest.importorskip("open_clip")
transformers = pytest.importorskip("transformers")

IMG = 32
OPEN_CLIP = {  # name -> (model class, model_cfg)
    "oc_clip": ("CLIP", dict(embed_dim=24, quick_gelu=True,
                             vision_cfg=dict(image_size=IMG, layers=2, width=32, head_width=8, patch_size=8),
                             text_cfg=dict(context_length=16, vocab_size=49408, width=16, heads=2, layers=2))),
    # SigLIP's layout: a timm trunk with attention-pool (map) head, bidirectional text pooled last, biased
    # projection, a learned logit bias; the text tower under `text.` (CustomTextCLIP)
    "oc_siglip": ("CustomTextCLIP", dict(
        embed_dim=64, init_logit_bias=-10.0, custom_text=True,
        vision_cfg=dict(image_size=IMG, timm_model_name="test_vit", timm_pool="map", timm_proj="none"),
        text_cfg=dict(context_length=12, vocab_size=60, width=32, heads=4, layers=2, no_causal_mask=True,
                      pool_type="last", proj_bias=True, norm_kwargs=dict(eps=1e-6),
                      act_kwargs=dict(approximate="tanh")))),  # SigLIP2's text activation
}
TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=IMG, intermediate_size=96,
             patch_size=8)
TEXT = dict(vocab_size=70, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=10, bos_token_id=68, eos_token_id=69)


def clip_tokenizer_json() -> str:
    """open_clip's CLIP BPE (its vocabulary and merges) as a tokenizer.json, laid out as transformers' CLIP
    converter writes it: NFC, whitespace runs, lowercase; CLIP's split pattern, byte-level; BPE with '</w>'."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    t = open_clip.tokenizer.SimpleTokenizer()
    names = {t.decoder[t.sot_token_id]: "<|startoftext|>", t.decoder[t.eot_token_id]: "<|endoftext|>"}
    vocab = {names.get(k, k): v for k, v in t.encoder.items()}
    merges = sorted(t.bpe_ranks, key=t.bpe_ranks.get)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="</w>",
                        unk_token="<|endoftext|>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Lowercase()])
    split = Regex(r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""")
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(split, behavior="removed", invert=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|startoftext|>", "<|endoftext|>"])
    return tok.to_str()


def siglip_tokenizer_folder(folder, vocab_size=60):
    """SigLIP's tokenizer files as its hub repositories hold them, for a vocabulary trained here: a SentencePiece
    unigram model as transformers' T5 converter lays it out (Metaspace '▁' before the first word, '</s>'
    appended; <pad> 0, </s> 1, <unk> 2) and tokenizer_config.json padding with '</s>', as SigLIP pads."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import Unigram

    from vit.hub.clip_tokenizer import clean_text

    tok = Tokenizer(Unigram())
    tok.normalizer = normalizers.Replace(Regex(" {2,}"), " ")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    corpus = [clean_text(t, "canonicalize") for t in prompts(400, seed=7)]
    tok.train_from_iterator(corpus, trainers.UnigramTrainer(vocab_size=vocab_size, unk_token="<unk>",
                                                            special_tokens=["<pad>", "</s>", "<unk>"]))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="T5Tokenizer", pad_token="</s>", eos_token="</s>", unk_token="<unk>", model_max_length=64)))
    return folder


def gemma_tokenizer_folder(folder, template="$A <eos>", **config):
    """SigLIP2's tokenizer files as its repositories hold them, for a vocabulary trained here: Gemma's BPE (byte
    fallback, spaces as '▁', no pre-split; <pad> 0, <eos> 1, <bos> 2, <unk> 3) with `template` as its post-processor,
    and tokenizer_config.json naming GemmaTokenizer with `config` (add_bos_token, add_eos_token, padding_side)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    from vit.hub.clip_tokenizer import clean_text

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    tok = Tokenizer(BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    corpus = [clean_text(t, "lower") for t in prompts(400, seed=7)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=60, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single=template, pair=f"{template} {template.replace('$A', '$B')}", special_tokens=[("<eos>", 1), ("<bos>", 2)])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="GemmaTokenizer", pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>",
        mask_token="<mask>", model_max_length=64, **config)))
    return folder


def prompts(n=300, seed=0):
    """Captions with what open_clip's cleaning touches: case, HTML entities, tabs and runs of spaces, accents,
    apostrophes, digits, emoji, CJK, underscores, and ones longer than the context."""
    words = ["a", "photo", "of", "the", "Cat", "DOG's", "naïve", "café", "3", "42x", "!!", "  ", "\t", "&amp;",
             "don't", "We'll", "🙂", "日本", "über", "_under_", "scratched", "part.", "x" * 30]
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 25))) for _ in range(n)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip")
    refs = {}
    torch.manual_seed(0)
    bpe = clip_tokenizer_json()
    for name, (cls, cfg) in OPEN_CLIP.items():
        model = perturb(getattr(open_clip.model, cls)(**{k: v for k, v in cfg.items() if k != "custom_text"}))
        folder = hub_snapshot(root / "hub", f"org/{name}")
        (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
        if name == "oc_clip":
            (folder / "tokenizer.json").write_text(bpe)
        refs[name] = model
    T = transformers
    for name, model in {
        "hf_clip": T.CLIPModel(T.CLIPConfig(text_config=TEXT, vision_config=TOWER, projection_dim=20)),
        "hf_siglip": T.SiglipModel(T.SiglipConfig(
            text_config=dict(TEXT, hidden_act="gelu_pytorch_tanh", projection_size=32), vision_config=TOWER)),
    }.items():
        model = perturb(model)
        model.save_pretrained(hub_snapshot(root / "hub", f"org/{name}"))
        refs[name] = model
    return root, refs


@pytest.fixture
def hub(cache, offline_hub):
    offline_hub(cache[0] / "hub")
    return cache[1]


def _inputs(vocab, length, n=5):
    g = torch.Generator().manual_seed(3)
    images = torch.randn(4, 3, IMG, IMG, generator=g)
    ids = torch.randint(1, vocab, (n, length), generator=g)
    return images, ids


@pytest.mark.parametrize("name", list(OPEN_CLIP))
def test_open_clip_features_and_logits(hub, name):
    ref = hub[name]
    model = vit.create_clip_model(f"hf-hub:org/{name}")
    assert isinstance(model.visual, vit.VisionTransformer) and isinstance(model.text, vit.TextEncoder)
    text_cfg = OPEN_CLIP[name][1]["text_cfg"]
    images, ids = _inputs(text_cfg["vocab_size"], text_cfg["context_length"])
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(images), ref.encode_image(images), atol=1e-5, rtol=0)
        expected = ref.encode_text(ids)
        torch.testing.assert_close(model.encode_text(ids), expected, atol=1e-5, rtol=0)
        ours, theirs = model(images, ids), ref(images, ids)
        assert len(ours) == len(theirs) == (4 if name == "oc_siglip" else 3)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.logits(ours[0], ours[1]), ref.get_logits(images, ids)[0], atol=1e-5, rtol=0)
    assert expected.std(0).mean() > 0.05  # not vacuous: features vary by caption


def test_hf_models_features_and_logits(hub):
    for name in ("hf_clip", "hf_siglip"):
        ref = hub[name]
        model = vit.create_clip_model(f"hf-hub:org/{name}")
        images, ids = _inputs(TEXT["vocab_size"], TEXT["max_position_embeddings"])
        with torch.no_grad():
            out = ref(input_ids=ids, pixel_values=images)
            torch.testing.assert_close(model.encode_image(images), ref.get_image_features(pixel_values=images)
                                       .pooler_output, atol=1e-5, rtol=0)
            torch.testing.assert_close(model.encode_text(ids), ref.get_text_features(input_ids=ids).pooler_output,
                                       atol=1e-5, rtol=0)
            image, text = model(images, ids)[:2]
            torch.testing.assert_close(model.logits(image, text), out.logits_per_image, atol=1e-5, rtol=0)
        assert out.logits_per_image.std() > 0.05, name
        assert (model.logit_bias is not None) == (name == "hf_siglip")


def test_tokenizer_ids_equal_open_clip(hub):
    """CLIP's BPE through `tokenizers` against open_clip's SimpleTokenizer on 300 generated captions (case, HTML
    entities, whitespace, accents, emoji, CJK; some cut at the context length), then through the model."""
    model = vit.create_clip_model("hf-hub:org/oc_clip")
    texts = prompts()
    ours, theirs = model.tokenizer(texts), open_clip.tokenizer.SimpleTokenizer(context_length=16)(texts)
    assert torch.equal(ours, theirs)
    assert (theirs[:, -1] != 0).any() and (theirs[:, -1] == 0).any()  # cut and padded captions both present
    with torch.no_grad():
        torch.testing.assert_close(model.encode_text(ours[:20]), hub["oc_clip"].encode_text(theirs[:20]),
                                   atol=1e-5, rtol=0)


def test_not_a_clip_repository_is_one_sentence(hub, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="not a CLIP or SigLIP repository") as e:
        vit.create_clip_model(f"local-dir:{tmp_path}")
    assert "\n" not in str(e.value)


def _hash_tokenizer(length, vocab):
    """Deterministic ids per caption (for a repository without a tokenizer.json): the same for both libraries."""
    def tok(texts):
        return torch.stack([torch.randint(1, vocab, (length,), generator=torch.Generator().manual_seed(
            sum(map(ord, t)) * 31 + len(t))) for t in texts])
    return tok


@pytest.mark.parametrize("name", list(OPEN_CLIP))
def test_zero_shot_logits_equal_open_clip(hub, name):
    """Our classifier (text side built once) against open_clip's build_zero_shot_classifier and its logits by hand:
    softmax for CLIP, sigmoid with logit_bias for SigLIP."""
    from open_clip.zero_shot_classifier import build_zero_shot_classifier

    from vit.eval.zero_shot import DEFAULT_TEMPLATES, ZeroShotClassifier

    ref, model = hub[name], vit.create_clip_model(f"hf-hub:org/{name}")
    text_cfg = OPEN_CLIP[name][1]["text_cfg"]
    tok = model.tokenizer or _hash_tokenizer(text_cfg["context_length"], text_cfg["vocab_size"])
    theirs_tok = open_clip.tokenizer.SimpleTokenizer(context_length=16) if model.tokenizer else tok
    classes = ["red circle", "blue square", "scratched part", "cat"]
    clf = ZeroShotClassifier(model, classes, tokenizer=tok)
    images = _inputs(10, 4)[0]
    with torch.no_grad():
        weights = build_zero_shot_classifier(ref, theirs_tok, classes, DEFAULT_TEMPLATES)  # (E, C)
        expected = ref.logit_scale.exp() * ref.encode_image(images, normalize=True) @ weights
        if ref.logit_bias is not None:
            expected = expected + ref.logit_bias
        logits = clf(images)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    probs = clf.probabilities(logits)
    torch.testing.assert_close(probs, expected.sigmoid() if name == "oc_siglip" else expected.softmax(-1))
    assert expected.std() > 0.01  # not vacuous


def test_zero_shot_accuracy_on_a_folder(hub, tmp_path):
    """A generated image folder: class names read from its subfolders, the logits of every file equal open_clip's
    on the same preprocessed pixels, and the accuracy is their argmax against the folder labels."""
    from helpers import make_image_folder
    from open_clip.zero_shot_classifier import build_zero_shot_classifier

    from vit.config import AugConfig
    from vit.data.transforms import build_transform
    from vit.eval.zero_shot import ZeroShotClassifier, class_names, read_templates, zero_shot_accuracy

    root = make_image_folder(tmp_path / "data", classes=("cat", "dog", "fox"), n_val=3)
    (tmp_path / "templates.txt").write_text("a photo of a {}.\n\nart of the {}\n")
    model, ref = vit.create_clip_model("hf-hub:org/oc_clip"), hub["oc_clip"]
    classes, templates = class_names(root / "val"), read_templates(tmp_path / "templates.txt")
    assert classes == ["cat", "dog", "fox"] and class_names("cat, dog,fox") == classes
    transform = build_transform(AugConfig().resolved(model.visual.pretrained_cfg), IMG, train=False)
    out = zero_shot_accuracy(ZeroShotClassifier(model, classes, templates), root / "val", transform, batch_size=4)
    files = [p for c in classes for p in sorted((root / "val" / c).iterdir())]
    with torch.no_grad():
        weights = build_zero_shot_classifier(ref, open_clip.tokenizer.SimpleTokenizer(context_length=16), classes,
                                             templates)
        expected = ref.logit_scale.exp() * ref.encode_image(torch.stack([transform.load(p) for p in files]),
                                                            normalize=True) @ weights
    torch.testing.assert_close(out["logits"], expected, atol=1e-5, rtol=0)
    assert out["count"] == 9 and out["chance"] == pytest.approx(1 / 3)
    assert out["accuracy"] == pytest.approx((expected.argmax(1) == torch.arange(3).repeat_interleave(3)).float().mean())


def test_evaluate_script_zero_shot(hub, tmp_path):
    """evaluate.py --clip NAME --classes DIR: the folder's accuracy (as the library computes it) in metrics.json;
    --clip without --classes is one sentence."""
    from helpers import import_script, make_image_folder

    from vit.eval.zero_shot import evaluate_zero_shot

    root = make_image_folder(tmp_path / "data", classes=("cat", "dog"), n_val=2)
    evaluate = import_script("evaluate")
    assert evaluate.main(["--clip", "hf-hub:org/oc_clip", "--classes", str(root / "val"), "--out",
                          str(tmp_path / "out")]) == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    expected = evaluate_zero_shot("hf-hub:org/oc_clip", "cat,dog", root / "val")
    assert metrics["accuracy"] == pytest.approx(expected["accuracy"]) and metrics["count"] == 4
    assert metrics["classes"] == ["cat", "dog"] and metrics["chance"] == 0.5
    with pytest.raises(ValueError, match="--clip needs --classes"):
        evaluate.main(["--clip", "hf-hub:org/oc_clip", "--out", str(tmp_path / "out2")])


def test_predict_script_zero_shot(hub, tmp_path):
    """predict.py --clip NAME --classes LIST IMAGES: top-k rows whose probabilities are the classifier's softmax."""
    import csv

    from helpers import import_script, make_image_folder

    from vit.eval.zero_shot import predict_zero_shot

    root = make_image_folder(tmp_path / "data", classes=("cat", "dog"), n_train=0, n_val=2)
    (root / "val" / "cat" / "broken.png").write_bytes(b"not an image")
    predict = import_script("predict")
    assert predict.main(["--clip", "hf-hub:org/oc_clip", "--classes", "cat,dog,fox", str(root / "val"), "--topk",
                         "2", "--out", str(tmp_path / "out")]) == 0
    rows = list(csv.DictReader((tmp_path / "out" / "predictions.csv").open()))
    paths = sorted(p for p in (root / "val").rglob("*.png") if p.name != "broken.png")
    classes, probs, ok = predict_zero_shot("hf-hub:org/oc_clip", ["cat", "dog", "fox"], paths)
    assert len(rows) == 4 and ok.all() and "broken.png" in (tmp_path / "out" / "skipped.csv").read_text()
    by_path = {r["path"]: r for r in rows}
    for p, row in zip(paths, probs):
        top = by_path[str(p)]
        assert top["pred1_name"] == classes[int(row.argmax())]
        assert float(top["prob1"]) == pytest.approx(float(row.max()), abs=1e-6)
    torch.testing.assert_close(probs.sum(1), torch.ones(4))


def test_a_hostile_text_config_is_refused_before_allocating(tmp_path):
    """A config claiming a 10**10-token vocabulary is one sentence, not gigabytes allocated."""
    cfg = json.loads(json.dumps(OPEN_CLIP["oc_clip"][1]))
    cfg["text_cfg"]["vocab_size"] = 10**10
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    save_file({"logit_scale": torch.tensor(1.0)}, tmp_path / "open_clip_model.safetensors")
    with pytest.raises(ValueError, match=r"its text tower would have about \S+ parameters \(buffers included\), "
                                         r"more than") as e:
        vit.create_clip_model(f"local-dir:{tmp_path}")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text_cfg, logit_scale, message", [
    (dict(pool_type="eos", eos_id=49408), 2.0, "sets eos_id to 49408, which is no token of its vocabulary .ids 0 "
                                                "to 49407.; set it to the tokenizer's end-of-text id."),
    (dict(pool_type="eos", eos_id=-1), 2.0, "sets eos_id to -1, which is no token"),
    (dict(pool_type="eos", eos_id=2.5), 2.0, "sets eos_id to 2.5, which is no token"),
    ({}, 1e4, "its logit_scale .the log of the similarity scale. is .10000.0., whose exp is not a finite float32"),
])
def test_config_values_that_make_every_output_nan_or_wrong_are_refused(hub, tmp_path, text_cfg, logit_scale,
                                                                        message):
    """An eos_id no token has pooled every caption at position 0; a logit_scale whose exp overflows float32 made
    every logit inf (NaN after the softmax): refused when the repository is read, in one sentence."""
    cls, cfg = OPEN_CLIP["oc_clip"]
    cfg = dict(cfg, text_cfg=dict(cfg["text_cfg"], **text_cfg))
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    state = dict(hub["oc_clip"].state_dict(), logit_scale=torch.tensor(logit_scale))
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "open_clip_model.safetensors")
    with pytest.raises(ValueError, match=message) as e:
        vit.create_clip_model(f"local-dir:{tmp_path}")
    assert "\n" not in str(e.value)
    if text_cfg:  # the same tower with an end-of-text id its vocabulary has loads, and pools there as open_clip
        cfg["text_cfg"]["eos_id"] = 49407
        (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
        ref = getattr(open_clip.model, cls)(**cfg)
        ref.load_state_dict(state)
        ids = _inputs(49407, 16)[1]
        ids[:, 7] = 49407
        with torch.no_grad():
            torch.testing.assert_close(vit.create_clip_model(f"local-dir:{tmp_path}").encode_text(ids),
                                       ref.encode_text(ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["oc_clip", "oc_siglip", "hf_clip"])
def test_saved_clip_reloads_here_and_in_open_clip(hub, name, tmp_path):
    """save_clip_model writes open_clip's layout: create_clip_model("local-dir:") gives the same outputs bit for
    bit, open_clip's create_model / get_tokenizer the same features (1e-5) and ids. hf_clip crosses layouts
    (transformers in, open_clip out, pooled at its own end-of-text id 69)."""
    model = vit.create_clip_model(f"hf-hub:org/{name}")
    # open_clip's and CLIPModel's image projections have no bias, so the loaded model has none a fine-tune could learn
    assert "visual.head.bias" not in model.state_dict()
    with torch.no_grad():  # every parameter moved off the loaded weights, as after fine-tuning
        for p in model.parameters():
            p.add_(0.01)
    folder = vit.save_clip_model(model, tmp_path / "saved")
    again = vit.create_clip_model(f"local-dir:{folder}")
    theirs = open_clip.create_model(f"local-dir:{folder}").eval()
    vocab, length = model.text.vocab_size, model.text.max_len
    images, ids = _inputs(vocab, length)
    with torch.no_grad():
        ours = model(images, ids)
        for a, b in zip(ours, again(images, ids)):
            assert torch.equal(a, b)
        torch.testing.assert_close(theirs.encode_image(images), model.encode_image(images), atol=1e-5, rtol=0)
        torch.testing.assert_close(theirs.encode_text(ids), model.encode_text(ids), atol=1e-5, rtol=0)
        for a, b in zip(theirs(images, ids), ours):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert ours[1].std(0).mean() > 0.05  # not vacuous
    if model.tokenizer is not None:
        texts = prompts(40)
        assert torch.equal(again.tokenizer(texts), open_clip.get_tokenizer(f"local-dir:{folder}")(texts))


@pytest.mark.parametrize("final_ln_after_pool", [False, True])
def test_an_avg_pooled_tower_round_trips_through_open_clip(tmp_path, final_ln_after_pool):
    """open_clip's average-pooled ViT norms the tokens before pooling (ln_post: our `norm`) or, with
    final_ln_after_pool, the pooled vector (ln_post: our `fc_norm`). Random open_clip weights load here with its
    features (1e-5), and, moved as by fine-tuning, save into a folder open_clip reloads with ours."""
    cfg = dict(OPEN_CLIP["oc_clip"][1], quick_gelu=False)
    cfg["vision_cfg"] = dict(cfg["vision_cfg"], pool_type="avg", final_ln_after_pool=final_ln_after_pool)
    torch.manual_seed(1)
    ref = perturb(open_clip.model.CLIP(**cfg)).eval()
    src = tmp_path / "src"
    src.mkdir()
    (src / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, src / "open_clip_model.safetensors")
    model = vit.create_clip_model(f"local-dir:{src}")
    images, ids = _inputs(cfg["text_cfg"]["vocab_size"], cfg["text_cfg"]["context_length"])
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(images), ref.encode_image(images), atol=1e-5, rtol=0)
        for p in model.parameters():  # every one moved, as after fine-tuning (the head has no bias to keep at 0)
            p.add_(0.01 * torch.randn_like(p))
        folder = vit.save_clip_model(model, tmp_path / "saved")
        theirs = open_clip.create_model(f"local-dir:{folder}").eval()
        ours = model.encode_image(images)
        torch.testing.assert_close(theirs.encode_image(images), ours, atol=1e-5, rtol=0)
        torch.testing.assert_close(theirs.encode_text(ids), model.encode_text(ids), atol=1e-5, rtol=0)
    assert ours.std(0).mean() > 0.05  # not vacuous: features vary by image
    saved = json.loads((folder / "open_clip_config.json").read_text())["model_cfg"]["vision_cfg"]
    assert saved["final_ln_after_pool"] is final_ln_after_pool


def test_a_clip_open_clip_cannot_hold_is_one_sentence(hub, tmp_path):
    """transformers' tiny SigLIP: its image tower is no timm model by name, its text uses tanh GELU; nothing is
    written."""
    model = vit.create_clip_model("hf-hub:org/hf_siglip")
    with pytest.raises(ValueError, match="open_clip's repository layout cannot hold") as e:
        vit.save_clip_model(model, tmp_path / "saved")
    assert "\n" not in str(e.value) and not (tmp_path / "saved").exists()


def test_siglip_tokenizer_ids_equal_open_clip(hub, tmp_path):
    """SigLIP's path (a repository's SentencePiece tokenizer.json, big_vision's cleaning: punctuation removed,
    lowercased) against open_clip's SigLipTokenizer (T5's fast tokenizer, padded with </s>) and its HFTokenizer
    reading the folder (how open_clip loads a hub SigLIP repository), on 300 captions; then through a saved model,
    which open_clip's get_tokenizer reads the same."""
    from open_clip.tokenizer import HFTokenizer, SigLipTokenizer

    folder = siglip_tokenizer_folder(tmp_path / "tok")
    texts = prompts(300, seed=1)
    ours = vit.load_clip_tokenizer(f"local-dir:{folder}", 12, "hf", "canonicalize")
    ids = ours(texts)
    # SigLipTokenizer's constructor fetches Google's vocabulary file; its __call__ (the cleaning, padding and cut) is
    # run here on the same vocabulary, set up as that constructor sets it up
    ref = SigLipTokenizer.__new__(SigLipTokenizer)
    ref.tokenizer = transformers.T5TokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), extra_ids=0,
                                                 legacy=False)
    ref.tokenizer.pad_token_id, ref.tokenizer.eos_token_id, ref.context_length = 1, 1, 12
    assert torch.equal(ids, ref(texts))
    assert torch.equal(ids, HFTokenizer(str(folder), context_length=12, clean="canonicalize")(texts))
    assert (ids[:, -1] == 1).all() and (ids[:, -2] == 1).any() and (ids[:, -2] != 1).any()  # padded and cut
    assert not torch.equal(ids, vit.load_clip_tokenizer(f"local-dir:{folder}", 12, "hf", "whitespace")(texts))
    model = vit.create_clip_model("hf-hub:org/oc_siglip")  # vocabulary 60, as the tokenizer's
    model.tokenizer = ours
    saved = vit.save_clip_model(model, tmp_path / "saved")
    assert torch.equal(vit.create_clip_model(f"local-dir:{saved}").tokenizer(texts), ids)
    assert torch.equal(open_clip.get_tokenizer(f"local-dir:{saved}")(texts), ids)


def test_an_hf_tokenizer_without_a_cleaner_cleans_as_open_clips_default(tmp_path):
    """An open_clip config naming a Hugging Face tokenizer (hf_tokenizer_name) without tokenizer_kwargs.clean gets
    HFTokenizer's default, 'whitespace' (case kept): ids equal open_clip's get_tokenizer on the same folder, and
    differ from lowercasing's on these captions (a case-sensitive vocabulary), so a wrong default is seen."""
    from vit.hub.clip_tokenizer import repo_clip_tokenizer

    folder = siglip_tokenizer_folder(tmp_path / "repo")
    text = dict(OPEN_CLIP["oc_siglip"][1]["text_cfg"], hf_tokenizer_name=".")
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": dict(text_cfg=text)}))
    texts = prompts(200, seed=2)
    ours = repo_clip_tokenizer(f"local-dir:{folder}")
    ids = ours(texts)
    assert ours.clean == "whitespace"
    assert torch.equal(ids, open_clip.get_tokenizer(f"local-dir:{folder}")(texts))
    assert not torch.equal(ids, vit.load_clip_tokenizer(f"local-dir:{folder}", text["context_length"], "hf",
                                                        "lower")(texts))


def test_siglip2_layout_equals_transformers_at_a_fixed_resolution(tmp_path, monkeypatch):
    """transformers' Siglip2Model (its vision tower reads (p, p, C) patch rows and resizes its position table to
    each image's grid): at the table's own grid, our ViT's image features, text features and logits equal it; a
    table that is no square grid (NaFlex only) is one sentence."""
    T = transformers
    tower = {k: v for k, v in TOWER.items() if k != "image_size"} | dict(num_patches=(IMG // 8) ** 2)
    text = dict(TEXT, hidden_act="gelu_pytorch_tanh", projection_size=32)
    ref = perturb(T.Siglip2Model(T.Siglip2Config(text_config=text, vision_config=tower)))
    ref.save_pretrained(tmp_path / "s2")
    model = vit.create_clip_model(f"local-dir:{tmp_path / 's2'}")
    images, ids = _inputs(TEXT["vocab_size"], TEXT["max_position_embeddings"])
    B, g = images.shape[0], IMG // 8
    patches = images.reshape(B, 3, g, 8, g, 8).permute(0, 2, 4, 3, 5, 1).reshape(B, g * g, 8 * 8 * 3)
    extra = dict(pixel_attention_mask=torch.ones(B, g * g, dtype=torch.long), spatial_shapes=torch.tensor([[g, g]] * B))
    with torch.no_grad():
        out = ref(input_ids=ids, pixel_values=patches, **extra)
        torch.testing.assert_close(model.encode_image(images), ref.get_image_features(pixel_values=patches, **extra)
                                   .pooler_output, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.encode_text(ids), ref.get_text_features(input_ids=ids).pooler_output,
                                   atol=1e-5, rtol=0)
        image, text = model(images, ids)[:2]
        torch.testing.assert_close(model.logits(image, text), out.logits_per_image, atol=1e-5, rtol=0)
    assert out.logits_per_image.std() > 0.05 and model.logit_bias is not None
    assert model.visual.pretrained_cfg["crop_mode"] == "squash"
    config = json.loads((tmp_path / "s2" / "config.json").read_text())
    config["vision_config"]["num_patches"] = 12
    (tmp_path / "s2" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not a square grid; only fixed-resolution SigLIP2") as e:
        vit.create_clip_model(f"local-dir:{tmp_path / 's2'}")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("template, config", [
    ("$A <eos>", dict(add_bos_token=False, add_eos_token=True, padding_side="right")),  # as SigLIP2's repositories
    # flags that disagree with the template: transformers 5 follows tokenizer.json's template, and so do we
    ("<bos> $A", dict(add_bos_token=False, add_eos_token=True, padding_side="right")),
    ("$A <eos>", dict(add_bos_token=False, add_eos_token=True)),  # no padding side: Gemma's class pads on the left
])
def test_a_siglip2_repository_with_its_tokenizer_gives_transformers_ids(tmp_path, template, config):
    """transformers' Siglip2Model saved with SigLIP2's tokenizer files loads (its Gemma tokenizer was read as CLIP's
    BPE and refused), with the ids transformers' AutoTokenizer gives on the same folder (its Siglip2Tokenizer:
    lowercased, padded and cut to the text positions) on captions with case, accents, apostrophes, emoji and CJK,
    and the text features of transformers' model on them."""
    from vit.hub.clip_tokenizer import clean_text

    T = transformers
    tower = {k: v for k, v in TOWER.items() if k != "image_size"} | dict(num_patches=(IMG // 8) ** 2)
    text = dict(TEXT, hidden_act="gelu_pytorch_tanh", projection_size=32)
    ref = perturb(T.Siglip2Model(T.Siglip2Config(text_config=text, vision_config=tower))).eval()
    folder = tmp_path / "s2"
    ref.save_pretrained(folder)
    gemma_tokenizer_folder(folder, template, **config)
    model = vit.create_clip_model(f"local-dir:{folder}")
    # captions open_clip's cleaning leaves as they are but for case (it also folds whitespace runs and HTML
    # entities, which transformers' tokenizer keeps)
    texts = [" ".join(w for w in t.split() if w != "&amp;") or "a" for t in prompts(200, seed=3)]
    assert all(clean_text(t, "whitespace") == t for t in texts)
    length = TEXT["max_position_embeddings"]
    auto = T.AutoTokenizer.from_pretrained(str(folder))
    expected = auto(texts, padding="max_length", max_length=length, truncation=True, return_tensors="pt").input_ids
    ids = model.tokenizer(texts)
    assert torch.equal(ids, expected)
    assert (ids == 0).any(dim=1).any() and (ids != 0).all(dim=1).any()  # padded and cut captions both present
    unlowered = vit.load_clip_tokenizer(f"local-dir:{folder}", length, "hf", "whitespace")(texts)
    assert not torch.equal(unlowered, ids)  # the lowercasing is seen
    with torch.no_grad():
        torch.testing.assert_close(model.encode_text(ids[:16]),
                                   ref.get_text_features(input_ids=expected[:16]).pooler_output, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", [None, 5])
def test_create_clip_model_names_a_name_that_is_not_text(name):
    with pytest.raises(TypeError, match=r"create_clip_model takes a repository name \(a str, .*\), got ") as e:
        vit.create_clip_model(name)
    assert "\n" not in str(e.value)
