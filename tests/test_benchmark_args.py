"""benchmark.py's options: counts below 1 get one sentence, and a grey checkpoint is benchmarked on grey images."""

import pytest
from helpers import import_script

import vit
from vit.checkpoint import save_checkpoint
from vit.config import load_config


@pytest.mark.parametrize("flag", ["--repeats", "--scaling", "--batch-size", "--iters", "--img-size"])
def test_counts_below_one_are_refused(flag, capsys):
    bench = import_script("benchmark")
    with pytest.raises(SystemExit) as e:
        bench.build_parser().parse_args([flag, "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in err and "at least 1" in err


def test_a_grey_checkpoint_is_benchmarked(tmp_path, capsys):
    bench = import_script("benchmark")
    over = {"model.img_size": 16, "model.patch_size": 8, "model.embed_dim": 32, "model.depth": 2,
            "model.num_heads": 2, "model.in_chans": 1, "aug.mean": [0.5], "aug.std": [0.5]}
    cfg = load_config(None, over)
    model = vit.create_model("vit_tiny_patch16_224", img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                             in_chans=1, num_classes=10)
    ck = save_checkpoint(tmp_path / "best", model, cfg, [str(i) for i in range(10)])
    assert bench.main(["--token-reduction", "merge:1", "--checkpoint", str(ck), "--batch-size", "2", "--repeats",
                       "1", "--warmup", "0", "--device", "cpu", "--out", str(tmp_path / "b.json")]) == 0
