"""A process that has imported what the root scripts import, and runs each script the tests ask for in a fork.

Most of a tiny training's time is its interpreter importing torch, accelerate, albumentations and matplotlib
(about 3 s of CPU each time here), and the suite starts train.py, evaluate.py, ... a few hundred times. This server
imports them once, runs no torch operation (so that no thread pool exists to be lost in a fork), and answers each
request with a forked child that runs the script as `__main__` with the request's argv, working directory,
environment and output files: a real process of its own, which a fault injection may SIGKILL or SIGTERM.

Protocol, one JSON object a line: in {"script", "args", "cwd", "env", "stdout", "stderr"}; out {"pid"}, then
{"returncode"} once the child ended (negative: killed by that signal, as subprocess reports it).
`helpers.run_script` uses it only where the answer is the same as a fresh interpreter's (helpers.FORKABLE_ENV).
"""

import json
import os
import sys

PRELOAD = ("torch", "numpy", "cv2", "PIL.Image", "accelerate", "albumentations", "timm", "safetensors.torch",
           "matplotlib.figure", "yaml", "vit", "vit.config", "vit.data", "vit.models.build", "vit.train.engine",
           "vit.eval.plots", "vit.cli.runtime")


def _child(request: dict) -> None:
    """In the fork: become the script's process and run it. What it raises (SystemExit, an exception) goes up
    through the server's loop to the interpreter, which exits as a fresh one would."""
    import runpy
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    script = request["script"]
    sys.argv = [script, *request["args"]]
    sys.path[0] = os.path.dirname(script)  # as `python script.py` sets it
    runpy.run_path(script, run_name="__main__")  # SystemExit or an exception: the interpreter's own handling


def main() -> None:
    import importlib

    _become_subreaper()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 (an optional package: the script imports it itself, or says so)
            pass
    # the protocol on copies of stdin/stdout; a child's fds 0-2 become its own
    fds = os.dup(0), os.dup(1)
    requests, replies = open(fds[0], closefd=False), open(fds[1], "w", closefd=False)
    print(json.dumps({"ready": True}), file=replies, flush=True)
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            for fd in fds:
                os.close(fd)
            _child(request)
            sys.exit(0)  # the interpreter's own exit: atexit handlers, threads joined, files flushed
        try:
            os.setpgid(pid, pid)
        except OSError:  # the child did it first
            pass
        print(json.dumps({"pid": pid}), file=replies, flush=True)
        _, status = os.waitpid(pid, 0)
        _reap_group(pid)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=replies, flush=True)


def _reap_group(pgid: int) -> None:
    """Wait for what the script started (loader workers, say) to end too, as subprocess.run does by reading the
    pipes they inherited until they close: a killed training's workers still hold its run folder's lock for a
    moment. This process is their subreaper, so they are its children once the script is gone."""
    import time

    while True:
        try:
            if os.waitpid(-pgid, os.WNOHANG) == (0, 0):
                time.sleep(0.02)  # alive: not yet
        except ChildProcessError:
            return


def _become_subreaper() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come here
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    main()
