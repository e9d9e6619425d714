"""`data.dataset: wds`: WebDataset tar shards read by N processes x W loader workers, epochs exact where the
data allows, a mid-epoch resume that never reopens a finished shard.

Each epoch, `vit.data.shards.plan_epoch` shuffles the shard list by (seed, epoch) and deals it round-robin to the R
= N x W readers; every reader yields the same number of samples (the plan's quota), so every process takes the same
number of steps. A reader opens its shards with webdataset's `gopen` (local files; http(s) URLs and `pipe:` commands
only when the user named them, vit.config), reads them with `vit.data.shard_samples.tar_samples` (a link, a device or an
oversized member is a bad sample) and shuffles in blocks: consecutive shards are read until `data.shuffle_buffer`
samples are held (raw bytes, as webdataset's own buffer holds them), the block is permuted by (seed, epoch, block)
and decoded and augmented sample by sample by our pipeline (`Pipeline.load_bytes`, as the folder dataset). Unlike
webdataset's streaming buffer, whose state after k samples cannot be rebuilt without reading them again, a block
permutation is known in advance: a resume at batch b skips, unopened, every block the reader had finished, and
within the block it was in, the samples it had already yielded. Augmentation is seeded per (seed, epoch, sample
index), so a resumed epoch yields the very batches the uninterrupted one would have.

Validation: the shards in order, dealt round-robin, each sample once; readers with fewer samples pad their
stream to the largest count with zero images whose index is -1, which `vit.eval.metrics.predict` drops after
gathering. An unreadable image is dropped the same way (index -2, counted as skipped), never replaced by a
sample that would then be scored twice. The loaders are not passed through `accelerator.prepare` (Accelerate
would dispatch an iterable dataset's batches from the main process); `ShardLoader` moves batches to the device
itself.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .base import DataError, check_classes
from .decode import BadImageError
from .shard_samples import BAD, tar_samples
from .shards import ShardSplit, plan_epoch, read_info, resolve_split

__all__ = ["ShardDataset", "ShardLoader", "build_wds_datasets", "build_wds_loaders", "worker_consumed"]
log = logging.getLogger(__name__)

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
SKIPPED = -2  # the index of an unreadable evaluation sample: dropped and counted by vit.eval.metrics.predict
TRACE_ENV = "VIT_SHARD_TRACE"  # tests only: a file each reader appends "<split> <epoch> open <url>" / "... <index>" to


def worker_consumed(start_batch: int, worker: int, num_workers: int, batch_size: int, quota: int) -> int:
    """Samples reader `worker` had yielded when its process had taken `start_batch` batches. A DataLoader takes
    batches from its workers in turn (batch i from worker i % W), and every worker yields ceil(quota / B)
    batches, so that count is exact: W = 2, B = 8, 5 batches -> worker 0 gave 3 (24 samples), worker 1 gave 2."""
    batches = max(0, (start_batch - worker + num_workers - 1) // num_workers)
    return min(quota, batches * batch_size)


def _trace(line: str) -> None:
    path = os.environ.get(TRACE_ENV)
    if path:
        with open(path, "a") as f:  # O_APPEND: lines from several processes do not interleave
            f.write(line + "\n")


class ShardDataset(IterableDataset):
    """One split of tar shards. Yields (image (C, S, S), label) for training, (image, label, index) for
    evaluation. `num_workers`, `rank`, `world` are set by the loader; `set_epoch` before each epoch."""

    def __init__(self, split: ShardSplit, classes: list[str], transform, train: bool, seed: int = 0,
                 shuffle_buffer: int = 2048, batch_size: int = 1, name: str = "train", img_size: int = 224) -> None:
        self.split, self.classes, self.transform, self.train = split, list(classes), transform, train
        self.img_size = img_size  # of the zero images that pad a short evaluation reader
        self.seed, self.shuffle_buffer, self.batch_size, self.name = seed, shuffle_buffer, batch_size, name
        self.epoch, self.start_batch, self.num_workers, self.rank, self.world = 0, 0, 1, 0, 1

    def __len__(self) -> int:
        return self.split.num_samples

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def describe(self, i: int) -> str:
        """Sample i (global index) as `<shard url>#<position in the shard>`, followed by the original file name
        that the sample's .json holds (`(cat/001.png)`, vit.data.shards writes it) when the shard is a local file."""
        offsets = self.split.offsets()
        k = max(j for j, o in enumerate(offsets) if o <= i)
        where, names = f"{self.split.urls[k]}#{i - offsets[k]}", self._file_names(k)
        return f"{where} ({names[i - offsets[k]]})" if i - offsets[k] < len(names) else where

    def _file_names(self, shard: int) -> list[str]:
        """The `filename` of each sample's .json in a local shard, in sample order ("" where there is none);
        only the small .json members are read, the images are skipped. [] for a remote shard."""
        import json
        import tarfile

        cache = self.__dict__.setdefault("_names", {})
        url = self.split.urls[shard]
        if shard not in cache:
            keys: dict[str, str] = {}
            if os.path.isfile(url):
                try:
                    with tarfile.open(url) as tar:
                        for m in tar:
                            key, _, ext = m.name.partition(".")
                            keys.setdefault(key, "")
                            if ext == "json" and m.isreg() and m.size <= 2**20:
                                keys[key] = str(json.loads(tar.extractfile(m).read()).get("filename", ""))
                except (OSError, ValueError, tarfile.TarError, AttributeError):
                    keys = {}  # only a nicer name: the url#position stays
            cache[shard] = list(keys.values()) if all(keys.values()) else []
        return cache[shard]

    def check_seen(self, seen: int) -> None:
        """After an evaluation pass over every sample: warn when the shards held another number of samples than
        the split was said to hold (a wrong count after '|' in a brace pattern, a stale _info.json)."""
        if seen != self.split.num_samples:
            log.warning("warning: the %s shards held %d samples, not the %d their count (after '|' in the brace "
                        "pattern, or in _info.json) says; correct it, image counts and epoch lengths follow it.",
                        self.name, seen, self.split.num_samples)

    def plan(self, epoch: int | None = None):
        return plan_epoch(self.split.lengths, self.world * self.num_workers, self.epoch if epoch is None else epoch,
                          self.seed, shuffle=self.train)

    def batches_per_process(self) -> int:
        """The same on every process and in every epoch: W workers x ceil(quota / B)."""
        return self.num_workers * math.ceil(self.plan(0).quota / self.batch_size)

    def __iter__(self) -> Iterator:
        # epoch and start batch are read now, when the loader starts, not when the first sample is asked for
        info = get_worker_info()
        # The loader takes its first batch from worker 0; after a resume at batch b that batch is reader
        # b % W's, so loader worker j plays reader (j + b) % W.
        worker = ((info.id if info is not None else 0) + self.start_batch) % self.num_workers
        return self._samples(self.epoch, self.start_batch, worker)

    def _samples(self, epoch: int, start_batch: int, worker: int) -> Iterator:
        plan = self.plan(epoch)
        mine = plan.shards[self.rank * self.num_workers + worker]
        if not self.train:
            yield from self._eval(mine, plan.quota, epoch)
            return
        skip = worker_consumed(start_batch, worker, self.num_workers, self.batch_size, plan.quota)
        pos, last = 0, []  # samples of this reader's epoch stream passed so far; the last block read
        for block in self._blocks(mine):
            n = sum(self.split.lengths[i] for i in block)
            if pos + n <= skip:  # finished before the interruption: not opened again
                pos += n
                continue
            samples = [s for i in block for s in self._read(i, epoch)]
            random.Random(self.seed * 1_000_003 + epoch * 10_007 + block[0]).shuffle(samples)
            last = samples
            for k in range(len(samples)):
                if pos >= plan.quota:
                    return
                if pos >= skip:
                    yield self._decode(samples, k, epoch)
                pos += 1
        if last and pos < plan.quota:  # shards shorter than _info.json says: repeat rather than hang the others
            log.warning("%s shards hold fewer samples than listed; repeating %d to keep processes in step",
                        self.name, plan.quota - pos)
        while last and pos < plan.quota:
            yield self._decode(last, pos % len(last), epoch)
            pos += 1

    def _blocks(self, shards: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Consecutive shards grouped until each group holds at least shuffle_buffer samples."""
        out, cur, n = [], [], 0
        for i in shards:
            cur.append(i)
            n += self.split.lengths[i]
            if n >= self.shuffle_buffer:
                out.append(tuple(cur))
                cur, n = [], 0
        return out + ([tuple(cur)] if cur else [])

    def _read(self, shard: int, epoch: int) -> list[tuple[int, str, bytes | str, int]]:
        """(global index, name, image bytes, label) of every sample in one shard, in tar order; a bad sample (a
        link, a device or an oversized member, see vit.data.shard_samples.tar_samples) carries its reason instead
        of bytes."""
        url = self.split.urls[shard]
        _trace(f"{self.name} {epoch} open {url}")
        start, out = self.split.offsets()[shard], []
        for k, s in enumerate(tar_samples(url)):
            if BAD in s:
                out.append((start + k, f"{url}:{s['__key__']}", s[BAD], 0))
                continue
            key = next((x for x in IMAGE_KEYS if x in s), None)
            if key is None or "cls" not in s:
                raise DataError(f"sample {s.get('__key__')} in {url} has no image (.jpg/.png/.webp) or no .cls "
                                "label; write shards with python shards.py.")
            try:
                y = int(s["cls"])
            except ValueError:
                raise DataError(f"sample {s['__key__']} in {url} has the label {s['cls'][:20]!r}, not a class "
                                "index; write shards with python shards.py.") from None
            if y < 0:  # no class count makes a negative label valid: the shard is wrong
                raise DataError(f"sample {s.get('__key__')} in {url} has label {y}, a negative class index "
                                f"(labels are 0..{len(self.classes) - 1}); fix the shard's .cls.")
            if not 0 <= y < len(self.classes):  # else a raw IndexError from the loss, mid-epoch
                raise DataError(f"sample {s.get('__key__')} in {url} has label {y}, but there are "
                                f"{len(self.classes)} classes (labels 0..{len(self.classes) - 1}); set "
                                f"data.num_classes to at least {y + 1}, or fix the shard's .cls.")
            out.append((start + k, f"{url}:{s['__key__']}", s[key], y))
        if len(out) < self.split.lengths[shard]:  # a tar cut at a member boundary reads as a shorter archive
            log.warning("warning: shard %s holds %d samples, not the %d listed: it is truncated or its count is "
                        "stale; write it again with python shards.py.", url, len(out), self.split.lengths[shard])
        return out

    def _load(self, data: bytes | str, name: str, seed: int) -> torch.Tensor:
        """One sample through the pipeline; BadImageError for an undecodable image or a bad sample's reason."""
        if isinstance(data, str):
            raise BadImageError(data)
        return self.transform.load_bytes(data, name, seed)

    def _seed(self, epoch: int, index: int) -> int:
        return (self.seed * 1_000_003 + epoch * 10_007 + index) % (2**31)  # as the folder dataset

    def _decode(self, samples: list, k: int, epoch: int):
        """Training sample k decoded and augmented; an unreadable image is replaced by the next good one of its
        block (and logged), so that every reader still yields its quota. Evaluation drops it instead (_eval)."""
        for j in range(len(samples)):
            index, name, data, y = samples[(k + j) % len(samples)]
            try:
                x = self._load(data, name, self._seed(epoch, index))
            except BadImageError as e:
                log.warning("skipping %s", e)
                continue
            _trace(f"{self.name} {epoch} sample {index}")
            return (x, y) if self.train else (x, y, index)
        raise DataError(f"no readable image left in the {self.name} shards.")

    def _eval(self, mine: tuple[int, ...], quota: int, epoch: int) -> Iterator:
        n = 0
        for i in mine:
            for index, name, data, y in self._read(i, epoch):
                n += 1
                try:
                    x = self._load(data, name, self._seed(epoch, index))
                except BadImageError as e:  # dropped, never replaced: a duplicate would be scored twice
                    log.warning("skipping %s", e)
                    yield torch.zeros(len(self.transform.tables), self.img_size, self.img_size), 0, SKIPPED
                    continue
                _trace(f"{self.name} {epoch} sample {index}")
                yield x, y, index
        while n < quota:  # padding, so that every process evaluates as many batches; predict drops index -1
            yield torch.zeros(len(self.transform.tables), self.img_size, self.img_size), 0, -1
            n += 1


class ShardLoader:
    """A DataLoader over a ShardDataset that moves batches to `device` and resumes at a batch (see module doc)."""

    def __init__(self, dataset: ShardDataset, batch_size: int, num_workers: int, rank: int, world: int,
                 device: torch.device | str = "cpu") -> None:
        dataset.batch_size, dataset.num_workers, dataset.rank, dataset.world = batch_size, max(1, num_workers), \
            rank, world
        self.dataset, self.device = dataset, torch.device(device)
        readers, shards = world * dataset.num_workers, len(dataset.split.urls)
        if dataset.train and dataset.plan(0).quota == 0:
            raise DataError(f"{world} process(es) x {dataset.num_workers} loader worker(s) = {readers} shard readers, "
                            f"but the {dataset.name} split has only {shards} shard(s): some readers would get none. "
                            "Write smaller shards (python shards.py --shard-size) or lower data.num_workers.")
        # own generator: starting the loader draws its worker seed from it, not from the global RNG (train.py)
        self.loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                 pin_memory=self.device.type == "cuda", generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return self.dataset.batches_per_process()

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def skip_first_batches(self, n: int) -> ShardLoader:
        """The next iteration starts at batch n of the epoch (what Accelerate's skip_first_batches does for a
        prepared loader, without reading the skipped samples)."""
        self.dataset.start_batch = n
        return self

    def __iter__(self):
        it = iter(self.loader)  # workers copy the dataset (epoch, start batch) now
        self.dataset.start_batch = 0
        try:
            for batch in it:
                yield [t.to(self.device, non_blocking=True) for t in batch]
        except DataError as e:  # from a worker, the message carries the worker's traceback: keep our sentence
            text = str(e).rstrip()
            if not text.startswith("Caught "):
                raise
            raise DataError(text.splitlines()[-1].split(": ", 1)[-1]) from None


def build_wds_datasets(cfg, t_train, t_val, splits=("train", "val"), classes=None):
    """(train, val, class names) for `data.dataset: wds`: `data.root` (folder, URL or `pipe:` prefix) with
    `data.train_split` / `data.val_split` (names in _info.json or brace patterns)."""
    root = cfg.data.root
    info = read_info(root)
    found = info.get("classes")
    if not found:
        if not cfg.data.num_classes:
            raise DataError(f"{root} has no {'_info.json' if not info else 'class names in _info.json'}; set "
                            "data.num_classes (labels are the .cls integers), or write the shards with "
                            "python shards.py.")
        found = [str(i) for i in range(cfg.data.num_classes)]
    classes = check_classes(classes, list(found))
    if classes != list(found):
        raise DataError("the shards' classes are in another order than the checkpoint's; relabelling shards is not "
                        "supported, write them again with the checkpoint's class order.")
    out = {}
    for name, split, t in (("train", cfg.data.train_split, t_train), ("val", cfg.data.val_split, t_val)):
        if name in splits:
            s = resolve_split(root, split, info)
            ds = ShardDataset(s, classes, t, name == "train", cfg.run.seed, cfg.data.shuffle_buffer,
                              cfg.data.batch_size, name, cfg.model.img_size)
            out[name] = ds
    return out.get("train"), out.get("val"), classes


def build_wds_loaders(cfg, train_ds: ShardDataset, val_ds: ShardDataset,
                      accelerator) -> tuple[ShardLoader, ShardLoader]:
    """Train and val loaders for this process; not to be passed to accelerator.prepare."""
    rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
    train = ShardLoader(train_ds, cfg.data.batch_size, cfg.data.num_workers, rank, world, device)
    val = ShardLoader(val_ds, cfg.data.eval_batch_size or cfg.data.batch_size, cfg.data.num_workers, rank, world,
                      device)
    return train, val
