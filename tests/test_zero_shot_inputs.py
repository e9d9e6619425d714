"""--classes and --templates of predict.py / evaluate.py --clip (vit.eval.zero_shot.class_names, read_templates):
a value that looks like a path is a readable folder or regular file or is refused in one sentence (a typo, a
FIFO, a device never become one class at probability 1.0, and are never opened for reading forever); long text
is text; one class is refused for CLIP's softmax and scored for SigLIP's sigmoid. Oracles: the same names passed
as a list (which never touches the file system) and open_clip's zero-shot classifier."""

import json
import os
import re
import threading

import pytest
import test_clip
import torch
from helpers import import_script, make_image_folder

import vit

open_clip = pytest.importorskip("open_clip")
cache, hub = test_clip.cache, test_clip.hub  # fixtures: test_clip.py's tiny models in a hub cache, read offline

LONG = ",".join(f"class number {i}" for i in range(30))  # 449 bytes: longer than a file name can be


@pytest.fixture
def fifo(tmp_path):
    """A FIFO whose writer end is held open by a thread: code that wrongly opens it for reading gets end-of-file
    (and the test fails on its message) instead of blocking the suite forever."""
    path = tmp_path / "fifo.txt"
    os.mkfifo(path)
    writer = threading.Thread(target=lambda: open(path, "wb").close(), daemon=True)
    writer.start()
    yield path
    if writer.is_alive():  # nothing read it, as it should be: release the writer's open
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    writer.join(timeout=10)


def _predict(tmp_path, classes, *extra, clip="oc_clip"):
    root = make_image_folder(tmp_path / "data", classes=("cat", "dog"), n_train=0, n_val=1)
    return import_script("predict").main(["--clip", f"hf-hub:org/{clip}", "--classes", classes, str(root / "val"),
                                          "--out", str(tmp_path / "out"), *extra])


def test_a_path_that_is_no_readable_file_or_folder_is_refused(hub, tmp_path, fifo):
    """A typo, a bare name.txt, a FIFO and a device: one sentence each from predict.py, before any prediction;
    the same loader refuses them for evaluate.py."""
    from vit.data.base import DataError

    cases = {str(tmp_path / "typo" / "names.txt"): "no file or folder at", "names.txt": "no file or folder at",
             str(fifo): "is a FIFO", "/dev/zero": "is a device", f"{tmp_path}/{'x' * 300}": "File name too long"}
    for value, words in cases.items():
        with pytest.raises(ValueError, match=words) as e:
            _predict(tmp_path, value)
        assert "\n" not in str(e.value) and not (tmp_path / "out" / "predictions.csv").exists()
    root = make_image_folder(tmp_path / "eval", classes=("cat", "dog"), n_train=0, n_val=1)
    with pytest.raises(DataError, match="no file or folder at"):
        import_script("evaluate").main(["--clip", "hf-hub:org/oc_clip", "--classes", "cat/dog", "--data-dir",
                                        str(root / "val"), "--out", str(tmp_path / "eval-out")])
    with pytest.raises(ValueError, match="is a FIFO"):
        import_script("evaluate").main(["--clip", "hf-hub:org/oc_clip", "--classes", str(fifo), "--data-dir",
                                        str(root / "val"), "--out", str(tmp_path / "eval-out")])


def test_files_folders_and_names_are_read_as_before(tmp_path, monkeypatch):
    """The rule's other side: a folder, a file of names, a bare name of an existing folder, names with commas;
    a .json list is read as JSON (a checkpoint's classes.json), not line by line."""
    from vit.eval.zero_shot import class_names

    root = make_image_folder(tmp_path / "data", classes=("cat", "dog"), n_train=0, n_val=1)
    (tmp_path / "names.txt").write_text("\ufeffred square\n\nblue circle\n")
    (tmp_path / "classes.json").write_text(json.dumps(["cat", "a/b"], indent=1))
    assert class_names(str(root / "val")) == class_names(root / "val") == ["cat", "dog"]
    assert class_names(str(tmp_path / "names.txt")) == ["red square", "blue circle"]
    assert class_names(str(tmp_path / "classes.json")) == ["cat", "a/b"]
    monkeypatch.chdir(root)
    assert class_names("val") == ["cat", "dog"] and class_names("cat, dog ,fox") == ["cat", "dog", "fox"]
    assert class_names(LONG) == [f"class number {i}" for i in range(30)]


