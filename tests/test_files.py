"""vit.utils.files: reading a file someone else wrote, refused in one sentence unless regular and small enough."""

import os
import subprocess
import sys

import pytest
from helpers import ROOT

from vit.utils.files import check_regular_file, read_regular_file


def test_a_regular_file_is_read_whole(tmp_path):
    (tmp_path / "a.json").write_bytes(b'{"x": 1}')
    os.symlink(tmp_path / "a.json", tmp_path / "link.json")  # the hub cache's snapshots are links to blobs
    assert read_regular_file(tmp_path / "link.json", 8, "tokenizer.json of m:") == b'{"x": 1}'
    assert check_regular_file(tmp_path / "a.json", None, "x:") == tmp_path / "a.json"


@pytest.mark.parametrize("kind,named", [("fifo", "FIFO"), ("dev-zero", "device or socket"), ("folder", "folder")])
def test_what_would_hang_or_never_end_is_refused_unread(tmp_path, kind, named):
    path = tmp_path / "tokenizer.json"
    {"fifo": os.mkfifo, "folder": os.mkdir, "dev-zero": lambda p: os.symlink("/dev/zero", p)}[kind](path)
    with pytest.raises(ValueError, match=f"m: {path} is not a regular file \\(it is a {named}") as e:
        read_regular_file(path, 2**20, "m:")
    assert "\n" not in str(e.value)


def test_too_large_missing_and_unreadable(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # 300 MB, sparse: costs no disk
        f.seek(300 * 2**20)
        f.write(b" ")
    with pytest.raises(ValueError, match=r"is 300.0 MB, larger than such a file can be \(1.0 MB\), so it is not"):
        read_regular_file(big, 2**20, "m:")
    with pytest.raises(FileNotFoundError, match="m: .*absent.json does not exist"):
        read_regular_file(tmp_path / "absent.json", 10, "m:")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    with pytest.raises(ValueError, match="cannot be read"):
        read_regular_file(tmp_path / "loop", 10, "m:")


def test_it_imports_nothing_heavy():
    """Shared with torch-free code (the ONNX predictor): the standard library only."""
    code = "import sys, vit.utils.files; print(sorted({'torch', 'numpy', 'vit.hub'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
