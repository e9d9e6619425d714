"""The README and docs/: every relative link resolves, every documented command parses with the script's own parser."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from helpers import ROOT, import_script

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    out, fence = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.add(_slug(line.lstrip("#")))
    return out


def _commands(path: Path) -> list[str]:
    """The shell commands of a page's ```bash blocks, continuation lines joined."""
    out, fence, pending = [], None, ""
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            continue
        if fence != "bash":
            continue
        line = pending + line
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line.strip())
    return out


def test_the_pages_exist_and_the_readme_fits_three_screens():
    names = {p.name for p in DOCS}
    for page in ("training", "pretrained", "library", "evaluation", "predict-export", "explain", "token-reduction",
                 "text", "scaling", "performance", "reliability", "contributing"):
        assert f"{page}.md" in names, page
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
        if anchor:
            assert anchor in _anchors(dest), f"{page.relative_to(ROOT)} links to {target}: no such heading"


def test_no_page_runs_a_library_module():
    """One way to run a command: a root script, never `python -m` on a library module."""
    banned = "python -m " + "vit."
    for path in [*DOCS, *ROOT.glob("*.py"), *(ROOT / "vit").rglob("*.py"), *(ROOT / "tests").glob("*.py")]:
        assert banned not in path.read_text(), path


def _check_script_command(script: str, args: list[str]) -> None:
    from vit.config import load_config, parse_overrides

    args = ["x" if a == "..." else a for a in args]  # `--config ...`, `--checkpoint ...`: the reader's own
    if script == "train":
        config, overrides = import_script("train").parse_args(args)
        config = ROOT / config if (ROOT / config).is_file() else None  # a placeholder path: its overrides alone
        load_config(config, [o for o in overrides if not o.startswith("--config")])  # raises on a bad key
        return
    parser = import_script(script).build_parser()
    ns, rest = parser.parse_known_args(args)  # SystemExit on a wrong or missing flag
    parse_overrides(rest)  # what is left are config overrides (--data.*, --aug.*), or it raises


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_documented_commands_parse(page):
    """Each `python X.py ...` / `accelerate launch ... X.py ...` of a page is parsed by X.py's own parser (and a
    train.py command's overrides by the config loader); `make` targets and scripts/ files exist. Running them
    is the other tests' business: here a renamed flag or key in the docs fails."""
    makefile = (ROOT / "Makefile").read_text()
    for command in _commands(page):
        words = [w for w in shlex.split(command, comments=True) if not re.match(r"^[A-Z_]+=", w)]
        if not words:
            continue
        if words[0] == "make":
            assert re.search(rf"^{words[1]}:", makefile, re.M), f"{page.name}: make {words[1]} is no target"
            continue
        if words[0] == "bash":
            assert (ROOT / words[1]).is_file(), f"{page.name}: {words[1]} does not exist"
            continue
        scripts = [i for i, w in enumerate(words) if w.endswith(".py") and (ROOT / w).is_file()]
        if words[0] in ("python", "accelerate") and "-c" not in words:
            assert scripts, f"{page.name}: `{command}` names no root script"
        if scripts:
            i = scripts[0]
            try:
                _check_script_command(words[i][:-3], words[i + 1:])
            except SystemExit as e:
                raise AssertionError(f"{page.name}: `{command}` does not parse (exit {e.code})") from None


def test_multi_process_launches_say_multi_gpu():
    """`accelerate launch --num_processes 2` without --multi_gpu (or a config file) starts ONE process on a CPU
    machine; every such command in the README and docs must really start the processes it counts."""
    lines = [ln for page in DOCS for ln in page.read_text().splitlines()
             if re.search(r"accelerate launch .*--num_processes [2-9]", ln) and "--config_file" not in ln]
    assert lines and all("--multi_gpu" in ln for ln in lines), lines
