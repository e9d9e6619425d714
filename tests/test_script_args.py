"""One vocabulary across scripts: evaluate, predict, export and visualize_attention name a model the same way,
--checkpoint DIR | --model NAME [--pretrained | --weights FILE] (vit/cli/args.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch
from helpers import import_script
from PIL import Image
from timm.models import save_for_hf

SCRIPTS = ("evaluate", "predict", "export", "visualize_attention")
POSITIONAL = {"predict": ["img.png"], "visualize_attention": ["img.png"]}


def _parse(script, argv):
    mod = import_script(script)
    from vit.cli.args import check_model_source

    args, _ = mod.build_parser().parse_known_args(argv + POSITIONAL.get(script, []))
    check_model_source(args)
    return args


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_takes_the_same_model_group(script):
    a = _parse(script, ["--model", "vit_tiny_patch16_224"])
    assert (a.model, a.pretrained, a.weights, a.checkpoint) == ("vit_tiny_patch16_224", True, None, None)
    a = _parse(script, ["--model", "vit_tiny_patch16_224", "--pretrained", "--img-size", "32"])
    assert (a.pretrained, a.img_size) == (True, 32)
    a = _parse(script, ["--model", "vit_tiny_patch16_224", "--weights", "w.safetensors"])
    assert (a.pretrained, a.weights) == (False, "w.safetensors")
    assert _parse(script, ["--checkpoint", "runs/x/best"]).checkpoint == "runs/x/best"
    with pytest.raises(ValueError, match="--weights goes with --model NAME; a --checkpoint folder brings its own"):
        _parse(script, ["--checkpoint", "runs/x/best", "--weights", "w.safetensors"])
    for bad in (["--model", "m", "--pretrained", "--weights", "w"], ["--checkpoint", "c", "--model", "m"], []):
        with pytest.raises(SystemExit):  # argparse: 'not allowed with' / 'required', exit 2
            _parse(script, bad)


def test_visualize_attention_takes_a_model_by_name(tmp_path):
    """A hub-layout folder (local-dir:) as --model: the sidecar's top-5 are the model's own probabilities."""
    torch.manual_seed(0)
    folder = tmp_path / "tiny"
    ref = timm.create_model("vit_tiny_patch16_224", img_size=32, embed_dim=32, depth=2, num_heads=2, num_classes=4)
    save_for_hf(ref, str(folder), safe_serialization=True)
    img = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(img)
    vis = import_script("visualize_attention")
    assert vis.main(["--model", f"local-dir:{folder}", str(img), "--out", str(tmp_path / "out")]) == 0
    sidecar = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    from vit.config import load_config
    from vit.data import resolve_data_config
    from vit.data.transforms import build_transform

    cfg = resolve_data_config(load_config(None, {"model.img_size": 32}), ref.pretrained_cfg)
    x = build_transform(cfg.aug, 32, train=False).load(img)[None]
    with torch.no_grad():
        want = ref.eval()(x).softmax(-1)[0]
    got = {d["index"]: d["prob"] for d in sidecar["top5"]}
    assert len(got) == 4 and all(abs(got[i] - float(want[i])) < 1e-4 for i in got)
    assert (tmp_path / "out").is_dir() and any((tmp_path / "out").glob("*.png"))



@pytest.mark.parametrize("command,refused", [("predict", "data.root"), ("export", "data.root"),
                                             ("features", "data.root"), ("few_shot", "data.root"),
                                             ("anomaly", "data.root"), ("evaluate", "optim.lr")])
def test_every_model_command_refuses_overrides_outside_its_sections(command, refused, tmp_path):
    """The one front-end (vit.cli.args.parse_command): --aug.* only (evaluate: also --data.*); anything else is
    one sentence naming the key, before a model loads or a file is written."""
    from vit.config import ConfigError

    argv = ["--model", "vit_tiny_patch16_224", "--out", str(tmp_path / "o.npz"),
            *(["fit", "--good", "g"] if command == "anomaly" else []),
            *(["--train", "t", "--test", "t"] if command == "few_shot" else []), "--aug.eval_crop_pct=1.0"]
    with pytest.raises(ConfigError, match=f"^{command}.py takes only --(data.* and --)?aug.* overrides.*, not "
                                          f"--{refused}.$"):
        import_script(command).main([*argv, f"--{refused}=1"])
    assert not any(tmp_path.iterdir())
