"""The names of a wheel list (bench/gpu_wheels.txt) pinned to the versions installed here, so
that the GPU machines' wheelhouse (`make wheelhouse`) holds what the tests ran with."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path


def main(path: str) -> None:
    for line in Path(path).read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            print(f"{name}=={metadata.version(name)}")


if __name__ == "__main__":
    main(sys.argv[1])
