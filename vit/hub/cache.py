"""The Hugging Face hub cache, as timm and transformers use it through huggingface_hub: whether we are offline
(HF_HUB_OFFLINE=1, or a hub that does not answer one request), which cache folder is in use, and one file of a
repository from it (downloaded into it only when online). A repository that is not cached raises one sentence
naming it, the cache folder and the command that fetches it. Names and configs are `vit.hub.names`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["offline", "hub_reachable", "hub_cache_dir", "hub_file"]


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return _truthy(os.environ.get("HF_HUB_OFFLINE")) or constants.HF_HUB_OFFLINE


def hub_reachable() -> bool:
    """Whether the hub's endpoint (HF_ENDPOINT) answers one HEAD request now, without retries. hf_hub_download
    retries a refused or timed-out request 5 times (about 30 s) before it falls back to the cache, so an
    unreachable hub is found out here once and the cache is asked directly."""
    from huggingface_hub import constants, get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except Exception:  # the HTTP client's connect/DNS/timeout/proxy errors: whichever, the hub is not there now
        return False
    return True  # any answer, an error status included: hf_hub_download names what it means


def hub_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face hub cache in use: `cache_dir`, else $HF_HUB_CACHE, else huggingface_hub's default
    (~/.cache/huggingface/hub, or $HF_HOME/hub)."""
    from huggingface_hub import constants

    return Path(cache_dir or os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)


def not_cached_message(what: str, repo_id: str, revision: str | None, cache: Path) -> str:
    at = f"@{revision}" if revision else ""
    why = "HF_HUB_OFFLINE=1 forbids downloading it" if offline() else "the hub could not be reached"
    folder = "models--" + repo_id.replace("/", "--")
    rev = f" --revision {revision}" if revision else ""
    return (f"model {repo_id}{at} ({what}) is not in the Hugging Face cache {cache} and {why}; fetch it on a "
            f"machine with network with `hf download {repo_id}{rev}` (or huggingface_hub.snapshot_download("
            f"'{repo_id}')) and copy its {folder}/ folder into {cache}, or point HF_HUB_CACHE at a cache that has it.")


def hub_file(repo_id: str, revision: str | None, names: tuple[str, ...], cache_dir: str | Path | None,
              what: str, kind: str = "a timm model repository") -> Path:
    """The first of `names` that the repository has, from the cache (or downloaded into it when online)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache, not_cached = hub_cache_dir(cache_dir), False
    local_only = offline() or not hub_reachable()  # unreachable: the cache now, not after 30 s of retries
    for filename in names:
        try:
            return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=str(cache),
                                        local_files_only=local_only, library_name="vit"))
        except LocalEntryNotFoundError:  # not cached, and offline or no network (a subclass: caught first)
            not_cached = True
        except EntryNotFoundError:  # the repository has no such file: try the next one
            continue
        except RevisionNotFoundError:
            raise ValueError(f"{repo_id} has no revision {revision!r}; use a branch, tag or commit it has.") from None
        except RepositoryNotFoundError:
            raise ValueError(f"{repo_id} does not exist on the Hugging Face hub, or is private or gated (log in with "
                             "`hf auth login`); check the name.") from None
        except HFValidationError as e:
            raise ValueError(f"{repo_id!r} is not a valid hub repository id ({str(e).splitlines()[0]}).") from None
        except OSError as e:  # HTTP errors other than the above, a full disk, ...
            raise ValueError(f"could not fetch {filename} of {repo_id} ({str(e).splitlines()[0]}).") from None
    if not_cached:
        raise FileNotFoundError(not_cached_message(what, repo_id, revision, cache))
    raise FileNotFoundError(f"{repo_id} has none of {', '.join(names)}; it is not {kind}.")
