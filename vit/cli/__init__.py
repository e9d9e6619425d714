"""What the root scripts share: `--help` answered before torch loads (`help`) and the run-time helpers
(`runtime`: the Accelerator, machine defaults, one clear line per user error), output folders (`outputs`) and
the image files a command line names (`images`, torch-free), train.py's config and start-up lines
(`training`). Import by module (`from vit.cli.help import exit_if_help`); this `__init__` imports nothing, so
`--help` stays light."""
