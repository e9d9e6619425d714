"""Associative recall among thousands of tokens: dense attention against DSA sparse attention, on the CPU.

    python scripts/sparse_recall.py                  # 2,048 tokens, 4 needles; about 15 min on a shared 2-core CPU

A sequence holds a query key at position 0, random filler, and `--pairs` needle tokens scattered anywhere, each
one a (key, value) pair in a single id, the keys distinct; the label is the value of the needle whose key is the
query (chance 1 / values). Nothing near the query helps: its needle is on average N / 2 tokens away, so attention
that drops the wrong blocks fails. There are no position embeddings (the task needs none), so a model trained at
`--short` tokens carries over to N.

Protocol (DeepSeek-V3.2's, at small scale): train dense (`--short-steps` at `--short` tokens, then `--steps` at N);
from those weights, the indexer warm-up (`--warmup` steps, only the indexer learns the dense attention by KL),
then sparse training of everything (`--sparse-steps`, the indexer's input detached). The indexer's KL weighs the
query rows by how concentrated their dense attention is (`--kl-rows peaked`; DeepSeek's plain mean over rows:
`--kl-rows mean`), since only the query's row is read here. Dense and sparse (at each `--density`) are scored on
the same held-out sequences at N. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vit.layers import SparseOptions, indexer_loss  # noqa: E402
from vit.layers.sparse_attention import KL_ROWS, sparse_modules  # noqa: E402
from vit.models import TextEncoder  # noqa: E402
from vit.train.indexer import indexer_only_grads, indexer_schedule  # noqa: E402

FILLER = 64  # filler ids 0..63; query ids follow, then one id per (key, value)


def make_batch(gen: torch.Generator, batch: int, tokens: int, keys: int, values: int, pairs: int):
    """(ids (B, N), labels (B,)): query key at 0, `pairs` needles with distinct keys at random places."""
    ids = torch.randint(0, FILLER, (batch, tokens), generator=gen)
    chosen = torch.rand(batch, keys, generator=gen).argsort(-1)[:, :pairs]  # (B, pairs) distinct keys
    vals = torch.randint(0, values, (batch, pairs), generator=gen)
    where = torch.rand(batch, tokens - 1, generator=gen).argsort(-1)[:, :pairs] + 1  # (B, pairs) positions
    ids.scatter_(1, where, FILLER + keys + chosen * values + vals)
    ids[:, 0] = FILLER + chosen[:, 0]  # the query is the first needle's key
    return ids, vals[:, 0]


class Recall(nn.Module):
    """A TextEncoder without positions read at the query's position by a linear head."""

    def __init__(self, keys: int, values: int, dim: int, depth: int, heads: int, tokens: int, **sparse) -> None:
        super().__init__()
        self.encoder = TextEncoder(FILLER + keys + keys * values, dim, depth, heads, max_len=tokens,
                                   pos_embed="none", **sparse)
        self.head = nn.Linear(dim, values)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(ids).last_hidden_state[:, 0])


def train(model: nn.Module, args, steps: int, tokens: int, gen: torch.Generator, lr: float,
          warmup_steps: int = 0, indexer_lr: float | None = None) -> list[float]:
    """AdamW steps on fresh batches; with DSA, DeepSeek's stages by step (`indexer_schedule`), the indexers at
    `indexer_lr`. Returns the indexer losses seen (empty without DSA)."""
    indexer = [p for m in sparse_modules(model) if m.indexer is not None for p in m.indexer.parameters()]
    ids = {id(p) for p in indexer}
    groups = [dict(params=[p for p in model.parameters() if id(p) not in ids], lr=lr)]
    if indexer:
        groups.append(dict(params=indexer, lr=indexer_lr or lr))
    opt = torch.optim.AdamW(groups, weight_decay=0.0)
    model.train()
    kl = []
    for step in range(steps):
        stage = indexer_schedule(model, step, warmup_steps, args.kl_rows)
        batch = args.batch if tokens == args.short else args.long_batch
        ids, y = make_batch(gen, batch, tokens, args.keys, args.values, args.pairs)
        loss = F.cross_entropy(model(ids), y)
        aux = indexer_loss(model) if stage is not None else None
        if aux is not None:
            kl.append(aux.item())
            loss = aux if stage == "warmup" else loss + aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if stage == "warmup":
            indexer_only_grads(model)
        opt.step()
    return kl


