"""Our CLIP / SigLIP against open_clip's on the same weights, interleaved in one run: zero-shot throughput (the
image tower, then the cached (C, E) text classifier: exp(s) * normalize(f(x)) @ W.T [+ b]) and one contrastive
training step (both towers forward, the loss, backward, AdamW's step).

Both sides are built from one folder in open_clip's repository layout: open_clip builds the model from
`config` (a name of its own configs, e.g. "ViT-B-16" or "ViT-B-16-SigLIP", or "tiny" / "tiny-siglip") with its random
initialisation, its weights are saved beside the config, and `vit.create_clip_model("local-dir:...")` reads them.
The captions are random ids (no tokenizer files are needed; both sides get the same ids). Losses: ours from
`vit.train.contrastive`, open_clip's `ClipLoss` / `SigLipLoss`; optimizers: ours `vit.train.optim.build_optimizer`,
open_clip's training recipe (torch AdamW, no decay on norms, biases, positions and scales), lr 1e-4, decay 0.05.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
import zlib
from pathlib import Path

import torch

from ..config import OptimConfig
from ..models.clip import create_clip_model
from ..train.contrastive import clip_loss, siglip_loss
from ..train.optim import build_optimizer
from ..utils.timing import interleaved, ratio_stats
from .sides import autocast, device_sync

__all__ = ["TINY", "bench_clip", "format_clip_report"]

# models of a fraction of a million parameters, for the test and a quick look: CLIP's layout, and SigLIP's (a timm
# trunk with attention pooling, a bidirectional text tower pooled at its last token, a learned logit bias)
TINY = {"tiny": dict(embed_dim=32, vision_cfg=dict(image_size=32, layers=2, width=64, head_width=16, patch_size=8),
                     text_cfg=dict(context_length=16, vocab_size=1000, width=32, heads=2, layers=2)),
        "tiny-siglip": dict(embed_dim=64, init_logit_bias=-10.0, custom_text=True,
                            vision_cfg=dict(image_size=32, timm_model_name="test_vit", timm_pool="map",
                                            timm_proj="none"),
                            text_cfg=dict(context_length=16, vocab_size=1000, width=32, heads=4, layers=2,
                                          no_causal_mask=True, pool_type="last", proj_bias=True,
                                          norm_kwargs=dict(eps=1e-6)))}


def _model_cfg(config: str) -> dict:
    import open_clip

    if config in TINY:
        return json.loads(json.dumps(TINY[config]))
    cfg = open_clip.get_model_config(config)
    if cfg is None:
        raise ValueError(f"unknown open_clip config {config!r}; use 'tiny', 'tiny-siglip' or one of "
                         "open_clip.list_models() (e.g. ViT-B-16, ViT-B-16-SigLIP).")
    return cfg


def _pair(config: str, folder: Path, device: torch.device):
    """(ours, open_clip's) built from one folder holding open_clip's config and random weights."""
    import open_clip
    from safetensors.torch import save_file

    cfg = _model_cfg(config)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    logging.disable(logging.WARNING)  # open_clip warns that the folder holds no weights yet: it is why we build it
    try:
        ref = open_clip.create_model(f"local-dir:{folder}")  # its random initialisation
    finally:
        logging.disable(logging.NOTSET)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, folder / "open_clip_model.safetensors")
    ours = create_clip_model(f"local-dir:{folder}")
    return ours.to(device), ref.to(device)


def _open_clip_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """open_clip's training recipe: AdamW, weight decay only on matrices (`exclude` in its main.py)."""
    decay = [p for p in model.parameters() if p.ndim >= 2 and p.requires_grad]
    rest = [p for p in model.parameters() if p.ndim < 2 and p.requires_grad]
    return torch.optim.AdamW([{"params": rest, "weight_decay": 0.0}, {"params": decay, "weight_decay": 0.05}],
                             lr=1e-4)


def _zero_shot_sides(ours, ref, classes: int, device: torch.device, precision: str) -> tuple:
    """(ours, open_clip's) zero-shot classifiers over `classes` names: images (B, 3, S, S) -> logits (B, C), each
    side's text classifier built by its own code from the same random caption ids."""
    from open_clip.zero_shot_classifier import build_zero_shot_classifier

    from ..eval.zero_shot import ZeroShotClassifier

    vocab, length = ours.text.vocab_size, ours.text.max_len

    def tokenize(texts):  # random ids, the same for the same caption on both sides
        ids = [torch.randint(1, vocab, (length,), generator=torch.Generator().manual_seed(zlib.crc32(t.encode())))
               for t in texts]
        return torch.stack(ids).to(device)

    names = [f"class {i}" for i in range(classes)]
    ours.eval()
    ref.eval()
    with torch.no_grad(), autocast(device, precision):
        ours_clf = ZeroShotClassifier(ours, names, templates=("{}",), tokenizer=tokenize)
        weights = build_zero_shot_classifier(ref, tokenize, names, ("{}",), device=device)  # (E, C)
    scale, bias = ref.logit_scale.exp(), ref.logit_bias

    def theirs_zero_shot(x):
        logits = scale * ref.encode_image(x, normalize=True) @ weights
        return logits + bias if bias is not None else logits

    return ours_clf, theirs_zero_shot


def _train_steps(ours, ref, x: torch.Tensor, ids: torch.Tensor, device: torch.device, precision: str) -> dict:
    """One contrastive training step of each side on (x, ids), as calls for `interleaved`: forward, the
    side's own loss (CLIP's or SigLIP's), backward, its optimizer's step."""
    import open_clip

    siglip = ours.logit_bias is not None
    opt_ours = build_optimizer(ours, OptimConfig(lr=1e-4, weight_decay=0.05))
    opt_ref = _open_clip_optimizer(ref)
    ref_loss = open_clip.loss.SigLipLoss() if siglip else open_clip.loss.ClipLoss()
    ours_loss = siglip_loss if siglip else clip_loss

    def step(model, loss_fn, opt):
        def call():
            model.train()
            with autocast(device, precision):
                out = model(x, ids)
                loss = loss_fn(*(t.float() for t in out))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return call

    return {"ours": step(ours, ours_loss, opt_ours), "open_clip": step(ref, ref_loss, opt_ref)}


def bench_clip(config: str, device: torch.device, batch_size: int = 32, precision: str = "fp32",
               classes: int = 1000, warmup: int = 2, repeats: int = 5, iters: int = 1) -> dict:
    """Zero-shot images/s and contrastive training-step pairs/s of ours and open_clip's `config` (module
    docstring), medians and the ratio ours/open_clip per paired repeat; `max_abs_logit_difference`: how far the
    two sides' zero-shot logits are apart (the same weights: ~1e-5 in fp32)."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        ours, ref = _pair(config, Path(tmp), device)
    img = ours.visual.patch_embed.img_size[0]
    ours_clf, theirs_zero_shot = _zero_shot_sides(ours, ref, classes, device, precision)
    x = torch.randn(batch_size, 3, img, img, device=device)
    ids = torch.randint(1, ours.text.vocab_size, (batch_size, ours.text.max_len), device=device)
    with torch.inference_mode(), autocast(device, precision):
        diff = float((ours_clf(x).float() - theirs_zero_shot(x).float()).abs().max())

    def infer(fn):
        def call():
            with torch.inference_mode(), autocast(device, precision):
                fn(x)
        return call

    sync = device_sync(device)
    zero_shot = interleaved({"ours": infer(ours_clf), "open_clip": infer(theirs_zero_shot)}, warmup, repeats, iters,
                            sync).wall
    train = interleaved(_train_steps(ours, ref, x, ids, device, precision), warmup, repeats, iters, sync).wall
    res = dict(config=config, device=str(device), precision=precision, batch_size=batch_size, classes=classes,
               img_size=img, threads=torch.get_num_threads(), max_abs_logit_difference=diff,
               params_millions=sum(p.numel() for p in ours.parameters()) / 1e6)
    for mode, times in (("zero_shot", zero_shot), ("train_step", train)):
        res[mode] = {side: dict(images_per_s=batch_size / statistics.median(t), seconds_all=t)
                     for side, t in times.items()}
        res[mode]["ratio_ours_over_open_clip"] = ratio_stats(times["ours"], times["open_clip"])
    return res


def format_clip_report(res: dict) -> str:
    """`bench_clip`'s result as the table benchmark.py prints."""
    lines = [f"\nCLIP against open_clip: {res['config']} ({res['params_millions']:.1f}M parameters)  "
             f"{res['img_size']} px  batch {res['batch_size']}  {res['classes']} classes  {res['precision']}  "
             f"{res['device']}  {res['threads']} threads  (zero-shot logits apart by at most "
             f"{res['max_abs_logit_difference']:.1e})",
             f"{'':<26}{'ours img/s':>12}{'open_clip img/s':>17}{'ratio (min-max)':>22}"]
    for mode, label in (("zero_shot", "zero-shot (tower + W)"), ("train_step", "contrastive train step")):
        r, q = res[mode], res[mode]["ratio_ours_over_open_clip"]
        lines.append(f"{label:<26}{r['ours']['images_per_s']:>12.4g}{r['open_clip']['images_per_s']:>17.4g}"
                     f"{q['median']:>10.3f} ({q['min']:.3f}-{q['max']:.3f})")
    return "\n".join(lines)
