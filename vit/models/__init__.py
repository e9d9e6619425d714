"""The models: the shared Transformer `encoder`, the `vision_transformer` (timm-exact) and the `text_encoder`
on it (`text_build`: pretrained text models by name), timm's feature API (`features`), the stage-by-stage
`summary`, the config's model (`build`), model checkpoint folders (`checkpoint`) and the README.md model card
each of them carries (`model_card`)."""

from .build import build_model, check_model_config, create_model, list_models, model_kwargs, pretrained_cfg_of
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .encoder import Block, Encoder
from .model_card import model_card
from .text_build import create_text_model, text_encoder_from_config
from .text_encoder import TextEncoder, TextEncoderOutput
from .vision_transformer import VARIANTS, VisionTransformer

__all__ = ["VisionTransformer", "create_model", "list_models", "VARIANTS", "Block", "Encoder", "TextEncoder",
           "TextEncoderOutput", "build_model", "pretrained_cfg_of", "model_kwargs", "check_model_config",
           "save_checkpoint", "load_checkpoint", "CheckpointError", "model_card", "create_text_model",
           "text_encoder_from_config"]
