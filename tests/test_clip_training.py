"""train.py's contrastive mode (data.dataset: captions): its config sentences, image-caption data, the open_clip
layout its checkpoints are written in (open_clip itself as the oracle), retrieval, and a tiny run that resumes
exactly and reloads through vit.create_clip_model."""

import dataclasses
import json
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY, make_image_folder, perturb, run_script
from safetensors.torch import load_file, save_file

import vit
from vit.config import ConfigError, from_dict
from vit.data.base import DataError
from vit.data.captions import check_cut, read_pairs
from vit.hub.clip_tokenizer import word_tokenizer
from vit.models.clip import new_clip_model
from vit.models.clip_save import save_clip_model

CAPTIONS = {"dataset": "captions", "root": "/data"}


@pytest.mark.parametrize("data, sentence", [
    ({"contrastive": {"loss": "siglip"}}, "config key 'contrastive.loss' is read only with data.dataset captions, and "
                                          "data.dataset is 'digits'; remove it or set data.dataset=captions."),
    ({"data": {"dataset": "captions"}}, "data.dataset=captions needs data.root"),
    ({"data": CAPTIONS, "aug": {"mixup": 0.2}}, "config key 'aug.mixup' has no meaning in a contrastive run"),
    ({"data": CAPTIONS, "model": {"pretrained": "hf-hub:x/y"}}, "contrastive.pretrained names a CLIP model to start"),
    ({"data": CAPTIONS, "run": {"select_by": "macro_f1"}}, "choose top1 (image-to-caption retrieval on val) or loss."),
    ({"data": CAPTIONS, "contrastive": {"logit_bias": -5.0}}, "config key 'contrastive.logit_bias' is SigLIP's"),
    ({"data": CAPTIONS, "contrastive": {"exchange": "ring"}}, "CLIP's softmax needs every caption at once"),
    ({"data": CAPTIONS, "contrastive": {"text_width": 30}},
     "config key 'contrastive.text_heads' (4) must divide 'contrastive.text_width' (30)."),
    ({"data": CAPTIONS, "contrastive": {"template": "a photo"}}, "config key 'contrastive.template' must hold one {}"),
    ({"data": CAPTIONS, "contrastive": {"context_length": 2}}, "'contrastive.context_length' must be at least 3"),
    ({"data": CAPTIONS, "contrastive": {"loss": "softmax"}}, "config key 'contrastive.loss' must be one of 'clip'"),
    ({"data": CAPTIONS, "contrastive": {"embed_dim": 0}}, "config key 'contrastive.embed_dim' must be positive"),
    ({"data": CAPTIONS, "contrastive": {"logit_scale": 1e10}},
     "config key 'contrastive.logit_scale' is the log of the similarity scale, whose exp is infinite in float32"),
    ({"data": CAPTIONS, "contrastive": {"logit_scale": -200.0}}, "whose exp is 0 in float32 at -200"),
    ({"data": CAPTIONS, "contrastive": {"logit_scale": float("nan")}},
     "config key 'contrastive.logit_scale' must be a finite number"),
])
def test_bad_contrastive_configs_get_one_sentence(data, sentence):
    with pytest.raises(ConfigError) as e:
        from_dict(data)
    message = str(e.value)
    assert sentence in message and message.endswith(".") and "\n" not in message, message
    from_dict({"data": CAPTIONS, "contrastive": {"loss": "siglip", "exchange": "ring", "logit_bias": -5.0}})


def test_the_logit_scale_bounds_are_where_float32_exp_stays_finite_and_normal():
    """contrastive.logit_scale's range, against torch's float32 exp (the model stores and exponentiates it so): at
    the bounds exp is a finite normal number, a model built there gives finite logits, beyond them inf or 0."""
    from vit.config.checks import LOG_SCALE_RANGE

    low, high = torch.tensor(LOG_SCALE_RANGE)
    tiny, big = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max
    assert tiny <= low.exp() and high.exp() <= big
    assert (low - 17).exp() == 0 and (high + 0.01).exp() == float("inf")
    for scale in LOG_SCALE_RANGE:
        from_dict({"data": CAPTIONS, "contrastive": {"logit_scale": scale}})
        model = _tiny_clip("clip")
        model.logit_scale.data.fill_(scale)
        image, text, exp_scale = model(torch.randn(2, 3, 32, 32), torch.randint(0, 6, (3, 8)))
        assert torch.isfinite(model.logits(image, text)).all() and torch.isfinite(exp_scale)


