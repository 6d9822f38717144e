"""``python -m lightning_hybrid.cli ...``: the same as the ``lightning-hybrid`` command."""

from lightning_hybrid.cli import main

if __name__ == "__main__":
    main()
