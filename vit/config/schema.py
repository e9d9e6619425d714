"""The config schema: one dataclass per section (model, data, aug, optim, run, contrastive, distill, pretrain, seg),
every field with its meaning in a comment beside it (vit/cli/help.py prints them as --help)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from .choices import LAYER_SCALE_NAMES, MLP_LAYERS, NORM_LAYERS, POOL_KINDS, POS_EMBEDS, QKV_BIAS
from .errors import ConfigError
from .model_parts import NaFlex, RelPos, Rope, Stem
from .options import NaFlexOptions, SparseOptions

DEFAULT_MODEL = "vit_tiny_patch16_224"  # model.name when neither it nor model.pretrained names an architecture


@dataclass
class ModelConfig:
    # Each field is a vit.create_model argument of the same name (vit/models/build.py passes the section straight
    # through; tests/test_config_model_options.py holds the two lists equal): a new model option is one line here,
    # its choices (if any) a Literal of a tuple in vit/config/choices.py, which the layer's registry is held to.
    # A field left null defers to the architecture `name` (or the weights' config.json).

    # a vit.create_model name; the fields below override it. null: the architecture of the weights
    # model.pretrained names (so the two cannot disagree), else vit_tiny_patch16_224 (vit.models.build.resolve_name)
    name: str | None = None
    img_size: int = 224  # input height and width in pixels
    patch_size: int | None = None  # patch side in pixels; null: the name's (16 for *_patch16_*)
    # input channels, 3 (RGB) or 1 (grey); null: the data's (1 when its images are grey, else 3), see
    # vit.data.resolve.choose_channels; a number pins it
    in_chans: int | None = None
    # token: the [CLS] token feeds the head; avg / max / avgmax: of the patch tokens; map: attention pooling
    # (SigLIP); '': none (the tokens themselves); null: the name's (token for most)
    global_pool: Literal[POOL_KINDS] | None = None
    # prefix tokens and norms (vit.layers.PrefixTokens, Pooling); null: the name's, e.g. 4 registers for *_reg4_*
    class_token: bool | None = None  # a [CLS] token first
    reg_tokens: int | None = None  # register tokens after [CLS] (DINOv2-reg4: 4)
    dist_token: bool | None = None  # DeiT's distillation token and its second head
    no_embed_class: bool | None = None  # prefix tokens get no position embedding (DeiT III)
    pre_norm: bool | None = None  # a norm after the embeddings (CLIP's image tower)
    fc_norm: bool | None = None  # norm the pooled vector instead of the tokens
    final_norm: bool | None = None  # false: no final norm at all (neither norm nor fc_norm); null: the name's
    pool_include_prefix: bool | None = None  # avg / max / map pool the prefix tokens too (Perception Encoder's map)
    attn_pool_num_heads: int | None = None  # global_pool map: its heads; null: the blocks' (PE: 8)
    attn_pool_mlp_ratio: float | None = None  # global_pool map: its MLP's ratio; null: the blocks'
    embed_dim: int | None = None  # token width D; null: the name's
    depth: int | None = None  # number of Transformer blocks; null: the name's
    num_heads: int | None = None  # attention heads per block (must divide embed_dim); null: the name's
    mlp_ratio: float | None = None  # MLP hidden width / embed_dim; null: the name's (4.0)
    # learn: learned position embedding (ViT); sincos: fixed 2-D sin-cos; none: no absolute positions (rope or
    # rel_pos give them)
    pos_embed: Literal[POS_EMBEDS] = "learn"
    norm_layer: Literal[NORM_LAYERS] = "layernorm"  # normalisation in every block (vit.layers.norm.NORM_LAYERS)
    norm_eps: float | None = None  # the norms' epsilon; null: the name's (1e-6; CLIP and EVA: 1e-5)
    # the MLP of every block (vit.layers.mlp.MLP_LAYERS): gelu: fc-GELU-fc (ViT); swiglu: gated SiLU MLP;
    # swiglu_packed: its one-matrix form; geglu: ViTamin's GeGLU; gelu_tanh / quick_gelu: those activations
    mlp_layer: Literal[MLP_LAYERS] = "gelu"
    norm_first: bool = True  # pre-norm blocks (ViT); false: post-norm (original Transformer)
    init_values: float | None = None  # LayerScale initial value (e.g. 1e-5, CaiT/DeiT III); null: none
    # LayerScale's saved names: ls (timm's ViT: ls1.gamma) or gamma (Eva, BEiT: gamma_1); null: the name's
    layer_scale_names: Literal[LAYER_SCALE_NAMES] | None = None
    qkv_bias: bool | Literal[QKV_BIAS] | None = None  # biases of q, k, v; qv: q and v only (Eva, BEiT); null: name's
    # a block's optional parts (vit.layers.BlockParts, timm's names); null: the name's
    qkv_fused: bool | None = None  # false: q / k / v saved as q_proj / k_proj / v_proj (EVA02; computed fused)
    scale_attn_norm: bool | None = None  # a norm on the attention output before attn.proj (NormFormer)
    scale_mlp_norm: bool | None = None  # a norm on the MLP's hidden layer before fc2 (EVA02's scale_mlp)
    proj_bias: bool | None = None  # biases of attn.proj and the MLP's linears (false: AIMv2)
    embed_norm: bool | None = None  # a norm on the patch tokens inside the patch embedding (AIMv2)
    res_post_norm: bool | None = None  # each sub-layer's norm on its output, inside the residual (Swin v2)
    attn_only_layer_scale: bool | None = None  # LayerScale on the attention branch only (Sapiens2); null: the name's
    # rotary positions in attention, e.g. {kind: dinov3, temperature: 100, rotate_half: true} (vit.layers.rope;
    # Rope's fields below); replaces the name's rope whole; null: the name's (none for most)
    rope: Rope | None = None
    # relative position bias, e.g. {kind: table} (BEiT) or {kind: mlp, hidden_dim: 128} (vit.layers.rel_pos);
    # null: the name's
    rel_pos: RelPos | None = None
    # a convolutional stem before the tokens, e.g. {kind: resnetv2, layers: [3, 4, 9]} (R50+ViT; vit.layers.
    # hybrid_embed); null: the name's (patches straight from the pixels for most)
    stem: Stem | None = None
    # NaFlex embeddings, how the position table is resampled per image, e.g. {pos_grid: [16, 16]} (vit.layers.
    # naflex; fed by data.naflex, which sets {} when this is null); null: the name's
    naflex: NaFlex | None = None
    drop_rate: float = 0.0  # dropout on the features before the head
    pos_drop_rate: float | None = None  # dropout on the tokens after the position embedding; null: the name's (0)
    attn_drop_rate: float = 0.0  # dropout on the attention weights
    drop_path_rate: float = 0.0  # stochastic depth, rising linearly to this rate in the last block
    qk_norm: bool | None = None  # a norm on each head's queries and keys (timm's q_norm / k_norm); null: the name's
    fused_attn: bool | None = None  # F.scaled_dot_product_attention (true) or the explicit softmax path; null: true
    # SAM's image encoder (samvit_*; vit/models/sam_vit.py); each null: the name's
    window_size: int | None = None  # attention within window_size x window_size token windows
    global_attn_indexes: list[int] | None = None  # the blocks that attend over the whole grid instead
    use_rel_pos: bool | None = None  # decomposed relative positions in every block (rel_pos_h / rel_pos_w)
    use_abs_pos: bool | None = None  # the learned (h, w) position table
    neck_chans: int | None = None  # channels of the convolutional neck after the blocks
    # grouped-query attention: key / value heads, each shared by num_heads / num_kv_heads query heads (one value
    # for every block; create_model takes one per block too); null: the name's (one per query head)
    num_kv_heads: int | None = None
    dynamic_img_size: bool | None = None  # positions resampled to any input size on the fly; null: the name's
    # weights to fine-tune from: true (those `name` points at, e.g. timm's default tag from the Hugging Face
    # cache), a hub name (vit_base_patch16_224.augreg_in21k, hf-hub:org/repo[@rev], local-dir:/folder), a folder
    # (a run's best/) or a weights file; see vit/hub/names.py
    pretrained: bool | str | None = None
    # e.g. merge:8 (ToMe) or topk:0.7@3,6,9 (EViT); see vit/layers/token_reduction.py
    token_reduction: str | None = None
    # top-k key blocks per query, e.g. {method: dsa, density: 0.25} (SparseOptions above); null: dense attention
    sparse_attention: SparseOptions | None = None
    # (model.attention, create_model(attention=...), an AttentionOptions mapping, is one more field here, typed
    # `AttentionOptions | None`, once create_model takes it; build_model passes it through as it passes rope)
    grad_checkpointing: bool = False  # recompute each block in backward: same gradients, far less activation memory
    freeze: bool = False  # train the head only: the backbone keeps the weights it was loaded with (docs/few-labels.md)


@dataclass
class DataConfig:
    # digits | imagefolder | cifar10 | cifar100 | synthetic | wds | hf | text_csv | captions | segmentation
    dataset: str = "digits"
    # imagefolder: folder with train/ and val/ (no val/: val_fraction of train/); cifar: download folder;
    # captions: the images' folder (contrastive.captions_file, or class subfolders as imagefolder);
    # segmentation: a folder with train/ and val/, each images/ + masks/ or a CSV train.csv / val.csv (seg.*);
    # wds: shard folder with _info.json, URL or 'pipe:' prefix (vit/data/shard_loader.py); hf: a
    # datasets.save_to_disk folder or a folder of parquet files (vit/data/hf_datasets.py)
    root: str | None = None
    download: bool = True  # cifar only
    val_fraction: float = 0.2  # digits, and an imagefolder without val/: stratified held-out share
    split_seed: int = 0  # seed of the held-out split
    batch_size: int = 64  # per process
    eval_batch_size: int | None = None  # per process; null: batch_size
    num_workers: int | str = "auto"  # loader processes per process (0: the main one); auto: from the CPUs, device
    on_bad_image: str = "skip"  # skip | error
    synthetic_train_size: int = 512  # synthetic only: training images
    synthetic_val_size: int = 128  # synthetic only: held-out images
    synthetic_num_classes: int = 4  # synthetic only: classes
    # wds and hf: split names (_info.json's, the dataset's) or, for wds, brace patterns 'train-{00000..00099}.tar'
    train_split: str = "train"  # wds and hf: the training split's name (wds: or a brace pattern)
    val_split: str = "val"  # wds and hf: the held-out split's name (wds: or a brace pattern)
    shuffle_buffer: int = 2048  # wds: samples shuffled together (held as raw bytes, per loader worker)
    num_classes: int | None = None  # wds/hf: when the data does not name its classes (labels 0..n-1)
    image_column: str = "image"  # hf: the column holding the images
    label_column: str = "label"  # hf: the column holding the integer labels; text_csv: the class names
    text_column: str = "text"  # text_csv: the CSV column holding the sentences (vit/data/text.py)
    # imagefolder, multi-label: a CSV (image,labels[,split]) or JSON ({image: [labels]}) file listing images under
    # data.root with any number of labels each (vit/data/multilabel.py); sigmoid + BCE, scored by mAP
    labels_file: str | None = None
    # shuffle: each image once per epoch; balanced: as many draws per epoch, each class equally likely (images
    # drawn with replacement, weight 1 / their class's count), seeded per (seed, epoch) so a resume is exact
    sampler: Literal["shuffle", "balanced"] = "shuffle"
    # native aspect ratio (NaFlexOptions: {max_num_patches: 256, tokens_per_batch: null}): each image resized whole
    # to its own patch grid, batches filled up to a token budget (vit/data/naflex.py); the model takes the batch
    # dict. aug.random_resized_crop, scale, ratio and eval_crop_pct do not apply. null: square model.img_size inputs
    naflex: NaFlexOptions | None = None


INTERPOLATIONS = ("bilinear", "bicubic")
MIN_CROP_PCT = 0.1  # a smaller centre-crop share resizes images to over 10x the model's input before cropping
MIN_STD = 1e-6  # a smaller std overflows float32 once images are divided by it: inf, then NaN scores


@dataclass
class AugConfig:
    random_resized_crop: bool = True  # train crops of a random area (scale) and aspect (ratio), resized
    scale: list[float] = field(default_factory=lambda: [0.08, 1.0])  # random_resized_crop: [min, max] image area share
    ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333])  # random_resized_crop: [min, max] aspect ratio
    affine_translate: float = 0.0  # fraction of the image size
    affine_rotate: float = 0.0  # degrees
    affine_scale: float = 0.0  # +- fraction
    hflip: float = 0.5  # probability of a horizontal flip
    color_jitter: float = 0.0  # brightness/contrast/saturation jitter strength
    rand_augment_ops: int = 0  # >0: apply that many random photometric/geometric ops (RandAugment-like)
    random_erasing: float = 0.0  # probability of erasing a random rectangle
    mixup: float = 0.0  # mixup alpha (0: off)
    cutmix: float = 0.0  # cutmix alpha (0: off)
    mixup_prob: float = 1.0  # probability of mixing a batch when mixup or cutmix is on
    label_smoothing: float = 0.1  # share of the target spread over all classes
    # Preprocessing; None (unset): the pretrained weights' own (model.pretrained_cfg, as timm's
    # resolve_data_config), else the fallbacks in `resolved`. train.py saves the resolved values.
    mean: list[float] | None = None  # per-channel mean subtracted; null: the pretrained weights' own, else 0.5
    std: list[float] | None = None  # per-channel std divided by; null: the pretrained weights' own, else 0.5
    eval_crop_pct: float | None = None  # evaluation centre-crop share; null: the weights' (0.9 cuts borders), else 1
    interpolation: str | None = None  # bilinear | bicubic, for resizing and crops

    def resolved(self, pretrained_cfg: dict | None = None, in_chans: int | None = 3) -> AugConfig:
        """A copy with mean, std, eval_crop_pct and interpolation filled where unset: from the weights'
        pretrained config (timm's keys mean, std, crop_pct, interpolation) where it has a usable value, else 0.5,
        0.5, 1.0 and bilinear. Values taken from the weights pass the config's own checks (`check_preprocessing`,
        one sentence if not); statistics for the weights' own channel count when the model has another (RGB
        weights adapted to a grey model) fall back. A ViT fine-tuned with other statistics than its weights saw loses
        accuracy silently, so values the config sets are kept and everything else follows the weights."""
        p, in_chans = pretrained_cfg or {}, in_chans or 3
        own = p.get("input_size")  # the weights' own channels: statistics for those are theirs, not malformed
        own = own[0] if isinstance(own, (list, tuple)) and own and isinstance(own[0], int) else in_chans
        unset = {"mean": self.mean, "std": self.std, "crop_pct": self.eval_crop_pct}
        check_preprocessing({k: p.get(k) for k, v in unset.items() if v is None}, own,
                            lambda k: f"the weights' pretrained config (config.json pretrained_cfg) '{k}'",
                            lambda k: f"; fix it there, or set --aug.{'eval_crop_pct' if k == 'crop_pct' else k}")

        def pick(value, key, fallback, usable):
            if value is not None:
                return value
            return p[key] if p.get(key) is not None and usable(p[key]) else fallback

        return dataclasses.replace(
            self,
            mean=[float(v) for v in pick(self.mean, "mean", [0.5] * in_chans, lambda v: len(v) == in_chans)],
            std=[float(v) for v in pick(self.std, "std", [0.5] * in_chans, lambda v: len(v) == in_chans)],
            eval_crop_pct=float(pick(self.eval_crop_pct, "crop_pct", 1.0, lambda v: True)),
            interpolation=pick(self.interpolation, "interpolation", "bilinear", lambda v: v in INTERPOLATIONS),
        )


def check_preprocessing(values: dict[str, Any], channels: int, name, advice=lambda key: "") -> None:
    """The checks every source of preprocessing passes (the config's aug.* keys, a weights' pretrained_cfg):
    `mean` and `std` lists of `channels` finite numbers, `std` positive (images are divided by it), `crop_pct`
    in [MIN_CROP_PCT, 1]; None: unset. Raises ConfigError: `name(key)` says where the value came from, and
    `advice(key)` is added before the full stop."""
    for key in ("mean", "std"):
        v = values.get(key)
        if v is None:
            continue
        if not isinstance(v, (list, tuple)) or not all(type(x) in (int, float) for x in v):
            raise ConfigError(f"{name(key)} must be a list of numbers, got {v!r}{advice(key)}.")
        if not all(math.isfinite(x) for x in v):
            raise ConfigError(f"{name(key)} must hold finite numbers, got {list(v)}{advice(key)}.")
        if len(v) != channels:
            raise ConfigError(f"{name(key)} needs {channels} values (one per input channel), got {list(v)}"
                              f"{advice(key)}.")
        if key == "std" and not min(v) >= MIN_STD:
            raise ConfigError(f"{name(key)} must hold values of at least {MIN_STD:g} (images are divided by it), got "
                              f"{list(v)}{advice(key)}.")
    crop = values.get("crop_pct")
    if crop is not None and (type(crop) not in (int, float) or not MIN_CROP_PCT <= crop <= 1):
        raise ConfigError(f"{name('crop_pct')} must be between {MIN_CROP_PCT} and 1 (the centre crop's share of the "
                          f"resized image), got {crop!r}{advice('crop_pct')}.")


@dataclass
class OptimConfig:
    lr: float = 1e-3  # peak learning rate for the global batch
    min_lr: float = 1e-6  # floor of the cosine schedule
    weight_decay: float = 0.05  # AdamW decoupled weight decay (not on norms, biases, tokens)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    warmup_epochs: float = 5.0  # linear warm-up from 0 to lr (fractions allowed)
    layer_decay: float | None = None  # e.g. 0.65 for fine-tuning
    clip_grad: float | None = 1.0  # clip the global gradient norm to this; null: no clipping
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    ema: bool = False  # also keep an exponential moving average of the weights (timm ModelEmaV3); evaluated and saved
    ema_decay: float = 0.9998  # EMA decay per optimizer step
    # null: every class weighs the same in the loss; auto: inverse frequency in the training split,
    # n / (num_classes * n_c), so that each class contributes as much in total (cross-entropy's weight)
    class_weights: Literal["auto"] | None = None
    # model.sparse_attention.method=dsa: DeepSeek's indexer warm-up, optimizer steps where only the indexer learns the
    # dense attention (KL), the rest frozen; sparse training follows, the indexer still learning on its selection
    indexer_warmup_steps: int = 0
    # how the indexer's KL weighs query rows: mean (DeepSeek's, every row alike) or peaked (rows weighted by how
    # concentrated their dense attention is; better where few rows are read, e.g. a [CLS] classifier)
    indexer_kl_rows: Literal["mean", "peaked"] = "mean"
    # LoRA adapters of this rank on every block's qkv, proj, fc1 and fc2 (peft; vit/train/lora.py), the rest but
    # the head frozen; merged into the weights on save, so checkpoints hold a plain model. 0: none
    lora_rank: int = 0
    lora_alpha: float | None = None  # the LoRA update's scale is lora_alpha / lora_rank; null: lora_rank (scale 1)


@dataclass
class RunConfig:
    name: str = "default"  # the run folder is output_dir/name
    output_dir: str = "runs"  # parent folder of run folders
    epochs: int = 100  # training epochs
    seed: int = 0  # seed for weights, augmentation and data order
    # no | bf16 | fp16 | auto (bf16 on a GPU that has it, else no); None: what `accelerate launch` was told
    mixed_precision: str | None = None
    num_threads: int | str = "auto"  # torch threads per process; auto: its share of the CPUs minus the loader workers
    compile: bool = False  # torch.compile the model
    eval_every: int = 1  # epochs
    save_state_every: int = 0  # steps; 0 = at the end of every epoch
    keep_best: int = 1  # best checkpoints kept (by val_acc1)
    # resumable training states kept in state/ (each: weights + optimizer moments, ~3x the model); the oldest is
    # deleted once a newer one is complete. 2: a damaged newest state falls back to the one before; 1: half the disk
    keep_states: int = 2
    resume: str | None = None  # 'auto' or a state folder
    overwrite: bool = False  # start afresh in a run folder that already holds a run (its files are deleted)
    log_every: int = 10  # steps between the trackers' train-loss points
    # experiment trackers, through Accelerate: tensorboard, csv (metrics.csv, always written), wandb, mlflow,
    # comet_ml, aim, clearml, dvclive, swanlab, trackio; one name or a list; null: [tensorboard, csv]
    # (see vit/train/tracking.py)
    log_with: list[str] | str | None = None
    project: str = "vit"  # the trackers' project (wandb project, MLflow experiment); each run is named run.name
    on_nonfinite: str = "stop"  # stop | skip
    max_steps: int | None = None  # stop early (smoke runs)
    # the validation number that picks best/ and top/: top1, macro_f1, balanced_accuracy (mean per-class recall),
    # loss (lowest), map (multi-label); null: top1, or map for multi-label data (data.labels_file)
    select_by: Literal[None, "top1", "macro_f1", "balanced_accuracy", "loss", "map"] = None

    def __post_init__(self) -> None:
        if isinstance(self.log_with, str):  # one name, as Trainer(report_to="mlflow") takes it
            self.log_with = [self.log_with]


@dataclass
class ContrastiveConfig:
    # data.dataset=captions only: a CLIP / SigLIP model trained on image-caption pairs (docs/zero-shot.md); the
    # image tower is model.* (a CLIP-style ViT: model.pre_norm), the text tower the text_* keys, or both come from
    # `pretrained`
    loss: Literal["clip", "siglip"] = "clip"  # clip: symmetric InfoNCE (softmax); siglip: a sigmoid per pair + bias
    # siglip across processes: gather (every caption on every process) or ring (chunks passed between neighbours)
    exchange: Literal["gather", "ring"] = "gather"
    # a vit.create_clip_model name to start from (hf-hub:org/repo, local-dir:/folder, a run's best/); null: from
    # scratch, the text tower's vocabulary the training captions' words
    pretrained: str | None = None
    # a CSV (image,caption[,split]) or JSON ([{"image": ..., "caption": ...}]) of image paths under data.root;
    # null: data.root is an image folder (train/[val/] or class subfolders) captioned from its class names
    captions_file: str | None = None
    template: str = "a photo of a {}."  # the caption of a class-folder image, {} its class name
    embed_dim: int = 64  # width of the space both towers project into (from scratch)
    text_width: int = 64  # text tower: token width (from scratch)
    text_depth: int = 2  # text tower: blocks (from scratch)
    text_heads: int = 4  # text tower: attention heads, dividing text_width (from scratch)
    context_length: int = 16  # text tower: tokens per caption, start and end included (from scratch)
    # log of the initial similarity scale; null: log(1 / 0.07) for clip (CLIP's), log(10) for siglip (SigLIP's)
    logit_scale: float | None = None
    logit_bias: float | None = None  # siglip: the initial bias; null: -10 (SigLIP's); clip has none


@dataclass
class DistillConfig:
    # knowledge distillation (vit/train/distill.py, as timm.task): the student is model.*, taught by a frozen teacher
    # a timm tag in the Hugging Face cache, hf-hub:org/repo, local-dir:/folder, a run's best/ or a CLIP / SigLIP
    # repository (its image tower), seen in its own mean, std and input size; null: no distillation
    teacher: str | None = None
    # logit: the student's class scores match the teacher's; feature: its features, projected to the teacher's
    # width (any teacher class set); token: DeiT's distillation token (a distilled student, model.dist_token)
    kind: Literal["logit", "feature", "token"] = "logit"
    temperature: float = 1.0  # logit and soft token: softmax temperature T, > 0 (the KL is scaled by T^2; 1-4 usual)
    # the task loss's weight; with distill_weight null the distillation weighs 1 - task_weight (timm's complementary
    # mode, task_weight in [0, 1]); both null: 1 and 1
    task_weight: float | None = None
    distill_weight: float | None = None  # the distillation loss's weight; null: 1 - task_weight (or 1)
    token_mode: Literal["soft", "hard"] = "soft"  # token: KL at the temperature, or cross-entropy with its argmax
    feature_loss: Literal["mse", "cosine"] = "mse"  # feature: mean squared error (timm's) or 1 - cosine similarity
    features: Literal["pooled", "patch"] = "pooled"  # feature: the pre-logits vector (timm's) or every patch token


@dataclass
class PretrainConfig:
    # self-supervised pretraining on the unlabelled images under data.root (any layout, labels ignored; docs/
    # pretraining.md): dino (DINOv2's: EMA teacher, multi-crop, centring, iBOT, KoLeo), mae, or null (supervised)
    method: str | None = None
    knn_root: str | None = None  # a few labelled images (train/, val/ class folders): k-NN top-1 at each evaluation
    local_crops: int = 6  # dino: small crops per image besides the 2 global ones (0: none)
    local_size: int = 32  # dino: the local crops' side in pixels, a multiple of the patch size (positions resampled)
    global_scale: float = 0.35  # dino: global crops cover [global_scale, 1] of the image, local ones [0.05, it]
    out_dim: int = 4096  # dino: prototypes K the head's last, weight-normalised layer scores
    hidden_dim: int = 512  # dino: the head's MLP width
    bottleneck_dim: int = 128  # dino: the head's bottleneck before the L2 normalisation
    student_temp: float = 0.1  # dino: the student's softmax temperature
    teacher_temp: float = 0.07  # dino: the teacher's softmax temperature after its warm-up
    warmup_teacher_temp: float = 0.04  # dino: the teacher's temperature at step 0, linear to teacher_temp
    warmup_teacher_temp_epochs: float = 0.0  # dino: epochs of that warm-up (0: teacher_temp from the start)
    centering: Literal["centre", "sinkhorn", "none"] = "centre"  # dino: EMA centre, Sinkhorn-Knopp, none (no guard)
    centre_momentum: float = 0.9  # dino: the centre's EMA momentum
    momentum: float = 0.996  # dino: the teacher's EMA momentum at step 0, cosine to 1 at the last step
    koleo_weight: float = 0.0  # dino: weight of the KoLeo regulariser on the student's [CLS] (DINOv2: 0.1)
    ibot_weight: float = 0.0  # dino: weight of iBOT's masked-patch loss (DINOv2: 1); 0: no masking
    mask_ratio: float = 0.75  # mae: share of patches hidden from the encoder; dino with iBOT: share masked
    decoder_dim: int = 64  # mae: the decoder's width
    decoder_depth: int = 2  # mae: the decoder's blocks (the encoder's Block class)
    decoder_heads: int = 4  # mae: the decoder's attention heads, dividing decoder_dim
    norm_pix_loss: bool = True  # mae: each target patch normalised by its own mean and variance (MAE's default)
    # dino: the run stops when the teacher's outputs vary less than this across a batch (mean standard deviation
    # of its L2-normalised logits; a collapsed teacher gives the same output for every image); 0: never
    collapse_spread: float = 1e-4


@dataclass
class SegConfig:
    # data.dataset=segmentation only: a head on the backbone's patch grids, a class per pixel (docs/segmentation.md)
    head: Literal["linear", "dpt"] = "linear"  # linear: BN + 1x1 conv per patch (DINOv2's); dpt: reassemble + fusion
    blocks: int = 1  # linear: the last N blocks' tokens concatenated (DINOv2's linear: 1, its multi-layer: 4)
    loss: Literal["ce", "dice", "ce+dice"] = "ce"  # per-pixel cross-entropy (optim.class_weights), soft Dice, or both
    classes: list[str] | None = None  # the class names, index = mask value; null: classes_file, else the palette
    classes_file: str | None = None  # a JSON list or one name per line; null: seg.classes or the masks' palette
    missing_masks: Literal["error", "background"] = "error"  # an image without a mask: refused, or all background
    dpt_width: int = 256  # dpt: the fusion blocks' width
    dpt_sizes: list[int] | None = None  # dpt: the four reassembled widths; null: embed_dim / 8, / 4, / 2, / 1
    dpt_factors: list[float] = field(default_factory=lambda: [4.0, 2.0, 1.0, 0.5])  # dpt: each map's resampling
    window: int | None = None  # evaluate / predict: sliding windows of this size over larger images; null: img_size
    geometry: Literal["resample", "exact", "none"] = "resample"  # train: crops+rotations | whole pixels only | none


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    aug: AugConfig = field(default_factory=AugConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    contrastive: ContrastiveConfig = field(default_factory=ContrastiveConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    seg: SegConfig = field(default_factory=SegConfig)
