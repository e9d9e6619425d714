"""Where code lives: every module and script imports, and the import graph points down (LAYOUT.md)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from helpers import ROOT, import_script

LIBRARY = sorted(str(p.relative_to(ROOT))[:-3].replace("/", ".").removesuffix(".__init__")
                 for p in (ROOT / "vit").rglob("*.py"))
SCRIPTS = sorted(p.stem for p in ROOT.glob("*.py"))
MAINTAINER = sorted(p.stem for p in (ROOT / "scripts").glob("*.py"))


@pytest.mark.parametrize("module", LIBRARY)
def test_every_library_module_imports(module):
    importlib.import_module(module)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_root_script_imports(script):
    import_script(script)


@pytest.mark.parametrize("script", MAINTAINER)
def test_every_maintainer_script_imports(script):
    """scripts/ holds maintainer tools only; a broken import there is found here, not by the next maintainer."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_maintainer_{script}", ROOT / "scripts" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def test_public_api_is_unchanged_and_lazy():
    """`import vit` gives the same names as before the packages, and `import vit.config` loads no torch."""
    code = ("import sys, vit, vit.config; light = 'torch' not in sys.modules; "
            "names = sorted(vit.__all__); [getattr(vit, n) for n in names]; print(light, names)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""}).stdout
    assert out.startswith("True "), out
    assert out.split(" ", 1)[1].strip() == str(sorted([
        "Attention", "Block", "Encoder", "TextEncoder", "TextEncoderOutput", "VARIANTS", "VisionTransformer",
        "attention_maps", "attention_rollout", "create_model", "gradient_rollout", "list_models", "load_pretrained",
        "raw_attention", "read_state_dict", "resample_abs_pos_embed", "to_grid"]))
