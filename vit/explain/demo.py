"""A local demo page: drop an image, see the model's top-5 (top-K for K < 5 classes) and where it looked
(attention rollout); for an anomaly checkpoint (anomaly.py fit wrote <checkpoint>/anomaly/, or anomaly/NAME/ for
demo.py --detector NAME) also its anomaly score, verdict and heat map (any of the methods: PatchCore's or
AnomalyDINO's patch distances, `vit.eval.anomaly`, or Dinomaly's reconstruction error), drawn as the rollout
overlay is.

One HTML page of our own (no JavaScript library, no Gradio) served by the standard library's http.server:
the page POSTs the chosen file's bytes to /predict with fetch(); the answer is JSON with the top-5 classes and
their probabilities and the overlay as a PNG data URL. The image goes through the checkpoint's own evaluation
preprocessing (`build_transform(..., train=False)`, as evaluate.py and predict.py), the map is
`vit.explain.rollout.attention_maps` (the same as visualize_attention.py) and the overlay is the overlay panel of its
picture (`vit.eval.plots.overlay_image`), drawn at least DISPLAY pixels wide.

`ClipDemo` serves a CLIP / SigLIP model (vit.create_clip_model) the same way for labels typed on the page:
POST /predict?labels=<comma-separated>&explain=<one of them> answers with every label's probability (softmax
for CLIP, each label's sigmoid with the logit bias for SigLIP: `ZeroShotClassifier.probabilities`) and the
gradient rollout of the image tower for the `explain` label (default: the most probable), i.e. where the model
looked for that class (`attention_maps(..., "grad_rollout", target_class)`, Chefer et al., 2021). The text side
of each label set is computed once and kept.

A file that is not an image, or one over MAX_UPLOAD bytes, more than MAX_LABELS labels or a request line over
http.server's 64 KiB are answered with one sentence (HTTP 400 / 413 / 414) that the page shows, as is a request
whose Content-Length is missing (411) or not a size (400), before any body is read; a body that stops arriving
times out (408). A client that goes away is not an error, and prints nothing. The server keeps serving. One
request runs the model at a time (a lock): the model and the pipeline are not shared between threads.
"""

from __future__ import annotations

import base64
import io
import json
import math
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import torch
from PIL import Image

from ..data.base import DataError
from ..data.datasets import image_transform
from ..data.decode import BadImageError
from ..data.naflex import as_picture, collate_naflex
from ..data.transforms import build_transform
from ..eval.dinomaly import find_detector
from ..eval.plots import overlay_image, to_display
from ..models.checkpoint import load_checkpoint
from .rollout import attention_maps

__all__ = ["ClipDemo", "Demo", "make_server", "PAGE", "MAX_LABELS", "MAX_UPLOAD", "DISPLAY"]

MAX_UPLOAD = 20 * 1024 * 1024  # bytes of one uploaded image
# labels one request may type: each is encoded with every prompt template, under the lock every page waits on
MAX_LABELS = 100
DISPLAY = 224  # the overlay is drawn at least this wide (a 32-pixel model input would be a speck)


