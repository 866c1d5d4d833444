"""`compile: true`: the same training as eager, the same checkpoints, and eager with a warning
where the net cannot be compiled."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.workers.test_precision import Lines, mlp_job, train
from workers.checkpoint import load_checkpoint, resolve_checkpoint

WARNING = "warning: compile: the net cannot be compiled"
# What inductor raises on a machine without a C++ compiler (its first line).
NO_COMPILER = "InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx"


def few_steps(**top: Any) -> dict[str, Any]:
    # Eight steps and two test batches: compiling (the train and the test phase) is what costs.
    return {**mlp_job(**top), "train_steps": 8, "disp_freq": 4, "test": {"steps": 2}}


def warnings_of(trainer: Any) -> list[str]:
    (sink,) = trainer.reporting.sinks
    assert isinstance(sink, Lines)
    return [line for line in sink.lines if line.startswith(WARNING)]


@pytest.mark.slow
def test_the_compiled_net_trains_to_the_same_parameters_and_checkpoint(
    tmp_path: Path, cache_dir: Path
) -> None:
    eager, _ = train(few_steps(), tmp_path / "eager", cache_dir)
    compiled, trainer = train(few_steps(compile=True), tmp_path / "compiled", cache_dir)
    assert compiled.status == "succeeded" and not warnings_of(trainer)
    assert trainer.compiled_net.active  # it did not fall back
    assert compiled.metrics["test/loss"] == pytest.approx(eager.metrics["test/loss"], rel=1e-4)
    a = load_checkpoint(resolve_checkpoint(tmp_path / "eager"))
    b = load_checkpoint(resolve_checkpoint(tmp_path / "compiled"))
    assert a.params.keys() == b.params.keys() == {"fc1/w", "fc1/b", "fc2/w", "fc2/b"}
    assert a.updater.keys() == b.updater.keys() and a.buffers.keys() == b.buffers.keys()
    for key in a.params:
        torch.testing.assert_close(b.params[key], a.params[key], rtol=1e-4, atol=1e-5)


def _refuses(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(NO_COMPILER)


def _fails_when_called(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    def compiled(*call_args: Any, **call_kwargs: Any) -> Any:
        raise RuntimeError(NO_COMPILER)

    return compiled


@pytest.mark.parametrize(
    "compile_",
    [_refuses, _fails_when_called],
    ids=["refused-at-once", "fails-at-the-first-call"],
)
def test_a_net_that_cannot_be_compiled_trains_eagerly_with_a_warning(
    compile_: Callable[..., Any],
    tmp_path: Path,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Stands in for the compiler failing: torch.compile refuses, or (as inductor does without
    # a C++ compiler) the compiled forward raises when it is first called.
    monkeypatch.setattr(torch, "compile", compile_)
    train(few_steps(), tmp_path / "eager", cache_dir)
    fallen, trainer = train(few_steps(compile=True), tmp_path / "compiled", cache_dir)
    assert fallen.status == "succeeded" and fallen.steps == 8
    assert warnings_of(trainer) == [f"{WARNING} (RuntimeError: {NO_COMPILER}); it runs uncompiled"]
    assert not trainer.compiled_net.active and "forward" not in vars(trainer.net)
    a = load_checkpoint(resolve_checkpoint(tmp_path / "eager")).params
    b = load_checkpoint(resolve_checkpoint(tmp_path / "compiled")).params
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
