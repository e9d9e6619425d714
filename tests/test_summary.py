"""summary.py and vit.models.summary: shapes, parameters and FLOPs per stage against counted formulas."""

import subprocess
import sys

import pytest
import torch
from helpers import ROOT

import vit
from vit.models.summary import summarize
from vit.utils.perf import count_flops


def test_summary_traces_shapes_and_counts_flops_like_the_papers():
    m = vit.create_model("vit_tiny_patch16_224").eval()
    rows = summarize(m, torch.randn(1, 3, 224, 224))
    by = {r.name: r for r in rows}
    assert by["patch_embed"].shape == (1, 196, 192)
    assert by["blocks.0.attn"].shape == (1, 197, 192)
    assert by["head"].shape == (1, 1000)
    # timm's table: ViT-Ti/16 at 224 is 1.26 GMACs = ~2.5 GFLOPs (2 per multiply-add); params 5.7M
    assert abs(by["total"].flops / 2e9 - 1.26) < 0.03
    assert by["total"].params == sum(p.numel() for p in m.parameters())
    # per-stage FLOPs add up to the total (stages: patch embed, attn + mlp per block, head)
    parts = by["patch_embed"].flops + by["head"].flops + sum(by[f"blocks.{i}"].flops for i in range(12))
    assert abs(parts - by["total"].flops) / by["total"].flops < 0.01
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert count_flops(lambda: m.forward_head(m.forward_features(x))) == by["total"].flops
        # forward() computes the last block for [CLS] only: ~10/12 of one block's 12 blocks fewer
        pruned = count_flops(lambda: m(x))
    assert 0.05 < 1 - pruned / by["total"].flops < 0.08
    # the CPU flash kernel's matmuls are counted: 12 blocks x 2 matmuls x 3 heads x 197^2 x 64 x 2
    attn = sum(by[f"blocks.{i}.attn"].flops for i in range(12))
    qkv_proj = 12 * 2 * 197 * 192 * (3 * 192 + 192)
    assert attn - qkv_proj == 12 * 2 * 3 * 197 * 197 * 64 * 2


@pytest.mark.slow
def test_summary_cli():
    out = subprocess.run([sys.executable, str(ROOT / "summary.py"), "vit_tiny_patch16_224", "--img-size", "64"],
                         capture_output=True, text=True, check=True).stdout
    assert "[1, 17, 192]" in out and "total" in out
    bad = subprocess.run([sys.executable, str(ROOT / "summary.py"), "vit_nope"], capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown model 'vit_nope'" in bad.stderr


def test_summary_lists_the_parts_an_option_adds():
    """CLIP's pre-norm, SigLIP's attention pool and DeiT's distillation head are stages with their parameters."""

    for options, parts in ((dict(pre_norm=True, global_pool="map", class_token=False), ("norm_pre", "attn_pool")),
                           (dict(dist_token=True), ("head_dist",))):
        m = vit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, **options).eval()
        rows = {r.name: r for r in summarize(m, torch.randn(1, 3, 32, 32))}
        for name in parts:
            assert rows[name].params == sum(p.numel() for p in m.get_submodule(name).parameters()) > 0
