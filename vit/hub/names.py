"""Pretrained weights by name, found as timm 1.0 finds them: tags in timm's registry, files on the Hugging Face hub
(through huggingface_hub and its standard cache) or in a local folder laid out like a hub repository.

    vit_base_patch16_224                the default tag's repository: timm/vit_base_patch16_224.augreg2_in21k_ft_in1k
    vit_base_patch16_224.augreg_in21k   that tag's repository: timm/vit_base_patch16_224.augreg_in21k
    hf-hub:org/repo[@revision]          that repository; its config.json gives the architecture, model_args,
                                        num_classes, label names and the pretrained config
    local-dir:/path/to/folder           a folder holding config.json and model.safetensors (or pytorch_model.bin)

A repository in transformers' layout (config.json with a `model_type`) or open_clip's (open_clip_config.json) is
read through vit.hub.hf_vision / vit.hub.open_clip_weights: its options become timm's ViT's, its weights are
renamed when loaded (`Source.format`).

Only names, configs and file locations are resolved here; `vit.hub.weights` reads and adapts the weights, and
`vit.hub.cache` fetches a repository's files (from the cache at once when offline). The checkpoint side,
the config.json that makes a train.py checkpoint folder a timm hub folder, is `vit.hub.hub_config`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from ..utils.files import check_regular_file, read_regular_file
from .cache import hub_file

__all__ = ["Source", "resolve", "resolve_source", "weights_architecture", "weights_file", "WEIGHT_FILES",
           "regular_file", "repo_file", "read_json"]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # timm's order: safetensors first, never code
CONFIG_FILES = ("config.json", "open_clip_config.json")  # timm's or transformers', then open_clip's
BASE = "vit_base_patch16_224"  # what a converted model without a name of its own is built as (its sizes in model_args)
SOURCES = ("hf-hub:", "local-dir:")
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")
MAX_CONFIG_BYTES = 2**20  # a timm config.json is a few kB (label names of 21k classes: ~500 kB)


@dataclass
class Source:
    """Where a model's weights and pretrained config come from."""

    name: str  # as the user wrote it
    architecture: str  # a registered architecture, e.g. 'vit_base_patch16_224'
    pretrained_cfg: dict  # timm's PretrainedCfg.to_dict(): becomes `model.pretrained_cfg`
    model_args: dict = field(default_factory=dict)  # construction args saved with the weights (config.json)
    repo_id: str | None = None  # hub repository ...
    revision: str | None = None  # ... at this branch, tag or commit (None: main)
    folder: Path | None = None  # local-dir: a folder laid out like a repository
    file: Path | None = None  # a plain weights file
    config: Path | None = None  # the config.json model_args and pretrained_cfg were read from (for messages)
    weights: Path | None = None  # where the weights are (set by resolve_source when they are wanted)
    format: str = "timm"  # the weights' layout: 'timm', 'transformers' or 'open_clip' (renamed when loaded)
    format_config: dict = field(default_factory=dict)  # the config.json it was read from, for renaming its weights
    weight_files: tuple[str, ...] = ()  # the repository's weights files in order of preference (empty: WEIGHT_FILES)

    def model_kwargs(self) -> dict:
        """create_model defaults the weights imply, as timm's factory: the pretrained config's class count,
        channels and (for fixed-size models) image size, under the source's own model_args. A plain file implies
        nothing (today's behaviour), and the caller's overrides always win."""
        if self.file is not None:
            return {}
        cfg, out = self.pretrained_cfg, {}
        size = cfg.get("input_size")
        n = cfg.get("num_classes")
        if n is not None and (type(n) is not int or n >= 0):  # a wrong type is named by create_model's check
            out["num_classes"] = n
        if size is not None:
            out["in_chans"] = size[0]
            if cfg.get("fixed_input_size"):
                out["img_size"] = tuple(size[-2:])
        out.update(self.model_args)
        if isinstance(out.get("img_size"), list):
            out["img_size"] = tuple(out["img_size"])
        return out


def _split_source(name: str) -> tuple[str | None, str]:
    """'hf-hub:org/repo' -> ('hf-hub', 'org/repo'); a registry name -> (None, name), as timm's parse_model_name."""
    from timm.models import parse_model_name

    try:
        return parse_model_name(name)
    except ValueError as e:
        raise ValueError(f"{e}".rstrip(".") + ".") from None


def _check_arch(arch: str, name: str, known: Collection[str] | None) -> None:
    if known is not None and arch not in known:
        raise ValueError(f"{name!r} needs the architecture {arch!r}, which this library does not build; "
                         f"vit.list_models() lists the {len(known)} it builds.")


