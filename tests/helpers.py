"""Small things the tests make: ImageFolders of generated images, tiny training runs."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]

TINY = [
    "--model.img_size=32", "--model.embed_dim=32", "--model.depth=2", "--model.num_heads=2",
    "--model.mlp_ratio=2", "--data.batch_size=8", "--run.log_every=1", "--aug.random_resized_crop=false",
    "--optim.warmup_epochs=0.5", "--run.eval_every=1",  # configs/default.yaml evaluates every 5th epoch
    "--data.num_workers=0",  # starting a loader worker each epoch costs more than a few tiny images
]


def make_image_folder(root: Path, classes=("cat", "dog", "fox"), n_train=8, n_val=5, size=40, seed=0) -> Path:
    """Images whose mean colour encodes the class, so a tiny model can learn them in a few steps."""
    rng = np.random.default_rng(seed)
    colours = {c: rng.integers(30, 225, size=3) for c in classes}
    for split, n in (("train", n_train), ("val", n_val)):
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                img = np.clip(colours[c] + rng.normal(0, 25, size=(size, size + 8, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(img).save(d / f"{i:03d}.png")
    return root


def hub_snapshot(cache: Path, repo_id: str, commit: str = "a" * 40, main: bool = True) -> Path:
    """The folder of one snapshot of `repo_id` in a Hugging Face hub cache, laid out as huggingface_hub keeps it
    (models--org--name/snapshots/<commit>/, refs/main holding the commit when `main`); write the files into it."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    if main:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def perturb(model):
    """`model` in eval mode, its parameters moved away from their init (LayerNorm 1/0, std 0.02) by seeded noise, so
    that every parameter matters to the outputs of a comparison."""
    import torch

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.1 if p.dim() == 1 else 0.15))
    return model.eval()


# A script run by a test writes into the test's temporary folder, never into the checkout: these options must be
# given (the suite's end compares runs/ and `git status` with its start, conftest.py).
OUTPUT_OPTIONS = {"train.py": "--run.output_dir", "visualize_attention.py": "--out"}


def run_script(script: str, *args: str, timeout: float = 600, env: dict | None = None,
               launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run a root script of this tree in a process of its own (cwd: the repository), output captured: forked
    from tests/script_server.py where that gives what a fresh interpreter would (no launcher, no environment
    change that a library reads when it is imported), a fresh interpreter otherwise."""
    option = OUTPUT_OPTIONS.get(script)
    if option and not any(a == option or a.startswith(option + "=") for a in args):
        raise AssertionError(f"run_script({script!r}) without {option}: give it a folder under tmp_path, or it "
                             "writes into the checkout's runs/.")
    target = [script] if script.startswith("-") else [str(ROOT / script)]
    cmd = (launcher or [sys.executable]) + target + list(args)
    e = _script_env(env)
    if launcher is None and not script.startswith("-") and _server.fits(e):
        return _server.run(cmd, e, timeout)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=e,
                          preexec_fn=_sigint_as_in_a_terminal)


def _sigint_as_in_a_terminal() -> None:
    """In the child, before exec: SIGINT back to its default, as tests/script_server.py's children get it. A test
    run started in the background (`make test &`, nohup) inherits SIGINT ignored, and a Python started so ignores
    Ctrl-C: train.py's Ctrl-C tests would then see a run that is never interrupted."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _script_env(extra: dict | None = None) -> dict:
    """The environment a root script runs in: this process's, the tree importable, tqdm quiet, then `extra`."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1", **(extra or {})}


# Variables that scripts (and the libraries under them) read when they run, not when they are imported: a child of
# the script server sees them as a fresh interpreter would. Any other difference from the server's environment
# (OMP_NUM_THREADS, HF_HOME, PYTHONPATH, ...) takes a fresh interpreter.
FORKABLE_ENV = {"VIT_FAULT_INJECT", "VIT_SHARD_TRACE", "TQDM_DISABLE", "CUDA_VISIBLE_DEVICES",
                "PYTEST_CURRENT_TEST"}


class _ScriptServer:
    """This test process's tests/script_server.py, started on first use (VIT_TEST_FORK=0: never)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.env: dict | None = None

    def fits(self, env: dict) -> bool:
        if os.environ.get("VIT_TEST_FORK", "1") == "0" or not hasattr(os, "fork"):
            return False
        base = self.env or _script_env()
        return all(k in FORKABLE_ENV for k in set(env) ^ set(base) | {k for k in env if env.get(k) != base.get(k)})

    def _start(self) -> None:
        self.env = _script_env()
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "script_server.py")], cwd=ROOT,
                                     env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.pending = b""
        assert self._reply(600) == {"ready": True}

    def _reply(self, timeout: float) -> dict | None:
        """The server's next line, or None when none came within `timeout` seconds."""
        import select
        import time

        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError("tests/script_server.py ended; run with VIT_TEST_FORK=0 to see the script itself")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
        import signal
        import tempfile

        if self.proc is None or self.proc.poll() is not None:
            self._start()
        with tempfile.TemporaryDirectory(prefix="vit-script-") as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            request = {"script": cmd[1], "args": cmd[2:], "cwd": str(ROOT), "env": env, "stdout": out, "stderr": err}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            pid = self._reply(60)["pid"]
            done = self._reply(timeout)
            if done is None:
                os.killpg(pid, signal.SIGKILL)  # the script and what it started
                self._reply(60)
            read = lambda p: open(p, encoding="utf-8", errors="replace").read()  # noqa: E731
            if done is None:
                raise subprocess.TimeoutExpired(cmd, timeout, read(out), read(err))
            return subprocess.CompletedProcess(cmd, done["returncode"], read(out), read(err))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()  # end of requests: the server's loop ends
            self.proc.wait(timeout=60)


