"""A local demo page for a trained checkpoint: drop an image, see the top-5 and the attention-rollout overlay.

    python demo.py --checkpoint runs/default/best                 # then open http://127.0.0.1:7860/
    python demo.py --checkpoint runs/x/best --port 8000
    python demo.py --clip hf-hub:timm/ViT-B-16-SigLIP --labels "a cat, a dog, a scratched part"

With --clip, the page takes the labels you type (zero-shot: softmax for CLIP, a sigmoid per label for SigLIP)
and shows where the image tower looked for the label you choose (gradient rollout).

The page and the server are ours (vit/explain/demo.py: the standard library's http.server and one HTML page,
no extra package). It listens on 127.0.0.1 only, unless --host says otherwise; Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import errno
import sys


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.help import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", help="a checkpoint folder written by train.py (a run's best/)")
    which.add_argument("--clip", metavar="NAME", help="a CLIP / SigLIP model (vit.create_clip_model: hf-hub:org/repo "
                       "or local-dir:/folder), classifying against labels typed on the page")
    ap.add_argument("--labels", default="a photo of a cat, a photo of a dog",
                    help="--clip: the labels the page starts with, separated by commas")
    ap.add_argument("--detector", metavar="NAME", default=None,
                    help="--checkpoint: which of its anomaly detectors scores uploads (<checkpoint>/anomaly/NAME/; "
                         "default: <checkpoint>/anomaly/ itself)")
    ap.add_argument("--port", type=int, default=7860, help="port to listen on (0: any free one)")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to listen on; 0.0.0.0 shows the page to the whole network")
    return ap


def main(argv=None) -> int:
    from vit.config import ConfigError
    from vit.explain.demo import ClipDemo, Demo, make_server

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {args.port}.")
    if args.detector and args.clip:
        raise ConfigError("--detector names an anomaly detector of a --checkpoint; a --clip page has none.")
    if args.clip:
        demo = ClipDemo(args.clip, args.labels)
    elif _is_segmentation(args.checkpoint):
        from vit.explain.seg_demo import SegDemo

        if args.detector:
            raise ConfigError("--detector names an anomaly detector; a segmentation checkpoint's page shows its "
                              "classes' masks.")
        demo = SegDemo(args.checkpoint)
    else:
        demo = Demo(args.checkpoint, detector=args.detector)
    try:
        server = make_server(demo, args.host, args.port)
    except OSError as e:  # a port in use or not ours to take; an address this machine does not have or resolve
        which = "--port" if e.errno in (errno.EADDRINUSE, errno.EACCES) else "--host"
        raise ConfigError(f"cannot listen on {args.host}:{args.port} ({e.strerror}); pass another {which}.") from None
    host, port = server.server_address[:2]
    print(f"serving {demo.title()} on http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0



def interrupt_note() -> str:
    """What Ctrl-C leaves (vit.cli.runtime.run_cli says it in one line)."""
    return "the demo stopped; nothing was written"


def _is_segmentation(checkpoint: str) -> bool:
    """Whether the checkpoint's config.yaml says data.dataset=segmentation (anything unreadable: no, and the
    classifier's loader says what is wrong)."""
    from pathlib import Path

    from vit.config import read_yaml

    try:
        data = read_yaml(Path(checkpoint) / "config.yaml").get("data") or {}
    except Exception:  # noqa: BLE001 (the loader reports it)
        return False
    return isinstance(data, dict) and data.get("dataset") == "segmentation"
