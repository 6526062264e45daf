"""`python -m rlprof.cli`: the `rlprof` command."""

from . import main

main()
