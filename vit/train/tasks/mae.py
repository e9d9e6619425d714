"""Masked-autoencoder pretraining (pretrain.method: mae; He et al. 2022; vit/models/mae.py): the run's model is the
encoder, seeing only the patches left after hiding pretrain.mask_ratio of them; a lightweight decoder (an extra
module: optimised and kept by the training state, never in the checkpoint) predicts the hidden patches' pixels,
normalised per patch (pretrain.norm_pix_loss). The checkpoint folder is the encoder alone, a plain model folder.
Evaluation has no labels: the held-out images' reconstruction loss under a fixed mask (seeded noise), and with a
new best a picture of masked / reconstructed / original images (reconstructions.png beside best/).
"""

from __future__ import annotations

import torch

from ...models.mae import MAEDecoder, encode_visible, mae_loss, patchify, random_masking, reconstruction
from ..knn_monitor import KnnMonitor, with_knn
from .base import Evaluation, Task

__all__ = ["MAETask"]

EVAL_NOISE_SEED = 0  # the held-out images' masks: the same at every evaluation, so the losses compare


class MAETask(Task):
    select_by = "loss"
    bypasses_wrapper = True  # the encoder runs unwrapped on the visible patches: the loop syncs its gradients

    def __init__(self, cfg, classes: list[str], model: torch.nn.Module) -> None:
        super().__init__(cfg, classes)
        p = cfg.pretrain
        self.patch = model.patch_embed.patch_size[0]
        self.decoder = MAEDecoder(model.num_features, model.patch_embed.grid_size, self.patch,
                                  model.patch_embed.proj.in_channels, p.decoder_dim, p.decoder_depth, p.decoder_heads)
        self.knn = KnnMonitor(cfg) if p.knn_root else None  # a few labelled images scored at each evaluation

    @classmethod
    def from_config(cls, cfg, classes, train_ds=None, model=None) -> MAETask:
        if model is None:
            raise ValueError("an MAE task needs the encoder it trains (task_for(..., model=)).")
        return cls(cfg, classes, model)

    def reconstruct(self, encoder, decoder, x: torch.Tensor, noise: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, predicted patches (B, N, p*p*C), mask (B, N)) of images x, masked by `noise` (random if None)."""
        n = (x.shape[-2] // self.patch) * (x.shape[-1] // self.patch)
        ids_keep, mask, ids_restore = random_masking(x.shape[0], n, self.cfg.pretrain.mask_ratio, noise, x.device)
        pred = decoder(encode_visible(encoder, x, ids_keep), ids_restore)
        return mae_loss(pred.float(), patchify(x, self.patch).float(), mask, self.cfg.pretrain.norm_pix_loss), \
            pred, mask

    def loss(self, run, x, y) -> torch.Tensor:
        with run.accelerator.autocast():
            return self.reconstruct(run.accelerator.unwrap_model(run.model), run.extras["decoder"], x)[0]

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        return {"decoder": self.decoder}

    @torch.no_grad()
    def evaluate(self, run, model: torch.nn.Module) -> Evaluation:
        """The held-out reconstruction loss, every batch masked by noise seeded from EVAL_NOISE_SEED."""
        model.eval()
        decoder = run.accelerator.unwrap_model(run.extras["decoder"])
        decoder.eval()
        g, total, n, first = torch.Generator().manual_seed(EVAL_NOISE_SEED), 0.0, 0, None
        for x, _ in run.val_loader:
            noise = torch.rand(x.shape[0], (x.shape[-2] // self.patch) * (x.shape[-1] // self.patch), generator=g)
            with run.accelerator.autocast():
                loss, pred, mask = self.reconstruct(model, decoder, x, noise.to(x.device))
            total, n = total + loss.item() * x.shape[0], n + x.shape[0]
            if first is None:
                first = (x[:8].cpu(), pred[:8].float().cpu(), mask[:8].cpu())
        decoder.train()
        loss = run.accelerator.reduce(torch.tensor(total / max(1, n), device=run.accelerator.device), "mean").item()
        return with_knn(Evaluation(f"val reconstruction loss {loss:.4f}", dict(val_loss=loss), dict(val_loss=loss),
                                   outputs={"first": first}), self.knn, model, run.accelerator)

    def on_new_best(self, run, evaluation: Evaluation) -> None:
        """reconstructions.png in best/: masked / reconstructed / original for up to 8 held-out images."""
        from ...eval.plots import plot_reconstructions

        if evaluation.outputs.get("first") is None:
            return
        x, pred, mask = evaluation.outputs["first"]
        rec = reconstruction(pred, x, mask, self.patch, self.cfg.pretrain.norm_pix_loss)
        plot_reconstructions(x, rec, mask, self.patch, run.run_dir / "best" / "reconstructions.png",
                             self.cfg.aug.mean, self.cfg.aug.std)