class Demo:
    """A checkpoint ready to classify uploaded image bytes: top-5 and the rollout overlay."""

    typed_labels = False  # its classes are the checkpoint's
    caption = "attention rollout"

    def __init__(self, checkpoint: str | Path, top: int = 5, detector: str | None = None) -> None:
        self.folder = Path(checkpoint).resolve()
        self.model, self.cfg, self.classes, self.meta = load_checkpoint(checkpoint)
        # data.naflex: each image at its own aspect ratio, patchified (a square tensor was the square path's input,
        # and its PatchCore maps a list the overlay could not draw)
        self.transform = image_transform(self.cfg, train=False)
        self.naflex_patch = self.cfg.model.patch_size if self.cfg.data.naflex is not None else None
        self.top = min(top, len(self.classes))
        self.multi_label = bool(self.cfg.data.labels_file)  # trained on label sets: a sigmoid per class, as predict.py
        self.patchcore = find_detector(self.folder, detector)  # any method of anomaly.py; None: a plain classifier
        self.lock = threading.Lock()

    def predict(self, data: bytes, name: str = "the upload") -> dict:
        """Image bytes -> {top: [{label, prob}], overlay: PNG data URL, size: [w, h]}; BadImageError for bytes
        that are not a readable image. prob: the softmax, or for a multi-label model each class's sigmoid."""
        with self.lock:
            sample = self.transform.load_bytes(data, name)  # (C, S, S), the evaluation preprocessing; NaFlex: patches
            batch = sample[None] if self.naflex_patch is None else collate_naflex([(sample, 0)])[0]
            maps, logits = attention_maps(self.model, batch, "rollout")  # (1, h, w) or [(h, w)], (1, K)
            probs = (logits.float().sigmoid() if self.multi_label else logits.float().softmax(1))[0]
            if self.patchcore is not None:
                score, heat = self.patchcore.score(self.model, batch)  # (1,), (1, h, w) or [(h, w)]
        x = as_picture(sample, self.naflex_patch)  # (C, H, W) as the model saw it
        p, i = probs.topk(self.top)
        answer = dict(top=[dict(label=self.classes[int(k)], prob=float(v)) for v, k in zip(p, i)],
                      **overlay_answer(x, maps[0], self.cfg.aug.mean, self.cfg.aug.std))
        if self.patchcore is not None:  # verdict as predict.py's: defect at or above the saved threshold
            s, t = float(score[0]), self.patchcore.threshold
            heat_map = overlay_answer(x, heat[0], self.cfg.aug.mean, self.cfg.aug.std)["overlay"]
            answer["anomaly"] = dict(score=s, threshold=t, verdict="" if t is None else "defect" if s >= t else "good",
                                     overlay=heat_map)
        return answer

    def title(self) -> str:
        """The checkpoint's folder (run/best) and the architecture the weights have, read from the model: the
        config's model.name is only the template its fields override (vit_tiny_patch16_224 with patch_size 8)."""
        m = self.model
        (h, w) = m.patch_embed.img_size
        shape = (f"NaFlex ViT (each image at its own aspect ratio, up to {self.cfg.data.naflex.max_num_patches} "
                 "patches)" if self.naflex_patch else f"ViT, {h}x{w} input")
        arch = (f"{shape}, {tokens(m.patch_embed)}, width {m.embed_dim}, depth {len(m.blocks)}, "
                f"{m.blocks[0].attn.num_heads} heads")
        acc = self.meta.get("val_acc1")
        scored = f", val top-1 {100 * acc:.1f}%" if isinstance(acc, (int, float)) else ""
        return f"{self.folder.parent.name}/{self.folder.name}: {arch}: {len(self.classes)} classes{scored}"


def tokens(embed) -> str:
    """What a token covers: '16-pixel patches', or for a hybrid 'a resnetv2 stem, 16-pixel tokens' (its stride
    times the patch size; its `patch_size` alone would say 1)."""
    sh, sw = getattr(embed, "token_step", embed.patch_size)  # a NaFlex model's PatchGrid: its patch size
    side = f"{sh}-pixel" if sh == sw else f"{sh}x{sw}-pixel"
    stem = getattr(embed, "stem", None)
    return f"a {stem.kind} stem, {side} tokens" if stem is not None else f"{side} patches"


def overlay_answer(x, grid_map, mean, std) -> dict:
    """The input (C, H, W) as the model saw it with the (h, w) map over it, its longer side drawn at least DISPLAY
    pixels (a NaFlex strip one patch wide is not enlarged by its short side): {overlay: PNG data URL, size: [w, h]}."""
    seen = to_display(x, mean, std)  # (H, W, 3) in [0, 1]
    scale = max(1, math.ceil(DISPLAY / max(seen.shape[:2])))
    if scale > 1:  # nearest: the pixels the model saw, only larger; the map is upsampled smoothly over them
        seen = seen.repeat(scale, axis=0).repeat(scale, axis=1)
    over = overlay_image(seen, grid_map.numpy())
    buf = io.BytesIO()
    Image.fromarray(over).save(buf, format="PNG")
    return dict(overlay="data:image/png;base64," + base64.b64encode(buf.getvalue()).decode(),
                size=[over.shape[1], over.shape[0]])