def test_long_class_lists_are_text(hub, tmp_path):
    """Over 255 bytes of names: the classes, as the same names passed as a list give them (predict.py and
    evaluate.py, with and without --data-dir)."""
    import csv

    from vit.config import ConfigError
    from vit.eval.zero_shot import evaluate_zero_shot, predict_zero_shot

    names = LONG.split(",")
    assert _predict(tmp_path, LONG, "--topk", "30") == 0
    rows = list(csv.DictReader((tmp_path / "out" / "predictions.csv").open()))
    paths = sorted((tmp_path / "data" / "val").rglob("*.png"))
    classes, probs, _ = predict_zero_shot("hf-hub:org/oc_clip", names, paths)
    assert classes == names and len(rows) == len(paths) == 2
    for row, p in zip(rows, probs):
        got = {row[f"pred{k}_name"]: float(row[f"prob{k}"]) for k in range(1, 31)}
        assert got == pytest.approx(dict(zip(names, p.tolist())), abs=1e-6)
    evaluate = import_script("evaluate")
    classes = LONG + ",cat,dog"
    assert evaluate.main(["--clip", "hf-hub:org/oc_clip", "--classes", classes, "--data-dir",
                          str(tmp_path / "data" / "val"), "--out", str(tmp_path / "eval")]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    expected = evaluate_zero_shot("hf-hub:org/oc_clip", classes.split(","), tmp_path / "data" / "val")
    assert metrics["classes"] == classes.split(",") and metrics["accuracy"] == pytest.approx(expected["accuracy"])
    with pytest.raises(ConfigError, match="pass --data-dir"):
        evaluate.main(["--clip", "hf-hub:org/oc_clip", "--classes", LONG, "--out", str(tmp_path / "eval2")])


def test_one_class_is_refused_for_clip_and_scored_for_siglip(hub, tmp_path):
    """CLIP's softmax over one class is 1.0 for every image: refused. SigLIP's sigmoid scores one class on its
    own: its probability equals open_clip's sigmoid(scale * image @ w + bias)."""
    from open_clip.zero_shot_classifier import build_zero_shot_classifier

    from vit.data.base import DataError
    from vit.eval.zero_shot import DEFAULT_TEMPLATES, ZeroShotClassifier

    with pytest.raises(DataError, match="softmax over 1 class") as e:
        _predict(tmp_path, "cat")
    assert "\n" not in str(e.value) and not (tmp_path / "out" / "predictions.csv").exists()
    ref, model = hub["oc_siglip"], vit.create_clip_model("hf-hub:org/oc_siglip")
    text_cfg = test_clip.OPEN_CLIP["oc_siglip"][1]["text_cfg"]
    length, vocab = text_cfg["context_length"], text_cfg["vocab_size"]

    def tok(texts):  # ids per caption, the same for both libraries (the repository has no tokenizer.json)
        return torch.stack([torch.randint(1, vocab, (length,), generator=torch.Generator().manual_seed(len(t) * 7919
                            + sum(map(ord, t)))) for t in texts])

    clf = ZeroShotClassifier(model, ["scratched part"], tokenizer=tok)
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        w = build_zero_shot_classifier(ref, tok, ["scratched part"], DEFAULT_TEMPLATES)  # (E, 1)
        expected = (ref.logit_scale.exp() * ref.encode_image(images, normalize=True) @ w + ref.logit_bias).sigmoid()
        probs = clf.probabilities(clf(images))
    torch.testing.assert_close(probs, expected, atol=1e-6, rtol=0)
    assert expected.std() > 1e-4  # a score per image, not a constant


def test_templates_that_are_no_regular_file_are_refused_without_reading(tmp_path, fifo):
    """A FIFO (would block forever), /dev/zero (would fill memory), a file over MAX_LIST_BYTES: one sentence each,
    nothing read; a regular file reads as before."""
    from vit.eval.zero_shot import read_templates

    for path, words in ((fifo, "is a FIFO"), ("/dev/zero", "is a device")):
        with pytest.raises(ValueError, match=words) as e:
            read_templates(path)
        assert str(e.value).startswith("the prompt templates file") and "\n" not in str(e.value)
    from vit.eval.zero_shot import MAX_LIST_BYTES

    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(MAX_LIST_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ValueError, match="larger than"):
        read_templates(big)
    (tmp_path / "t.txt").write_text("a photo of a {}.\n\n  art of the {}  \n")
    assert read_templates(tmp_path / "t.txt") == ["a photo of a {}.", "art of the {}"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_templates(tmp_path / "missing.txt")


@pytest.mark.parametrize("line", ["a {} of {x}", "{}{:>9}", "a {} of {1}", "a { photo of {}", "{0.__class__}",
                                  "a photo of {!r}"])
def test_a_template_str_format_reads_otherwise_is_one_sentence(tmp_path, line):
    """A named field was a KeyError traceback, a second automatic field an IndexError, {1} or a stray brace
    str.format's own words: one plain {} is the one thing a template may hold, in a file or passed as a list;
    escaped braces are text, as str.format reads them."""
    from vit.data.base import DataError
    from vit.eval.zero_shot import ZeroShotClassifier, read_templates

    (tmp_path / "t.txt").write_text(f"a photo of a {{}}.\n{line}\n")
    with pytest.raises(DataError, match=r"every line must be a prompt with one \{\}.*this one is not: " +
                       re.escape(repr(line))):
        read_templates(tmp_path / "t.txt")
    with pytest.raises(DataError, match=r"a prompt template needs one \{\}.*not " + re.escape(repr(line))):
        ZeroShotClassifier(torch.nn.Linear(1, 1), ["cat", "dog"], [line], tokenizer=lambda t: None)
    (tmp_path / "ok.txt").write_text("a {{curly}} photo of a {}.\n")
    assert read_templates(tmp_path / "ok.txt") == ["a {{curly}} photo of a {}."]


@pytest.mark.parametrize("classes", ["Cat,cat,dog", "caf\u00e9,cafe\u0301,dog", "red  car,red car,dog",
                                     "a scratched metal part with a long description of type alpha,"
                                     "a scratched metal part with a long description of type beta"])
def test_classes_the_tokenizer_makes_one_are_refused_naming_both(hub, tmp_path, classes):
    """Names that differ only in case, in Unicode normal form, in spaces, or past the 16-token context were
    scored as two classes with one weight (the second never chosen, exit 0): their token ids are equal in every
    prompt, as open_clip's tokenizer makes them; refused naming both. Names the tokenizer tells apart still run."""
    from vit.data.base import DataError

    tok = open_clip.tokenizer.SimpleTokenizer(context_length=16)
    a, b = classes.split(",")[:2]
    assert torch.equal(tok([f"a photo of a {a}."]), tok([f"a photo of a {b}."]))  # the oracle: one sequence
    with pytest.raises(DataError, match=f"the classes {re.escape(repr(a[:60]))} and {re.escape(repr(b[:60]))} are "
                                        "the same tokens in every prompt") as e:
        _predict(tmp_path, classes)
    assert "\n" not in str(e.value) and not (tmp_path / "out" / "predictions.csv").exists()
    assert _predict(tmp_path, "cat,caf\u00e9,red car") == 0


def test_a_json_class_list_nested_past_the_stack_is_one_sentence(tmp_path):
    """100000 nested lists in a .json class list were a RecursionError traceback."""
    from vit.data.base import DataError
    from vit.eval.zero_shot import class_names

    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(DataError, match=r"deep.json is not JSON \(nested too deep\)"):
        class_names(str(tmp_path / "deep.json"))
