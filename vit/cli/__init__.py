"""The commands: `commands` (one module per `vit` subcommand, holding build_parser and main, and the registry),
`main` (the `vit` dispatcher, help answered from the registry alone), `args` (the one front-end of the model
commands: arguments, --aug.* overrides, model source), `predict_outputs` (predict.py's --out files and its torch-free
--onnx mode), `anomaly_inputs` (anomaly.py's detector folder, backbone and tile). What they share: `--help`
answered before torch loads (`help`) and the run-time helpers
(`runtime`: the Accelerator, machine defaults, one clear line per user error), output folders (`outputs`) and
the image files a command line names (`images`, torch-free), train.py's config and start-up lines
(`training`). Import by module (`from vit.cli.help import exit_if_help`); this `__init__` imports nothing, so
`--help` stays light."""
