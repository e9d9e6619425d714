"""demo.py: the page's top-5 and rollout overlay against the model run directly, driven in headless chromium."""

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT
from PIL import Image

import vit

CLASSES = ["cat", "dog", "fox", "owl", "yak", "elk"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained tiny RGB model saved as train.py saves one: the oracle below runs the same weights."""
    from vit.config import load_config
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    cfg = load_config(None, ["--data.dataset=synthetic", "--model.img_size=32", "--model.patch_size=8",
                             "--model.embed_dim=32", "--model.depth=2", "--model.num_heads=2"])
    torch.manual_seed(0)
    model = build_model(cfg, len(CLASSES))
    with torch.no_grad():  # a head that tells the classes apart (an untrained head gives ~uniform probabilities)
        model.head.weight.mul_(40)
    folder = tmp_path_factory.mktemp("demo") / "best"
    save_checkpoint(folder, model, cfg, CLASSES, dict(val_acc1=0.5, epoch=1, step=3))
    return folder


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """A 48x40 RGB picture: a bright square on a dark, noisy ground."""
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 60, size=(40, 48, 3)).astype(np.uint8)
    arr[8:24, 24:40] = (250, 200, 40)
    path = tmp_path_factory.mktemp("img") / "square.png"
    Image.fromarray(arr).save(path)
    return path


def oracle(checkpoint, path):
    """Top-5 (label, prob) and the rollout map, computed here from the checkpoint with the library's pieces."""
    from vit.data.transforms import build_transform
    from vit.explain.rollout import attention_rollout, to_grid
    from vit.models.checkpoint import load_checkpoint

    model, cfg, classes, _ = load_checkpoint(checkpoint)
    x = build_transform(cfg.aug, cfg.model.img_size, train=False).load(path)[None]
    with torch.no_grad():
        logits = model(x)  # the fused path: the page's numbers come from the explicit one
        _, attns = model.forward_with_attention(x)
    grid = to_grid(attention_rollout(attns), model.grid_size((32, 32)))[0].numpy()
    p, i = logits.softmax(1)[0].topk(5)
    return [(classes[int(k)], float(v)) for v, k in zip(p, i)], grid


def decode_overlay(url):
    assert url.startswith("data:image/png;base64,")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))