@torch.no_grad()
def accuracy(model: nn.Module, held_out: list) -> float:
    model.eval()
    hits = sum(int((model(ids).argmax(-1) == y).sum()) for ids, y in held_out)
    return hits / sum(len(y) for _, y in held_out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048, help="sequence length N of the measured task")
    ap.add_argument("--short", type=int, default=128, help="sequence length of the first dense phase")
    ap.add_argument("--short-steps", type=int, default=800, help="dense steps at --short tokens")
    ap.add_argument("--steps", type=int, default=20, help="dense steps at N")
    ap.add_argument("--warmup", type=int, default=150, help="indexer warm-up steps (only the indexers learn)")
    ap.add_argument("--sparse-steps", type=int, default=20, help="sparse training steps after the warm-up")
    ap.add_argument("--density", type=float, nargs="+", default=[0.25, 0.125], help="kept share of key blocks")
    ap.add_argument("--select", choices=("token", "block"), default="token", help="selection granularity")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--keys", type=int, default=8)
    ap.add_argument("--values", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=4, help="needles per sequence (distinct keys)")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="sequences per step at --short tokens")
    ap.add_argument("--long-batch", type=int, default=8, help="sequences per step at N tokens")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--indexer-lr", type=float, default=1e-2, help="the indexers' learning rate")
    ap.add_argument("--kl-rows", choices=KL_ROWS, default="peaked",
                    help="how the indexer KL weighs query rows: mean (DeepSeek's) or peaked (by concentration)")
    ap.add_argument("--eval", type=int, default=128, help="held-out sequences at N")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (one is fastest on a shared 2-core CPU)")
    return ap


def run(args) -> dict:
    t0 = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    held_gen = torch.Generator().manual_seed(args.seed + 10_000)
    held_out = [make_batch(held_gen, min(16, args.eval), args.tokens, args.keys, args.values, args.pairs)
                for _ in range(max(1, args.eval // 16))]
    shape = (args.keys, args.values, args.dim, args.depth, args.heads, args.tokens)
    dense = Recall(*shape)
    train(dense, args, args.short_steps, args.short, gen, args.lr)
    train(dense, args, args.steps, args.tokens, gen, args.lr)
    out = dict(tokens=args.tokens, dense_acc=accuracy(dense, held_out), chance=1 / args.values, sparse={},
               args=vars(args))
    print(f"dense accuracy {out['dense_acc']:.4f} at {args.tokens} tokens ({time.perf_counter() - t0:.0f} s)",
          file=sys.stderr, flush=True)
    for density in args.density:
        sparse = Recall(*shape, sparse_attention=SparseOptions("dsa", density=density, select=args.select,
                                                               block_size=args.block_size, min_tokens=0))
        sparse.load_state_dict(dense.state_dict(), strict=False)  # everything but the new indexers
        for m in sparse_modules(sparse):
            m.kernel = "gather"  # SDPA on the kept blocks: a CPU backward, no compiling; masked SDPA where it can't
        untrained = accuracy(sparse, held_out)
        kl = train(sparse, args, args.warmup + args.sparse_steps, args.tokens, gen, args.lr / 4, args.warmup,
                   args.indexer_lr)
        acc = accuracy(sparse, held_out)
        out["sparse"][str(density)] = dict(acc=acc, of_dense=acc / max(out["dense_acc"], 1e-9),
                                           untrained_indexer_acc=untrained,
                                           indexer_kl_first=kl[0] if kl else None,
                                           indexer_kl_last_warmup=kl[args.warmup - 1] if args.warmup else None,
                                           indexer_kl_last=kl[-1] if kl else None,
                                           blocks_kept=sparse_modules(sparse)[0].topk(args.tokens),
                                           blocks=-(-args.tokens // args.block_size))
        print(json.dumps({density: out["sparse"][str(density)]}), file=sys.stderr, flush=True)
    out["seconds"] = time.perf_counter() - t0
    return out


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