def test_caption_files_read_and_refused(tmp_path):
    (tmp_path / "a.png").write_bytes(b"x")
    (tmp_path / "pairs.csv").write_text("image,caption\na.png, a red circle \n")
    (tmp_path / "pairs.json").write_text(json.dumps([{"image": "a.png", "caption": "a red circle", "split": "val"}]))
    assert read_pairs("pairs.csv", tmp_path) == ([tmp_path / "a.png"], ["a red circle"], [""])
    assert read_pairs(tmp_path / "pairs.json", tmp_path) == ([tmp_path / "a.png"], ["a red circle"], ["val"])
    for text, sentence in [("img,caption\na.png,x\n", "needs a header row with the columns image and caption"),
                           ("image,caption\nb.png,x\n", "names " + str(tmp_path / "b.png") + ", which does not exist"),
                           ("image,caption\na.png,\n", "row 2 has no image path or no caption")]:
        (tmp_path / "bad.csv").write_text(text)
        with pytest.raises(DataError, match=sentence.replace("(", r"\(").replace(")", r"\)")):
            read_pairs("bad.csv", tmp_path)


def test_a_quoted_line_break_stays_in_its_caption(tmp_path):
    """csv's own quoting: a caption written over two lines inside quotes keeps its break (it became 'a redsquare'
    when the file was split into lines before the CSV reader saw it)."""
    (tmp_path / "a.png").write_bytes(b"x")
    (tmp_path / "pairs.csv").write_text('image,caption\na.png,"a red\nsquare"\n', newline="")
    (tmp_path / "crlf.csv").write_bytes(b'image,caption\r\na.png,"a red\r\nsquare"\r\n')
    assert read_pairs("pairs.csv", tmp_path)[1] == ["a red\nsquare"]
    assert read_pairs("crlf.csv", tmp_path)[1] == ["a red\r\nsquare"]


@pytest.mark.parametrize("data,sentence", [
    (b'image,caption\na.png,"a black\nb.png,a red square\n', "is not a CSV file this reader can split (unexpected "
                                                             "end of data); close each quoted caption"),
    (b'image,caption\na.png,"' + b"x" * 200000 + b'"\n', "(field larger than field limit (131072))"),
    ("image,caption\na.png,caf\xe9\n".encode("latin-1"), "is not UTF-8 text; save it as UTF-8."),
    (b"[" * 100000 + b"]" * 100000, "is not valid JSON (maximum recursion depth"),
])
def test_a_captions_file_the_reader_cannot_split_is_one_sentence(tmp_path, data, sentence):
    """A quote left open swallowed every later row into one caption (two pairs read as one, exit 0); a caption
    over csv's field limit was a _csv.Error traceback, a Latin-1 file a UnicodeDecodeError, a JSON list nested
    past the stack a RecursionError. A closed quote over two lines still reads as its caption."""
    (tmp_path / "a.png").write_bytes(b"x")
    (tmp_path / "b.png").write_bytes(b"x")
    name = "bad.json" if data.startswith(b"[") else "bad.csv"
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError, match=re.escape(sentence)) as e:
        read_pairs(name, tmp_path)
    assert "\n" not in str(e.value)
    (tmp_path / "ok.csv").write_bytes(b'image,caption\na.png,"a black\nsquare"\nb.png,a red square\n')
    assert read_pairs("ok.csv", tmp_path)[1] == ["a black\nsquare", "a red square"]


def test_captions_the_context_cuts_are_counted_and_refused_when_they_merge(caplog):
    """A caption longer than contrastive.context_length is cut without a word (clip_shapes.yaml's context of 5 with
    plain captions gave 100% retrieval over '1 captions'): a warning counts the cut ones, and a cut that makes two
    distinct captions the same ids is refused, naming both."""
    caps = ["a red circle", "a red circle on grey", "a blue square"]
    tok = word_tokenizer(caps, 6)
    assert tok.lengths(caps) == [5, 7, 5]
    assert tok.lengths(caps) == [int((r > 0).sum()) for r in word_tokenizer(caps, 16)(caps)]  # uncut ids, unpadded
    with caplog.at_level("WARNING", logger="vit.data.captions"):
        check_cut(caps, tok.lengths(caps), tok(caps))
    assert "cuts 1 of 3 captions (the longest needs 7 tokens)" in caplog.text
    tok = word_tokenizer(caps, 4)
    with pytest.raises(DataError, match=r"contrastive.context_length=4 cuts distinct captions to the same tokens "
                                        r"\('a red circle' and 'a red circle on grey'\); raise "
                                        r"contrastive.context_length to 7"):
        check_cut(caps, tok.lengths(caps), tok(caps))
    caplog.clear()
    with caplog.at_level("WARNING", logger="vit.data.captions"):
        check_cut(caps, word_tokenizer(caps, 7).lengths(caps), word_tokenizer(caps, 7)(caps))
    assert not caplog.text


