"""Nothing a folder one is handed runs a command or fetches a URL: _info.json names, saved data sources."""

# Nothing a folder one is handed says runs a command or fetches a URL: shard names in _info.json, data sources
# in a checkpoint's saved config, through every entry point that builds a dataset or loads a checkpoint.

import json
from pathlib import Path

import pytest
from helpers import TINY, import_script, make_image_folder, run_script
from PIL import Image

from vit.config import ConfigError, load_config
from vit.data import DataError, build_datasets
from vit.data.shards import resolve_split, write_shards
from vit.models.build import build_model
from vit.models.checkpoint import load_checkpoint, save_checkpoint


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Real shards (2 classes, 2 val images each) that a pipe: command could `cat`."""
    base = tmp_path_factory.mktemp("untrusted")
    folder = make_image_folder(base / "f", classes=("a", "b"), n_train=2, n_val=2, size=16)
    write_shards(folder, base / "s", shard_size=2)
    return base / "s"


@pytest.fixture(scope="module")
def image(shards):
    path = shards.parent / "one.png"
    Image.new("RGB", (20, 20), (90, 30, 200)).save(path)
    return path


def _checkpoint(folder: Path, shards: Path, **data) -> Path:
    cfg = load_config(None, [*TINY, "--data.dataset=wds", f"--data.root={shards}", "--data.num_workers=0"])
    for key, value in data.items():
        setattr(cfg.data, key, value)
    return save_checkpoint(folder, build_model(cfg, 2), cfg, ["a", "b"])


def _command(marker: Path, shards: Path) -> str:
    return f"pipe:touch {marker}; cat {shards}/val-00000.tar"


# --- _info.json names plain relative files only ----------------------------------------------------------------

EVIL_NAMES = {
    "pipe": lambda m, s: f"pipe:touch {m}; cat {s}/val-00000.tar",
    "absolute": lambda m, s: f"{s}/val-00000.tar",
    "parent": lambda m, s: f"../{s.name}/val-00000.tar",
    "https": lambda m, s: "https://127.0.0.1:9/val-00000.tar",
    "file-url": lambda m, s: f"file://{s}/val-00000.tar",
    "other-scheme": lambda m, s: "s3:bucket/val-00000.tar",
    "home": lambda m, s: "~/val-00000.tar",
    "not-a-string": lambda m, s: 7,
}


def _evil_folder(tmp_path: Path, shards: Path, name) -> Path:
    evil = tmp_path / "evil"
    evil.mkdir()
    for f in shards.glob("*.tar"):
        (evil / f.name).write_bytes(f.read_bytes())
    info = json.loads((shards / "_info.json").read_text())
    info["splits"]["val"]["filenames"] = [name, *info["splits"]["val"]["filenames"][1:]]
    (evil / "_info.json").write_text(json.dumps(info))
    return evil


@pytest.mark.parametrize("kind", sorted(EVIL_NAMES))
def test_info_names_other_than_plain_files_refuse_the_folder(tmp_path, shards, kind):
    marker = tmp_path / "pwned"
    evil = _evil_folder(tmp_path, shards, EVIL_NAMES[kind](marker, shards))
    with pytest.raises(DataError, match="not a plain file name under its folder"):
        resolve_split(str(evil), "val")
    with pytest.raises(DataError, match="not a plain file name under its folder"):  # a pattern draws on it too
        resolve_split(str(evil), "val-{00000..00001}.tar")
    assert not marker.exists()


@pytest.mark.slow
def test_info_names_refused_through_train_and_evaluate(tmp_path, shards):
    marker = tmp_path / "pwned"
    evil = _evil_folder(tmp_path, shards, _command(marker, shards))
    train = import_script("train")
    with pytest.raises(DataError, match="not a plain file name"):
        train.main([*TINY, "--data.dataset=wds", f"--data.root={evil}", "--run.epochs=1",
                    f"--run.output_dir={tmp_path / 'runs'}", "--run.name=r"])
    ck = _checkpoint(tmp_path / "ck", shards)
    with pytest.raises(DataError, match="not a plain file name"):
        import_script("evaluate").main(["--checkpoint", str(ck), f"--data.root={evil}", "--out", str(tmp_path / "e")])
    assert not marker.exists()


def test_sub_folder_names_in_info_are_read(tmp_path, shards):
    """A relative name with a folder in it stays allowed: it is under the root."""
    (tmp_path / "s" / "v").mkdir(parents=True)
    info = json.loads((shards / "_info.json").read_text())
    for f in info["splits"]["val"]["filenames"]:
        (tmp_path / "s" / "v" / f).write_bytes((shards / f).read_bytes())
    info["splits"]["val"]["filenames"] = [f"v/{f}" for f in info["splits"]["val"]["filenames"]]
    (tmp_path / "s" / "_info.json").write_text(json.dumps(info))
    split = resolve_split(str(tmp_path / "s"), "val")
    assert split.urls[0] == f"{tmp_path / 's'}/v/val-00000.tar" and split.num_samples == 4


# --- data sources in a saved config are withheld ----------------------------------------------------------------


def _entry_points(ck: Path, image: Path, tmp: Path) -> dict:
    """Each entry point that loads a checkpoint folder: a call, and whether it needs the data (then it is refused
    in one sentence) or not (then it runs, without opening the data)."""
    def faithfulness():
        return import_script("faithfulness").main(["--checkpoint", str(ck), "--out", str(tmp / "faith")])

    def library():
        _, cfg, classes, _ = load_checkpoint(ck)
        return build_datasets(cfg, splits=("val",), classes=classes)

    return {
        "evaluate": (lambda: import_script("evaluate").main(["--checkpoint", str(ck), "--out", str(tmp / "ev")]), True),
        "export": (lambda: import_script("export").main(["--checkpoint", str(ck), "--format", "torchscript",
                                                         "--out", str(tmp / "ex")]), True),
        "benchmark": (lambda: import_script("benchmark").main(
            ["--checkpoint", str(ck), "--model", "vit_tiny_patch16_224", "--img-size", "32", "--token-reduction",
             "merge:2", "--batch-size", "2", "--warmup", "0", "--repeats", "1", "--device", "cpu"]), True),
        "faithfulness": (faithfulness, True),
        "library": (library, True),
        "predict": (lambda: import_script("predict").main(["--checkpoint", str(ck), str(image),
                                                           "--out", str(tmp / "pr")]), False),
        "visualize": (lambda: import_script("visualize_attention").main(["--checkpoint", str(ck), str(image),
                                                                         "--out", str(tmp / "va")]), False),
    }


@pytest.mark.parametrize("key", ["root", "val_split"])
@pytest.mark.parametrize("entry", ["evaluate", "export", "benchmark", "faithfulness", "library", "predict",
                                   "visualize"])
def test_a_saved_pipe_source_never_runs(tmp_path, shards, image, capsys, entry, key):
    marker = tmp_path / "pwned"
    source = _command(marker, shards) + ("|4" if key == "val_split" else "")
    ck = _checkpoint(tmp_path / "ck", shards, **{key: source})
    call, needs_data = _entry_points(ck, image, tmp_path)[entry]
    if needs_data:
        try:
            code = call()
        except ConfigError as e:
            message = str(e)
        else:  # benchmark prints its error and returns 2
            assert code == 2
            message = capsys.readouterr().err
        assert "comes from a saved config" in message and f"--data.{key}=" in message
    else:
        assert call() == 0
    assert not marker.exists()


@pytest.mark.parametrize("source", ["https://127.0.0.1:9/shards", "s3://bucket/shards", "{a,pipe:true}"])
def test_saved_remote_sources_are_withheld(tmp_path, shards, source):
    ck = _checkpoint(tmp_path / "ck", shards, root=source)
    _, cfg, classes, _ = load_checkpoint(ck)
    with pytest.raises(ConfigError, match="comes from a saved config"):
        build_datasets(cfg, splits=("val",), classes=classes)


def test_a_source_the_user_types_is_honoured(tmp_path, shards):
    """The same checkpoint evaluates once the user names the data, a local folder or a pipe: command."""
    marker = tmp_path / "ran"
    ck = _checkpoint(tmp_path / "ck", shards, root=_command(tmp_path / "pwned", shards))
    evaluate = import_script("evaluate")
    assert evaluate.main(["--checkpoint", str(ck), f"--data.root={shards}", "--out", str(tmp_path / "e1")]) == 0
    typed = f"pipe:touch {marker}; cat {shards}"  # the reader appends /val-00000.tar, as timm's does
    assert evaluate.main(["--checkpoint", str(ck), f"--data.root={typed}", "--data.val_split=val-00000.tar|2",
                          "--out", str(tmp_path / "e2")]) == 0
    assert marker.exists() and not (tmp_path / "pwned").exists()
    _, cfg, _, _ = load_checkpoint(save_checkpoint(tmp_path / "plain", *_plain(shards)))
    assert cfg.data.root == str(shards)  # a local source is kept as saved


def _plain(shards):
    cfg = load_config(None, [*TINY, "--data.dataset=wds", f"--data.root={shards}"])
    return build_model(cfg, 2), cfg, ["a", "b"]


@pytest.mark.slow
def test_evaluate_script_says_it_in_one_sentence(tmp_path, shards):
    marker = tmp_path / "pwned"
    ck = _checkpoint(tmp_path / "ck", shards, root=_command(marker, shards))
    r = run_script("evaluate.py", "--checkpoint", str(ck), "--out", str(tmp_path / "e"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "comes from a saved config" in r.stderr.strip().splitlines()[-1]
    assert not marker.exists()
