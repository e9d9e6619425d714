"""Read the digits in an image and write them as words: the seed's "CV/NLP, one family" as image-to-text.

    python examples/image_to_text.py --out runs/image_to_text     # 70 s of CPU time, 96% exact match

An image holds two to four handwritten digits side by side (scikit-learn's 8x8 digits on an 8x32 canvas, blank
where a string is shorter); the target is the digits as words: "three one four". The encoder is the Vision
Transformer (`vit.VisionTransformer`, patches of 4x4: a 2x8 grid of patch tokens, 2x2 per digit, plus [CLS];
SCALE below enlarges the digits for a finer grid, at 4x the tokens per doubling); the decoder is the same
`TextDecoder` that translates text, its cross-attention reading the patch tokens. Test images use handwriting
never trained on (a fifth of scikit-learn's digits, held out) and digit sequences never trained on (one in ten).

At the end it draws which patches each generated word looked at (`cross_attention.png` in --out): the
decoder's cross-attention (mean over heads and blocks) from word k to the memory tokens, carried back through
the encoder's attention rollout (Abnar & Zuidema, 2020) to the input patches, as rollout does for [CLS]:
    relevance(word k, patch j) = sum_m cross(k, m) R(m, j),   R = rollout of the encoder's self-attention.
It also prints the share of each word's relevance that falls on its own digit.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

WORDS = "zero one two three four five six seven eight nine".split()
PAD, BOS, EOS = 0, 1, 2
VOCAB = ["<pad>", "<bos>", "<eos>", *WORDS]
SLOTS, SCALE, PATCH = 4, 1, 4  # digits per image at most; pixel upscale; patch size
IMG = (8 * SCALE, 8 * SCALE * SLOTS)  # (8, 32)
GRID = (IMG[0] // PATCH, IMG[1] // PATCH)  # (2, 8): each digit 2x2 patches


def held_out(digits: tuple[int, ...]) -> bool:
    """One digit sequence in ten is kept for testing only (a fixed hash of the sequence)."""
    return (int("".join(map(str, digits))) * 2654435761 + len(digits)) % 1000 < 100


class DigitStrings:
    """Images of `min_digits` .. SLOTS digits drawn from one pool of scikit-learn digits (train or test)."""

    def __init__(self, split: str, min_digits: int = 2, seed: int = 0) -> None:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        d = load_digits()
        tr, te = train_test_split(np.arange(len(d.target)), test_size=0.2, random_state=0, stratify=d.target)
        idx = tr if split == "train" else te
        self.images = torch.tensor(d.images[idx] / 16.0, dtype=torch.float32)  # (n, 8, 8) in [0, 1]
        self.by_digit = [np.flatnonzero(d.target[idx] == k) for k in range(10)]
        self.split, self.min_digits = split, min_digits
        self.rng = np.random.default_rng(seed)

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, ...]]]:
        """n images (n, 1, 16, 64) in [-1, 1], targets (n, SLOTS + 2) = <bos> words <eos> <pad>..., the digits."""
        images = torch.zeros(n, 8, 8 * SLOTS)
        targets = torch.full((n, SLOTS + 2), PAD, dtype=torch.long)
        strings = []
        for i in range(n):
            while True:  # training never sees a held-out sequence, testing sees only those
                digits = tuple(self.rng.integers(0, 10, size=self.rng.integers(self.min_digits, SLOTS + 1)).tolist())
                if held_out(digits) == (self.split == "test"):
                    break
            for slot, k in enumerate(digits):
                images[i, :, 8 * slot : 8 * slot + 8] = self.images[self.rng.choice(self.by_digit[k])]
            targets[i, : len(digits) + 2] = torch.tensor([BOS, *(3 + k for k in digits), EOS])
            strings.append(digits)
        images = images.repeat_interleave(SCALE, 1).repeat_interleave(SCALE, 2)  # (n, 16, 64)
        return images[:, None] * 2 - 1, targets, strings


def build_model(dim: int, depth: int, heads: int):
    import vit
    from vit.models import Seq2Seq, TextDecoder

    encoder = vit.VisionTransformer(IMG, PATCH, in_chans=1, num_classes=0, embed_dim=dim, depth=depth,
                                    num_heads=heads, mlp_ratio=2)
    decoder = TextDecoder(len(VOCAB), dim, 2, heads, max_len=SLOTS + 2, mlp_ratio=2)
    return Seq2Seq(encoder, decoder, BOS, EOS, PAD)


def as_words(ids: list[int]) -> str:
    return " ".join(VOCAB[i] for i in ids if i > EOS)


@torch.no_grad()
def exact_match(model, images: torch.Tensor, strings: list[tuple[int, ...]]) -> float:
    model.eval()
    out = model.generate(images, max_new_tokens=SLOTS + 1).sequences.tolist()
    return float(np.mean([as_words(o) == " ".join(WORDS[k] for k in s) for o, s in zip(out, strings)]))


def train(model, data: DigitStrings, test, steps: int, batch_size: int, lr: float, eval_every: int) -> None:
    """AdamW, linear warm-up then cosine decay; a fresh batch of generated images at every step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    warmup = max(1, steps // 20)
    bar = tqdm(total=steps, desc="train", unit="step", leave=False, disable=None)
    t0, loss_sum = time.perf_counter(), 0.0
    for step in range(1, steps + 1):
        frac = step / warmup if step <= warmup else 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))
        for group in opt.param_groups:
            group["lr"] = lr * frac
        model.train()
        images, targets, _ = data.sample(batch_size)
        loss = model.loss(images, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_sum += loss.item()
        bar.update()
        if step % eval_every == 0 or step == steps:
            line = (f"step {step}/{steps}  train loss {loss_sum / eval_every:.4f}  test exact match "
                    f"{100 * exact_match(model, test[0][:300], test[2][:300]):.1f}% ({len(test[2][:300])} images)  "
                    f"{time.perf_counter() - t0:.0f} s")
            loss_sum = 0.0
            if bar.disable:
                print(line, flush=True)
            else:
                bar.write(line)  # above the bar, which stays at the bottom
    bar.close()


@torch.no_grad()
def word_relevance(model, images: torch.Tensor) -> tuple[torch.Tensor, list[list[int]]]:
    """Per generated word, its relevance over the input patches (B, L, h, w) (module docstring), and the words."""
    from vit.explain.rollout import attention_rollout

    model.eval()
    seqs = model.generate(images, max_new_tokens=SLOTS + 1).sequences  # (B, L)
    memory, enc_attn = model.encoder.encode(images, return_attention=True)  # (B, 1 + h*w, D), L maps (B, H, N, N)
    rollout = attention_rollout(enc_attn, num_prefix_tokens=1)  # (B, N, N): memory token -> input tokens
    inputs = torch.cat([torch.full_like(seqs[:, :1], BOS), seqs[:, :-1]], dim=1)  # what each step was fed
    _, _, cross = model.decoder.forward_features(inputs, memory, return_attention=True)
    cross = torch.stack(cross).mean(dim=(0, 2))  # (B, L, N): mean over blocks and heads
    rel = (cross @ rollout)[..., 1:]  # (B, L, h*w): the patch columns
    return rel.reshape(*rel.shape[:2], *GRID), seqs.tolist()


def own_digit_share(rel: torch.Tensor, seqs: list[list[int]]) -> float:
    """Mean share of a digit word's patch relevance that lies on the slot of its own digit."""
    shares = []
    w = GRID[1] // SLOTS
    for r, seq in zip(rel, seqs):
        for k, token in enumerate(seq):
            if token <= EOS:
                break
            shares.append((r[k, :, k * w : (k + 1) * w].sum() / r[k].sum()).item())
    return float(np.mean(shares))


def draw(path: Path, images: torch.Tensor, rel: torch.Tensor, seqs: list[list[int]]) -> None:
    """One column per image: the image, then each generated word's relevance map over it (min-max per map)."""
    from matplotlib.figure import Figure

    from vit.eval.plots import save_figure

    rows = 1 + rel.shape[1]
    fig = Figure(figsize=(3.2 * len(images), 0.95 * rows))
    axes = fig.subplots(rows, len(images), squeeze=False)
    for j, (img, r, seq) in enumerate(zip(images, rel, seqs)):
        shown = ((img[0] + 1) / 2).numpy()
        axes[0, j].imshow(shown, cmap="gray", vmin=0, vmax=1)
        axes[0, j].set_title(f"generated: {as_words(seq)}", fontsize=8)
        for k in range(rel.shape[1]):
            ax = axes[k + 1, j]
            token = seq[k] if k < len(seq) else PAD
            if token == PAD:
                ax.set_visible(False)
                continue
            m = r[k] - r[k].min()
            m = (m / m.max() if m.max() > 0 else m).repeat_interleave(PATCH, 0).repeat_interleave(PATCH, 1)
            ax.imshow(shown, cmap="gray", vmin=0, vmax=1)
            ax.imshow(m.numpy(), cmap="jet", alpha=0.5, vmin=0, vmax=1)
            ax.set_title(f"word {k + 1}: {VOCAB[token]}", fontsize=7)
    for ax in axes.flat:
        ax.axis("off")
    fig.suptitle("which patches each generated word looked at (cross-attention x encoder rollout)", fontsize=9)
    save_figure(fig, path, dpi=110)


def run(steps: int, batch_size: int, lr: float, dim: int, depth: int, heads: int, seed: int, test_size: int = 1000,
        eval_every: int | None = None):
    """Build, train, evaluate: (model, test exact match, training seconds, the test set)."""
    torch.manual_seed(seed)
    data, test_data = DigitStrings("train", seed=seed), DigitStrings("test", seed=seed + 1)
    test = test_data.sample(test_size)
    print(f"train on {len(data.images)} digit images, test on {len(test_data.images)} others; images "
          f"{IMG[0]}x{IMG[1]}, {GRID[0]}x{GRID[1]} patches; e.g. target '{as_words(test[1][0].tolist())}'")
    model = build_model(dim, depth, heads)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e3:.0f}k parameters")
    t0 = time.perf_counter()
    train(model, data, test, steps, batch_size, lr, eval_every or max(1, steps // 4))
    train_s = time.perf_counter() - t0
    return model, exact_match(model, test[0], test[2]), train_s, test


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/image_to_text"), help="folder for weights, results, picture")
    ap.add_argument("--steps", type=int, default=1000, help="training steps (default: 1000)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--dim", type=int, default=64, help="token width D")
    ap.add_argument("--depth", type=int, default=3, help="ViT encoder blocks (the decoder has 2)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, acc, train_s, test = run(args.steps, args.batch_size, args.lr, args.dim, args.depth, args.heads, args.seed)
    rel, seqs = word_relevance(model, test[0][:200])
    share = own_digit_share(rel, seqs)
    print(f"test exact match: {100 * acc:.2f}% of {len(test[2])} images, trained in {train_s:.0f} s; "
          f"{100 * share:.0f}% of each word's patch relevance lies on its own digit (a quarter of the image or less)")
    args.out.mkdir(parents=True, exist_ok=True)
    by_len = {n: [i for i, s in enumerate(test[2][:200]) if len(s) == n] for n in (2, 3, 4)}
    picks = [by_len[4][0], by_len[3][0], by_len[2][0], by_len[4][1]]  # images of 4, 3, 2 and 4 digits
    draw(args.out / "cross_attention.png", test[0][picks], rel[picks], [seqs[i] for i in picks])
    save(args.out, model, {"exact_match": acc, "test_images": len(test[2]), "train_seconds": round(train_s, 1),
                           "own_digit_share": share, **{k: v for k, v in vars(args).items() if k != "out"}})


def save(out: Path, model, results: dict) -> None:
    from safetensors.torch import save

    from vit.utils.atomic import atomic_write_bytes, atomic_write_text

    atomic_write_bytes(out / "model.safetensors", save({k: v.contiguous() for k, v in model.state_dict().items()}))
    atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
    print(f"wrote {out / 'cross_attention.png'}, {out / 'model.safetensors'} and {out / 'results.json'}")


if __name__ == "__main__":
    main()
