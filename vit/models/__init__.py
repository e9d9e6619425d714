"""The models: the shared Transformer `encoder`, the `vision_transformer` (timm-exact) and the `text_encoder`
on it, the `decoder` and the encoder-decoder (`seq2seq`, decoded by `generation`), timm's feature API
(`features`), the stage-by-stage `summary`, the config's model (`build`) and model checkpoint folders
(`checkpoint`)."""

from .build import build_model, check_model_config, create_model, list_models, model_kwargs, pretrained_cfg_of
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .decoder import Decoder, DecoderBlock, DecoderCache, LayerCache, TextDecoder
from .encoder import Block, Encoder
from .generation import GenerateOutput, beam_search, greedy_search
from .seq2seq import Seq2Seq
from .text_encoder import TextEncoder, TextEncoderOutput
from .vision_transformer import VARIANTS, VisionTransformer

__all__ = ["VisionTransformer", "create_model", "list_models", "VARIANTS", "Block", "Encoder", "TextEncoder",
           "TextEncoderOutput", "build_model", "pretrained_cfg_of", "model_kwargs", "check_model_config",
           "save_checkpoint", "load_checkpoint", "CheckpointError", "DecoderBlock", "Decoder", "DecoderCache",
           "LayerCache", "TextDecoder", "Seq2Seq", "GenerateOutput", "greedy_search", "beam_search"]
