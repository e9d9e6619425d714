"""Every checkpoint's README.md model card, read by huggingface_hub; publish.py against a local hub stand-in."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from helpers import run_script

CLASSES = ["cat", "dog", "fox"]
META = dict(epoch=7, step=42, val_acc1=0.8125, val_loss=0.4321, n=48)


def _save(folder, *overrides):
    from vit.config import load_config
    from vit.models.build import build_model
    from vit.models.checkpoint import save_checkpoint

    cfg = load_config(None, ["--model.img_size=32", "--model.embed_dim=32", "--model.depth=2",
                             "--model.num_heads=2", "--run.name=pets", *overrides])
    model = build_model(cfg, len(CLASSES))
    save_checkpoint(folder, model, cfg, CLASSES, META)
    return model


@pytest.fixture(scope="module")
def best(tmp_path_factory):
    folder = tmp_path_factory.mktemp("card") / "best"
    model = _save(folder, "--data.dataset=cifar10", "--optim.lr=3e-4", "--aug.mixup=0.8")
    return folder, sum(p.numel() for p in model.parameters())


def test_the_card_parses_with_huggingface_hub_and_holds_the_evaluation(best):
    from huggingface_hub import ModelCard

    folder, n_params = best
    card = ModelCard.load(folder / "README.md")
    d = card.data
    assert d.library_name == "timm" and d.pipeline_tag == "image-classification" and d.license == "apache-2.0"
    assert "vision-transformer" in d.tags and d.datasets == ["uoft-cs/cifar10"] and d.metrics == ["accuracy"]
    (result,) = d.eval_results  # model-index, as the hub reads it
    assert (result.task_type, result.dataset_type, result.dataset_split) == ("image-classification",
                                                                            "uoft-cs/cifar10", "validation")
    assert (result.metric_type, result.metric_value) == ("accuracy", META["val_acc1"])
    assert d.model_name == "pets"
    text = card.text
    for heading in ("# pets", "## Training", "## Evaluation", "## How to use"):
        assert heading in text
    assert f"{n_params / 1e6:.2f}M parameters" in text and "for 3 classes: cat, dog, fox" in text
    assert "AdamW lr 0.0003" in text and "mixup 0.8" in text
    assert "Validation top-1 accuracy 81.25%, loss 0.4321, on 48 images (epoch 7, step 42)" in text
    assert 'vit.create_model("hf-hub:you/pets", pretrained=True)' in text
    assert 'timm.create_model("hf-hub:you/pets", pretrained=True)' in text


def test_local_data_is_not_named_as_a_hub_dataset(tmp_path):
    from huggingface_hub import ModelCard

    _save(tmp_path / "c", "--data.dataset=imagefolder", f"--data.root={tmp_path}")
    d = ModelCard.load(tmp_path / "c" / "README.md").data
    assert d.datasets is None and d.eval_results[0].dataset_type == "imagefolder"
    assert str(tmp_path) not in (tmp_path / "c" / "README.md").read_text()  # no local path in the card


HOSTILE = ["[click](http://evil.example)", "<img src=x onerror=alert(1)>", "**bold**\n# Heading", "`code`", "a_b&c",
           "![i](http://evil.example/x.png)", "<b>plain tag</b>"]


def test_user_chosen_names_reach_the_card_as_text_never_as_links_or_html(tmp_path):
    """The card rendered by a CommonMark renderer (markdown-it-py, HTML allowed as the spec does): hostile class,
    run and split names show as their characters, and no local path of this machine is named."""
    import dataclasses
    import html
    import re

    from markdown_it import MarkdownIt

    from vit.config import load_config
    from vit.models.model_card import model_card

    cfg = load_config(None, ["--run.name=pets](javascript:alert(1)) <b onmouseover=x>", "--data.dataset=wds",
                             f"--data.root={tmp_path}", f"--data.val_split={tmp_path}/val_[x](y)-{{0..1}}.tar",
                             "--model.name=vit_tiny_patch16_224", f"--model.pretrained={tmp_path}/w.safetensors"])
    cfg = dataclasses.replace(cfg, aug=cfg.aug.resolved(None, 3))  # as save_checkpoint writes it
    card = model_card(cfg, HOSTILE, META, 1000)
    rendered = MarkdownIt("commonmark").render(card.split("---\n", 2)[2])  # the body; the header is metadata
    for tag in ("<a ", "<img", "<b ", "<b>", "<strong>", "<em>", "<h2>Heading"):
        assert tag not in rendered, tag
    assert rendered.count("<h1>") == 1 and "<code>code</code>" not in rendered  # the title only; no code span
    text = html.unescape(re.sub(r"<[^>]+>", "", rendered))
    for name in [*HOSTILE, "pets](javascript:alert(1)) <b onmouseover=x>", "val_[x](y)-{0..1}.tar"]:
        assert name.replace("\n", " ") in text, name
    assert str(tmp_path) not in card and "from: local weights" in text
    assert 'create_model("hf-hub:you/pets-javascript-alert-1-b-onmouseover-x"' in card  # a hub-shaped id


def test_the_cards_timm_example_loads_the_folder_with_the_same_logits(best):
    import timm

    from vit.models.checkpoint import load_checkpoint

    folder, _ = best
    ours, *_ = load_checkpoint(folder)
    theirs = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()  # the card's hf-hub: line, offline
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), ours(x), atol=1e-5, rtol=1e-5)


class HubStandIn(BaseHTTPRequestHandler):
    """The endpoints huggingface_hub 2.4.0's create_repo + upload_folder call, recording what arrives:
    POST /api/repos/create; POST /api/validate-yaml (a README.md is uploaded: its metadata, checked here with
    huggingface_hub's own card parser); POST /api/models/<repo>/preupload/<rev> (answered "regular" for every
    file, the hub's answer for small text files: the real hub sends binary files such as model.safetensors
    through LFS/Xet, which this stand-in does not serve); POST /api/models/<repo>/commit/<rev> (NDJSON: a header
    line, then one line per file with its base64 content)."""

    calls: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.calls.append((self.path, self.headers.get("Authorization"), body))
        if self.headers.get("Authorization") != "Bearer hf_standin":
            return self._json({"error": "Invalid credentials in Authorization header"}, 401)
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        if self.path == "/api/repos/create":
            req = json.loads(body)
            return self._json({"url": f"{base}/{req['organization']}/{req['name']}"})
        if self.path == "/api/validate-yaml":
            from huggingface_hub import ModelCard

            try:
                ModelCard(json.loads(body)["content"], ignore_metadata_errors=False).data.to_dict()
            except Exception as e:
                return self._json({"errors": [{"message": str(e)}]}, 400)
            return self._json({"errors": [], "warnings": []})
        if "/preupload/" in self.path:
            files = json.loads(body)["files"]
            return self._json({"files": [dict(path=f["path"], uploadMode="regular", shouldIgnore=False)
                                         for f in files]})
        if "/commit/" in self.path:
            repo = self.path.split("/api/models/")[1].split("/commit/")[0]
            return self._json({"commitUrl": f"{base}/{repo}/commit/{'a' * 40}", "commitOid": "a" * 40})
        self._json({"error": f"the stand-in does not serve {self.path}"}, 404)

    def _json(self, obj, status=200):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub():
    HubStandIn.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubStandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", HubStandIn.calls
    server.shutdown()
    server.server_close()


def _env(endpoint, tmp_path, token="hf_standin"):
    env = {"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf_home"),
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    if token:
        env["HF_TOKEN"] = token
    return env


@pytest.mark.slow
def test_publish_creates_a_private_repo_and_commits_the_checkpoint_files(best, hub, tmp_path):
    import shutil

    endpoint, calls = hub
    run = tmp_path / "runs" / "pets"
    shutil.copytree(best[0], run / "best")
    (run / "best" / "notes.txt").write_text("not part of the checkpoint")
    r = run_script("publish.py", str(run), "--repo", "me/pets-vit", env=_env(endpoint, tmp_path, token=None))
    assert r.returncode == 2 and r.stderr.startswith("error: no Hugging Face token found;"), r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1 and not calls  # one sentence, nothing sent
    r = run_script("publish.py", str(run), "--repo", "me/pets-vit", env=_env(endpoint, tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"to {endpoint}/me/pets-vit (private)" in r.stdout
    paths = [c[0] for c in calls]
    assert paths == ["/api/repos/create", "/api/validate-yaml", "/api/models/me/pets-vit/preupload/main",
                     "/api/models/me/pets-vit/commit/main"]
    assert all(c[1] == "Bearer hf_standin" for c in calls)
    assert json.loads(calls[0][2]) == {"name": "pets-vit", "organization": "me", "visibility": "private"}
    lines = [json.loads(line) for line in calls[3][2].decode().splitlines()]
    assert lines[0]["key"] == "header" and lines[0]["value"]["summary"] == "Upload pets/best with vit publish.py"
    sent = {v["value"]["path"]: base64.b64decode(v["value"]["content"]) for v in lines[1:]}
    assert sorted(sent) == sorted(["model.safetensors", "config.json", "config.yaml", "classes.json", "meta.json",
                                   "README.md"])  # notes.txt stays home
    for name, data in sent.items():
        assert data == (run / "best" / name).read_bytes(), name  # byte for byte what the folder holds
    assert b'hf-hub:me/pets-vit' in sent["README.md"]  # the card now names its repository


def test_publish_public_and_the_refusals_are_one_sentence(best, hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from vit.config import ConfigError
    from vit.deploy.publish import publish

    endpoint, calls = hub
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)  # what HF_ENDPOINT sets when huggingface_hub is imported
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # conftest's HF_HUB_OFFLINE=1
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-cached-login"))
    monkeypatch.setenv("HF_TOKEN", "hf_standin")
    assert publish(best[0], "me/pub", private=False) == f"{endpoint}/me/pub"
    assert json.loads(calls[0][2])["visibility"] == "public"
    n = len(calls)
    with pytest.raises(ConfigError, match=r"^--repo 'noslash' must look like you/name"):
        publish(best[0], "noslash")
    with pytest.raises(ConfigError, match=r"nothing does not exist; pass a run folder"):
        publish(tmp_path / "nothing", "me/x")
    (tmp_path / "half").mkdir()
    with pytest.raises(ConfigError, match=r"is not a complete checkpoint \(no model.safetensors, config.json"):
        publish(tmp_path / "half", "me/x")
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(ConfigError, match=r"^no Hugging Face token found; run `hf auth login`"):
        publish(best[0], "me/x")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match=r"^HF_HUB_OFFLINE is set"):
        publish(best[0], "me/x", token="hf_standin")
    assert len(calls) == n  # refused before anything was sent
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ConfigError, match=r"the hub refused the upload to me/x \(HTTP 401"):
        publish(best[0], "me/x", token="hf_bad")  # the stand-in refuses this token, as the hub would


def test_published_files_name_no_local_path(tmp_path, hub, monkeypatch):
    """A run trained on /abs/data with an absolute labels file and output folder: what reaches the hub holds no
    absolute path of this machine; config.yaml keeps each path's last component and every other setting."""
    import os
    from pathlib import Path

    import yaml
    from huggingface_hub import constants

    from vit.deploy.publish import publish

    endpoint, calls = hub
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    data = tmp_path / "home" / "me" / "mydata"
    folder = tmp_path / "runs" / "pets" / "best"
    _save(folder, "--data.dataset=imagefolder", f"--data.root={data}", f"--data.labels_file={data}/labels.csv",
          f"--run.output_dir={tmp_path}/runs")
    assert str(tmp_path) in (folder / "config.yaml").read_text()  # the folder's own file keeps the paths
    publish(folder, "me/pets", token="hf_standin")
    lines = [json.loads(line) for line in calls[-1][2].decode().splitlines()]
    sent = {v["value"]["path"]: base64.b64decode(v["value"]["content"]) for v in lines[1:]}
    assert "config.yaml" in sent and "README.md" in sent and len(sent) == 6
    for name, content in sent.items():
        for local in {str(tmp_path), str(Path.home()), os.getcwd()}:
            assert local.encode() not in content, (name, local)
    ours, theirs = yaml.safe_load((folder / "config.yaml").read_text()), yaml.safe_load(sent["config.yaml"])
    assert (theirs["data"]["root"], theirs["data"]["labels_file"], theirs["run"]["output_dir"]) == (
        "mydata", "labels.csv", "runs")
    for d in (ours, theirs):
        d["data"].pop("root"), d["data"].pop("labels_file"), d["run"].pop("output_dir")
    assert theirs == ours  # nothing else changed
    assert all(sent[n] == (folder / n).read_bytes() for n in sent if n != "config.yaml")


def test_a_file_url_is_reduced_to_its_last_component_as_a_path_is():
    """webdataset reads file:///home/me/val-{0..1}.tar as the path itself: it went up with the home folder in it."""
    from vit.deploy.publish import public_config

    got = public_config({"data": {"val_split": "file:///home/me/val-{0..1}.tar", "root": "file:/srv/me/data"},
                         "run": {"name": "file-check"}})
    assert got == {"data": {"val_split": "val-{0..1}.tar", "root": "data"}, "run": {"name": "file-check"}}