def _registry(name: str, arch: str, tag: str, known: Collection[str] | None) -> Source:
    """A registry name, with or without tag -> its pretrained config and hub repository, as timm resolves it."""
    from timm.models import get_arch_pretrained_cfgs, is_model, resolve_pretrained_cfg

    _check_arch(arch, name, known)
    if not is_model(arch):
        raise ValueError(f"unknown model {arch!r}; it has no entry in timm's registry.")
    try:
        cfg = resolve_pretrained_cfg(arch, pretrained_cfg=tag or None).to_dict()
    except RuntimeError:
        tags = sorted(get_arch_pretrained_cfgs(arch))
        raise ValueError(f"unknown pretrained tag {tag!r} for {arch}; its tags are: {', '.join(tags)}.") from None
    return Source(name, arch, cfg, repo_id=cfg.get("hf_hub_id"))


def _read_config(folder: Path, name: str) -> tuple[dict, str, dict]:
    """A repository's config.json -> (pretrained_cfg, architecture, model_args), parsed by timm's own reader so
    that legacy layouts and top-level num_classes / label_names are read exactly as timm reads them. A file that
    is not regular (a FIFO would block the read) or larger than MAX_CONFIG_BYTES is refused before it is read."""
    from timm.models._hub import load_model_config_from_path

    file = regular_file(folder / "config.json", f"{name}:", f"{name}: {folder} has no config.json; pass a folder "
                        "laid out like a hub repository (config.json and model.safetensors), or the weights file "
                        "itself.")
    size = file.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"{name}: {file} is {size / 2**20:.0f} MB, larger than a model config can be "
                         f"({MAX_CONFIG_BYTES // 2**20} MB); it is not a timm config.json, so it is not read.")
    try:
        cfg, arch, args = load_model_config_from_path(folder)
    except FileNotFoundError:
        raise FileNotFoundError(f"{name}: {folder} has no config.json; pass a folder laid out like a hub "
                                "repository (config.json and model.safetensors), or the weights file itself.") from None
    except Exception as e:  # bad JSON, no 'architecture', ...
        raise ValueError(f"{name}: {folder / 'config.json'} is not a timm model config ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'missing field'}).") from None
    return cfg, arch, dict(args or {})


def _from_config(name: str, arch: str, cfg: dict, known: Collection[str] | None) -> dict:
    """timm's resolution of a config.json's pretrained config (PretrainedCfg(**cfg).to_dict())."""
    from timm.models import resolve_pretrained_cfg

    _check_arch(arch, name, known)
    try:
        return resolve_pretrained_cfg(arch, pretrained_cfg=cfg).to_dict()
    except TypeError as e:
        raise ValueError(f"{name}: its config.json holds a pretrained_cfg timm does not know ({e}).") from None


def _converted(name: str, config: Path, known: Collection[str] | None, cache_dir: str | Path | None,
               **where) -> Source | None:
    """The Source of a repository in transformers' or open_clip's layout (vit.hub.hf_vision,
    vit.hub.open_clip_weights), its architecture and options converted to timm's; None for a timm config.json.
    An architecture `known` lacks is built as BASE with every size in its model_args."""
    from .hf_vision import hf_model_args, hf_pretrained_cfg, is_transformers_config
    from .open_clip_weights import WEIGHT_FILES as OPEN_CLIP_FILES
    from .open_clip_weights import is_open_clip_config, open_clip_model_args, open_clip_pretrained_cfg

    data = read_json(config, name)
    if config.name == "open_clip_config.json" or is_open_clip_config(data):
        fmt, files = "open_clip", OPEN_CLIP_FILES
        arch, args = open_clip_model_args(data, name)
        cfg = open_clip_pretrained_cfg(data, args["num_classes"])
    elif is_transformers_config(data):
        fmt, files = "transformers", WEIGHT_FILES
        arch, args = hf_model_args(data, name)
        try:
            pre = read_json(repo_file(_folder_name(name, config), ("preprocessor_config.json",), cache_dir), name)
        except FileNotFoundError:  # the image processor's defaults
            pre = None
        cfg = hf_pretrained_cfg(data, pre, args, name)
    else:
        return None
    if known is not None and arch not in known and "embed_dim" in args:
        arch = BASE
    _check_arch(arch, name, known)
    cfg.update(architecture=arch, **({"hf_hub_id": where["repo_id"], "source": "hf-hub"} if "repo_id" in where
                                     else {}))
    return Source(name, arch, cfg, args, config=config, format=fmt, format_config=data, weight_files=files, **where)


def _folder_name(name: str, config: Path) -> str:
    """The name repo_file reads a sibling of `config` by: the hf-hub: name as given, or local-dir: its folder."""
    return name if name.startswith(("hf-hub:", "hf_hub:")) else f"local-dir:{config.parent}"


