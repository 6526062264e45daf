"""`python -m rlprof.trainer [CONFIG] [overrides]` (also under torchrun)."""

from .launch import cli_main

raise SystemExit(cli_main())
