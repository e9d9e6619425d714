"""The samples of one tar shard, in tar order, read member by member with bounds.

Read here rather than with webdataset's tar iterator because that one reads every member whole, however large,
and drops links and devices without a word: here a member that is not a regular file, or larger than
MAX_MEMBER_BYTES, is never read and makes its sample bad (`sample[BAD]` says why), to be skipped like an
unreadable image. Where the shards are and who reads which is `vit.data.shards`'s; `vit.data.shard_loader` reads
them through `tar_samples`.
"""

from __future__ import annotations

from collections.abc import Iterator

from .base import DataError
from .shards import webdataset

__all__ = ["tar_samples", "MAX_MEMBER_BYTES", "BAD"]

MAX_MEMBER_BYTES = 256 * 2**20  # a larger tar member is a bad sample, never read (vit.data.decode's file limit)
BAD = "__bad__"  # key of a sample's reason for being unusable (a link, a device, an oversized member)


def tar_samples(url: str) -> Iterator[dict]:
    """The samples of one shard, in tar order: {'__key__': key, '<ext>': bytes, ...}, as webdataset groups
    members (`dir/key.ext`, the key up to the first dot of the file name). Read here rather than with
    webdataset's tar iterator because that one reads every member whole, however large, and drops links and
    devices without a word: here a member that is not a regular file, or larger than MAX_MEMBER_BYTES, is never
    read and makes its sample bad (`sample[BAD]` says why), to be skipped like an unreadable image. A shard that
    is not a tar, empty or truncated raises DataError."""
    import lzma
    import tarfile
    import zlib

    wds = webdataset()
    try:
        stream = wds.gopen(url)  # a local file; a URL or pipe: only when the user named one (vit.config)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot open shard {url} ({e}); check data.root.") from None
    cur: dict | None = None
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as tar:
            for m in tar:
                if m.isdir():
                    continue
                folder, _, base = m.name.rpartition("/")
                key, dot, ext = base.partition(".")
                if not dot or not key:
                    continue
                key = f"{folder}/{key}" if folder else key
                if cur is None or cur["__key__"] != key:
                    if cur is not None:
                        yield cur
                    cur = {"__key__": key}
                if not m.isreg():
                    kind = "link" if m.issym() or m.islnk() else "device, FIFO or other special file"
                    cur[BAD] = f"{url}:{m.name} is a {kind}, not a file"
                elif m.size > MAX_MEMBER_BYTES:
                    cur[BAD] = f"{url}:{m.name} holds {m.size} bytes, more than {MAX_MEMBER_BYTES} " \
                               "(vit.data.shard_samples.MAX_MEMBER_BYTES)"
                else:
                    cur[ext.lower()] = tar.extractfile(m).read()
            if cur is not None:
                yield cur
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error, lzma.LZMAError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"shard {url} is not a readable tar file ({e or type(e).__name__}: empty, truncated or "
                        "another format); write it again with python shards.py.") from None
    finally:
        stream.close()
