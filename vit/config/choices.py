"""The names a model option chooses among, as data without torch: the config's choices (ModelConfig's Literal
types) and the model parts' options (model_parts.py) are these tuples, and the layers' registries are keyed by them
(tests/test_config_model_options.py holds each registry against its tuple, so a kind added to a layer and not here, or
here and not there, fails by name)."""

from __future__ import annotations

MLP_LAYERS = ("gelu", "swiglu", "swiglu_packed", "geglu", "gelu_tanh", "quick_gelu")  # vit.layers.mlp.MLP_LAYERS
NORM_LAYERS = ("layernorm", "rmsnorm")  # vit.layers.norm.NORM_LAYERS
POOL_KINDS = ("token", "avg", "max", "avgmax", "map", "")  # vit.layers.pooling.POOL_KINDS ('': no pooling)
POS_EMBEDS = ("learn", "sincos", "none")  # VisionTransformer's pos_embed: learned, 2-D sine-cosine, none
LAYER_SCALE_NAMES = ("ls", "gamma")  # LayerScale saved as timm ViT's ls1 / ls2 or Eva / BEiT's gamma_1 / gamma_2
QKV_BIAS = ("qv",)  # qkv_bias besides true / false: q and v biases, k's fixed at zero (Eva, BEiT)
ROPE_KINDS = ("axial", "dinov3", "mixed")  # vit.layers.rope: EVA02 / RoPE-ViT, DINOv3, RoPE-Mixed
REL_POS_KINDS = ("mlp", "table")  # vit.layers.rel_pos: timm's relpos MLP, BEiT's table
STEM_KINDS = ("resnetv2", "mci", "vitamin")  # vit.layers.hybrid_embed: BiT ResNetV2, MobileCLIP, ViTamin
INTERP_MODES = ("bicubic", "bilinear")  # vit.layers.naflex: how a NaFlex model resamples its position table
