"""Packaging: lower bounds a user's environment can meet, exact pins for CI, the wheel with every subpackage."""

# Packaging: pyproject.toml declares ranges a user's own environment can meet, constraints.txt pins what this
# repository is tested with, and the two agree. A user with their own torch must be able to install us without
# pip replacing it.

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # stdlib from Python 3.11; the packaging checks are for developers

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements(extras: bool = True) -> list[Requirement]:
    project = _project()
    reqs = [Requirement(r) for r in project["dependencies"]]
    if extras:
        reqs += [Requirement(r) for group in project["optional-dependencies"].values() for r in group]
    return reqs


def _constraints() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier  # exactly one `==` per line
        assert spec.operator == "==", f"constraints.txt: {line!r} is not an exact pin"
        pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def test_every_dependency_has_a_lower_bound_and_no_exact_pin():
    for req in _requirements():
        ops = {s.operator for s in req.specifier}
        assert ">=" in ops, f"{req} has no lower bound"
        assert not ops & {"==", "===", "~="}, f"{req} pins a version: exact versions belong in constraints.txt"


def test_constraints_pin_every_dependency_inside_its_range():
    pins = _constraints()
    for req in _requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {req}"


def test_the_environment_running_the_tests_has_the_pinned_versions():
    """`make test` installs with -c constraints.txt: what runs here is what is pinned (local tags aside)."""
    pins = _constraints()
    for req in _requirements():
        installed = Version(metadata.version(req.name))
        assert Version(installed.public) == pins[canonicalize_name(req.name)], req.name


def _claimed_pythons() -> list[str]:
    claimed = SpecifierSet(_project()["requires-python"])
    found = []
    for minor in range(8, 16):
        version = f"3.{minor}"
        if version == f"{sys.version_info.major}.{sys.version_info.minor}" or not claimed.contains(f"{version}.0"):
            continue
        pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
        exe = next((str(p / "bin" / "python") for p in sorted(pyenv.glob(f"{version}.*"))), None)
        if exe is None and "shims" not in (shutil.which(f"python{version}") or "shims"):
            exe = shutil.which(f"python{version}")  # pyenv's shims fail when that version is not selected
        if exe:
            found.append(exe)
    return found


# Byte-compiles every file, then imports every module of the package with the installed third-party modules
# (torch, timm, ...) replaced by stand-ins, so that syntax and standard-library use (tomllib, typing.Self,
# datetime.UTC...) are checked under another Python without installing a second torch there.
_IMPORT_CHECK = r"""
import importlib, importlib.abc, importlib.machinery, pathlib, sys, types
root, third_party = pathlib.Path(sys.argv[1]), set(sys.argv[2].split(","))
for p in [*root.glob("vit/**/*.py"), *root.glob("*.py"), *root.glob("examples/*.py")]:
    compile(p.read_text(), str(p), "exec")

class StandIn(type):  # a stand-in is a class: it can be a base class, a decorator, a type, a flag...
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return StandIn(name, (), {})
    def __call__(cls, *args, **kwargs):
        return StandIn("call", (), {})
    def __getitem__(cls, key):
        return StandIn("item", (), {})
    def __or__(cls, other):
        return StandIn("or", (), {})
    __ror__ = __or__
    def __iter__(cls):
        return iter(())

class StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return StandIn(name, (), {})

class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in third_party:
            return None  # the standard library and our own package are the real thing
        return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        module = StandInModule(spec.name)
        module.__path__, module.__spec__ = [], spec
        return module
    def exec_module(self, module):
        pass

sys.meta_path.insert(0, StandIns())
sys.path.insert(0, str(root))
import vit
for name in sorted(p.stem for p in (root / "vit").glob("*.py")):
    importlib.import_module(f"vit.{name}")
print("ok", sys.version.split()[0])
"""


@pytest.mark.parametrize("exe", _claimed_pythons() or [pytest.param(None, marks=pytest.mark.skip("none found"))])
def test_the_package_compiles_and_imports_under_every_claimed_python(exe):
    third_party = ",".join(sorted(set(metadata.packages_distributions()) - {"vit"}))
    out = subprocess.run([exe, "-c", _IMPORT_CHECK, str(ROOT), third_party], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-3000:]


@pytest.mark.slow
def test_installing_without_constraints_keeps_the_users_torch(tmp_path):
    """A new venv that already sees a torch 2.14.1 / torchvision 0.29.1 (and the rest of this environment,
    through a .pth file, instead of copying 5 GB) installs us without constraints and without an index: pip
    must find every range met and install nothing but our package; then the model runs there."""
    env_dir = tmp_path / "user-env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages")]
    (Path(site) / "users-own-packages.pth").write_text("\n".join(ours) + "\n")
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [py, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--disable-pip-version-check",
         "--dry-run", "--report", str(report), "-e", str(ROOT)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    would_install = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert would_install == ["vit"], would_install
    run = subprocess.run(
        [py, "-c", "import sys, torch; sys.path.insert(0, sys.argv[1]); import vit; "
                   "print(vit.create_model('vit_tiny_patch16_224')(torch.randn(1, 3, 224, 224)).shape, "
                   "torch.__version__)", str(ROOT)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "torch.Size([1, 1000])" in run.stdout


def test_jpeg_decoding_without_opencvs_rgb_flag_gives_the_same_pixels(monkeypatch):
    """OpenCV before 4.11 has no IMREAD_COLOR_RGB (albumentations 2.0 accepts such releases): the fallback decodes
    to BGR and flips, and must give exactly the pixels of the RGB path, at full and reduced scale."""
    import io

    import numpy as np
    from PIL import Image

    import vit.data.decode as decode

    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (64, 48, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    rgb = [decode.decode_bytes(data, "x.jpg", reduction=r) for r in (1, 2)]
    monkeypatch.setattr(decode, "_RGB_DECODE", False)
    monkeypatch.setattr(decode, "_REDUCED", decode._decode_flags(False))
    for r, want in zip((1, 2), rgb):
        np.testing.assert_array_equal(decode.decode_bytes(data, "x.jpg", reduction=r), want)


def test_the_wheel_holds_every_subpackage():
    """pyproject's packages.find, as setuptools applies it, finds vit and every folder of it that holds code:
    a subpackage without __init__.py (or outside the include) would be left out of the wheel."""
    import tomllib
    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    found = set(find_packages(where=str(ROOT), include=include))
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "vit").rglob("*.py")}
    assert folders <= found, f"left out of the wheel: {sorted(folders - found)}"
    assert {"vit", "vit.utils", "vit.layers", "vit.hub", "vit.models", "vit.data", "vit.eval", "vit.explain",
            "vit.deploy", "vit.train", "vit.cli"} <= found
    assert not any(p.startswith(("tests", "scripts", "docs")) for p in found)
