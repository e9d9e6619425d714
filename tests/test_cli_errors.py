"""Script arguments and options are checked before anything is written: one sentence, exit code 2."""

from argparse import Namespace

import pytest
from helpers import import_script as _script
from helpers import run_script

from vit.config import ConfigError
from vit.data import DataError


@pytest.mark.parametrize("args,needle", [
    (["--data.dataset=imagefolder", "--data.root=/nonexistent/folder"], "does not exist"),
    (["--run.output_dir=/proc/forbidden"], "cannot write to the output folder"),
    (["--model.patch_size=7"], "model.patch_size"),
    (["--model.num_heads=5", "--model.embed_dim=32"], "model.num_heads"),
    (["--data.batch_size=0"], "data.batch_size"),
    (["--optim.lr=-0.1"], "optim.lr"),
    (["--optim.lrr=0.1"], "optim.lrr"),
    (["--run.epochs=many"], "run.epochs"),
])
def test_bad_arguments_give_one_sentence_and_write_nothing(tmp_path, args, needle):
    out = tmp_path / "runs"
    r = run_script("train.py", f"--run.output_dir={out}", *args, *(["--run.output_dir=/proc/forbidden"]
                   if "--run.output_dir=/proc/forbidden" in args else []))
    assert r.returncode == 2, r.stderr[-2000:]
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "Traceback" not in r.stderr
    assert not out.exists()


def test_evaluate_and_visualize_options_give_one_sentence_before_writing(tmp_path):
    evaluate, vis = _script("evaluate"), _script("visualize_attention")
    (tmp_path / "file").write_text("x")
    for args, needle in ((["--topk", "0"], "--topk must be at least 1"),
                         (["--batch-size", "0"], "--batch-size must be at least 1"),
                         (["--out", str(tmp_path / "file")], "is an existing file")):
        with pytest.raises(ConfigError, match=needle):
            evaluate.parse_args(["--checkpoint", str(tmp_path), *args])
    ok = dict(layer=-1, start_layer=0, batch_size=16, discard_ratio=0.0, residual_alpha=0.5, out=str(tmp_path / "o"))
    vis.check_options(Namespace(**ok), depth=4)
    for bad, needle in ((dict(layer=9), "--layer 9 does not exist: the model has 4 blocks"),
                        (dict(layer=-5), "--layer -5"), (dict(start_layer=4), "--start-layer 4"),
                        (dict(batch_size=0), "--batch-size"), (dict(out=str(tmp_path / "file")), "existing file")):
        with pytest.raises(DataError, match=needle):
            vis.check_options(Namespace(**{**ok, **bad}), depth=4)
