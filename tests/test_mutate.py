"""scripts/mutate.py, the mutation check: verdicts on a toy repository, and the project's own list well formed."""

import importlib.util
import json
import subprocess
import sys

import pytest
from helpers import ROOT

spec = importlib.util.spec_from_file_location("_mutate", ROOT / "scripts" / "mutate.py")
mutate = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mutate  # dataclasses look their module up
spec.loader.exec_module(mutate)

TOY = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
TOY_TEST = "from toy import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def _entry(name, original, replacement, tests=("tests/test_toy.py",)):
    return {"name": name, "file": "toy.py", "original": original, "replacement": replacement, "tests": list(tests),
            "why": f"why {name}"}


def test_a_caught_mutation_is_killed_an_uncaught_one_survives(tmp_path, capsys, monkeypatch):
    """add is tested and sub is not: `a + b` -> `a - b` is killed, `a - b` -> `a + b` survives, a snippet that is
    not in the file is an error; the toy checkout is left as it was."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the toy's pytest needs none of the venv's plugins
    toy = tmp_path / "toy"
    (toy / "tests").mkdir(parents=True)
    (toy / "toy.py").write_text(TOY)
    (toy / "tests" / "test_toy.py").write_text(TOY_TEST)
    subprocess.run(["git", "init", "-q"], cwd=toy, check=True)  # copied as git lists it
    entries = [_entry("add-minus", "a + b", "a - b"), _entry("sub-plus", "a - b", "a + b"),
               _entry("stale", "a * b", "a / b")]
    (tmp_path / "m.json").write_text(json.dumps(entries))
    code = mutate.main(["--mutations", str(tmp_path / "m.json"), "--root", str(toy), "--no-baseline"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    verdicts = {line.split()[1].rstrip(":"): line.split()[0] for line in out if not line.startswith(("kill rate", " "))}
    assert verdicts == {"add-minus": "killed", "sub-plus": "survived", "stale": "error"}
    assert "(why sub-plus)" in next(line for line in out if "sub-plus" in line)  # a survivor says what it stands for
    assert out[-1] == "kill rate: 1/3 killed (33%), 1 survived, 1 error"
    assert (toy / "toy.py").read_text() == TOY and sorted(p.name for p in toy.iterdir()) == [".git", "tests", "toy.py"]

    # the baseline: tests that fail on the unmutated tree make every verdict meaningless, so nothing is judged
    (toy / "tests" / "test_toy.py").write_text(TOY_TEST.replace("== 5", "== 6"))
    assert mutate.main(["--mutations", str(tmp_path / "m.json"), "--root", str(toy), "--only", "add-minus"]) == 2
    assert "the tests fail on the unmutated tree" in capsys.readouterr().err


def test_a_malformed_list_is_one_sentence(tmp_path, capsys):
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps([{**_entry("x", "a", "b"), "test": ["t.py"]}]))
    assert mutate.main(["--mutations", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: mutation x in ") and "needs exactly the keys" in err[0]
    bad.write_text(json.dumps([_entry("x", "a", "b")]))
    assert mutate.main(["--mutations", str(bad), "--only", "y"]) == 2
    assert "no mutation named y" in capsys.readouterr().err


def test_the_projects_mutations_apply_to_the_code_as_it_is():
    """Every snippet of scripts/mutations.json occurs exactly once in its file and every test it names exists, so
    the list does not go stale unnoticed as the code moves (running it is a maintainer's job: minutes of CPU)."""
    mutations = mutate.load_mutations(ROOT / "scripts" / "mutations.json")
    assert len(mutations) >= 20
    for m in mutations:
        assert (ROOT / m.file).read_text().count(m.original) == 1, f"{m.name}: snippet not found once in {m.file}"
        for test in m.tests:
            path, _, name = test.partition("::")
            assert (ROOT / path).is_file(), f"{m.name}: no test file {path}"
            assert not name or f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), f"{m.name}: no {test}"


@pytest.mark.parametrize("code,expected", [(0, "survived"), (1, "killed"), (2, "killed"), (-1, "killed"),
                                           (4, "error"), (5, "error")])
def test_pytest_exit_codes_map_to_verdicts(code, expected):
    assert mutate.verdict(code) == expected
