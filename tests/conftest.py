import os

import pytest
import torch
from helpers import checkout_changes, checkout_state

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


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