def test_word_tokenizer_ends_each_caption_at_its_highest_id():
    tok = word_tokenizer(["a red circle", "A blue square."], 6)
    ids = tok(["a red circle", "a purple circle and more words"])
    vocab = tok.tokenizer.backend.get_vocab()
    end, start = vocab["<end>"], vocab["<start>"]
    assert end == tok.tokenizer.vocab_size - 1 and start == end - 1
    assert ids[0].tolist() == [start, vocab["a"], vocab["red"], vocab["circle"], end, 0]
    assert ids[1].tolist() == [start, vocab["a"], vocab["<unk>"], vocab["circle"], vocab["<unk>"], end]  # cut


def _tiny_clip(loss="siglip"):
    torch.manual_seed(0)
    visual = vit.create_model("vit_base_patch16_clip_224", img_size=32, patch_size=8, embed_dim=32, depth=2,
                              num_heads=4, num_classes=24)
    tok = word_tokenizer(["a red circle", "a blue square", "a green triangle"], 8)
    return perturb(new_clip_model(visual, tok, 24, 16, 2, 2, 2.3, -7.0 if loss == "siglip" else None))


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_open_clip_layout_loads_in_open_clip_and_create_clip_model(tmp_path, loss):
    """Saved, the model is an open_clip repository: open_clip's own CLIP and vit.create_clip_model give its image
    and text features and logit scale/bias."""
    open_clip = pytest.importorskip("open_clip")
    model = _tiny_clip(loss)
    save_clip_model(model, tmp_path / "m", preprocess=dict(mean=[0.5] * 3, std=[0.5] * 3, interpolation="bicubic"))
    ours = vit.create_clip_model(f"local-dir:{tmp_path / 'm'}")
    theirs = open_clip.create_model(f"local-dir:{tmp_path / 'm'}").eval()
    x = torch.randn(3, 3, 32, 32)
    ids = ours.tokenizer(["a red circle", "a blue square", "green"])
    torch.testing.assert_close(ids, model.tokenizer(["a red circle", "a blue square", "green"]), atol=0, rtol=0)
    with torch.no_grad():
        for m in (ours, theirs):
            torch.testing.assert_close(m.encode_image(x), model.encode_image(x), atol=1e-5, rtol=0)
            torch.testing.assert_close(m.encode_text(ids), model.encode_text(ids), atol=1e-5, rtol=0)
        assert model.encode_text(ids).std() > 0.1  # not vacuous: features of perturbed weights
    assert theirs.logit_scale.item() == pytest.approx(model.logit_scale.item())
    assert (theirs.logit_bias is None) == (loss == "clip") == (ours.logit_bias is None)
    if loss == "siglip":
        assert float(ours.logit_bias) == pytest.approx(float(model.logit_bias))
    assert ours.visual.pretrained_cfg["interpolation"] == "bicubic"
    from vit.models.checkpoint import CheckpointError, load_checkpoint

    with pytest.raises(CheckpointError, match=r"is a CLIP model \(a contrastive run's\); score it zero-shot with "
                                              r"--clip local-dir:.* --classes \.\.\. \(demo\.py: --labels "
                                              r"\.\.\.\), or load it with vit\.create_clip_model\.$"):
        load_checkpoint(tmp_path / "m")


def test_the_model_line_names_both_towers():
    from vit.train.console import describe_model

    line = describe_model(_tiny_clip(), "vit_base_patch16_clip_224")
    assert line.startswith("vit_base_patch16_clip_224 as built: 3 channels (RGB), width 32, depth 2, 4 heads, patch 8")
    assert "params image tower; text tower width 16, depth 2, context 8; both projected to 24; " in line, line


