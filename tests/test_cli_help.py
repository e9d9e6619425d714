"""--help of every script: the config schema, every option with its help and default, and no torch import."""

# --help of every script: the config schema from the dataclasses, every option with its help and default, and
# no torch import on the way (checked in sys.modules of a fresh interpreter, not by timing).

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT
from helpers import import_script as _script

from vit import config as C
from vit.cli.help import config_help, field_comments, format_value

# every command is a root script (train.py first: its help is the config schema, not argparse options)
SCRIPTS = ("train", *sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "train"))

# Runs each script as __main__ with --help in one fresh interpreter; prints {script: help} and whether any module
# of torch (or timm, accelerate) was imported by the time every help had been printed.
PROBE = r"""
import contextlib, io, json, runpy, sys
out = {}
for name in sys.argv[1:]:
    buf = io.StringIO()
    sys.argv = [name + ".py", "--help"]
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_path(name + ".py", run_name="__main__")
        except SystemExit as e:
            out[name + ":code"] = e.code
    out[name] = buf.getvalue()
out["heavy"] = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "timm", "accelerate", "numpy"))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps() -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, *SCRIPTS], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "100"}, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)



def test_help_imports_no_torch_and_exits_zero(helps):
    assert helps["heavy"] == []  # not torch, timm, accelerate, nor even numpy
    for name in SCRIPTS:
        assert helps[f"{name}:code"] in (0, None), name
        assert len(helps[name].splitlines()) > 10, name


def _yaml_scalar(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    return {None: "null", True: "true", False: "false"}[v] if v is None or isinstance(v, bool) else str(v)


def test_train_help_lists_every_config_key_with_its_default_and_meaning(helps):
    text = helps["train"]
    lines = text.splitlines()
    for section in dataclasses.fields(C.Config):
        cls = section.default_factory
        start = lines.index(f"{section.name}:")
        comments = field_comments(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            shown = _yaml_scalar(default)
            row = [i for i, line in enumerate(lines[start:], start) if line.startswith(f"  {f.name} = ")]
            assert row, f"{section.name}.{f.name} missing from train.py --help"
            assert lines[row[0]].startswith(f"  {f.name} = {shown}  ("), lines[row[0]]
            # the meaning is the comment written beside the field in vit/config/schema.py: it cannot drift from the code
            assert comments.get(f.name), f"{section.name}.{f.name} has no comment in vit/config/schema.py; add one"
            assert lines[row[0] + 1].strip() == comments[f.name][: len(lines[row[0] + 1].strip())]
    # the values configs/default.yaml sets instead are marked, so a user sees what a plain run uses
    assert "  img_size = 224  (int)  [file: 64]" in lines
    assert "  mixed_precision = null  (str | None: no|bf16|fp16|auto)" in lines


def test_train_help_shows_the_named_config_files_values(tmp_path):
    (tmp_path / "x.yaml").write_text("optim:\n  lr: 0.25\nrun:\n  mixed_precision: no\n")
    text = config_help(tmp_path / "x.yaml")
    assert "  lr = 0.001  (float)  [file: 0.25]" in text
    assert "  mixed_precision = null  (str | None: no|bf16|fp16|auto)  [file: no]" in text
    assert format_value([0.5, None, True]) == "[0.5, null, true]"


def test_field_comments_take_the_trailing_comment_or_the_block_above():
    src = "class A:\n    # about b,\n    # two lines\n    b: int = 1\n    c: int = 2  # c's\n    d: int = 3\n"
    assert field_comments(type("A", (), {}), src) == {"b": "about b, two lines", "c": "c's"}


@pytest.mark.parametrize("name", SCRIPTS[1:])
def test_script_options_all_have_help_and_show_their_defaults(helps, name):
    parser: argparse.ArgumentParser = _script(name).build_parser()
    text = " ".join(helps[name].split())  # argparse wraps lines; compare with whitespace collapsed
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{name}.py {action.option_strings or action.dest} has no help text"
        d = action.default
        if d is not None and not isinstance(d, bool):
            shown = " ".join(map(str, d)) if isinstance(d, list) else str(d)
            assert f"(default: {shown})" in text, f"{name}.py {action.option_strings}: default {d!r} not shown"


def test_export_help_names_the_formats_vit_export_writes():
    from vit.deploy.export import FORMATS

    assert _script("export").EXPORT_FORMATS == tuple(FORMATS)


def test_visualize_attention_writes_into_the_checkpoints_run_folder(tmp_path):
    vis = _script("visualize_attention")
    run = tmp_path / "runs" / "r1"
    (run / "best").mkdir(parents=True)
    (run / "config.yaml").write_text("{}")
    assert vis.parse_args(["--checkpoint", str(run / "best"), "x.png"]).out == str(run / "attention")
    lone = tmp_path / "exported_model"
    lone.mkdir()
    assert vis.parse_args(["--checkpoint", str(lone), "x.png"]).out == "runs/attention-exported_model"
    assert vis.parse_args(["--checkpoint", str(lone), "x.png", "--out", "o"]).out == "o"


def test_train_help_outside_the_repository_uses_the_default_config_next_to_train_py(tmp_path):
    def helptext(*args):
        r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help", *args], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "  img_size = 224  (int)  [file: 64]" in helptext().splitlines()  # configs/default.yaml was found
    text = " ".join(helptext("--config", "nope.yaml").split())
    assert "The config file nope.yaml does not exist" in text and "[file: 64]" not in text


def _command_source(script: str) -> str:
    """The code behind a root script: its command module (vit/cli/commands/<script>.py; the script is a shim)."""
    return (ROOT / "vit" / "cli" / "commands" / f"{script}.py").read_text()


def test_every_command_that_takes_aug_overrides_says_how_to_keep_the_border(helps):
    """A hub ViT's 0.9 centre crop cut the border off inspection images (12 of 90 defects reached into it): every
    command that takes --aug.* says in its help how to keep the whole image; train.py's config help says it too."""
    takers = [n for n in SCRIPTS if n != "train" and '"aug."' in _command_source(n)]  # parse_command's sections
    assert set(takers) >= {"anomaly", "evaluate", "export", "features", "predict"}
    for name in takers:
        assert "--aug.eval_crop_pct=1.0 keeps the whole image, border included" in " ".join(helps[name].split()), name
    assert "eval_crop_pct = null" in helps["train"] and "0.9 cuts borders" in helps["train"]
