"""Why a sweep selects on a validation split: examples/mnist1d_sweep.yaml run through the service,
and three figures from its trials.

The service is a real stack (bench/sweep.py's: an embedded Redis, the API, the scheduler and a
node agent with 2 slots over a SQLite file in a temporary directory). The example is submitted
as it is with the SDK: 8 TPE trials of 1000 steps, ASHA pruning, each trial judged by its last
val/accuracy (a tenth of MNIST-1D's training samples, held out) and tested once, at its end, on
the test split. From the trials that ran to the end:

1. the validation accuracy of the trial the sweep chose (the highest val/accuracy): a score it
   was chosen for, so optimistic;
2. that trial's test accuracy: the test split played no part in the choice, so this is the
   honest estimate of what the sweep found;
3. the test accuracy of the trial the test split would have chosen (the highest test/accuracy):
   what a sweep selecting on the test split reports; it is at least figure 2 by construction,
   and the difference is what selecting on the test split adds to the reported score.

    .venv/bin/python bench/selection_bias.py [--max-trials 8] [--pruner asha] [--seed 0 ...]
        [--json out.json]

`--pruner none --max-trials 16` runs every trial to the end, so both rules choose among the
same trials; `--seed 0 1 2 3 4` runs a sweep for each seed of the sampler, in one stack.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

import smoke
from sweep import service

from trainyard import Client
from trainyard.sweeps import Sweep as SweepHandle

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mnist1d_sweep.yaml"
VAL, TEST = "val/accuracy", "test/accuracy"


@dataclass
class TrialResult:
    number: int
    job_id: int
    state: str
    params: dict[str, Any]
    val: float | None  # the last reported val/accuracy (what the sweep judges)
    test: float | None  # test/accuracy at the trial's end (none for a pruned trial)


@dataclass
class Figures:
    chosen: int  # the trial the sweep chose on the validation split
    chosen_val: float
    chosen_test: float
    test_pick: int  # the trial the test split would have chosen
    test_pick_test: float
    test_pick_val: float
    completed: int
    trials: int
    seconds: float


def document(max_trials: int, pruner: str, seed: int) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    search = doc["search"]
    if (max_trials, pruner, seed) != (
        search["max_trials"],
        search["pruner"]["type"],
        search["seed"],
    ):
        doc["name"] = f"{doc['name']}-{pruner}-n{max_trials}-s{seed}"
        search.update(max_trials=max_trials, seed=seed)
        if pruner != search["pruner"]["type"]:
            search["pruner"] = {"type": pruner}
    return doc


def run(client: Client, doc: dict[str, Any]) -> tuple[list[TrialResult], SweepHandle, float]:
    started = time.time()
    handle = client.submit(doc)
    assert isinstance(handle, SweepHandle)
    handle.wait(timeout=3600, poll=0.5)
    seconds = time.time() - started
    results = []
    for trial in handle.trials():
        summary = client.job(trial.job_id).summary
        val, test = summary.get(VAL), summary.get(TEST)
        results.append(
            TrialResult(
                trial.number,
                trial.job_id,
                trial.state,
                dict(trial.params),
                float(val) if isinstance(val, int | float) else None,
                float(test) if isinstance(test, int | float) else None,
            )
        )
    return results, handle, seconds


def figures(trials: list[TrialResult], handle: SweepHandle, seconds: float) -> Figures:
    done = [
        t for t in trials if t.state == "SUCCEEDED" and t.val is not None and t.test is not None
    ]
    if not done:
        raise SystemExit(f"no trial of sweep {handle.id} ran to its end")
    detail = handle.detail()
    chosen = next(t for t in done if t.number == detail.best_trial)
    # Ties: the earliest trial, as the sweep breaks them.
    test_pick = max(done, key=lambda t: (t.test, -t.number))
    assert detail.best_test is not None and detail.best_test.value == chosen.test
    return Figures(
        chosen=chosen.number,
        chosen_val=chosen.val or 0.0,
        chosen_test=chosen.test or 0.0,
        test_pick=test_pick.number,
        test_pick_test=test_pick.test or 0.0,
        test_pick_val=test_pick.val or 0.0,
        completed=len(done),
        trials=len(trials),
        seconds=seconds,
    )


def show(trials: list[TrialResult], found: Figures) -> None:
    print(f"{'trial':>5} {'state':<10} {VAL:>13} {TEST:>14}  values")
    for t in trials:
        val = f"{t.val:.4f}" if t.val is not None else "-"
        test = f"{t.test:.4f}" if t.test is not None else "-"
        mark = "*" if t.number == found.chosen else ("+" if t.number == found.test_pick else " ")
        values = "  ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t.params.items()
        )
        print(f"{t.number:>4}{mark} {t.state:<10} {val:>13} {test:>14}  {values}")
    print(
        f"\n{found.completed} of {found.trials} trials ran to the end, in {found.seconds:.0f} s"
        f"\n1. the chosen trial ({found.chosen}, *) on the validation split: {found.chosen_val:.4f}"
        f"\n2. its test accuracy, the honest estimate:                 {found.chosen_test:.4f}"
        f"\n3. the trial the test split would choose ({found.test_pick}, +), its test "
        f"accuracy: {found.test_pick_test:.4f} (+{found.test_pick_test - found.chosen_test:.4f} "
        "over 2)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--max-trials", type=int, default=8)
    parser.add_argument("--pruner", default="asha", help="asha (the example's) or none")
    parser.add_argument(
        "--seed", type=int, nargs="+", default=[0], help="the sampler's seed: a sweep for each"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the trials and figures")
    args = smoke.parse(parser, max_trials=2)
    runs = []
    with (
        tempfile.TemporaryDirectory(prefix="selection-bias-") as tmp,
        service(Path(tmp)) as (client, _, _),
    ):
        for seed in args.seed:
            trials, handle, seconds = run(client, document(args.max_trials, args.pruner, seed))
            found = figures(trials, handle, seconds)
            print(f"\nseed {seed}: sweep {handle.id}")
            show(trials, found)
            runs.append(
                {"seed": seed, "figures": asdict(found), "trials": [asdict(t) for t in trials]}
            )
    if len(runs) > 1:
        print("\nseed  chosen: val    test   test split's choice: test   gap")
        for entry in runs:
            f = entry["figures"]
            gap = f["test_pick_test"] - f["chosen_test"]
            print(
                f"{entry['seed']:>4}  {f['chosen_val']:>12.4f} {f['chosen_test']:>7.4f}"
                f" {f['test_pick_test']:>26.4f} {gap:>+6.4f}"
            )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
