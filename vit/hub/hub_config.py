"""Our checkpoints as timm hub folders: the config.json timm's `save_for_hf` writes (architecture, num_classes,
label_names, model_args, pretrained_cfg), so that `timm.create_model("local-dir:<folder>", pretrained=True)`
rebuilds a train.py checkpoint and `huggingface_hub.upload_folder` can publish it as it is. The architecture's
defaults come from the caller (vit.models.checkpoint), so the hub knows nothing of the model code.
"""

from __future__ import annotations

__all__ = ["timm_config", "split_tag"]

_SOURCE_KEYS = {"url", "file", "state_dict", "hf_hub_id", "hf_hub_filename", "source"}
_KEEP_NULL = {"pool_size", "first_conv", "classifier"}
_ALWAYS = ("img_size", "in_chans", "num_classes", "global_pool")  # current values, always written (as timm)
_RUNTIME = {"drop_rate", "pos_drop_rate", "attn_drop_rate", "drop_path_rate", "fused_attn"}


def timm_config(model, architecture: str, label_names: list[str], data: dict, defaults: dict) -> dict:
    """config.json in the format timm's save_for_hf writes, for `model` as it is now, so that
    `timm.create_model('local-dir:<folder>', pretrained=True)` rebuilds it and `upload_folder` can publish it.

    model_args: the current image size, channels, classes and pooling, plus every architecture option that
    differs from the variant's defaults (drop rates left out, as timm). pretrained_cfg: the source's (tags and
    download locations dropped: these are new weights), with the preprocessing actually used (`data`: mean, std,
    crop_pct, interpolation), the current input size and class count. `defaults`: every architecture option at
    its value for `architecture` (the caller's: the model code knows them, the hub does not)."""
    h, w = model.patch_embed.img_size
    current = dict(img_size=[h, w], in_chans=model.in_chans, num_classes=model.num_classes,
                   global_pool=model.global_pool)
    args = {k: v for k, v in getattr(model, "_model_args", {}).items()
            if k not in _RUNTIME and k not in _ALWAYS and v != defaults.get(k)}
    args = {k: list(v) if isinstance(v, tuple) else v for k, v in args.items()}
    source = getattr(model, "pretrained_cfg", None) or {}
    cfg = {k: v for k, v in source.items()
           if k not in _SOURCE_KEYS and k not in {"architecture", "tag"} and (v is not None or k in _KEEP_NULL)}
    if source.get("num_classes") != model.num_classes:
        for key in ("label_names", "label_descriptions", "label_offset"):
            cfg.pop(key, None)
    for key in ("test_input_size", "test_crop_pct", "test_pool_size", "label_offset", "min_input_size"):
        cfg.pop(key, None)
    cfg.update(
        custom_load=False, input_size=[current["in_chans"], h, w], fixed_input_size=not model.dynamic_img_size,
        interpolation=data["interpolation"], crop_pct=data["crop_pct"], crop_mode=cfg.get("crop_mode", "center"),
        mean=list(data["mean"]), std=list(data["std"]), num_classes=model.num_classes,
        pool_size=None, first_conv="patch_embed.proj", classifier="head",
    )
    out = dict(architecture=architecture, num_classes=model.num_classes, num_features=model.num_features,
               global_pool=model.global_pool)
    if label_names:
        out["label_names"] = list(label_names)
    out["model_args"] = {**current, **args}
    out["pretrained_cfg"] = cfg
    return out


def split_tag(name: str) -> str:
    """'vit_base_patch16_224.augreg_in21k' -> 'vit_base_patch16_224'."""
    return name.partition(".")[0]