def resolve(name: str, known: Collection[str] | None = None, cache_dir: str | Path | None = None) -> Source:
    """A model name in one of the four forms above -> its Source (config.json is fetched, weights are not).
    A repository in transformers' or open_clip's layout is converted (see `_converted`)."""
    kind, ident = _split_source(name)
    if kind == "hf-hub":
        repo_id, _, revision = ident.partition("@")
        config = hub_file(repo_id, revision or None, CONFIG_FILES, cache_dir, "its config.json")
        converted = _converted(name, config, known, cache_dir, repo_id=repo_id, revision=revision or None)
        if converted is not None:
            return converted
        cfg, arch, args = _read_config(config.parent, name)
        cfg.pop("file", None)
        cfg.update(hf_hub_id=ident, source="hf-hub")  # what timm's load_model_config_from_hf records
        return Source(name, arch, _from_config(name, arch, cfg, known), args, repo_id=repo_id,
                      revision=revision or None, config=config)
    if kind == "local-dir":
        folder = Path(ident)
        if not folder.is_dir():
            raise FileNotFoundError(f"{name}: folder {folder} does not exist; pass a folder with config.json and "
                                    "model.safetensors (e.g. a run's best/).")
        config = next((folder / f for f in CONFIG_FILES if (folder / f).is_file()), folder / "config.json")
        converted = _converted(name, config, known, cache_dir, folder=folder) if config.is_file() else None
        if converted is not None:
            return converted
        cfg, arch, args = _read_config(folder, name)
        return Source(name, arch, _from_config(name, arch, cfg, known), args, folder=folder,
                      config=folder / "config.json")
    arch, _, tag = ident.partition(".")
    return _registry(name, arch, tag, known)


def _is_path(text: str, known: Collection[str] | None) -> bool:
    """Whether a `pretrained=` string is a file or folder rather than a model name."""
    if text.startswith(SOURCES) or text.startswith("hf_hub:"):
        return False
    if Path(text).exists() or any(c in text for c in "/\\") or text.endswith(WEIGHT_SUFFIXES):
        return True
    return known is not None and text.partition(".")[0] not in known


def resolve_source(name: str, pretrained: bool | str | Path | None, known: Collection[str] | None = None,
                   cache_dir: str | Path | None = None) -> Source | None:
    """What `create_model(name, pretrained)` builds from. None: a plain architecture name without weights.

    `name` may itself carry a tag or a source (its config then applies even without weights, as in timm).
    `pretrained`: True (the weights `name` points at), a model name in any form above whose architecture must be
    `name`'s, a folder (read as local-dir:), or a weights file (timm's registry config for the architecture,
    with `file` set, as timm's pretrained_cfg_overlay=dict(file=...)). Wanted weights are located here, before
    any model is built, so that a missing one fails at once."""
    named = resolve(name, known, cache_dir) if ("." in name or ":" in name) else None
    if pretrained is None or pretrained is False:
        return named
    if pretrained is True:
        source = named or resolve(name, known, cache_dir)
    else:
        source = _weights_source(named, name, str(pretrained), known, cache_dir)
    return dataclasses.replace(source, weights=weights_file(source, cache_dir))


def weights_architecture(pretrained: bool | str | Path | None, known: Collection[str] | None = None,
                         cache_dir: str | Path | None = None) -> str | None:
    """The architecture that a model.pretrained value names (a registry name or tag, hf-hub:, local-dir:, a
    folder; read from the registry or config.json, no weights loaded); None for True, None or False. A weights
    file does not say its architecture: ValueError, one sentence."""
    if not isinstance(pretrained, (str, Path)):
        return None
    text = str(pretrained)
    if Path(text).is_dir():
        return resolve(f"local-dir:{text}", known, cache_dir).architecture
    if _is_path(text, known):
        raise ValueError(f"model.pretrained {text!r} is a weights file, which does not say its architecture; set "
                         "model.name too (e.g. --model.name=vit_base_patch16_224).")
    return resolve(text, known, cache_dir).architecture


def _weights_source(named: Source | None, name: str, text: str, known: Collection[str] | None,
                    cache_dir: str | Path | None) -> Source:
    """The Source of a `pretrained=` string: a model name, a folder or a file (see resolve_source)."""
    arch = named.architecture if named else name
    if not _is_path(text, known):
        weights = resolve(text, known, cache_dir)
    elif Path(text).is_dir():
        weights = resolve(f"local-dir:{text}", known, cache_dir)
    else:
        if named is not None:
            cfg = {**named.pretrained_cfg, "file": text}
        else:
            from timm.models import is_model, resolve_pretrained_cfg

            cfg = (resolve_pretrained_cfg(arch, pretrained_cfg_overlay={"file": text}).to_dict() if is_model(arch)
                   else {"architecture": arch, "file": text})
        return Source(text, arch, cfg, file=Path(text))
    if weights.architecture != arch:
        raise ValueError(f"pretrained weights {text!r} are a {weights.architecture}, but the model is {arch}; "
                         f"leave model.name unset (the weights then set it) or set it to {weights.architecture}, "
                         f"or pick weights made for {arch}.")
    return weights


