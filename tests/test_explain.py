"""Token deletion / insertion: the curves' end points are the model's own outputs; the script writes its files."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import run_script

import vit
from vit.explain.faithfulness import auc, paired_bootstrap, token_curves


def test_curves_start_and_end_at_the_models_outputs():
    torch.manual_seed(0)
    m = vit.create_model("vit_tiny_patch16_224", img_size=(32, 48), depth=2, num_classes=4).eval()
    x = torch.randn(3, 3, 32, 48)
    with torch.no_grad():
        probs = m(x).softmax(1)
    target = probs.argmax(1)
    order = torch.stack([torch.randperm(6) for _ in range(3)])
    dele = token_curves(m, x, order, target, "deletion")
    ins = token_curves(m, x, order, target, "insertion")
    assert dele.shape == ins.shape == (3, 7)
    torch.testing.assert_close(dele[:, 0], probs.gather(1, target[:, None])[:, 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(ins[:, -1], dele[:, 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(ins[:, 0], dele[:, -1], atol=1e-6, rtol=0)  # both: [CLS] alone
    # deleting patch j equals running the model on the sequence without token j (an independent route)
    with torch.no_grad():
        tokens = m._pos_embed(m.patch_embed(x), (2, 3))  # (B, 1 + 6, D)
        keep = [0] + [1 + j for j in range(6) if j != int(order[0, 0])]
        y, _ = m.blocks(tokens[:1, keep])
        p = m.forward_head(m.norm(y)).softmax(1)[0, target[0]]
    torch.testing.assert_close(dele[0, 1], p, atol=1e-6, rtol=0)


def test_auc_and_bootstrap():
    c = torch.tensor([[1.0, 0.5, 0.0], [1.0, 1.0, 1.0]])
    torch.testing.assert_close(auc(c), torch.tensor([0.5, 1.0]))
    rng = np.random.default_rng(0)
    a = rng.normal(0.3, 0.1, 200)
    r = paired_bootstrap({"a": a, "b": a + 0.2, "c": a + rng.normal(0, 0.01, 200)})
    assert r["methods"]["a"]["lo"] < a.mean() < r["methods"]["a"]["hi"]
    assert r["differences"]["a - b"]["excludes_zero"] and r["differences"]["a - b"]["mean"] == pytest.approx(-0.2)


@pytest.fixture
def checkpoint(tiny_run):
    run, data = tiny_run  # the session's one tiny training (conftest.py)
    return run / "best", data


def test_faithfulness_cli_writes_table_json_and_png(checkpoint, tmp_path):
    ckpt, _ = checkpoint
    r = run_script("faithfulness.py", "--checkpoint", str(ckpt), "--out", str(tmp_path), "--limit", "6")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "faithfulness.json").read_text())
    assert res["n_images"] == 6
    assert set(res["deletion"]["methods"]) == {"rollout", "grad_rollout", "attention", "random"}
    assert (tmp_path / "faithfulness_curves.png").stat().st_size > 1000
    assert "deletion AUC" in r.stdout


@pytest.mark.slow
def test_script_writes_all_files_for_a_folder(checkpoint, tmp_path):
    ckpt, shared = checkpoint
    data = Path(shutil.copytree(shared, tmp_path / "data"))  # the session's folder stays as it is
    (data / "val" / "a" / "broken.png").write_bytes(b"not an image")
    for method in ("rollout", "grad_rollout"):  # the glob names files the folder holds too: one map each
        r = run_script("visualize_attention.py", "--checkpoint", str(ckpt), str(data / "val"),
                       str(data / "val" / "b" / "*.png"), "--method", method, "--batch-size", "4",
                       "--out", str(tmp_path), "--target-class", "b")
        assert r.returncode == 0, r.stderr[-3000:]
        assert "skipping" in r.stderr and "broken.png" in r.stderr
        assert "wrote 21 map(s)" in r.stdout
        for c in ("a", "b", "c"):  # 000.png in every class folder: a map each, none overwritten
            for i in range(3):
                for suffix in ("png", "npy", "json"):
                    assert (tmp_path / f"{c}_{i:03d}_{method}.{suffix}").is_file()
    assert len([p for p in tmp_path.glob("*_rollout.json") if "_grad_" not in p.name]) == 21
    side = json.loads((tmp_path / "c_000_grad_rollout.json").read_text())
    assert side["method"] == "grad_rollout" and side["explained_class"] == "b" and len(side["top5"]) == 5
    assert side["true_class"] == "c" and "true c, predicted" in side["title"]
    assert side["title"].endswith("\ngrad rollout, blocks 0-1")  # the settings this method uses, no others
    side = json.loads((tmp_path / "b_002_rollout.json").read_text())
    assert side["title"].endswith("rollout, heads: mean, discard ratio 0, blocks 0-1, residual alpha 0.5")
    assert side["true_class"] == "b" and side["title"].startswith("b_002: true b, predicted ")
    assert side["source"] == str(data / "val" / "b" / "002.png")  # which file the map is of
    assert np.load(tmp_path / "a_000_rollout.npy").shape == (2, 2)  # 32 px / 16 = a 2x2 grid
    r = run_script("visualize_attention.py", "--checkpoint", str(ckpt), str(tmp_path / "nothing*.png"), "--out",
                   str(tmp_path))
    assert r.returncode == 2 and "no images found" in r.stderr


def test_visualize_names_same_stem_inputs_by_the_folders_that_differ(tmp_path):
    from vit.explain import attention_inputs as vis
    files = [tmp_path / "val/cat/cat_0.png", tmp_path / "train/cat/cat_0.png", tmp_path / "val/dog/cat_0.png",
             tmp_path / "val/cat/other.png"]
    names = [n for n, *_ in vis.unique_names([(f.stem, f, None) for f in files])]
    assert names == ["val_cat_cat_0", "train_cat_cat_0", "dog_cat_0", "other"]
    assert [n for n, *_ in vis.unique_names([("digits_0001", object(), None)])] == ["digits_0001"]
