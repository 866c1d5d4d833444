"""How the frameworks' pieces compose into one trainer's StepHooks (without processes: the
exchanges are stand-ins that note when they run)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dsl.frameworks import FRAMEWORK_SPECS
from workers import parallel
from workers.parallel import FRAMEWORKS, sync_in_group, sync_through_servers
from workers.trainer import StepHooks


def test_every_framework_descriptor_has_a_function_that_applies_it() -> None:
    assert FRAMEWORKS.names() == FRAMEWORK_SPECS.names()


class _Calls(list[str]):
    def finish(self, scaler: Any = None) -> None:  # the group's GradientSync
        self.append("group mean")

    def connect(self) -> None:  # the parameter-server client
        self.append("connect")

    def step(self, step: int) -> None:
        self.append("push and pull")


def test_a_hybrid_averages_in_the_group_pushes_once_and_keeps_its_replicas_equal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _Calls()
    monkeypatch.setattr(parallel, "broadcast_replicas", lambda tensors: calls.append("rank 0"))
    job: Any = SimpleNamespace(spec=SimpleNamespace(precision="fp32", disp_freq=100))
    client: Any = calls
    group: Any = calls
    hooks = sync_through_servers(
        StepHooks(), client=client, job=job, device="cpu", replicas=[torch.zeros(1)]
    )
    hooks = sync_in_group(hooks, sync=group)
    trainer: Any = SimpleNamespace(updater=SimpleNamespace(scaler=None))
    for start in hooks.at_start:
        start(trainer)
    hooks.apply_update(trainer, 0)
    assert calls == ["connect", "rank 0", "group mean", "push and pull", "rank 0"]


def test_the_local_hooks_apply_the_updater() -> None:
    steps: list[int] = []
    trainer: Any = SimpleNamespace(updater=SimpleNamespace(step=steps.append))
    StepHooks().apply_update(trainer, 7)
    assert steps == [7]
