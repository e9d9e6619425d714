"""The masked autoencoder (vit/models/mae.py) against transformers' ViTMAEForPreTraining with the same weights and
the same noise: masking, patchify, the decoder's output, the normalised-pixel loss; the positions against MAE's
get_2d_sincos_pos_embed as transformers builds them."""

from __future__ import annotations

import pytest
import torch

from vit.models import create_model
from vit.models.mae import MAEDecoder, encode_visible, mae_loss, patchify, random_masking, reconstruction, unpatchify

transformers = pytest.importorskip("transformers")
IMG, P, C, D, DEC = 32, 8, 3, 32, 16


def _hf_model(norm_pix: bool):
    cfg = transformers.ViTMAEConfig(image_size=IMG, patch_size=P, num_channels=C, hidden_size=D,
                                    num_hidden_layers=2, num_attention_heads=4, intermediate_size=4 * D,
                                    decoder_hidden_size=DEC, decoder_num_hidden_layers=2,
                                    decoder_num_attention_heads=4, decoder_intermediate_size=4 * DEC, mask_ratio=0.75,
                                    norm_pix_loss=norm_pix, layer_norm_eps=1e-6, qkv_bias=True)
    torch.manual_seed(0)
    model = transformers.ViTMAEForPreTraining(cfg).eval()
    model.decoder.initialize_weights((IMG // P) ** 2)  # MAE's sin-cos decoder positions (zeros until initialised)
    return model


def _ours(hf):
    """Our encoder and decoder with transformers' weights (q, k, v fused into qkv; the names mapped)."""
    sd = hf.state_dict()
    enc = create_model("vit_tiny_patch16_224", img_size=IMG, patch_size=P, in_chans=C, embed_dim=D, depth=2,
                       num_heads=4, mlp_ratio=4.0, num_classes=0).eval()
    dec = MAEDecoder(D, (IMG // P, IMG // P), P, C, dim=DEC, depth=2, num_heads=4).eval()
    e = {"patch_embed.proj.weight": sd["vit.embeddings.patch_embeddings.projection.weight"],
         "patch_embed.proj.bias": sd["vit.embeddings.patch_embeddings.projection.bias"],
         "cls_token": sd["vit.embeddings.cls_token"], "pos_embed": sd["vit.embeddings.position_embeddings"],
         "norm.weight": sd["vit.layernorm.weight"], "norm.bias": sd["vit.layernorm.bias"]}
    d = {k: sd[f"decoder.{k}"] for k in ("decoder_embed.weight", "decoder_embed.bias", "mask_token",
                                         "decoder_norm.weight", "decoder_norm.bias", "decoder_pred.weight",
                                         "decoder_pred.bias")}
    for prefix, out, new in (("vit.layers.", e, "blocks."), ("decoder.decoder_layers.", d, "decoder_blocks.")):
        for i in range(2):
            for t in ("weight", "bias"):  # transformers 5's names (q_proj, k_proj, v_proj, o_proj, mlp.fc1/fc2)
                out[f"{new}{i}.attn.qkv.{t}"] = torch.cat([sd[f"{prefix}{i}.attention.{n}_proj.{t}"] for n in "qkv"])
                for old, name in (("attention.o_proj", "attn.proj"), ("layernorm_before", "norm1"),
                                  ("layernorm_after", "norm2"), ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
                    out[f"{new}{i}.{name}.{t}"] = sd[f"{prefix}{i}.{old}.{t}"]
    enc.load_state_dict(e, strict=True)
    dec.load_state_dict(d, strict=True)
    return enc, dec


@pytest.mark.parametrize("norm_pix", [True, False])
def test_masking_decoder_and_loss_match_transformers_vitmae(norm_pix):
    hf = _hf_model(norm_pix)
    enc, dec = _ours(hf)
    g = torch.Generator().manual_seed(1)
    images = torch.randn(3, C, IMG, IMG, generator=g)
    noise = torch.rand(3, (IMG // P) ** 2, generator=g)
    with torch.no_grad():
        want = hf(pixel_values=images, noise=noise)
        ids_keep, mask, ids_restore = random_masking(3, (IMG // P) ** 2, 0.75, noise=noise)
        latent = encode_visible(enc, images, ids_keep)
        pred = dec(latent, ids_restore)
        loss = mae_loss(pred, patchify(images, P), mask, norm_pix)
    assert torch.equal(mask, want.mask) and torch.equal(ids_restore, want.ids_restore)
    assert torch.allclose(patchify(images, P), hf.patchify(images), atol=0)
    assert torch.allclose(pred, want.logits, atol=1e-5)
    assert abs(loss.item() - want.loss.item()) < 1e-5
    assert torch.allclose(dec.decoder_pos_embed, hf.decoder.decoder_pos_embed, atol=1e-6)  # our sin-cos table
    assert torch.allclose(enc.pos_embed.detach(), hf.vit.embeddings.position_embeddings, atol=0)


def test_unpatchify_inverts_patchify_and_the_reconstruction_keeps_visible_patches():
    x = torch.randn(2, C, IMG, IMG)
    assert torch.equal(unpatchify(patchify(x, P), P, C, (IMG // P, IMG // P)), x)
    _, mask, _ = random_masking(2, 16, 0.75, noise=torch.rand(2, 16))
    pred = torch.zeros(2, 16, P * P * C)
    rec = patchify(reconstruction(pred, x, mask, P, norm_pix=False), P)
    assert torch.equal(rec[mask == 0], patchify(x, P)[mask == 0]) and (rec[mask == 1] == 0).all()


def test_the_reconstruction_picture_is_drawn(tmp_path):
    from PIL import Image

    from vit.eval.plots import plot_reconstructions

    x = torch.rand(2, 1, 16, 16)
    _, mask, _ = random_masking(2, 4, 0.5, noise=torch.rand(2, 4))
    plot_reconstructions(x, x.flip(-1), mask, 8, tmp_path / "r.png", [0.0], [1.0])
    assert Image.open(tmp_path / "r.png").size[0] > 100


def test_the_mae_task_computes_transformers_loss():
    from vit.config import load_config
    from vit.train.tasks.mae import MAETask

    hf = _hf_model(True)
    enc, dec = _ours(hf)
    cfg = load_config("configs/default.yaml", ["--pretrain.method=mae", "--pretrain.decoder_dim=16"])
    task = MAETask.from_config(cfg, [], model=enc)
    task.decoder.load_state_dict(dec.state_dict())
    g = torch.Generator().manual_seed(2)
    images, noise = torch.randn(2, C, IMG, IMG, generator=g), torch.rand(2, (IMG // P) ** 2, generator=g)
    with torch.no_grad():
        loss, pred, mask = task.reconstruct(enc, task.decoder, images, noise)
        want = hf(pixel_values=images, noise=noise)
    assert abs(loss.item() - want.loss.item()) < 1e-5 and torch.equal(mask, want.mask)
