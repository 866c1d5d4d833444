"""`python -m scheduler ...` is the `trainyard` command (the stack starts its children so)."""

from scheduler.cli.main import main

main()
