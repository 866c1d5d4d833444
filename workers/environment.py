"""What a worker process trains with, read once as it starts (workers/entry.py reports it as an
`EnvironmentRecord` of the job's stream): the interpreter, torch and its CUDA, cuDNN and NCCL
("" where torch has none), the devices it may use, the CPU, the host, the Trainyard install
(its version, and its git commit when it is a checkout) and the installed packages.

Packages are read with importlib.metadata (no `pip` subprocess: milliseconds, and no pip needed
on the node).
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
from importlib import metadata
from pathlib import Path

import torch

from contract.stream import MAX_PACKAGE_TEXT, MAX_PACKAGES, EnvironmentRecord

# This install's root: the folder holding the workers package (a checkout, or site-packages).
INSTALL_ROOT = Path(__file__).resolve().parents[1]


def installed_packages() -> list[str]:
    """Every installed distribution as "name==version", sorted, each once."""
    found = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.add(f"{name}=={dist.version}"[:MAX_PACKAGE_TEXT])
    return sorted(found, key=str.lower)


def packages_hash(packages: list[str]) -> str:
    return hashlib.sha256("\n".join(packages).encode()).hexdigest()


def cpu_model() -> str:
    """The CPU's model name as the kernel says it (Linux), else what platform knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "cpu model"):
                return value.strip()
    return platform.processor() or platform.machine()


def git_commit(root: Path = INSTALL_ROOT) -> str:
    """The commit checked out at `root`, read from its .git (a folder, or a worktree's file
    naming one); "" when `root` is no git checkout. Reads files only: no git needed."""
    dot_git = root / ".git"
    if dot_git.is_file():  # a worktree or a submodule: "gitdir: <path>"
        text = dot_git.read_text().strip()
        if not text.startswith("gitdir:"):
            return ""
        git_dir = (root / text.removeprefix("gitdir:").strip()).resolve()
    elif dot_git.is_dir():
        git_dir = dot_git
    else:
        return ""
    head = _read(git_dir / "HEAD")
    if not head.startswith("ref:"):
        return head  # a detached HEAD holds the commit itself
    ref = head.removeprefix("ref:").strip()
    common = git_dir
    if (git_dir / "commondir").is_file():  # a worktree's branches live in the main .git
        common = (git_dir / _read(git_dir / "commondir")).resolve()
    for folder in (git_dir, common):
        commit = _read(folder / ref)
        if commit:
            return commit
    for line in _read(common / "packed-refs").splitlines():
        commit, _, name = line.partition(" ")
        if name == ref:
            return commit
    return ""


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def collect(*, group: int = 0, rank: int = 0, device: str = "cpu") -> EnvironmentRecord:
    """This process's environment. `device` is the one it trains on: a CUDA device's name is
    read only then, so that reading the environment never starts CUDA where it is not used."""
    packages = installed_packages()
    cuda = torch.version.cuda or ""
    cudnn = ""
    nccl = ""
    devices: list[str] = []
    if device.startswith("cuda"):
        cudnn = str(torch.backends.cudnn.version() or "")
        if torch.distributed.is_available() and torch.distributed.is_nccl_available():
            nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
        devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        devices = [f"cpu ({os.cpu_count() or 0} cores)"]
    return EnvironmentRecord(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=cuda,
        cudnn=cudnn,
        nccl=nccl,
        devices=tuple(devices),
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count() or 0,
        hostname=socket.gethostname(),
        trainyard_version=_version("trainyard"),
        trainyard_commit=git_commit(),
        packages_hash=packages_hash(packages),
        packages=tuple(packages[:MAX_PACKAGES]),
        packages_total=len(packages),
        group=group,
        rank=rank,
    )