def test_a_tower_open_clip_cannot_hold_is_refused_in_one_sentence(tmp_path):
    model = _tiny_clip()
    model.visual = vit.create_model("vit_base_patch16_clip_224", img_size=32, patch_size=8, embed_dim=32, depth=1,
                                    num_heads=4, num_classes=24, reg_tokens=2)
    with pytest.raises(ValueError, match=r"^this CLIP model's image tower .*, which open_clip's repository layout "
                                         r"cannot hold; save its towers with torch\.save"):
        save_clip_model(model, tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_a_run_from_pretrained_weights_starts_from_them(tmp_path):
    """contrastive.pretrained: the captions are tokenised with the model's own tokenizer, the images at its size
    and statistics, and the model train.py builds holds its weights."""
    from vit.cli.training import train_config, train_model
    from vit.data import build_datasets

    saved = _tiny_clip()
    save_clip_model(saved, tmp_path / "m", preprocess=dict(mean=[0.4] * 3, std=[0.2] * 3, interpolation="bicubic"))
    data = make_image_folder(tmp_path / "data", classes=("circle", "square"), n_train=4, n_val=2)
    (tmp_path / "c.yaml").write_text(f"data: {{dataset: captions, root: {data}, batch_size: 2}}\n"
                                     f"contrastive: {{loss: siglip, pretrained: 'local-dir:{tmp_path / 'm'}', "
                                     "template: 'a red {}'}\n")
    cfg, _ = train_config(str(tmp_path / "c.yaml"), [f"--run.output_dir={tmp_path}"])
    assert cfg.model.img_size == 32 and cfg.aug.mean == [0.4] * 3 and cfg.aug.interpolation == "bicubic"
    train, val, classes = build_datasets(cfg)
    assert train[0][1].tolist() == saved.tokenizer(["a red circle"])[0].tolist() and classes == ["circle", "square"]
    model = train_model(cfg, len(classes), train.tokenizer)
    assert model.training
    for k, v in saved.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    with pytest.raises(ConfigError, match=r"is a siglip model \(it has a logit_bias\); set contrastive.loss=siglip\.$"):
        train_model(dataclasses.replace(cfg, contrastive=dataclasses.replace(cfg.contrastive, loss="clip")), 2,
                    train.tokenizer)


def _pretrained_folder(folder, source: str, loss: str):
    """A tiny CLIP (loss 'clip') or SigLIP folder to fine-tune from, written by save_clip_model ('ours') or with
    the weights of open_clip's own model of the same config ('open_clip')."""
    ours = _tiny_clip(loss)
    save_clip_model(ours, folder)
    if source == "open_clip":
        open_clip = pytest.importorskip("open_clip")
        cfg = json.loads((folder / "open_clip_config.json").read_text())["model_cfg"]
        theirs = perturb(open_clip.model.CLIP(**cfg))
        save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, folder / "open_clip_model.safetensors")
    return folder


@pytest.mark.parametrize("source, loss", [("ours", "siglip"), pytest.param("ours", "clip", marks=pytest.mark.slow),
                                          pytest.param("open_clip", "siglip", marks=pytest.mark.slow)])
def test_a_fine_tune_from_pretrained_weights_saves_and_reloads(tmp_path, source, loss):
    """contrastive.pretrained: the run trains and saves (the image head's zero bias, filled in by the loader for
    open_clip's bias-free `visual.proj`, learned a value open_clip's layout cannot hold, so the first save was
    refused); its last/ and best/ load through create_clip_model with the trained weights' features."""
    from helpers import import_script

    from vit.config import read_yaml
    from vit.models.clip_build import build_clip_model

    start = _pretrained_folder(tmp_path / "m", source, loss)
    data = make_image_folder(tmp_path / "data", classes=("circle", "square"), n_train=2, n_val=1)
    import_script("train").main([*TINY, "--data.dataset=captions", f"--data.root={data}", "--data.batch_size=2",
                                 f"--contrastive.loss={loss}", f"--contrastive.pretrained=local-dir:{start}",
                                 "--contrastive.template=a red {}", "--optim.lr=0.05", "--run.epochs=1",
                                 f"--run.output_dir={tmp_path}", "--run.name=r"])
    run = tmp_path / "r"
    trained = build_clip_model(from_dict(read_yaml(run / "config.yaml")), None).eval()
    before = {k: v.clone() for k, v in trained.state_dict().items()}
    trained.load_state_dict(load_file(str(sorted((run / "state").glob("step-*"))[-1] / "model.safetensors")))
    assert not torch.equal(before["visual.head.weight"], trained.state_dict()["visual.head.weight"])  # it trained
    x = torch.randn(2, 3, 32, 32)
    ids = trained.tokenizer(["a red circle", "a red square"])
    for saved in ("last", "best"):
        model = vit.create_clip_model(f"local-dir:{run / saved}")
        with torch.no_grad():
            torch.testing.assert_close(model.encode_image(x), trained.encode_image(x), atol=1e-6, rtol=0)
            torch.testing.assert_close(model.encode_text(ids), trained.encode_text(ids), atol=1e-6, rtol=0)
        assert model.logit_scale.item() == trained.logit_scale.item()
        assert (model.logit_bias is None) == (loss == "clip")