class ClipDemo:
    """A CLIP / SigLIP model ready to classify uploaded image bytes against typed labels (the module docstring).
    `labels`: the label set the page starts with."""

    typed_labels = True
    caption = "attention rollout"

    def __init__(self, name: str, labels: str = "", top: int = 5) -> None:
        from ..config import AugConfig
        from ..models.clip import create_clip_model

        self.name, self.labels, self.top = name, labels, top
        self.model = create_clip_model(name)
        self.aug = AugConfig().resolved(self.model.visual.pretrained_cfg)
        self.transform = build_transform(self.aug, self.model.visual.patch_embed.img_size[0], train=False)
        self.classifiers: dict[tuple[str, ...], object] = {}  # label set -> its ZeroShotClassifier
        self.lock = threading.Lock()
        if labels:  # the starting labels refused at start (e.g. one label for CLIP), not on the first upload
            self.classifier(labels)

    def classifier(self, labels: str):
        """The zero-shot classifier of comma-separated `labels`, built once per label set; DataError (one
        sentence) for none, an empty or a repeated one, or one label for CLIP's softmax. Labels are text, never
        looked up as a file or folder: the page may be reachable by others than its owner."""
        from ..eval.zero_shot import ZeroShotClassifier, split_class_names

        if labels.count(",") >= MAX_LABELS:  # counted before anything is split or encoded
            raise DataError(f"{labels.count(',') + 1} labels are more than the page takes ({MAX_LABELS}); give fewer, "
                            "or score a longer list with evaluate.py --classes FILE.")
        names = tuple(split_class_names(labels))
        if names not in self.classifiers:
            if len(self.classifiers) >= 32:  # a page typing label after label: keep the memory bounded
                self.classifiers.pop(next(iter(self.classifiers)))
            self.classifiers[names] = ZeroShotClassifier(self.model, names)
        return self.classifiers[names]

    def predict(self, data: bytes, name: str = "the upload", labels: str = "", explain: str = "") -> dict:
        """Image bytes -> {top: [{label, prob}], explained: label, overlay, size}; BadImageError for bytes that are
        not an image, DataError for labels that are not a list of names or an `explain` that is not one of them."""
        with self.lock:
            clf = self.classifier(labels or self.labels)
            if explain and explain not in clf.classes:
                raise DataError(f"{explain!r:.60} is not one of the labels; choose one of {', '.join(clf.classes)}.")
            x = self.transform.load_bytes(data, name)
            target = None if not explain else torch.tensor([clf.classes.index(explain)])
            maps, logits = attention_maps(clf, x[None], "grad_rollout", target_class=target)  # (1, h, w), (1, C)
            probs = clf.probabilities(logits.float())[0]
        p, i = probs.topk(min(self.top, len(clf.classes)))
        shown = explain or clf.classes[int(i[0])]
        return dict(top=[dict(label=clf.classes[int(k)], prob=float(v)) for v, k in zip(p, i)], explained=shown,
                    labels=clf.classes, **overlay_answer(x, maps[0], self.aug.mean, self.aug.std))

    def title(self) -> str:
        m = self.model.visual
        (h, w) = m.patch_embed.img_size
        kind = "SigLIP (a sigmoid per label)" if self.model.logit_bias is not None else "CLIP (softmax over labels)"
        return (f"{self.name}: {kind}, {h}x{w} input, {tokens(m.patch_embed)}, width {m.embed_dim}, depth "
                f"{len(m.blocks)}: zero-shot, labels typed below")


