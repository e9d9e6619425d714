"""export.py's verification and its files: non-finite outputs fail, sidecars follow a verified model, a rejected
file leaves the loadable name, verification.json covers every format present, shard checkpoints, --out checks."""

import json
import os

import pytest
import torch
from helpers import ROOT, import_script, make_image_folder

import vit
from vit.cli.outputs import OutputError
from vit.config import load_config
from vit.deploy.export import ExportError, verify
from vit.models.build import build_model
from vit.models.checkpoint import save_checkpoint

TINY = ["--model.img_size=32", "--model.embed_dim=32", "--model.depth=1", "--model.num_heads=2",
        "--model.mlp_ratio=2", "--model.in_chans=3", "--aug.mean=[0.5,0.5,0.5]", "--aug.std=[0.5,0.5,0.5]"]


def _checkpoint(tmp_path, overrides=(), name="ck", seed=0):
    cfg = load_config(ROOT / "configs/default.yaml", [*TINY, *overrides])
    torch.manual_seed(seed)
    model = build_model(cfg, 10)
    with torch.no_grad():
        model.head.weight.mul_(50.0)  # peaked probabilities, so a comparison means something
    save_checkpoint(tmp_path / name, model, cfg, [str(i) for i in range(10)])
    return tmp_path / name


@pytest.fixture(scope="module")
def export():
    return import_script("export")


def test_verify_refuses_non_finite_outputs():
    torch.manual_seed(0)
    model = vit.create_model("vit_tiny_patch16_224", img_size=16, embed_dim=16, depth=1, num_heads=2,
                             num_classes=3).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))  # a NaN model: its export agrees with it exactly, NaN for NaN
    with pytest.raises(ExportError, match="not finite"):
        verify(model, lambda t: model(t), [x])
    with torch.no_grad():
        model.head.weight.normal_()
    with pytest.raises(ExportError, match="not finite"):  # an export that gives inf where PyTorch does not
        verify(model, lambda t: torch.full((len(t), 3), float("inf")), [x])


def test_failed_export_keeps_the_old_sidecars_and_renames_the_rejected_file(tmp_path, export, monkeypatch):
    out = tmp_path / "exp"
    assert export.main(["--checkpoint", str(_checkpoint(tmp_path, name="a")), "--format", "torchscript",
                        "--out", str(out)]) == 0
    before = {n: (out / n).read_bytes() for n in ("preprocessing.json", "verification.json", "model.torchscript.pt")}
    # a second model (other preprocessing) whose export fails its check
    other = _checkpoint(tmp_path, ["--aug.mean=[0.1,0.2,0.3]"], name="b", seed=1)

    def fail(*a, **k):
        raise ExportError("the exported model differs from the PyTorch model (simulated)")

    monkeypatch.setattr("vit.deploy.export.verify", fail)
    with pytest.raises(ExportError, match="differs"):
        export.main(["--checkpoint", str(other), "--format", "torchscript", "--out", str(out)])
    # what a runtime loads is still the first, verified model with its own sidecars
    assert {n: (out / n).read_bytes() for n in before} == before
    assert (out / "model.torchscript.pt.rejected").is_file()
    assert not any(p.name.startswith(".tmp") for p in out.iterdir())


def test_verification_json_covers_every_format_present(tmp_path, export):
    out = tmp_path / "exp"
    ck = _checkpoint(tmp_path)
    assert export.main(["--checkpoint", str(ck), "--format", "torchscript", "--out", str(out)]) == 0
    assert export.main(["--checkpoint", str(ck), "--format", "exported-program", "--out", str(out)]) == 0
    ver = json.loads((out / "verification.json").read_text())["results"]
    assert set(ver) == {"torchscript", "exported-program"}
    assert all(v["max_abs_prob_diff"] <= 1e-4 for v in ver.values())


def test_shard_trained_checkpoint_exports(tmp_path, export, capsys):
    from vit.data.shards import write_shards

    shards = tmp_path / "shards"
    write_shards(make_image_folder(tmp_path / "f", classes=[str(i) for i in range(10)], n_train=1, n_val=1),
                 shards)
    ck = _checkpoint(tmp_path, ["--data.dataset=wds", f"--data.root={shards}"])
    assert export.main(["--checkpoint", str(ck), "--format", "torchscript", "--out", str(tmp_path / "e")]) == 0
    assert "wds validation split" in capsys.readouterr().out


def _never(*a, **k):
    raise AssertionError("the model was loaded before --out was checked")


def test_out_below_a_file_is_refused_before_any_work(tmp_path, export, monkeypatch):
    ck = _checkpoint(tmp_path)
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr("vit.eval.inference.load_model_and_config", _never)
    with pytest.raises(OutputError, match="cannot write"):
        export.main(["--checkpoint", str(ck), "--format", "torchscript", "--out", str(tmp_path / "file" / "sub")])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_out_is_refused_before_any_work(tmp_path, export, monkeypatch):
    ck = _checkpoint(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setattr("vit.eval.inference.load_model_and_config", _never)
    try:
        with pytest.raises(OutputError, match="cannot write"):
            export.main(["--checkpoint", str(ck), "--format", "torchscript", "--out", str(ro / "exp")])
    finally:
        ro.chmod(0o700)
