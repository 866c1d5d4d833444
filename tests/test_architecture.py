"""docs/architecture.md's recipes, followed on a copy of the code: a recipe that goes stale (a
file moved, a line it edits changed, a step missing) fails here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
PACKAGES = ("contract", "dsl", "workers", "scheduler", "api", "trainyard")


def _recipe_steps(tag: str) -> list[tuple[str, str, str]]:
    """(what, path, code) of each block marked `<!-- recipe: TAG WHAT PATH -->`, in order."""
    pattern = re.compile(rf"<!-- recipe: {tag} (\w+) (\S+) -->\n```\w*\n(.*?)```", re.DOTALL)
    steps = [(m[1], m[2], m[3]) for m in pattern.finditer(DOC)]
    assert steps, f"docs/architecture.md has no steps of the recipe '{tag}'"
    return steps


def _follow(tag: str, tree: Path) -> None:
    """Apply a recipe to a copy of the code. `file` writes a new file; `line` appends to one;
    `after` inserts the block's other lines after its first, an existing line of the file;
    `replace` puts the block's second line in place of its first."""
    for what, target, code in _recipe_steps(tag):
        path = tree / target
        if what == "file":
            assert not path.exists(), f"recipe '{tag}' writes {target}, which exists"
            path.write_text(code)
        elif what == "line":
            # A new top-level definition goes two blank lines below the last one.
            gap = "" if code.startswith(("from ", "import ")) else "\n\n"
            path.write_text(path.read_text() + gap + code)
        elif what == "after":
            anchor, _, added = code.partition("\n")
            text = path.read_text()
            assert text.count(anchor + "\n") == 1, f"{target} has no single line {anchor!r}"
            path.write_text(text.replace(anchor + "\n", anchor + "\n" + added, 1))
        elif what == "replace":
            old, new = code.splitlines()
            text = path.read_text()
            assert text.count(old + "\n") == 1, f"{target} has no single line {old!r}"
            path.write_text(text.replace(old + "\n", new + "\n", 1))
        else:
            raise AssertionError(f"recipe '{tag}': unknown step '{what}'")


def _copy(tree: Path, *paths: str) -> None:
    for name in paths:
        source = ROOT / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "node_modules")
            shutil.copytree(source, tree / name, ignore=ignore)
        else:
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, tree / name)


def _run(tree: Path, code: str) -> str:
    """Run Python in the copy (its packages first on the path); return what it printed."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_the_layer_recipe_adds_a_layer_type(tmp_path: Path) -> None:
    _copy(tmp_path, "dsl")
    _follow("layer", tmp_path)
    out = _run(
        tmp_path,
        """
        import json, torch
        from dsl.compiler import compile_job
        from dsl.layers.base import BuildContext
        from dsl.schema import JobSpec
        job = compile_job(
            {
                "name": "recipe",
                "data": {"source": "digits", "batch_size": 4},
                "neuralnet": {"layers": [
                    {"name": "data", "type": "input"},
                    {"name": "fc", "type": "dense", "srclayers": ["data"], "units": 3},
                    {"name": "s", "type": "scale", "srclayers": ["fc"]},
                    {"name": "loss", "type": "softmax_loss", "srclayers": ["s"]},
                ]},
                "train_one_batch": {"alg": "bp"},
                "updater": {"type": "sgd", "lr": {"base": 0.1}},
                "train_steps": 1,
            },
            BuildContext(sample_shape=(5,), num_classes=3),
        )
        out = job.net(torch.randn(4, 5), torch.tensor([0, 1, 2, 0]))
        out.loss.backward()
        row = next(r for r in job.table if r.name == "s")
        print(json.dumps({
            "row": [row.type, row.out_shape, row.params],
            "grad": job.net.named_params()["s/w"].grad is not None,
            "in_schema": '"scale"' in json.dumps(JobSpec.model_json_schema()),
        }))
        """,
    )
    assert json.loads(out) == {"row": ["scale", [3], 1], "grad": True, "in_schema": True}


@pytest.mark.slow  # a copy of the code, its tests run there
def test_the_field_recipe_adds_a_field_everywhere(tmp_path: Path) -> None:
    _copy(tmp_path, *PACKAGES, "scripts", "web/src", "pyproject.toml")
    _follow("field", tmp_path)
    _run(tmp_path, "import runpy; runpy.run_path('scripts/gen_types.py', run_name='__main__')")
    out = _run(
        tmp_path,
        f"""
        import json
        from api.routes.jobs import job_fields
        from scheduler.store.database import Database, migrate
        from scheduler.store.jobs import NewJob, create_job, list_jobs
        from scheduler.store.users import create_user
        from trainyard.models import JobOut
        url = "sqlite:///{tmp_path / "jobs.db"}"
        migrate(url)
        db = Database(url)
        with db.session() as session:
            owner = create_user(session, "ada")
            new = NewJob("j", "", {{}}, {{}}, {{}}, "local", 10)
            job = create_job(session, owner, new)
            job.pinned = True
        with db.session() as session:
            page, _ = list_jobs(session, owner)
            job = session.get(type(job), job.id)
            detail = job_fields(job, "ada", None, job.train_steps)
        print(json.dumps({{
            "listed": json.loads(page)[0]["pinned"],
            "detail": detail["pinned"],
            "client": "pinned" in JobOut.model_fields,
        }}))
        """,
    )
    assert json.loads(out) == {"listed": True, "detail": True, "client": True}
    assert "pinned: boolean" in (tmp_path / "web/src/types.gen.ts").read_text()


MODEL_AVERAGING_WORKER = """
import json, sys
from pathlib import Path
import torch
from dsl.compiler import compile_job
from dsl.topology import resolve_topology
from workers.context import RunContext
from workers.data import TrainingData
from workers.parallel import train