class _Handler(BaseHTTPRequestHandler):
    """The page at / and the classifier at POST /predict; make_server sets `demo`, `page`, `typed` and `timeout`
    (StreamRequestHandler sets it on the socket: every read and write is bounded)."""
    demo: Demo | ClipDemo
    page: bytes
    typed: bool

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, self.page, "text/html; charset=utf-8")
        else:
            self._error(HTTPStatus.NOT_FOUND, f"there is nothing at {self.path}; open / instead.")

    def do_POST(self):  # noqa: N802
        url = urlsplit(self.path)
        if url.path != "/predict":
            return self._error(HTTPStatus.NOT_FOUND, f"there is nothing at {self.path}; POST to /predict.")
        length = self.headers.get("Content-Length")
        if length is None:
            return self._error(HTTPStatus.LENGTH_REQUIRED, "the upload has no Content-Length header; send the "
                               "file as the request's body, as the page's fetch() does.")
        if not (length.strip().isascii() and length.strip().isdigit()):  # int() takes '-1' and ' +5 ', and
            # isdigit() alone takes '\xb2' (superscript two, a latin-1 header byte) that int() refuses
            return self._error(HTTPStatus.BAD_REQUEST, f"the Content-Length header must be a whole number of "
                               f"bytes, got {length[:40]!r}; send the file as the request's body.")
        size = int(length)
        if size > MAX_UPLOAD:
            return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"the file has {size} bytes; choose an image under {MAX_UPLOAD // 2**20} MB.")
        if size == 0:
            return self._error(HTTPStatus.BAD_REQUEST, "the upload was empty; choose an image file.")
        try:
            data = self.rfile.read(size)  # at most `size` bytes, each read bounded by the socket timeout
        except TimeoutError:
            return self._error(HTTPStatus.REQUEST_TIMEOUT, f"the upload stopped arriving for {self.timeout:g} s; "
                               "choose the file again.")
        if len(data) < size:  # the client closed the connection mid-body: nobody is left to answer
            self.close_connection = True
            return None
        query = {k: v[-1] for k, v in parse_qs(url.query).items() if k in ("labels", "explain")}
        query = query if self.typed else {}
        try:
            answer = self.demo.predict(data, self.headers.get("X-Filename") or "the upload", **query)
        except DataError as e:  # typed labels that are no list of names
            return self._error(HTTPStatus.BAD_REQUEST, str(e))
        except BadImageError as e:  # its message names the problem; add what to do where it does not
            text = str(e).rstrip(".")
            return self._error(HTTPStatus.BAD_REQUEST, text + "." if ";" in text else
                               f"{text}; choose a PNG, JPEG, WebP or BMP image.")
        self._send(HTTPStatus.OK, json.dumps(answer).encode(), "application/json")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a request line over its 64 KiB: 414; a malformed one: 400) as the page's
        JSON sentence, not an HTML page the page's fetch() cannot read."""
        if code == HTTPStatus.REQUEST_URI_TOO_LONG:
            text = "the request is longer than 64 KiB (its labels?); give fewer or shorter labels."
        else:
            text = f"the request was refused ({code} {str(message or HTTPStatus(code).phrase)[:80]}); reload the page."
        self._error(HTTPStatus(code), text)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self.close_connection = True  # a body left unread must not be taken for the next request
        self._send(status, json.dumps(dict(error=message)).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # one quiet line per request is enough for a local page
        pass


def make_server(demo: Demo | ClipDemo, host: str = "127.0.0.1", port: int = 7860,
                timeout: float = 30) -> ThreadingHTTPServer:
    """The page at / and the classifier at POST /predict, bound to host:port (port 0: a free one). `timeout`:
    seconds a socket may wait for the next bytes of a request (or for the client to take the answer)."""
    typed = getattr(demo, "typed_labels", False)
    box = LABELS.replace("{{LABELS}}", _escape(demo.labels).replace('"', "&quot;")) if typed else ""
    page = PAGE.replace("{{TITLE}}", _escape(demo.title())) \
        .replace("{{LABELBOX}}", box).replace("{{CAPTION}}", demo.caption) \
        .replace("{{HEADING}}", getattr(demo, "heading", f"top-{demo.top}")).encode()

    handler = type("Handler", (_Handler,), dict(demo=demo, page=page, typed=typed, timeout=timeout))
    return _Server((host, port), handler)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that went away (closed tab, reset, timed out) is routine for a page: nothing to print.
        Anything else is a bug, printed with its traceback as http.server does."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def _png_url(pixels) -> str:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# the label box and the class to explain, on a CLIP model's page
LABELS = """<div id="typed"><label>labels, separated by commas: <input id="labels" size="60"
 value="{{LABELS}}"></label> <label>rollout for <select id="explain"></select></label></div>
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>vit demo</title>
<style>
 body { font: 15px system-ui, sans-serif; margin: 2em auto; max-width: 880px; color: #222; }
 #drop { border: 2px dashed #888; border-radius: 8px; padding: 1.2em; text-align: center; }
 #drop.over { background: #eef; }
 .row { display: flex; gap: 1.5em; margin-top: 1.2em; align-items: flex-start; }
 img { width: 256px; image-rendering: auto; border: 1px solid #ccc; }
 img:not([src]) { display: none; }
 ol { padding-left: 1.4em; margin: 0; } li { margin: .2em 0; white-space: nowrap; }
 #result { min-width: 220px; }
 .bar { display: inline-block; height: .7em; background: #4a7; margin-left: .4em; vertical-align: middle; }
 #status { margin-top: 1em; color: #a22; min-height: 1.2em; }
</style></head>
<body>
<h2>{{TITLE}}</h2>
<div id="drop">Drop an image here, or <input type="file" id="file" accept="image/*"></div>
{{LABELBOX}}<div id="status"></div>
<div class="row">
 <figure><img id="input" alt="your image"><figcaption>your image</figcaption></figure>
 <figure><img id="overlay" alt="attention rollout overlay"><figcaption>{{CAPTION}}</figcaption></figure>
 <figure id="anomaly-fig" hidden><img id="anomaly" alt="anomaly map"><figcaption id="verdict"></figcaption></figure>
 <div id="result"><b>{{HEADING}}</b><ol id="top5"></ol></div>
</div>
<script>
const status = document.getElementById("status");
const labels = document.getElementById("labels"), explain = document.getElementById("explain");
let last = null, asked = 0;
async function classify(file, which) {
  last = file;
  const mine = ++asked;  // answers may come back out of order: only the newest request's is drawn
  status.textContent = "classifying " + file.name + " ...";
  document.getElementById("input").src = URL.createObjectURL(file);
  const query = labels ? "?labels=" + encodeURIComponent(labels.value) + "&explain=" + encodeURIComponent(which || "")
                       : "";
  let r, answer;
  try {
    r = await fetch("/predict" + query, {method: "POST", body: file, headers: {"X-Filename": file.name}});
    answer = await r.json();
  } catch (e) {  // the server stopped, or answered something that is not our JSON
    r = {ok: false}; answer = {error: "no answer from the demo server (is demo.py still running?); reload the page."};
  }
  if (mine !== asked) return;
  const list = document.getElementById("top5"), fig = document.getElementById("anomaly-fig");
  list.replaceChildren();
  if (!r.ok) {  // nothing of the previous image stays beside the sentence
    status.textContent = answer.error; document.getElementById("overlay").removeAttribute("src");
    if (fig) fig.hidden = true;
    return;
  }
  for (const t of answer.top) {
    const li = document.createElement("li");
    const label = document.createElement("span"); label.className = "label"; label.textContent = t.label;
    const prob = document.createElement("span"); prob.className = "prob";
    prob.textContent = (100 * t.prob).toFixed(1) + "%";
    const bar = document.createElement("span"); bar.className = "bar"; bar.style.width = (80 * t.prob) + "px";
    li.append(label, " ", prob, bar); list.append(li);
  }
  document.getElementById("overlay").src = answer.overlay;
  if (explain) {  // the labels the rollout can be shown for, the one shown selected
    explain.replaceChildren(...answer.labels.map(l => new Option(l, l, false, l === answer.explained)));
  }
  const a = answer.anomaly;
  if (fig) fig.hidden = !a;
  if (a) {
    document.getElementById("anomaly").src = a.overlay;
    document.getElementById("verdict").textContent = "anomaly score " + a.score.toFixed(3) +
      (a.verdict ? ": " + a.verdict + " (threshold " + a.threshold.toFixed(3) + ")" : "");
  }
  status.textContent = "";
}
if (labels) {
  labels.addEventListener("change", () => last && classify(last));
  explain.addEventListener("change", () => last && classify(last, explain.value));
}
document.getElementById("file").addEventListener("change", e => e.target.files[0] && classify(e.target.files[0]));
const drop = document.getElementById("drop");
drop.addEventListener("dragover", e => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", e => { e.preventDefault(); drop.classList.remove("over");
  if (e.dataTransfer.files[0]) classify(e.dataTransfer.files[0]); });
</script></body></html>
"""
