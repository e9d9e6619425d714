"""Segmentation heads: DPT against transformers' DPTForSemanticSegmentation with its weights copied, the linear head
against a float64 einsum, the segmenter's output size and what trains."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from vit.hub.hf_vision import hf_state_dict
from vit.layers.seg_heads import DPTHead, LinearSegHead
from vit.models import create_model
from vit.models.segmenter import create_segmenter, seg_blocks

transformers = pytest.importorskip("transformers")


def _hf_dpt(num_labels: int = 3):
    from transformers import DPTConfig, DPTForSemanticSegmentation

    cfg = DPTConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64, image_size=32,
                    patch_size=4, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 24, 32],
                    fusion_hidden_size=16, num_labels=num_labels, use_auxiliary_head=False,
                    semantic_classifier_dropout=0.0)
    torch.manual_seed(0)
    hf = DPTForSemanticSegmentation(cfg).eval()
    with torch.no_grad():  # weights larger than the init's (whose logits are near constant), BN statistics too,
        for p in hf.parameters():  # so that a skipped or misplaced layer shows
            p.copy_(torch.randn_like(p) * 0.3)
        for m in hf.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.5, 0.5)
    return hf


def _ours_from(hf) -> torch.nn.Module:
    backbone = create_model("vit_base_patch16_224", img_size=32, patch_size=4, embed_dim=32, depth=4, num_heads=2,
                            mlp_ratio=2.0, num_classes=0, norm_eps=1e-12)
    state = {k[4:]: v for k, v in hf.state_dict().items() if k.startswith("dpt.")}
    report = types.SimpleNamespace(actions=[], path="dpt")
    backbone.load_state_dict(hf_state_dict(state, {"model_type": "vit"}, report), strict=True)
    model = create_segmenter(backbone, 3, head="dpt", sizes=(8, 16, 24, 32), width=16, dropout=0.0)
    model.indices = [0, 1, 2, 3]  # the config's backbone_out_indices
    head_state = {k: v for k, v in hf.state_dict().items() if k.startswith(("neck.", "head."))}
    head_state = {k.replace("neck.", "", 1): v for k, v in head_state.items()}
    model.head.load_state_dict(head_state, strict=True)
    return model.eval()


def test_dpt_matches_transformers_with_the_same_weights():
    hf = _hf_dpt()
    ours = _ours_from(hf)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = hf(pixel_values=x).logits  # (2, 3, 128, 128): 16x the 8x8 patch grid
        got = ours.forward_head(x)
        resized = ours(x)
    assert got.shape == want.shape == (2, 3, 128, 128)
    assert want.std(dim=(2, 3)).min() > 0.1  # logits that vary over the image: not a trivial comparison
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert resized.shape == (2, 3, 32, 32)  # the model's output is at the input size


def test_dpt_readout_matters():
    """Dropping the [CLS] readout changes the logits: the comparison above exercises it."""
    hf = _hf_dpt()
    ours = _ours_from(hf)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        a = ours.forward_head(x)
        ours.head.reassemble_stage.readout = "add"
        b = ours.forward_head(x)
    assert (a - b).abs().max() > 0.1


def _linear_oracle(feats: list[torch.Tensor], head: LinearSegHead) -> torch.Tensor:
    x = torch.cat(feats, 1).double()  # (B, K*D, h, w)
    bn = head.bn
    xn = (x - bn.running_mean.double()[:, None, None]) / torch.sqrt(bn.running_var.double()[:, None, None] + bn.eps)
    xn = xn * bn.weight.double()[:, None, None] + bn.bias.double()[:, None, None]
    w = head.conv_seg.weight.double()[:, :, 0, 0]  # (C, K*D)
    return torch.einsum("bkhw,ck->bchw", xn, w) + head.conv_seg.bias.double()[:, None, None]


def test_linear_head_is_bn_then_one_matmul_per_patch():
    torch.manual_seed(1)
    backbone = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3, num_classes=0)
    model = create_segmenter(backbone, 5, head="linear", blocks=2).eval()
    with torch.no_grad():
        model.head.bn.running_mean.uniform_(-1, 1), model.head.bn.running_var.uniform_(0.5, 2)
        model.head.bn.weight.uniform_(0.5, 1.5), model.head.bn.bias.uniform_(-1, 1)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        got = model.forward_head(x)
        # the oracle's features: the last two blocks, normalised by the final norm, straight from the backbone
        tokens = backbone.forward_intermediates(x, indices=[1, 2], norm=True, intermediates_only=True,
                                                output_fmt="NLC")
        feats = [t.transpose(1, 2).reshape(2, -1, 4, 4) for t in tokens]
        want = _linear_oracle(feats, model.head)
        full = model(x)
    assert got.shape == (2, 5, 4, 4)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    want_full = F.interpolate(want, size=(32, 32), mode="bilinear", align_corners=False)
    torch.testing.assert_close(full.double(), want_full, atol=1e-5, rtol=1e-5)


def test_seg_blocks_and_bad_heads():
    assert seg_blocks(12, "dpt") == [2, 5, 8, 11]  # transformers' backbone_out_indices for ViT-B
    assert seg_blocks(12, "linear") == [11] and seg_blocks(12, "linear", 4) == [8, 9, 10, 11]
    with pytest.raises(ValueError, match="reads 1..12 blocks"):
        seg_blocks(12, "linear", 13)
    with pytest.raises(ValueError, match="unknown DPT readout"):
        DPTHead(32, 3, readout="mean")
    backbone = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=0)
    with pytest.raises(ValueError, match="unknown segmentation head"):
        create_segmenter(backbone, 3, head="upernet")


def test_frozen_backbone_trains_the_head_alone():
    backbone = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=4, num_classes=0)
    model = create_segmenter(backbone, 3, head="dpt", sizes=(8, 16, 24, 32), width=16)
    model.backbone.requires_grad_(False)
    y = torch.randint(0, 3, (2, 32, 32))
    F.cross_entropy(model(torch.randn(2, 3, 32, 32)), y).backward()
    assert all(p.grad is None for p in model.backbone.parameters())
    # the coarsest fusion layer has no skip input, so its first residual unit is unused (as in transformers)
    used = {n: p for n, p in model.head.named_parameters() if not n.startswith("fusion_stage.layers.0.residual_layer1")}
    assert len(used) < len(list(model.head.parameters()))
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in used.values())


@pytest.mark.parametrize("pool", [{}, {"global_pool": "avg"}, {"global_pool": "map"}])
@pytest.mark.parametrize("head,kw", [("linear", {"blocks": 2}), ("dpt", {"sizes": (8, 16, 16, 32), "width": 8})])
def test_every_trainable_parameter_gets_a_gradient(head, kw, pool):
    """DDP waits for a gradient of every trainable parameter: a segmenter leaves trainable only what its patch grids
    pass through (the backbone's final norm for DPT, fc_norm, attention pooling and the classifier are not), so a
    two-process run does not stop at its second step."""
    from vit.models import create_model
    from vit.models.segmenter import create_segmenter

    torch.manual_seed(0)
    backbone = create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2,
                            num_classes=0, **pool)
    model = create_segmenter(backbone, 3, head, **kw)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    idle = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not idle, idle
    frozen = {n.split(".")[1] if n.startswith("backbone.") else n.rsplit(".", 2)[0]
              for n, p in model.named_parameters() if not p.requires_grad}
    want = {"dpt": {"norm", "head.fusion_stage.layers.0.residual_layer1"}, "linear": set()}[head]
    want |= {"avg": {"fc_norm"}, "map": {"attn_pool"}}.get(pool.get("global_pool"), set())
    if pool.get("global_pool") == "avg":  # fc_norm instead of a final norm: nothing there to freeze
        want.discard("norm")
    assert frozen == want  # only what no patch grid passes through
