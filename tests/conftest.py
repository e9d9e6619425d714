import os

import pytest
import torch
from helpers import TINY, checkout_changes, checkout_state, make_image_folder, run_script

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One tiny training per test session, reused by every test that needs a real run's checkpoint: train.py, 2
    epochs of the TINY model on a 7-class ImageFolder (a to g; 6 train and 3 val images each).
    Returns (run folder, image folder); a test that changes either works on a copy."""
    tmp = tmp_path_factory.mktemp("tiny_run")
    data = make_image_folder(tmp / "folder", classes=tuple("abcdefg"), n_train=6, n_val=3)
    r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={data}", f"--run.output_dir={tmp}",
                   "--run.name=t", "--run.epochs=2", *TINY)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp / "t", data


def pytest_sessionstart(session):
    session.config._checkout_before = checkout_state()


def pytest_sessionfinish(session, exitstatus):
    """The suite leaves the checkout as it found it: no new or changed file in the working tree (git status) and
    nothing written under runs/ (a user's `make train` output lives there). Anything else fails the session."""
    before = getattr(session.config, "_checkout_before", None)
    if before is None:
        return
    changes = checkout_changes(before, checkout_state())
    if changes:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["the test suite wrote into the checkout (give every script a folder under tmp_path):", *changes]
        if reporter is not None:
            reporter.write_line("\n".join(lines), red=True)
        else:
            print("\n".join(lines))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
