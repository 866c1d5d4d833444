"""`--smoke` for every bench script: tiny sizes that run in seconds through the same code path,
so that `make test` (tests/test_bench_smoke.py) runs each script and none rots unnoticed.

A smoke run measures nothing worth reading; its figures are not to be quoted.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

SMOKE_HELP = "tiny sizes through the same code path, a few seconds (tests run it; no figure)"


def parse(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, **tiny: Any
) -> argparse.Namespace:
    """Parse the arguments, with `--smoke` setting each of `tiny` (argument name: value)."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    unknown = sorted(name for name in tiny if not hasattr(args, name))
    if unknown:
        raise ValueError(f"--smoke sets arguments the parser lacks: {unknown}")
    if args.smoke:
        for name, value in tiny.items():
            setattr(args, name, value)
    return args
