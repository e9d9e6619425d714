"""Publish a trained checkpoint to the Hugging Face hub: one command, private by default.

    python publish.py runs/default --repo you/vit-digits          # the run's best/, into a private repository
    python publish.py runs/x/last --repo org/name --public --message "epoch 30"

Uploads model.safetensors, config.json (timm's hub layout: `timm.create_model("hf-hub:you/name",
pretrained=True)` loads it), config.yaml, classes.json, meta.json and README.md, the model card, rewritten to
name the repository. The token: --token, else HF_TOKEN, else the login cached by `hf auth login`. The uploaded
config.yaml has data.root and every other local path reduced to its last component; the folder keeps its own.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from vit.cli.help import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("checkpoint", help="a run folder (its best/ is published) or a checkpoint folder")
    ap.add_argument("--repo", required=True, help="the hub repository, you/name or org/name; created if missing")
    ap.add_argument("--public", action="store_true", help="create the repository public (default: private)")
    ap.add_argument("--token", default=None, help="a write token (default: HF_TOKEN or the cached login)")
    ap.add_argument("--message", default=None, help="the commit message (default: names the folder)")
    return ap


def main(argv=None) -> int:
    from vit.deploy.publish import publish

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    url = publish(args.checkpoint, args.repo, private=not args.public, token=args.token, message=args.message)
    print(f"published {args.checkpoint} to {url} ({'public' if args.public else 'private'})")
    return 0



def interrupt_note() -> str:
    """What Ctrl-C leaves (vit.cli.runtime.run_cli says it in one line)."""
    return "the upload stopped; the repository keeps its last complete commit"
