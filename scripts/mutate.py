"""Mutation check: does each test exist for a bug it would catch? Standard library only.

    python scripts/mutate.py                          # every mutation in scripts/mutations.json, fast tests
    python scripts/mutate.py --only beam-cache-reorder --slow

Each entry of the list is a bug someone could plausibly write: a file, an exact snippet of it (found exactly once),
its replacement, the tests meant to catch it (pytest node ids, kept narrow) and why it matters. The tree (git's
tracked and untracked-but-not-ignored files) is copied once to a temporary folder; each mutation is applied there,
its tests run with `-m "not slow"` (`--slow`: all of them) and the file is restored. The checkout is never
written. A mutation is *killed* when its tests fail, *survived* when they pass, an *error* when its snippet is
missing or ambiguous or its tests cannot be collected. Before the mutations, the union of their tests must pass on
the unmutated copy (the baseline), or no verdict means anything. Prints one line per mutation, then the kill rate;
exits 1 if a mutation survived or errored.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIELDS = {"name", "file", "original", "replacement", "tests", "why"}


@dataclass(frozen=True)
class Mutation:
    name: str  # short, unique: how --only names it
    file: str  # relative to the repository root
    original: str  # exact snippet; must occur exactly once in the file
    replacement: str
    tests: tuple[str, ...]  # pytest node ids or files, relative to the root
    why: str  # the real bug this stands for


def load_mutations(path: Path) -> list[Mutation]:
    """The list in `path` (a JSON array of objects with FIELDS), each entry checked: a missing or unknown key, or a
    repeated name, is one sentence naming the entry."""
    entries = json.loads(Path(path).read_text())
    if not isinstance(entries, list):
        raise ValueError(f"{path} must hold a JSON array of mutations, got {type(entries).__name__}.")
    out, names = [], set()
    for i, e in enumerate(entries):
        label = e.get("name", f"#{i}") if isinstance(e, dict) else f"#{i}"
        if not isinstance(e, dict) or set(e) != FIELDS:
            keys = sorted(e) if isinstance(e, dict) else type(e).__name__
            raise ValueError(f"mutation {label} in {path} needs exactly the keys {sorted(FIELDS)}, got {keys}.")
        if e["name"] in names:
            raise ValueError(f"mutation name {e['name']!r} appears twice in {path}; give each a unique name.")
        if e["original"] == e["replacement"] or not e["tests"]:
            raise ValueError(f"mutation {label} in {path} must change its snippet and name at least one test.")
        names.add(e["name"])
        out.append(Mutation(e["name"], e["file"], e["original"], e["replacement"], tuple(e["tests"]), e["why"]))
    return out


def copy_tree(root: Path, dest: Path) -> None:
    """The working tree as git sees it (tracked files and untracked ones that are not ignored) into dest; a folder
    that is not a git checkout is copied whole, caches and virtual environments left out."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root, capture_output=True)
    if listed.returncode != 0:
        shutil.copytree(root, dest, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache", "runs"))
        return
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = root / rel
        if src.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_tests(tree: Path, tests: tuple[str, ...], slow: bool, python: str, timeout: float) -> tuple[int, str]:
    """pytest's exit code on `tests` inside `tree` (-1 on timeout) and the last lines of its output."""
    cmd = [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *([] if slow else ["-m", "not slow"]),
           *tests]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:.0f} s"
    return r.returncode, "\n".join((r.stdout + r.stderr).strip().splitlines()[-5:])


def verdict(code: int) -> str:
    """pytest's exit code as a verdict: 1 (a test failed), 2 (collection broke: the mutant does not even import)
    and a timeout (an endless loop) kill; 0 survives; anything else is a broken entry (no such test: 4, 5)."""
    return {0: "survived", 1: "killed", 2: "killed", -1: "killed"}.get(code, "error")


def check(mutations: list[Mutation], root: Path = ROOT, slow: bool = False, python: str = sys.executable,
          timeout: float = 600.0, baseline: bool = True, log=print) -> dict[str, str]:
    """{name: killed | survived | error} for each mutation, run in one temporary copy of `root`."""
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        tree = Path(tmp)
        copy_tree(root, tree)
        if baseline:
            union = tuple(dict.fromkeys(t for m in mutations for t in m.tests))
            code, tail = run_tests(tree, union, slow, python, timeout)
            if code != 0:
                raise RuntimeError(f"the tests fail on the unmutated tree (pytest exit {code}); fix them before "
                                   f"judging mutations:\n{tail}")
            log(f"baseline: {len(union)} test selections pass on the unmutated tree")
        for m in mutations:
            path = tree / m.file
            text = path.read_text() if path.is_file() else ""
            count = text.count(m.original)
            if count != 1:
                results[m.name] = "error"
                log(f"error     {m.name}: the snippet occurs {count} times in {m.file} (it must occur once); "
                    "update the entry to the code as it is")
                continue
            path.write_text(text.replace(m.original, m.replacement, 1))
            try:
                code, tail = run_tests(tree, m.tests, slow, python, timeout)
            finally:
                path.write_text(text)
            results[m.name] = verdict(code)
            note = f"  ({m.why})" if results[m.name] != "killed" else ""
            log(f"{results[m.name]:<9} {m.name}{note}")
            if results[m.name] == "error":
                log("          " + tail.replace("\n", "\n          "))
    killed, errors = (sum(v == verdict for v in results.values()) for verdict in ("killed", "error"))
    log(f"kill rate: {killed}/{len(results)} killed ({100 * killed / max(1, len(results)):.0f}%), "
        f"{sum(v == 'survived' for v in results.values())} survived, {errors} error{'s' * (errors != 1)}")
    return results


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mutations", type=Path, default=ROOT / "scripts" / "mutations.json", help="the JSON list")
    p.add_argument("--root", type=Path, default=ROOT, help="the repository to copy (default: this one)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run these mutations only")
    p.add_argument("--slow", action="store_true", help='include tests marked slow (default: -m "not slow")')
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run; a timeout kills")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip the run of every selected test on the unmutated tree")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        mutations = load_mutations(args.mutations)
        if args.only:
            unknown = sorted(set(args.only) - {m.name for m in mutations})
            if unknown:
                raise ValueError(f"no mutation named {', '.join(unknown)} in {args.mutations}.")
            mutations = [m for m in mutations if m.name in args.only]
        results = check(mutations, args.root.resolve(), args.slow, timeout=args.timeout, baseline=args.baseline)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if all(v == "killed" for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
