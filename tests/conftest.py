import os

import pytest
import torch
from filelock import FileLock
from helpers import TINY, checkout_changes, checkout_state, make_image_folder, run_script

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _pin_xdist_worker() -> None:
    """`make test` runs the suite in one pytest-xdist worker per core. Each worker is pinned to its own share of the
    CPUs, which the scripts it starts inherit: their thread and loader-worker choice (`machine_cpus`, the affinity
    mask) then sees that share, and no two workers' threads spin on the same core."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity"):
        return
    cpus, i, n = sorted(os.sched_getaffinity(0)), int(worker.removeprefix("gw")), int(count)
    if n <= len(cpus):
        os.sched_setaffinity(0, cpus[i % n::n])


_pin_xdist_worker()
torch.set_num_threads(max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                 else os.cpu_count() or 1)))


@pytest.fixture
def offline_hub(monkeypatch):
    """use(cache) -> cache: `cache` (a folder laid out as huggingface_hub keeps one, see helpers.hub_snapshot) is
    the Hugging Face hub cache for this test, offline (HF_HUB_OFFLINE=1), for us and for timm, transformers and
    open_clip through huggingface_hub: its environment variables and the constants it read when imported."""
    import huggingface_hub.constants

    def use(cache):
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        return cache
    return use


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One tiny training per test session, reused by every test that needs a real run's checkpoint: train.py, 2
    epochs of the TINY model on a 7-class ImageFolder (a to g; 6 train and 3 val images each).
    Returns (run folder, image folder); a test that changes either works on a copy."""
    tmp = shared_dir(tmp_path_factory, "tiny_run")
    with FileLock(str(tmp) + ".lock"):
        if not (tmp / "made").is_file():
            data = make_image_folder(tmp / "folder", classes=tuple("abcdefg"), n_train=6, n_val=3)
            r = run_script("train.py", "--data.dataset=imagefolder", f"--data.root={data}", f"--run.output_dir={tmp}",
                           "--run.name=t", "--run.epochs=2", *TINY)
            assert r.returncode == 0, r.stderr[-3000:]
            (tmp / "made").touch()
    return tmp / "t", tmp / "folder"


def shared_dir(tmp_path_factory, name: str):
    """A folder for a session fixture's files: under pytest-xdist, one that every worker of this session sees
    (the parent of the workers' temporary folders), so that the expensive thing is made once behind a FileLock;
    otherwise this session's own."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / f"shared-{name}"
    folder.mkdir(exist_ok=True)
    return folder


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


def pytest_collection_modifyitems(config, items):
    """Files that hold slow tests first, each file's tests in their order: pytest-xdist hands out whole files
    (--dist loadfile keeps a module's fixtures in one worker), sorted by test count (xdist's default; ties keep
    this order). Handing out the slow files strictly first (--no-loadscope-reorder) measured slower: 699 s against
    595 and 624 s for the whole suite on 2 workers."""
    heavy = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in heavy)
