"""Publishing a checkpoint folder to the Hugging Face hub: `create_repo` (private unless asked) + `upload_folder`.

The folder is what train.py writes (best/ of a run): model.safetensors and config.json in timm's hub layout,
config.yaml, classes.json, meta.json, and README.md, the model card (vit/models/model_card.py), rewritten here
so that its load examples name the repository. Only those files are uploaded, and none names a place on this
machine: config.yaml goes up as `public_config` makes it (data.root and every other local path reduced to its
last component; the folder's own file is unchanged), and the card names only hub or registry weights. The
token comes from where huggingface_hub looks (HF_TOKEN, then the login cached by `hf auth login`), or --token;
HF_ENDPOINT points the upload elsewhere (the tests use a local stand-in). Every refusal is one sentence.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath, PureWindowsPath

import yaml

from ..config import ConfigError, from_dict, read_yaml
from ..models.model_card import model_card
from ..utils.atomic import atomic_write_text

__all__ = ["PUBLISHED_FILES", "checkpoint_folder", "write_card", "public_config", "publish"]

PUBLISHED_FILES = ["model.safetensors", "config.json", "config.yaml", "classes.json", "meta.json", "README.md"]
REQUIRED = PUBLISHED_FILES[:4]


def checkpoint_folder(path: str | Path) -> Path:
    """A checkpoint folder itself, or a run folder's best/."""
    path = Path(path)
    folder = path / "best" if (path / "best").is_dir() and not (path / "model.safetensors").is_file() else path
    if not folder.is_dir():
        raise ConfigError(f"{path} does not exist; pass a run folder (runs/<name>) or its best/ folder.")
    missing = [n for n in REQUIRED if not (folder / n).is_file()]
    if missing:
        raise ConfigError(f"{folder} is not a complete checkpoint (no {', '.join(missing)}); pass a folder "
                          "written by train.py.")
    return folder


def write_card(folder: Path, repo_id: str) -> None:
    """README.md for `folder`, naming `repo_id` in its load examples (cards written by train.py say you/<run>)."""
    from safetensors import safe_open

    cfg = from_dict(read_yaml(folder / "config.yaml"))
    classes = json.loads((folder / "classes.json").read_text())
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").is_file() else {}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        num_params = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    atomic_write_text(folder / "README.md", model_card(cfg, classes, meta, num_params, repo_id))


def _local_path(text: str) -> bool:
    """An absolute or home-relative path (POSIX or Windows), bare or after local-dir: or file: (a shard URL)."""
    text = re.sub(r"^file:(//)?", "", text.removeprefix("local-dir:"))
    return text.startswith(("/", "~", "\\\\")) or re.match(r"[A-Za-z]:[\\/]", text) is not None


def _last_component(text: str) -> str:
    prefix = "local-dir:" if text.startswith("local-dir:") else ""
    path = text.removeprefix(prefix).rstrip("/\\")
    return prefix + (PureWindowsPath(path).name if "\\" in path else PurePosixPath(path).name)


def public_config(settings: dict) -> dict:
    """config.yaml's settings as published: data.root reduced to its last component (the dataset's folder
    name), and so every other string that is a local path (data.labels_file, run.output_dir, a wds split's
    shard pattern, model.pretrained's weights file, ...). Relative paths and names are kept."""
    def clean(value, key: str):
        if isinstance(value, dict):
            return {k: clean(v, f"{key}.{k}" if key else k) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v, key) for v in value]
        if isinstance(value, str) and (key == "data.root" or _local_path(value)):
            return _last_component(value)
        return value

    return clean(settings, "")


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def publish(path: str | Path, repo_id: str, private: bool = True, token: str | None = None,
            message: str | None = None) -> str:
    """Upload a checkpoint folder (or a run's best/) to the hub repository `repo_id`, creating it (private by
    default; an existing repository keeps its visibility), config.yaml as `public_config` makes it. Returns the
    repository's URL."""
    import httpx2  # huggingface_hub's HTTP client
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError

    folder = checkpoint_folder(path)
    if "/" not in repo_id.strip("/") or repo_id.count("/") != 1:
        raise ConfigError(f"--repo {repo_id!r} must look like you/name (your user or organisation, a slash, a name).")
    if constants.HF_HUB_OFFLINE:
        raise ConfigError("HF_HUB_OFFLINE is set, so nothing can be uploaded; unset it to publish.")
    token = token or huggingface_hub.get_token()
    if not token:
        raise ConfigError("no Hugging Face token found; run `hf auth login`, set HF_TOKEN, or pass --token.")
    write_card(folder, repo_id)
    api = huggingface_hub.HfApi(token=token)
    config = yaml.safe_dump(public_config(read_yaml(folder / "config.yaml")), sort_keys=False).encode()
    files = [huggingface_hub.CommitOperationAdd(path_in_repo=n, path_or_fileobj=config if n == "config.yaml"
                                                else str(folder / n))
             for n in PUBLISHED_FILES if (folder / n).is_file()]
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.create_commit(repo_id=repo_id, operations=files,
                          commit_message=message or f"Upload {folder.parent.name}/{folder.name} with vit publish.py")
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        detail = (e.server_message or str(e)).strip().splitlines()[0].rstrip(".")
        raise ConfigError(f"the hub refused the upload to {repo_id} (HTTP {status}: {detail}); check the token's "
                          "write access and the repository name.") from None
    except (OSError, httpx2.TransportError) as e:  # no network, DNS, a refused connection
        raise ConfigError(f"cannot reach the hub at {constants.ENDPOINT} ({e}); check the network "
                          "or HF_ENDPOINT.") from None
    return str(url)
