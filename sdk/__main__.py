"""`python -m sdk ...` is the `trainyard` command (used to start the stack's children)."""

from sdk.cli import main

main()