torch.set_num_threads(1)
rank, redis_url, cache = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
data = TrainingData(cache_dir=cache, base_dir=Path.cwd())
job = compile_job(
    {
        "name": "modelavg",
        "data": {"source": "digits", "batch_size": 32},
        "neuralnet": {"layers": [
            {"name": "data", "type": "input"},
            {"name": "fc", "type": "dense", "srclayers": ["data"], "units": 10},
            {"name": "loss", "type": "softmax_loss", "srclayers": ["fc"]},
        ]},
        "train_one_batch": {"alg": "bp"},
        "updater": {"type": "sgd", "lr": {"base": 0.1}},
        "cluster": {"framework": "modelavg"},
        "train_steps": 16,
    },
    data,
)
context = RunContext(
    job=job,
    dataset=data.dataset,
    topology=resolve_topology(job.spec.cluster),
    run_dir=Path(f"run{rank}"),
    rank=rank,
    redis_url=redis_url,
    scope="recipe:modelavg",
)
summary = train(context)
total = sum(float(p.double().sum()) for p in job.net.parameters())
print(json.dumps({"status": summary.status, "steps": summary.steps, "params": total}))
"""


@pytest.mark.slow  # a copy of the code, its tests run there
def test_the_framework_recipe_adds_a_framework(
    tmp_path: Path, redis_url: str, cache_dir: Path
) -> None:
    _copy(tmp_path, "contract", "dsl", "workers")
    _follow("framework", tmp_path)
    (tmp_path / "worker.py").write_text(MODEL_AVERAGING_WORKER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    workers = [
        subprocess.Popen(
            [sys.executable, "worker.py", str(rank), redis_url, str(cache_dir)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-4000:]
        results.append(json.loads(out.splitlines()[-1]))
    assert [(r["status"], r["steps"]) for r in results] == [("succeeded", 16)] * 2
    # The last step (16) averaged the replicas: the two workers end with the same parameters.
    assert results[0]["params"] == pytest.approx(results[1]["params"], rel=1e-6)


@pytest.mark.slow  # a copy of the code, its tests run there
def test_the_endpoint_recipe_serves_a_new_endpoint(tmp_path: Path, redis_url: str) -> None:
    _copy(tmp_path, *PACKAGES, "scripts", "web/src", "pyproject.toml")
    _follow("endpoint", tmp_path)
    _run(tmp_path, "import runpy; runpy.run_path('scripts/gen_types.py', run_name='__main__')")
    out = _run(
        tmp_path,
        f"""
        import json, math
        from fastapi.testclient import TestClient
        from api.app import create_app
        from contract.settings import Settings
        from scheduler.store.database import Database, migrate
        from scheduler.store.jobs import NewJob, create_job
        from scheduler.store.models import Metric
        from scheduler.store.users import create_token, create_user
        from trainyard.models import LatestMetrics
        settings = Settings(
            data_dir="{tmp_path / "data"}",
            database_url="sqlite:///{tmp_path / "jobs.db"}",
            redis_url="{redis_url}",
            redis_prefix="recipe-endpoint",
        )
        migrate(settings.sql_url())
        with Database(settings.sql_url()).session() as session:
            ada, bob = create_user(session, "ada"), create_user(session, "bob")
            tokens = {{"ada": create_token(session, ada), "bob": create_token(session, bob)}}
            job = create_job(session, ada, NewJob("j", "", {{}}, {{}}, {{}}, "local", 10))
            for step, loss in ((1, 2.0), (5, 0.5), (3, 1.0)):
                session.add(Metric(job_id=job.id, name="loss", step=step, value=loss, at=0.0))
            session.add(Metric(job_id=job.id, name="grad", step=5, value=math.inf, at=0.0))
            session.add(Metric(job_id=job.id, name="loss", step=9, value=7.0, rank=1, at=0.0))
            job_id = job.id
        with TestClient(create_app(settings, web_dist=None)) as client:
            url = f"/api/v1/jobs/{{job_id}}/metrics/latest"
            mine = client.get(url, headers={{"Authorization": "Bearer " + tokens["ada"]}})
            theirs = client.get(url, headers={{"Authorization": "Bearer " + tokens["bob"]}})
        print(json.dumps({{
            "status": [mine.status_code, theirs.status_code],
            "values": LatestMetrics.model_validate(mine.json()).values,
        }}))
        """,
    )
    assert json.loads(out) == {"status": [200, 404], "values": {"loss": 0.5, "grad": None}}
    assert "LatestMetrics" in (tmp_path / "web/src/types.gen.ts").read_text()
