"""Fine-tune a text model on "who did what to whom?": the shared encoder on text, and why positions matter.

    python examples/text_classification.py                    # a small BERT from scratch: ~2 min on 2 CPU cores
    python examples/text_classification.py --model hf-hub:google-bert/bert-base-uncased --epochs 3 --lr 3e-5
    python examples/text_classification.py --compare-positions      # learned positions vs none (~4 min)
    python examples/text_classification.py --out runs/who_did_what  # then saved: we and transformers load it

The seed articles' example: "the dog bites the man" and "the man bites the dog" hold the same words, yet mean
different things. Sentences here are "the [adj] SUBJECT VERB the [adj] OBJECT" over a small generated
vocabulary; the label says whether the subject is the larger of the two creatures (a fixed size order). Both
orders of every noun pair appear, so a bag of words cannot beat chance: only word order decides. Optional
adjectives make sentences of different lengths, so padding and its attention mask are exercised too.

With `--model` the model and its tokenizer are loaded by name (`vit.create_text_model`, `vit.load_tokenizer`:
`hf-hub:org/name` from the Hugging Face cache, fetched once with `hf download org/name`, or `local-dir:/folder`)
under a new 2-way head (`vit.create_text_model(name, num_classes=2)`: transformers' sequence-classification
head for the family) and fine-tuned. Without it a BERT-shaped classifier (the same architecture, 2 layers of
width 64; `vit.text_classifier_from_config`) is trained from scratch with a WordPiece vocabulary learnt from
the training sentences. `--out DIR` saves the result with `vit.save_text_model`: a folder that
`vit.create_text_model("local-dir:DIR", num_classes=2)` and transformers' `AutoModelForSequenceClassification`
both load (the script reloads it and prints the test accuracy again). `--compare-positions` trains the small
model twice, with learned positions and without any, and prints both test accuracies. A progress bar (on a
terminal) and one line per epoch show how it goes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import vit

NOUNS = ["ant", "mouse", "cat", "dog", "child", "man", "woman", "horse", "bear", "whale"]  # small -> large
VERBS = ["bites", "sees", "chases", "helps", "follows", "ignores", "greets", "finds"]
ADJECTIVES = ["big", "small", "old", "young", "happy", "angry"]
CLASSES = ["subject smaller", "subject larger"]
SMALL_BERT = dict(model_type="bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def make_sentences(rng: random.Random) -> list[tuple[str, int]]:
    out = []
    for (a, b), verb in itertools.product(itertools.permutations(NOUNS, 2), VERBS):
        for _ in range(2):  # two draws of adjectives per (subject, verb, object)
            words = ["the"] + ([rng.choice(ADJECTIVES)] if rng.random() < 0.5 else []) + [a, verb, "the"]
            words += ([rng.choice(ADJECTIVES)] if rng.random() < 0.5 else []) + [b]
            out.append((" ".join(words), int(NOUNS.index(a) > NOUNS.index(b))))
    return out


def train_tokenizer(texts: list[str]) -> vit.Tokenizer:
    """A BERT-style WordPiece tokenizer ([CLS] text [SEP], lower-cased) learnt from `texts` by the tokenizers
    library: what a tokenizer.json in a BERT repository holds, made here because no model is loaded."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")])
    return vit.Tokenizer(tok, TOKENIZER_CONFIG)


TOKENIZER_CONFIG = {"tokenizer_class": "BertTokenizer", "pad_token": "[PAD]", "unk_token": "[UNK]",
                    "cls_token": "[CLS]", "sep_token": "[SEP]", "do_lower_case": True, "model_max_length": 32}


def accuracy(model: vit.TextClassifier, tok: vit.Tokenizer, data: list[tuple[str, int]]) -> float:
    model.eval()
    with torch.no_grad():
        batch = tok([t for t, _ in data], padding=True, truncation=True, return_tensors="pt")
        return (model(**batch).argmax(1) == torch.tensor([y for _, y in data])).float().mean().item()