def check_overlay(over, grid):
    """224x224 (32 px x 7), not one colour, and the map's hottest patch redder than its coldest (jet: red high)."""
    assert over.shape == (224, 224, 3)
    assert len(np.unique(over.reshape(-1, 3), axis=0)) > 50
    cell = 224 // grid.shape[0]

    def redness(idx):
        r, c = np.unravel_index(idx, grid.shape)
        patch = over[r * cell + cell // 4:(r + 1) * cell - cell // 4, c * cell + cell // 4:(c + 1) * cell - cell // 4]
        return float(patch[..., 0].mean()) - float(patch[..., 2].mean())

    assert redness(grid.argmax()) > redness(grid.argmin()) + 40


def test_predict_gives_the_models_top5_and_the_rollout_overlay(checkpoint, image):
    from vit.explain.demo import Demo

    answer = Demo(checkpoint).predict(image.read_bytes(), image.name)
    want, grid = oracle(checkpoint, image)
    assert [t["label"] for t in answer["top"]] == [c for c, _ in want]
    np.testing.assert_allclose([t["prob"] for t in answer["top"]], [p for _, p in want], rtol=1e-4, atol=1e-6)
    assert answer["top"][0]["prob"] > 0.3  # the guard: a near-uniform answer would make the order meaningless
    assert answer["size"] == [224, 224]
    check_overlay(decode_overlay(answer["overlay"]), grid)


def test_a_multi_label_checkpoint_shows_each_class_sigmoid(tmp_path, image):
    """A model trained on label sets: the page's probabilities are its sigmoids, as predict.py's (a softmax
    summed them to 1 and ranked shapes that are all present as if one excluded the others)."""
    from vit.config import load_config
    from vit.data.transforms import build_transform
    from vit.explain.demo import Demo
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    cfg = load_config(None, ["--data.dataset=imagefolder", "--data.root=d", "--data.labels_file=l.csv",
                             "--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=1",
                             "--model.num_heads=2"])
    torch.manual_seed(0)
    model = build_model(cfg, 4).eval()
    save_checkpoint(tmp_path / "best", model, cfg, list("abcd"), {"threshold": 0.5})
    answer = Demo(tmp_path / "best").predict(image.read_bytes(), image.name)
    with torch.no_grad():
        want = model(build_transform(cfg.aug, 32, train=False).load(image)[None]).sigmoid()[0]
    got = {t["label"]: t["prob"] for t in answer["top"]}
    np.testing.assert_allclose([got[c] for c in "abcd"], want.numpy(), rtol=1e-4, atol=1e-6)
    assert abs(sum(got.values()) - 1) > 0.1  # the guard: four sigmoids near 0.5 are no softmax


def _post(url, data):
    req = urllib.request.Request(url, data=data, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_file_that_is_not_an_image_is_one_sentence_and_the_server_keeps_serving(checkpoint, image):
    from vit.explain.demo import Demo, make_server

    server = make_server(Demo(checkpoint), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        status, answer = _post(url + "/predict", b"this is not a picture")
        assert status == 400 and answer["error"].startswith("cannot decode image the upload")
        assert answer["error"].count(". ") == 0 and answer["error"].endswith(".")
        status, answer = _post(url + "/predict", image.read_bytes())
        assert status == 200 and len(answer["top"]) == 5
        with urllib.request.urlopen(url + "/", timeout=30) as r:
            page = r.read().decode()
        assert '<input type="file"' in page and "best: ViT, 32x32 input, 8-pixel patches, width 32" in page
    finally:
        server.shutdown()
        server.server_close()


def _browser(profile: Path):
    """Debian's chromium through its chromedriver, headless; Selenium Manager is never asked to download."""
    if not (shutil.which("chromium") and os.path.exists("/usr/bin/chromedriver")):
        pytest.skip("no chromium/chromedriver (Debian: apt-get install chromium chromium-driver; `make test` does)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev extra")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1024,720"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


@pytest.mark.slow
def test_the_page_in_a_headless_browser_shows_the_top5_and_the_overlay(checkpoint, image, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "demo.py"), "--checkpoint", str(checkpoint), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    driver = None
    try:
        line = proc.stdout.readline()  # "serving ... on http://127.0.0.1:PORT/ (Ctrl-C stops)"
        assert "http://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.split(" on ", 1)[1].split()[0]
        driver = _browser(tmp_path / "profile")
        driver.get(url)
        for img in ("input", "overlay"):  # no broken-image icons before an upload
            assert not driver.find_element(By.ID, img).is_displayed()
        driver.find_element(By.ID, "file").send_keys(str(image))  # what choosing the file in the dialog does
        wait = WebDriverWait(driver, 60)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#top5 li")) == 5)
        wait.until(lambda d: d.execute_script("const i = document.getElementById('overlay');"
                                              "return i.complete && i.naturalWidth > 0;"))
        want, grid = oracle(checkpoint, image)
        shown = [(li.find_element(By.CLASS_NAME, "label").text, li.find_element(By.CLASS_NAME, "prob").text)
                 for li in driver.find_elements(By.CSS_SELECTOR, "#top5 li")]
        assert [c for c, _ in shown] == [c for c, _ in want]
        for (_, text), (_, p) in zip(shown, want):  # one decimal, as the page rounds it
            assert text.endswith("%") and abs(float(text[:-1]) - 100 * p) <= 0.05 + 1e-4, (text, p)
        size = driver.execute_script("const i = document.getElementById('overlay');"
                                     "return [i.naturalWidth, i.naturalHeight, i.width];")
        assert size == [224, 224, 256]  # drawn at 256 CSS pixels
        check_overlay(decode_overlay(driver.find_element(By.ID, "overlay").get_attribute("src")), grid)
        assert driver.find_element(By.ID, "status").text == ""
        driver.save_screenshot(str(tmp_path / "demo.png"))
        assert Image.open(tmp_path / "demo.png").size[0] > 500
    finally:
        if driver is not None:
            driver.quit()
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def served(checkpoint):
    """The demo served in this process on a free port, with a short socket timeout; its request threads are
    joined on close, so whatever a handler printed has been printed when the test reads stderr."""
    from vit.explain.demo import Demo, make_server

    server = make_server(Demo(checkpoint), "127.0.0.1", 0, timeout=0.5)
    server.daemon_threads = False  # server_close() joins the request threads
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def _raw(server, head: bytes, body: bytes = b"", reset: bool = False) -> bytes:
    """Send `head` and `body` on a raw socket and read the answer until the server closes (b'' after a reset)."""
    import socket
    import struct

    with socket.create_connection(server.server_address[:2], timeout=20) as s:
        s.sendall(head + body)
        if reset:  # the client vanishes: close with an RST, as a closed browser tab does
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return b""
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:  # a server that answered before reading our whole body may close so
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def _answer(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _post_head(length: str | None) -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else ""
    return f"POST /predict HTTP/1.1\r\nHost: x\r\n{size}Connection: close\r\n\r\n".encode("latin-1")


@pytest.mark.parametrize("length, status, words", [
    ("-1", 400, "Content-Length header must be a whole number of bytes, got '-1'"),
    ("abc", 400, "Content-Length header must be a whole number of bytes, got 'abc'"),
    ("\u00b2", 400, "Content-Length header must be a whole number of bytes, got '\u00b2'"),  # isdigit(), not int()
    (None, 411, "the upload has no Content-Length header"),
    (str(21 * 2**20), 413, "choose an image under 20 MB"),
])
def test_a_bad_content_length_is_one_sentence_and_nothing_is_read(served, capsys, length, status, words):
    # the body is longer than the 20 MB cap: a server that read it would hang on the missing rest, not answer
    got, answer = _answer(_raw(served, _post_head(length), b"x" * 1000))
    assert got == status and words in answer["error"], answer
    assert answer["error"].endswith(".") and answer["error"].count(". ") == 0
    _, image_answer = _answer(_raw(served, _post_head("21"), b"not an image at all..."))
    assert "cannot decode" in image_answer["error"]  # the server keeps serving
    served.shutdown()
    served.server_close()
    assert "Traceback" not in capsys.readouterr().err


def test_a_body_slower_than_the_socket_timeout_is_answered_408_and_closed(served, capsys):
    # 10 of 100 bytes, then nothing: the server gives up after its timeout (0.5 s here) instead of waiting forever
    got, answer = _answer(_raw(served, _post_head("100"), b"0123456789", reset=False))
    assert got == 408 and answer["error"].startswith("the upload stopped arriving"), answer
    served.shutdown()
    served.server_close()
    assert "Traceback" not in capsys.readouterr().err


def test_a_client_that_disconnects_prints_nothing(served, capsys):
    import socket

    _raw(served, _post_head("100"), b"0123456789", reset=True)  # reset mid-body: the server's read fails
    _raw(served, _post_head("100"), b"0123456789" * 10, reset=True)  # whole request, gone before the answer
    _raw(served, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", reset=True)
    try:  # a write into a closed connection, deterministically: what the handler's wfile.write raises
        raise BrokenPipeError(32, "Broken pipe")
    except BrokenPipeError:
        served.handle_error(socket.socket(), ("127.0.0.1", 1))
    served.shutdown()
    served.server_close()  # joins the request threads
    assert capsys.readouterr().err == ""


def test_the_page_names_the_checkpoint_and_its_architecture_and_the_top_k_it_shows(tmp_path):
    from vit.config import load_config
    from vit.explain.demo import Demo, make_server
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    cfg = load_config(None, ["--data.dataset=synthetic", "--model.img_size=32", "--model.patch_size=8",
                             "--model.embed_dim=128", "--model.depth=2", "--model.num_heads=2"])
    folder = tmp_path / "flowers" / "best"
    save_checkpoint(folder, build_model(cfg, 4), cfg, CLASSES[:4], dict(val_acc1=0.75, epoch=1, step=3))
    demo = Demo(folder)
    assert demo.title() == ("flowers/best: ViT, 32x32 input, 8-pixel patches, width 128, depth 2, 2 heads: "
                            "4 classes, val top-1 75.0%")
    server = make_server(demo, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=30) as r:
            page = r.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert "vit_tiny_patch16_224" not in page and "<b>top-4</b>" in page and "top-5" not in page
    # no broken-image icon before an upload: an img without a source is not displayed
    assert "img:not([src]) { display: none; }" in page
    assert page.count('<img id="input" alt="your image">') == 1 and "src=" not in page.split("<script>")[0]


# --- a CLIP model and labels typed on the page

LABELS = "a red square, a blue circle, a green cat"


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    """A tiny open_clip CLIP in its repository layout with CLIP's BPE tokenizer.json, and the open_clip model."""
    open_clip = pytest.importorskip("open_clip")
    from helpers import perturb
    from safetensors.torch import save_file
    from test_clip import clip_tokenizer_json

    cfg = dict(embed_dim=24, vision_cfg=dict(image_size=32, layers=2, width=32, head_width=8, patch_size=8),
               text_cfg=dict(context_length=16, vocab_size=49408, width=16, heads=2, layers=1))
    torch.manual_seed(0)
    ref = perturb(open_clip.model.CLIP(**cfg))
    folder = tmp_path_factory.mktemp("clip")
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, folder / "open_clip_model.safetensors")
    (folder / "tokenizer.json").write_text(clip_tokenizer_json())
    return folder, ref


def clip_oracle(clip_folder, path, explain):
    """open_clip's zero-shot probabilities (its own classifier builder and tokenizer) and the gradient rollout
    for label `explain` computed here from the image tower's attention maps."""
    import open_clip
    from open_clip.zero_shot_classifier import build_zero_shot_classifier

    from vit.config import AugConfig
    from vit.data.transforms import build_transform
    from vit.eval.zero_shot import DEFAULT_TEMPLATES
    from vit.explain.rollout import gradient_rollout, to_grid

    folder, ref = clip_folder
    labels = [s.strip() for s in LABELS.split(",")]
    model = vit.create_clip_model(f"local-dir:{folder}")
    x = build_transform(AugConfig().resolved(model.visual.pretrained_cfg), 32, train=False).load(path)[None]
    with torch.no_grad():
        weights = build_zero_shot_classifier(ref, open_clip.tokenizer.SimpleTokenizer(context_length=16), labels,
                                             DEFAULT_TEMPLATES)  # (E, C)
        probs = (ref.logit_scale.exp() * ref.encode_image(x, normalize=True) @ weights).softmax(1)[0]
    feats, attns = model.visual.forward_with_attention(x)
    score = (torch.nn.functional.normalize(feats, dim=-1) @ weights)[0, labels.index(explain)]
    grads = torch.autograd.grad(score, attns)
    grid = to_grid(gradient_rollout([a.detach() for a in attns], list(grads)), (4, 4))[0].numpy()
    return {c: float(p) for c, p in zip(labels, probs)}, grid


def test_typed_labels_give_open_clips_probabilities_and_the_rollout_for_the_chosen_label(clip_folder, image):
    from vit.data.base import DataError
    from vit.explain.demo import ClipDemo

    demo = ClipDemo(f"local-dir:{clip_folder[0]}")
    for explain in ("", "a green cat"):
        answer = demo.predict(image.read_bytes(), image.name, labels=LABELS, explain=explain)
        shown = {t["label"]: t["prob"] for t in answer["top"]}
        want, grid = clip_oracle(clip_folder, image, explain or max(shown, key=shown.get))
        assert shown == pytest.approx(want, abs=1e-5) and max(want.values()) - min(want.values()) > 0.01
        assert answer["explained"] == (explain or max(want, key=want.get))
        check_overlay(decode_overlay(answer["overlay"]), grid)
    assert len(demo.classifiers) == 1  # the text side built once for the label set
    with pytest.raises(DataError, match="repeat"):
        demo.predict(image.read_bytes(), labels="cat, cat")
    with pytest.raises(DataError, match="is not one of the labels"):
        demo.predict(image.read_bytes(), labels="cat, dog", explain="fox")


def test_typed_labels_are_text_never_a_file_or_folder(clip_folder, image, tmp_path):
    """Labels that spell a local file or folder (the page may be reachable by others) are the typed text split at
    its commas, through the HTTP handler too, never the file's lines or the folder's subfolders; labels longer
    than a file name can be are text; one label for CLIP's softmax is one sentence (HTTP 400)."""
    from urllib.parse import quote

    from vit.data.base import DataError
    from vit.explain.demo import ClipDemo, make_server

    secret = tmp_path / "secret, notes.txt"  # a comma in the name: split as text, it is two labels
    secret.write_text("private line one\nprivate line two\n")
    folder = tmp_path / "private, photos"
    for sub in ("alice", "bob"):
        (folder / sub).mkdir(parents=True)
    long = ", ".join(f"a photo of object number {i}" for i in range(12))  # 370 bytes: no file name is so long
    demo = ClipDemo(f"local-dir:{clip_folder[0]}")
    server = make_server(demo, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/predict?labels="
        for typed in (str(secret), str(folder), long):
            want = [s.strip() for s in typed.split(",")]
            assert demo.predict(image.read_bytes(), labels=typed)["labels"] == want
            status, answer = _post(url + quote(typed), image.read_bytes())
            assert status == 200 and answer["labels"] == want
        status, answer = _post(url + quote(str(tmp_path / "names.txt")), image.read_bytes())
        assert status == 400 and "softmax over 1 class" in answer["error"] and "\n" not in answer["error"]
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(DataError, match="softmax over 1 class"):  # demo.py --labels: refused at start
        ClipDemo(f"local-dir:{clip_folder[0]}", labels=str(secret.with_name("one")))


# the page's first fetch() answers after the second's; window.staleDone is set once the page has read it
STALE_FIRST = """
const real = window.fetch; let calls = 0;
window.fetch = async (...args) => {
  const r = await real(...args);
  if (calls++ > 0) return r;
  await new Promise(done => setTimeout(done, 1500));
  const read = r.json.bind(r);
  r.json = async () => { const body = await read(); setTimeout(() => { window.staleDone = true; }, 0); return body; };
  return r;
};
"""


@pytest.mark.slow
def test_the_clip_page_in_a_headless_browser_takes_typed_labels(clip_folder, image, tmp_path):
    """demo.py --clip: type labels, choose the file, then choose the label to explain: the page shows open_clip's
    probabilities and redraws the overlay for that label."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "demo.py"), "--clip", f"local-dir:{clip_folder[0]}",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=env)
    driver = None
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, line + proc.stderr.read()
        driver = _browser(tmp_path / "profile")
        driver.get(line.rsplit(" on ", 1)[1].split()[0])
        box = driver.find_element(By.ID, "labels")
        box.clear()
        box.send_keys(LABELS)
        driver.find_element(By.ID, "file").send_keys(str(image))
        wait = WebDriverWait(driver, 60)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#top5 li")) == 3)
        want, _ = clip_oracle(clip_folder, image, "a green cat")
        shown = {li.find_element(By.CLASS_NAME, "label").text: float(li.find_element(By.CLASS_NAME, "prob").text[:-1])
                 for li in driver.find_elements(By.CSS_SELECTOR, "#top5 li")}
        assert shown == pytest.approx({c: 100 * p for c, p in want.items()}, abs=0.05 + 1e-4)
        first = driver.find_element(By.ID, "overlay").get_attribute("src")
        target = min(want, key=want.get)  # not the top-1, whose map is shown first
        Select(driver.find_element(By.ID, "explain")).select_by_value(target)
        wait.until(lambda d: d.find_element(By.ID, "overlay").get_attribute("src") != first)
        _, grid = clip_oracle(clip_folder, image, target)
        check_overlay(decode_overlay(driver.find_element(By.ID, "overlay").get_attribute("src")), grid)
        assert Select(driver.find_element(By.ID, "explain")).first_selected_option.text == target
        # two requests in flight (a label box left as the select is clicked sends one): the older answer, held back
        # here until after the newer one, is dropped, not drawn over it
        shown_now = driver.find_element(By.ID, "overlay").get_attribute("src")
        driver.execute_script(STALE_FIRST + "classify(last); classify(last, arguments[0]);", target)
        wait.until(lambda d: d.execute_script("return window.staleDone === true"))
        assert driver.find_element(By.ID, "overlay").get_attribute("src") == shown_now
        assert Select(driver.find_element(By.ID, "explain")).first_selected_option.text == target
    finally:
        if driver is not None:
            driver.quit()
        proc.terminate()
        proc.wait(timeout=30)
@pytest.fixture(scope="module")
def anomaly_checkpoint(checkpoint, tmp_path_factory):
    """The demo checkpoint with a PatchCore bank (a random one) and a threshold in anomaly/."""
    from vit.eval.anomaly import PatchCore, save_patchcore

    folder = tmp_path_factory.mktemp("demo-anomaly") / "best"
    shutil.copytree(checkpoint, folder)
    torch.manual_seed(1)
    save_patchcore(folder / "anomaly", PatchCore(torch.randn(30, 64), (0, 1), threshold=3.0))  # 2 blocks x width 32
    return folder


def test_an_anomaly_checkpoint_adds_the_score_verdict_and_map(anomaly_checkpoint, checkpoint, image):
    from vit.data.transforms import build_transform
    from vit.eval.anomaly import load_patchcore
    from vit.explain.demo import Demo
    from vit.models.checkpoint import load_checkpoint

    answer = Demo(anomaly_checkpoint).predict(image.read_bytes(), image.name)["anomaly"]
    model, cfg, _, _ = load_checkpoint(anomaly_checkpoint)
    x = build_transform(cfg.aug, 32, train=False).load(image)[None]
    pc = load_patchcore(anomaly_checkpoint / "anomaly")
    score, heat = pc.score(model, x)
    assert answer["score"] == pytest.approx(float(score[0]), rel=1e-6) and answer["threshold"] == 3.0
    assert answer["verdict"] == ("defect" if float(score[0]) >= 3.0 else "good")
    check_overlay(decode_overlay(answer["overlay"]), heat[0].numpy())
    assert "anomaly" not in Demo(checkpoint).predict(image.read_bytes())  # a plain classifier: no anomaly part


def test_a_dinomaly_detector_scores_uploads_as_its_own_scores(checkpoint, image, tmp_path):
    """A Dinomaly model in <checkpoint>/anomaly/: the demo's score and map are the detector's own."""
    from vit.data.transforms import build_transform
    from vit.eval.dinomaly import Dinomaly, save_dinomaly
    from vit.explain.demo import Demo
    from vit.models.checkpoint import load_checkpoint

    folder = tmp_path / "best"
    shutil.copytree(checkpoint, folder)
    torch.manual_seed(0)
    save_dinomaly(folder / "anomaly", det := Dinomaly(32, 2, (0, 1), threshold=0.05))
    answer = Demo(folder).predict(image.read_bytes(), image.name)["anomaly"]
    model, cfg, _, _ = load_checkpoint(folder)
    score, heat = det.score(model.eval(), build_transform(cfg.aug, 32, train=False).load(image)[None])
    assert answer["score"] == pytest.approx(float(score[0]), rel=1e-5) and answer["threshold"] == 0.05
    check_overlay(decode_overlay(answer["overlay"]), heat[0].numpy())


@pytest.mark.slow
def test_the_page_shows_the_anomaly_map_and_verdict_of_an_anomaly_checkpoint(anomaly_checkpoint, image, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from vit.explain.demo import Demo, make_server

    demo = Demo(anomaly_checkpoint)
    want = demo.predict(image.read_bytes())["anomaly"]
    server = make_server(demo, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    driver = None
    try:
        driver = _browser(tmp_path / "profile")
        driver.get(f"http://127.0.0.1:{server.server_address[1]}/")
        assert not driver.find_element(By.ID, "anomaly-fig").is_displayed()
        driver.find_element(By.ID, "file").send_keys(str(image))
        WebDriverWait(driver, 60).until(lambda d: d.execute_script(
            "const i = document.getElementById('anomaly'); return i.complete && i.naturalWidth > 0;"))
        assert driver.find_element(By.ID, "verdict").text == (f"anomaly score {want['score']:.3f}: {want['verdict']} "
                                                              "(threshold 3.000)")
        assert driver.find_element(By.ID, "anomaly").get_attribute("src") == want["overlay"]
    finally:
        if driver is not None:
            driver.quit()
        server.shutdown()
        server.server_close()


def test_a_hybrid_checkpoint_is_described_by_its_tokens_and_its_overlay_follows_the_model_grid(tmp_path, image):
    """A hybrid's patch_size (8) is not what a token covers (its stem's stride 4 times 8): the title said
    '8-pixel patches'."""
    from vit.config import load_config
    from vit.explain.demo import Demo
    from vit.explain.rollout import attention_rollout, to_grid
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    cfg = load_config(None, ["--data.dataset=synthetic", "--model.name=vit_tiny_r_s16_p8_224", "--model.img_size=64",
                             "--model.embed_dim=32", "--model.depth=2", "--model.num_heads=2"])
    torch.manual_seed(0)
    model = build_model(cfg, 4)
    folder = tmp_path / "hybrid" / "best"
    save_checkpoint(folder, model, cfg, CLASSES[:4], dict(val_acc1=0.5, epoch=1, step=3))
    demo = Demo(folder)
    assert demo.title().startswith("hybrid/best: ViT, 64x64 input, a resnetv2 stem, 32-pixel tokens, width 32")
    answer = demo.predict(image.read_bytes(), image.name)
    assert answer["size"] == [256, 256]  # 64 pixels drawn 4x: at least DISPLAY wide
    x = demo.transform.load(image)[None]
    with torch.no_grad():
        _, attns = demo.model.forward_with_attention(x)
    grid = to_grid(attention_rollout(attns), demo.model.grid_size((64, 64)))[0].numpy()
    assert grid.shape == (2, 2)
    over = decode_overlay(answer["overlay"])
    cell = 128  # each token's 32 pixels drawn 4x
    red = [[float(over[r * cell + 32:(r + 1) * cell - 32, c * cell + 32:(c + 1) * cell - 32, 0].mean()
                  - over[r * cell + 32:(r + 1) * cell - 32, c * cell + 32:(c + 1) * cell - 32, 2].mean())
            for c in range(2)] for r in range(2)]
    assert np.unravel_index(np.argmax(red), (2, 2)) == np.unravel_index(grid.argmax(), grid.shape)


def test_too_many_labels_and_too_long_a_request_are_one_json_sentence(clip_folder, image):
    """1000 typed labels were all encoded under the lock every page waits on (no cap); a request line over
    http.server's 64 KiB (10,000 labels) was answered with http.server's HTML page, which the page's fetch() cannot
    read as JSON. Both are one sentence, and the server keeps serving."""
    from urllib.parse import quote

    from vit.data.base import DataError
    from vit.explain.demo import MAX_LABELS, ClipDemo, make_server

    demo = ClipDemo(f"local-dir:{clip_folder[0]}")
    with pytest.raises(DataError, match=rf"^{MAX_LABELS + 1} labels are more than the page takes \({MAX_LABELS}\); "
                                        r"give fewer, or score a longer list with evaluate\.py --classes FILE\.$"):
        demo.classifier(",".join(f"l{i}" for i in range(MAX_LABELS + 1)))
    assert len(demo.classifier(",".join(f"l{i}" for i in range(MAX_LABELS))).classes) == MAX_LABELS
    server = make_server(demo, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/predict?labels="
        status, answer = _post(url + quote(",".join(map(str, range(10_000)))), image.read_bytes())
        assert status == 414 and answer["error"].startswith("the request is longer than 64 KiB (its labels?)")
        status, answer = _post(url + quote(",".join(f"l{i}" for i in range(1000))), image.read_bytes())
        assert status == 400 and answer["error"].startswith("1000 labels are more than the page takes")
        status, answer = _post(url + quote("a cat, a dog"), image.read_bytes())
        assert status == 200 and answer["labels"] == ["a cat", "a dog"]
    finally:
        server.shutdown()
        server.server_close()


def test_an_address_it_cannot_listen_on_names_the_option_to_change(clip_folder):
    """A host this machine cannot resolve said 'pass another --port'."""
    import socket

    from helpers import import_script

    from vit.config import ConfigError

    script = import_script("demo")
    with pytest.raises(ConfigError, match=r"^cannot listen on 256\.1\.1\.1:0 \(.*\); pass another --host\.$"):
        script.main(["--clip", f"local-dir:{clip_folder[0]}", "--host", "256.1.1.1", "--port", "0"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^cannot listen on 127\.0\.0\.1:{port} \(.*\); pass another --port\.$"):
            script.main(["--clip", f"local-dir:{clip_folder[0]}", "--port", str(port)])


def test_a_naflex_checkpoint_with_a_bank_reads_each_image_at_its_own_aspect_ratio(tmp_path):
    """A data.naflex checkpoint's page squashed every upload to a square, and with a PatchCore bank crashed on its
    list of maps ('list' object has no attribute 'float'). Its numbers are now the model's on the image's own
    NaFlex batch, the overlay on its own grid, drawn at least DISPLAY pixels on its longer side."""
    from helpers import import_script

    from vit.config import load_config
    from vit.data.datasets import image_transform
    from vit.data.naflex import collate_naflex
    from vit.eval.anomaly import find_patchcore
    from vit.explain.demo import DISPLAY, Demo
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    cfg = load_config(None, ["--model.img_size=32", "--model.patch_size=8", "--model.embed_dim=32", "--model.depth=2",
                             "--model.num_heads=2", "--data.naflex={max_num_patches: 16}"])
    torch.manual_seed(0)
    model = build_model(cfg, 2).eval()
    save_checkpoint(tmp_path / "ck", model, cfg, ["a", "b"])
    rng = np.random.default_rng(0)
    paths = []
    for i, (h, w) in enumerate([(8, 300), (300, 8), (40, 40)]):
        paths.append(tmp_path / "good" / f"{i}.png")
        paths[-1].parent.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    assert import_script("anomaly").main(["fit", "--checkpoint", str(tmp_path / "ck"), "--good",
                                          str(tmp_path / "good")]) == 0
    demo, transform, bank = Demo(tmp_path / "ck"), image_transform(cfg, train=False), find_patchcore(tmp_path / "ck")
    assert "NaFlex ViT (each image at its own aspect ratio, up to 16 patches)" in demo.title()
    for path, grid in zip(paths, [(1, 16), (16, 1), (4, 4)]):
        answer = demo.predict(path.read_bytes(), path.name)
        batch = collate_naflex([(transform.load(path), 0)])[0]
        with torch.no_grad():
            probs = model(batch).softmax(1)[0]
        score, _ = bank.score(model, batch)
        np.testing.assert_allclose(sorted(t["prob"] for t in answer["top"]), sorted(probs.tolist()), rtol=1e-4)
        assert answer["anomaly"]["score"] == pytest.approx(float(score[0]), rel=1e-5)
        w, h = answer["size"]
        assert h * grid[1] == w * grid[0] and DISPLAY <= max(w, h) < 2 * DISPLAY  # the grid's aspect ratio
