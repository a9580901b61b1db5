"""`python -m rig`: the same as the `rig` command."""

from rig.cli import main

main()
