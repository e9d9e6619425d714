"""tests/MODULES.md, the map from each vit/ module to the tests that exercise it, held against the code: every
module has a row, and every test a row names imports the module (or a name it defines), or runs the root script
or imports the module the row says it goes through, which in turn imports the module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from helpers import ROOT

MAP = ROOT / "tests" / "MODULES.md"
ROW = re.compile(r"^\| `(vit/[\w/]+\.py)` \| (.+) \|$")
ENTRY = re.compile(r"`(test_\w+\.py)`(?: through `([\w/.]+\.py)`)?")


def vit_modules(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "vit").rglob("*.py") if p.name != "__init__.py")


def _dotted(path: str) -> str:
    return path[:-3].replace("/", ".")


def definitions(root: Path, modules: list[str]) -> dict[str, dict[str, str]]:
    """package -> {top-level name: the module below it that defines the name}, so that `from vit.data import
    build_loaders` counts as using vit/data/loaders.py."""
    out: dict[str, dict[str, str]] = {}
    for m in modules:
        names = set()
        for node in ast.parse((root / m).read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        parts = _dotted(m).split(".")
        for i in range(1, len(parts)):
            for n in names:
                out.setdefault(".".join(parts[:i]), {}).setdefault(n, m)
    return out


def used_modules(path: Path, modules: list[str], defs: dict[str, dict[str, str]], package: str = "") -> set[str]:
    """The vit modules (as paths) that a file imports anywhere in it, whose names it imports through a package,
    whose attributes it reads as `vit.pkg.name`, or that it names in a string (a monkeypatch target)."""
    text = path.read_text()
    by_name = {_dotted(m): m for m in modules}
    used = {m for m in modules if _dotted(m) in text or m in text}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            used.update(by_name[a.name] for a in node.names if a.name in by_name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import inside vit/: `from .c import x` in vit.a.b is vit.a.c
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level] + ([base] if base else []))
            if base.split(".")[0] != "vit":
                continue
            if base in by_name:
                used.add(by_name[base])
            for a in node.names:
                if f"{base}.{a.name}" in by_name:
                    used.add(by_name[f"{base}.{a.name}"])
                elif a.name in defs.get(base, {}):
                    used.add(defs[base][a.name])
        elif isinstance(node, ast.Attribute):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id == "vit":
                dotted = ["vit", *reversed(chain)]
                for i in range(len(dotted), 1, -1):
                    if ".".join(dotted[:i]) in by_name:
                        used.add(by_name[".".join(dotted[:i])])
                        break
                    if dotted[i - 1] in defs.get(".".join(dotted[:i - 1]), {}):
                        used.add(defs[".".join(dotted[:i - 1])][dotted[i - 1]])
                        break
    return used


def runs_script(test: Path, script: str) -> bool:
    """Whether a test names a root script in a string: run_script("train.py", ...), import_script("train")."""
    stem = script[:-3]
    strings = {n.value for n in ast.walk(ast.parse(test.read_text())) if isinstance(n, ast.Constant)
               and isinstance(n.value, str)}
    return bool(strings & {script, stem}) or any(s.startswith((f"{script} ", f"{stem}.py ")) for s in strings)


def map_problems(root: Path, text: str) -> list[str]:
    modules = vit_modules(root)
    defs = definitions(root, modules)
    rows = {m.group(1): m.group(2) for m in map(ROW.match, text.splitlines()) if m}
    seen: dict[Path, set[str]] = {}

    def uses(path: Path, package: str = "") -> set[str]:  # each file read once
        if path not in seen:
            seen[path] = used_modules(path, modules, defs, package)
        return seen[path]

    def commands_of(via: str) -> set[str]:
        """A root script is a shim over its command module: what that module imports, and what those import in
        turn (the script's whole import closure within vit/), is reached through the script."""
        if via.startswith("vit/"):
            return set()
        todo = [m for m in uses(root / via) if m.startswith("vit/cli/commands/")]
        closure: set[str] = set()
        while todo:
            m = todo.pop()
            if m not in closure:
                closure.add(m)
                todo += uses(root / m, _dotted(m)) - closure
        return closure

    problems = [f"{m}: no row; add one naming the tests that exercise it" for m in modules if m not in rows]
    problems += [f"{m}: a row for a module that does not exist" for m in rows if m not in modules]
    for module, cell in rows.items():
        entries = ENTRY.findall(cell)
        if not entries:
            problems.append(f"{module}: its row names no test file")
        for test, via in entries:
            path = root / "tests" / test
            if not path.is_file():
                problems.append(f"{module}: {test} does not exist")
                continue
            if not via:
                if module not in uses(path):
                    problems.append(f"{module}: {test} neither imports it nor names it")
                continue
            if not (root / via).is_file():
                problems.append(f"{module}: {test} goes through {via}, which does not exist")
                continue
            reaches = via in uses(path) if via.startswith("vit/") else runs_script(path, via)
            pkg = _dotted(via) if via.startswith("vit/") else ""
            if not reaches:
                problems.append(f"{module}: {test} does not use {via}")
            elif module not in uses(root / via, pkg) | commands_of(via):
                problems.append(f"{module}: {via} does not import it")
    return problems


def test_every_module_maps_to_tests_that_use_it():
    problems = map_problems(ROOT, MAP.read_text())
    assert not problems, "tests/MODULES.md is out of date:\n" + "\n".join(problems)


@pytest.mark.parametrize("cell, problem", [
    ("`test_a.py`", ""),
    ("`test_b.py`", "vit/p/m.py: test_b.py neither imports it nor names it"),
    ("`test_c.py`", "vit/p/m.py: test_c.py does not exist"),
    ("`test_b.py` through `run.py`", ""),
    ("`test_a.py` through `vit/p/other.py`", "vit/p/m.py: test_a.py does not use vit/p/other.py"),
])
def test_the_map_check_reads_imports_package_names_and_scripts(tmp_path, cell, problem):
    (tmp_path / "vit" / "p").mkdir(parents=True)
    (tmp_path / "vit" / "p" / "__init__.py").write_text("")
    (tmp_path / "vit" / "p" / "m.py").write_text("def thing():\n    pass\n")
    (tmp_path / "vit" / "p" / "other.py").write_text("")
    (tmp_path / "run.py").write_text("from vit.p.m import thing\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("from vit.p import thing\n")  # through the package
    (tmp_path / "tests" / "test_b.py").write_text('def test():\n    run_script("run.py", [])\n')
    text = f"| `vit/p/m.py` | {cell} |\n| `vit/p/other.py` | `test_b.py` |\n"
    problems = [p for p in map_problems(tmp_path, text) if p.startswith("vit/p/m.py")]
    assert problems == ([problem] if problem else [])
