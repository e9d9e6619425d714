"""The models: the shared Transformer `encoder` (and timm's `parallel_block`), SAM's image encoder `sam_vit`, the
`vision_transformer` (timm-exact) with `naflex_vit` (NaFlex inputs, a subclass) and the `text_encoder` on it
(`text_build`: pretrained text models by name; `text_classifier`: transformers' sequence-classification heads;
`text_save`: saved for transformers), the `decoder` and the encoder-decoder (`seq2seq`, decoded by `generation`),
timm's feature API (`features`), the stage- by-stage `summary`, `create_model` and the config's model (`build`, its
keywords in `vit_options`, the architectures by timm's names in `variants`, the size bound in `model_size`), timm's
model API (`vit_api`) and weight fitting (`vision_weights`), CLIP and SigLIP (`clip`; train.py's in `clip_build`;
open_clip's layout in `clip_save`), model checkpoint folders (`checkpoint`) and the README.md model card each of
them carries (`model_card`), the masked
autoencoder's masking, decoder and loss (`mae`), a backbone with a segmentation head (`segmenter`), and a timm CNN
read as the anomaly methods read a ViT (`cnn_backbone`)."""

from .build import (
    build_model,
    check_model_config,
    create_model,
    list_models,
    model_kwargs,
    pretrained_cfg_of,
    resolve_name,
)
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .decoder import Decoder, DecoderBlock, DecoderCache, LayerCache, TextDecoder
from .encoder import Block, Encoder
from .generation import GenerateOutput, beam_search, greedy_search
from .model_card import model_card
from .naflex_vit import NaFlexVit
from .seq2seq import Seq2Seq
from .text_build import create_text_model, text_classifier_from_config, text_encoder_from_config
from .text_classifier import TextClassifier
from .text_encoder import TextEncoder, TextEncoderOutput
from .text_save import save_text_model
from .variants import REFUSED, VARIANTS
from .vision_transformer import VisionTransformer

__all__ = ["VisionTransformer", "NaFlexVit", "create_model", "list_models",
           "VARIANTS", "REFUSED", "Block", "Encoder", "TextEncoder",
           "TextEncoderOutput", "build_model", "pretrained_cfg_of", "model_kwargs", "check_model_config",
           "save_checkpoint", "load_checkpoint", "CheckpointError", "model_card", "create_text_model",
           "text_encoder_from_config", "text_classifier_from_config", "TextClassifier", "save_text_model",
           "resolve_name", "DecoderBlock", "Decoder", "DecoderCache", "LayerCache",
           "TextDecoder", "Seq2Seq", "GenerateOutput", "greedy_search", "beam_search"]