def test_retrieval_counts_repeated_captions_once():
    from vit.train.tasks.contrastive import retrieval_top1

    ids = torch.tensor([[1, 5, 2], [1, 6, 2], [1, 5, 2], [1, 7, 2]])  # captions A, B, A, C
    text = F.normalize(torch.tensor([[1.0, 0, 0], [0, 1, 0], [1, 0, 0], [0, 0, 1]]), dim=-1)
    image = F.normalize(torch.tensor([[1.0, 0.1, 0], [0.9, 0.2, 0], [1.0, 0, 0.1], [0, 0.1, 1]]), dim=-1)
    # image 0 -> A (right), 1 -> A (wrong, its caption is B), 2 -> A (right: the same caption as row 0's), 3 -> C
    assert retrieval_top1(image, text, ids) == 0.75


@pytest.mark.slow
def test_a_contrastive_run_resumes_exactly_and_reloads_by_name(tmp_path):
    """SigLIP on class-folder captions: stopped mid-epoch and resumed, the run ends with the uninterrupted run's
    weights and losses; its last/ loads through create_clip_model with the training state's features."""
    data = make_image_folder(tmp_path / "data", n_train=8, n_val=3)
    common = [*TINY, "--model.name=vit_base_patch16_clip_224", "--data.dataset=captions", f"--data.root={data}",
              "--contrastive.loss=siglip", "--contrastive.embed_dim=16", "--contrastive.text_width=16",
              "--contrastive.text_heads=2", "--contrastive.context_length=8",
              "--aug.label_smoothing=0", "--run.epochs=2", f"--run.output_dir={tmp_path}"]
    a = run_script("train.py", *common, "--run.name=a")
    assert a.returncode == 0, a.stderr[-3000:]
    assert "val retrieval top-1" in a.stdout
    b1 = run_script("train.py", *common, "--run.name=b", "--run.max_steps=4")  # 3 steps per epoch: mid-epoch 2
    assert b1.returncode == 0, b1.stderr[-3000:]
    b2 = run_script("train.py", *common, "--run.name=b", "--resume=auto")
    assert b2.returncode == 0 and "resumed from" in b2.stdout, b2.stderr[-3000:]
    wa, wb = (load_file(str(tmp_path / r / "last" / "open_clip_model.safetensors")) for r in "ab")
    assert wa.keys() == wb.keys() and "logit_bias" in wa
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    import csv

    def losses(run):  # the epochs' rows: step, epoch, lr, train loss, val loss, retrieval (not the wall-clock speed)
        with open(tmp_path / run / "metrics.csv") as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) % 3 == 0]
        return [[r[k] for k in ("step", "epoch", "lr", "train_loss", "val_loss", "val_acc1")] for r in rows]

    assert losses("a") == losses("b") and len(losses("a")) == 2

    from vit.config import read_yaml
    from vit.models.clip_build import build_clip_model

    model = vit.create_clip_model(f"local-dir:{tmp_path / 'a' / 'last'}")
    cfg = from_dict(read_yaml(tmp_path / "a" / "last" / "config.yaml"))
    trained = build_clip_model(cfg, model.tokenizer)
    state = sorted((tmp_path / "a" / "state").glob("step-*"))[-1]
    trained.load_state_dict(load_file(str(state / "model.safetensors")))
    trained.eval()
    x, ids = torch.randn(2, 3, 32, 32), model.tokenizer(["a photo of a cat.", "a photo of a fox."])
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(x), trained.encode_image(x), atol=1e-6, rtol=0)
        torch.testing.assert_close(model.encode_text(ids), trained.encode_text(ids), atol=1e-6, rtol=0)
    assert model.logit_bias.item() == trained.logit_bias.item() != -10.0  # learned, and kept


def test_a_model_open_clips_layout_cannot_hold_is_refused_before_training(tmp_path):
    """A captions run on a plain ViT name resized (vit_tiny at width 32: not the timm model open_clip would name)
    could train but never save; it stops before the first step in one sentence, with no checkpoint expected."""
    data = make_image_folder(tmp_path / "data", n_train=4, n_val=2, size=32)
    r = run_script("train.py", "--data.dataset=captions", f"--data.root={data}", "--model.img_size=32",
                   "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=2", "--model.num_heads=2",
                   "--data.batch_size=4", "--data.num_workers=0", "--run.epochs=1", "--contrastive.text_width=16",
                   "--contrastive.text_heads=2", f"--run.output_dir={tmp_path / 'runs'}", "--run.name=c")
    assert r.returncode == 2 and "which open_clip's repository layout cannot hold" in r.stderr, r.stderr[-2000:]
    assert "step 1/" not in r.stdout and not (tmp_path / "runs" / "c" / "metrics.csv").exists()
