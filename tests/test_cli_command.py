"""`vit`, the installed command: one registry of commands, each a root script's, help without torch, the README's
list held against the registry, and a wheel that installs it into a fresh environment."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import venv

import pytest
from helpers import ROOT

from vit.cli.commands import COMMANDS, find_command

# `vit --help` and `vit <command> --help` in one fresh interpreter (python -m vit, as installed); prints each help,
# its exit code, and which heavy modules were imported by the end
PROBE = r"""
import contextlib, io, json, sys
import vit.cli.main as cli
out = {}
for args in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            cli.main(args)
        except SystemExit as e:
            out[" ".join(args) + ":code"] = e.code
    out[" ".join(args)] = buf.getvalue()
out["heavy"] = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "timm", "accelerate", "numpy"))
print(json.dumps(out))
"""


def _probe(calls: list[list[str]]) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(calls)], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "100"}, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_every_root_script_is_a_registered_command_and_back():
    scripts = sorted(p.name for p in ROOT.glob("*.py"))
    assert sorted(c.script for c in COMMANDS) == scripts
    for c in COMMANDS:
        assert find_command(c.name) is c and find_command(c.script[:-3]) is c
        assert (ROOT / (c.module.replace(".", "/") + ".py")).is_file(), c.module
    assert find_command("nope") is None


def test_vit_help_and_every_commands_help_import_no_torch():
    out = _probe([["--help"], *[[c.name, "--help"] for c in COMMANDS]])
    assert out["heavy"] == []  # not torch, timm, accelerate, nor numpy
    listed = out["--help"]
    for c in COMMANDS:
        assert re.search(rf"^  {re.escape(c.name)} +{re.escape(c.help)}$", listed, re.M), c.name
        assert out[f"{c.name} --help:code"] in (0, None), c.name
        assert len(out[f"{c.name} --help"].splitlines()) > 5, c.name
    assert "usage: vit evaluate " in out["evaluate --help"]  # argparse names the subcommand, not the script


def test_vit_command_gives_the_scripts_help(tmp_path):
    """`vit evaluate --help` is `python evaluate.py --help` but for the program's name."""
    def run(*cmd):
        r = subprocess.run([sys.executable, *cmd, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "100"})
        assert r.returncode == 0, r.stderr
        return r.stdout

    # `python -m vit` runs vit.__main__, which dispatches as the installed `vit` does
    assert run("-m", "vit", "evaluate").replace("vit evaluate", "evaluate.py") == run("evaluate.py")
    assert run("-m", "vit", "train") == run("train.py")


def test_unknown_or_missing_command_is_one_sentence_and_exit_2():
    r = subprocess.run([sys.executable, "-m", "vit", "evalute"], capture_output=True, text=True, cwd=ROOT,
                       timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "no command 'evalute'" in r.stderr
    assert "evaluate" in r.stderr
    bare = subprocess.run([sys.executable, "-m", "vit"], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert bare.returncode == 2 and "commands:" in bare.stdout


def test_the_readme_names_every_registered_command_once():
    text = (ROOT / "README.md").read_text()
    named = re.findall(r"`vit ([a-z][a-z-]*)`", text.split("## Commands", 1)[1])
    assert sorted(named) == sorted(c.name for c in COMMANDS), named


def test_a_command_error_is_the_scripts_one_sentence_and_exit_code(tmp_path):
    r = subprocess.run([sys.executable, "-m", "vit", "evaluate", "--checkpoint", str(tmp_path / "nope"),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_wheel_installs_vit_and_its_subcommands_into_a_fresh_environment(tmp_path):
    """A non-editable install: the wheel built from a copy of the tree (nothing written into the checkout),
    offline (--no-build-isolation: this environment's setuptools), into a new virtualenv without pip (this pip
    installs into it with --python), then `vit --help` and `vit evaluate --help` from the venv's bin/, outside
    the repository and without PYTHONPATH."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "vit", src / "vit", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"),
                    str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("vit-*.whl")
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    clean = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "COLUMNS": "100"}
    top = subprocess.run([str(env_dir / "bin" / "vit"), "--help"], capture_output=True, text=True, cwd=tmp_path,
                         env=clean, timeout=60)
    assert top.returncode == 0, top.stderr
    assert all(f"  {c.name} " in top.stdout for c in COMMANDS)
    ev = subprocess.run([str(env_dir / "bin" / "vit"), "evaluate", "--help"], capture_output=True, text=True,
                        cwd=tmp_path, env=clean, timeout=60)
    assert ev.returncode == 0 and "usage: vit evaluate " in ev.stdout and "--checkpoint" in ev.stdout, ev.stderr
    where = subprocess.run([str(python), "-c", "import vit; print(vit.__file__)"], capture_output=True, text=True,
                           cwd=tmp_path, env=clean, timeout=60).stdout
    assert where.startswith(str(env_dir)), where  # the installed copy ran, not the checkout
