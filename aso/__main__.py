"""`python -m aso` is the `aso` command (used by `aso run` to start agent processes)."""

from aso.cli import main

main()