# --- files ---------------------------------------------------------------------------------------------------


def regular_file(path: Path, what: str, missing: str) -> Path:
    """`path` if it is a regular file (or a link to one); else one sentence: `missing` when nothing is there, and
    'not a regular file' for a FIFO, a device (a link to /dev/zero) or a folder, which would hang or never end."""
    if path.is_file():
        return path
    if path.exists() or path.is_symlink():
        raise ValueError(f"{what} {path} is not a regular file (a folder, FIFO, device or dangling link); "
                         "pass the file itself.")
    raise FileNotFoundError(missing)


def read_json(path: Path, name: str, limit: int = MAX_CONFIG_BYTES) -> dict:
    """A repository's JSON file (a transformers config.json, tokenizer_config.json, ...) as a dict, refused in one
    sentence when it is not a regular file, is larger than `limit` bytes, or is not a JSON object."""
    data = read_regular_file(path, limit, f"{name}:")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # RecursionError: [[[... 10**5 deep
        raise ValueError(f"{name}: {path} is not readable JSON ({type(e).__name__}: {e}).") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name}: {path} holds a JSON {type(value).__name__}, not an object; it is not a config.")
    return value


def repo_file(name: str, names: tuple[str, ...], cache_dir: str | Path | None = None, what: str | None = None,
              kind: str = "a Hugging Face model repository") -> Path:
    """The first of `names` that the repository `name` holds: `hf-hub:org/repo[@revision]` from huggingface_hub's
    cache (downloaded into it only when online) or `local-dir:/folder`. For files other than a timm model's,
    e.g. a transformers model's config.json or tokenizer.json; a repository or file that is not there raises
    one sentence (for the hub the same one as `resolve`: repository, cache folder and the command that fetches it)."""
    what = what or f"its {names[0]}"
    kind_, ident = _split_source(name) if name.startswith(SOURCES) or name.startswith("hf_hub:") else (None, name)
    if kind_ == "hf-hub":
        repo_id, _, revision = ident.partition("@")
        return check_regular_file(hub_file(repo_id, revision or None, names, cache_dir, what, kind), None,
                                  f"{name}:")
    if kind_ == "local-dir":
        folder = Path(ident)
        if not folder.is_dir():
            raise FileNotFoundError(f"{name}: folder {folder} does not exist; pass a folder laid out like a hub "
                                    f"repository (e.g. one written by save_pretrained).")
        for filename in names:
            path = folder / filename
            if path.exists() or path.is_symlink():  # a FIFO or a link to /dev/zero is named, not skipped
                return check_regular_file(path, None, f"{name}:")
        raise FileNotFoundError(f"{name}: {folder} holds none of {', '.join(names)}; it is not {kind}.")
    raise ValueError(f"{name!r} names no repository; write hf-hub:org/name[@revision] (a Hugging Face hub "
                     "repository, from its cache offline) or local-dir:/path/to/folder.")


def weights_file(source: Source, cache_dir: str | Path | None = None) -> Path:
    """The file holding `source`'s weights: model.safetensors first, then pytorch_model.bin (read later with
    weights_only=True); for the hub through huggingface_hub's cache, downloaded only when online."""
    if source.weights is not None:
        return source.weights
    if source.file is not None:
        return regular_file(source.file, "weights file", f"weights file {str(source.file)!r} does not exist; check "
                            "the path (a hub repository is written hf-hub:org/name).")
    files = source.weight_files or WEIGHT_FILES
    if source.folder is not None:
        for filename in files:
            path = source.folder / filename
            if path.exists() or path.is_symlink():
                return regular_file(path, f"{source.name}:", "")
        raise FileNotFoundError(f"{source.name}: {source.folder} holds neither {' nor '.join(files)}; "
                                "pass a folder written by train.py or timm's save_for_hf.")
    if not source.repo_id:
        url = source.pretrained_cfg.get("url")
        raise ValueError(f"{source.name} has no weights on the Hugging Face hub"
                         + (f" (only {url}); download that file and pass it as pretrained=<path>." if url else "."))
    filename = source.pretrained_cfg.get("hf_hub_filename")
    return hub_file(source.repo_id, source.revision, (filename,) if filename else files, cache_dir,
                     "its weights")