def run(model: vit.TextClassifier, tok: vit.Tokenizer, train: list, test: list, epochs: int, seed: int, lr: float,
        label: str, batch_size: int = 64) -> float:
    """Fine-tune `model` on `train` with AdamW; one line per epoch (train loss, test accuracy); the final test
    accuracy."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    rng = random.Random(seed)
    steps = -(-len(train) // batch_size)
    # the bar only on a terminal (disable=None); the epoch line always, so a log file shows progress too
    bar = tqdm(total=epochs * steps, desc=label, unit="step", leave=False, disable=None)
    for epoch in range(1, epochs + 1):
        model.train()
        rng.shuffle(train)
        t0, loss_sum = time.perf_counter(), 0.0
        for s in range(0, len(train), batch_size):
            chunk = train[s : s + batch_size]
            batch = tok([t for t, _ in chunk], padding=True, truncation=True, return_tensors="pt")
            loss = F.cross_entropy(model(**batch), torch.tensor([y for _, y in chunk]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            bar.update()
        line = (f"{label}  epoch {epoch}/{epochs}  train loss {loss_sum / steps:.4f}  "
                f"test acc {100 * accuracy(model, tok, test):.1f}%  ({time.perf_counter() - t0:.1f} s)")
        if bar.disable:
            print(line, flush=True)
        else:
            bar.write(line)  # above the bar, which stays at the bottom
    bar.close()
    return accuracy(model, tok, test)


def small_model(tok: vit.Tokenizer, seed: int, **overrides) -> vit.TextClassifier:
    torch.manual_seed(seed)
    return vit.text_classifier_from_config({**SMALL_BERT, "vocab_size": tok.vocab_size}, len(CLASSES), **overrides)


def save_and_reload(model: vit.TextClassifier, tok: vit.Tokenizer, out: str, source: str | None, test: list) -> None:
    """Save for transformers and us (the tokenizer too: the source's files, or the one learnt here), reload by
    name, score the test sentences again; and, where transformers is installed, its logits beside ours."""
    extra = {} if source else {"tokenizer.json": tok.backend.to_str(),
                               "tokenizer_config.json": json.dumps(TOKENIZER_CONFIG)}
    folder = vit.save_text_model(out, model, CLASSES, tokenizer=source, extra=extra)
    again = vit.create_text_model(f"local-dir:{folder}", num_classes=len(CLASSES))
    print(f"saved {folder}; reloaded: test accuracy {100 * accuracy(again, tok, test):.1f}%")
    try:
        from transformers import AutoModelForSequenceClassification
    except ImportError:
        return
    theirs = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    batch = tok([t for t, _ in test], padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        diff = (theirs(**batch).logits - again(**batch)).abs().max().item()
    print(f"transformers' {type(theirs).__name__} on the same folder: largest logit difference {diff:.1e}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None,
                    help="a text model to fine-tune, hf-hub:org/name[@revision] or local-dir:/folder (default: a "
                         "small BERT from scratch)")
    ap.add_argument("--epochs", type=int, default=None, help="training epochs (default: 15, or 3 with --model)")
    ap.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default: 1e-3, or 3e-5 with --model)")
    ap.add_argument("--compare-positions", action="store_true",
                    help="train the small model with learned positions and without any, and compare")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed for the sentences, the split and the weights (default: 0)")
    ap.add_argument("--out", default=None, metavar="DIR",
                    help="save the trained classifier there (vit.save_text_model), then reload it")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.model and args.compare_positions:
        ap.error("--compare-positions trains the small model from scratch; leave out --model.")
    if args.out and args.compare_positions:
        ap.error("--out saves one model; leave out --compare-positions (a model without positions has no "
                 "transformers layout).")
    epochs = args.epochs or (3 if args.model else 15)
    lr = args.lr or (3e-5 if args.model else 1e-3)
    rng = random.Random(args.seed)
    data = make_sentences(rng)
    rng.shuffle(data)
    cut = int(0.8 * len(data))
    train, test = data[:cut], data[cut:]
    print(f"{len(train)} training and {len(test)} test sentences, e.g. '{test[0][0]}' -> {test[0][1]}")
    if args.model:
        tok = vit.load_tokenizer(args.model)
        model = vit.create_text_model(args.model, num_classes=len(CLASSES))
        print(f"fine-tuning {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
              f"width {model.num_features}")
        acc = run(model, tok, list(train), test, epochs, args.seed, lr, args.model)
        print(f"test accuracy: {100 * acc:.1f}%")
        if args.out:
            save_and_reload(model, tok, args.out, args.model, test)
        return
    tok = train_tokenizer([t for t, _ in train])
    kinds = ("learn", "none") if args.compare_positions else ("learn",)
    for pos in kinds:
        model = small_model(tok, args.seed, pos_embed=pos)
        acc = run(model, tok, list(train), test, epochs, args.seed, lr, f"pos_embed={pos}")
        label = "with learned positions" if pos == "learn" else "without positions (a bag of words)"
        print(f"test accuracy {label}: {100 * acc:.1f}%")
        if args.out:
            save_and_reload(model, tok, args.out, None, test)


if __name__ == "__main__":
    main()
