"""Label images that have no labels: top-k classes and probabilities per image, in input order.

The same as `vit predict` (predict.py --help: the options); the code is vit/cli/commands/predict.py.
"""

from vit.cli.commands.predict import build_parser, main, parse_args, run_onnx  # noqa: F401 (the script's API)

if __name__ == "__main__":
    from vit.cli.main import run

    run("predict")