_server = _ScriptServer()
atexit.register(_server.stop)


def import_script(name: str):
    """A top-level script of this tree (train.py, evaluate.py, ...) imported as a module, once; its __main__
    block does not run."""
    import importlib.util

    if f"_script_{name}" not in sys.modules:
        spec = importlib.util.spec_from_file_location(f"_script_{name}", ROOT / f"{name}.py")
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[f"_script_{name}"]


def checkout_state(root: Path = ROOT) -> dict[str, list[str]]:
    """What a test could leave behind in a checkout: `git status --porcelain` (untracked files included; not
    a git checkout: none) and every path under runs/ with its modification time."""
    git = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, capture_output=True,
                         text=True)
    runs = root / "runs"
    return {"git status": git.stdout.splitlines() if git.returncode == 0 else [],
            "runs/": sorted(f"{p.relative_to(root)} {p.stat().st_mtime_ns}" for p in runs.rglob("*"))
            if runs.is_dir() else []}


def checkout_changes(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    """One line per entry that appeared, disappeared or changed between two `checkout_state`s."""
    out = []
    for key in before:
        old, new = set(before[key]), set(after[key])
        out += [f"{key}: new or changed: {x}" for x in sorted(new - old)]
        out += [f"{key}: gone or changed: {x}" for x in sorted(old - new)]
    return out


def pixel_model(out_channels: int):
    """A 1x1 convolution from RGB (seeded): a window's logits are the whole image's, so sliding-window inference
    must reproduce them. It records the input sizes it was called with in `.sizes`."""
    import torch

    class PixelModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = torch.nn.Conv2d(3, out_channels, 1)
            self.sizes = []

        def forward(self, x):
            self.sizes.append(tuple(x.shape[-2:]))
            return self.conv(x)

    return PixelModel()


def end_gloo_worker() -> None:
    """The end of a spawned gloo worker that finished its work: the process group closed, then out without the
    interpreter's teardown, where gloo's still-joinable threads have aborted a rank (std::terminate: SIGABRT) in CI,
    as predict.py's processes leave (vit/cli/commands/predict.py). A worker that fails raises instead."""
    import torch.distributed as dist

    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def peaked_checkpoint(folder: Path, overrides: list[str]) -> Path:
    """A 10-class checkpoint of configs/default.yaml with `overrides` saved at `folder`, its head scaled 30x: peaked
    probabilities, so that an exported model's 1e-4 comparison with PyTorch means something."""
    import torch

    from vit.config import load_config
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    cfg = load_config(ROOT / "configs/default.yaml", overrides)
    torch.manual_seed(0)
    model = build_model(cfg, 10)
    with torch.no_grad():
        model.head.weight.mul_(30.0)
    save_checkpoint(folder, model, cfg, [str(i) for i in range(10)])
    return folder
