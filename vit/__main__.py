"""`python -m vit <command> ...`: the installed `vit` command (vit/cli/main.py) without installing it."""

from vit.cli.main import main

if __name__ == "__main__":
    main()
