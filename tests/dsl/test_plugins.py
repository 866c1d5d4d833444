"""Plugins in this process: the example plugin loaded from its file, its layer's keys
validated from the signature, its shape from the meta device, its parameters' names and values,
its updater; duplicate names and failing plugins stopped with a clear message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dsl.compiler import compile_job
from dsl.errors import JobSpecError
from dsl.layers.base import LAYERS, BuildContext
from dsl.plugins import PLUGINS, PluginError, load_plugins, plugin_of, unloaded_after
from dsl.schema import json_schema
from workers.updaters import ParamEntry, Updater

torch.set_num_threads(1)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "plugin_dist" / "trainyard_rmsnorm.py"
CTX = BuildContext(sample_shape=(6,), num_classes=5, label_shape=(6,))

JOB = """\
name: plugin-job
data: {source: text, seq_len: 6, batch_size: 4}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: tok, type: embedding, srclayers: [data], dim: 8}
    - {name: norm, type: rmsnorm, srclayers: [tok], KEYS}
    - {name: head, type: dense, axis: 2, srclayers: [norm]}
    - {name: loss, type: softmax_loss, srclayers: [head]}
updater: {type: signsgd, momentum: 0.5, lr: {base: 0.01}}
train_steps: 2
"""


@pytest.fixture
def rmsnorm() -> Iterator[None]:
    with unloaded_after():
        [plugin] = load_plugins([str(FIXTURE)])
        assert (plugin.name, plugin.layers, plugin.updaters) == (
            "trainyard_rmsnorm",
            ["rmsnorm"],
            ["signsgd"],
        )
        yield
    assert "rmsnorm" not in LAYERS and "trainyard_rmsnorm" not in PLUGINS


def test_a_plugin_layer_compiles_and_trains(rmsnorm: None) -> None:
    job = compile_job(JOB.replace("KEYS", "eps: 0.001"), CTX)
    norm = job.net.named_layers()[2][1]
    assert norm.eps == 0.001  # type: ignore[comparison-overlap]
    params = job.net.named_params()
    # named <layer>/<attribute>, and the module's own initial values kept
    assert torch.equal(params["norm/scale"], torch.ones(8))
    assert [row.out_shape for row in job.table][2] == [6, 8]
    x = torch.randn(3, 6, 8)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 0.001)
    torch.testing.assert_close(norm(x), expected)
    out = job.net(torch.randint(0, 5, (4, 6)), torch.randint(0, 5, (4, 6)))
    assert out.loss is not None
    out.loss.backward()
    entries = [ParamEntry(name, p) for name, p in params.items()]
    updater = Updater(entries, job.spec.updater, total_steps=2)
    before = params["norm/scale"].detach().clone()
    updater.step(0)
    # signSGD moves every parameter with a gradient by exactly lr
    moved = (params["norm/scale"].detach() - before).abs()
    torch.testing.assert_close(moved, torch.full((8,), 0.01))


def test_a_plugin_layers_keys_are_validated_with_suggestions(rmsnorm: None) -> None:
    with pytest.raises(JobSpecError) as err:
        compile_job(JOB.replace("KEYS", "epsilon: 0.00001"), CTX)
    [issue] = err.value.issues
    assert issue.path == "neuralnet.layers[2].epsilon"
    assert issue.line == 7
    assert issue.message == "unknown key 'epsilon'" and issue.hint == "did you mean 'eps'?"
    with pytest.raises(JobSpecError, match=r"neuralnet.layers\[2\].eps"):
        compile_job(JOB.replace("KEYS", "eps: many"), CTX)


def test_a_plugin_type_is_in_the_schema_with_its_description(rmsnorm: None) -> None:
    definitions = json_schema()["$defs"]
    [rms] = [
        d
        for d in definitions.values()
        if d.get("properties", {}).get("type", {}).get("const") == "rmsnorm"
    ]
    assert rms["description"].startswith("Root-mean-square normalisation")
    assert rms["properties"]["eps"]["default"] == 1e-6
    owner = plugin_of("rmsnorm")
    assert owner is not None and owner.origin == str(FIXTURE)


def test_a_plugin_in_a_repeated_block(rmsnorm: None) -> None:
    text = JOB.replace(
        "    - {name: norm, type: rmsnorm, srclayers: [tok], KEYS}\n",
        "    - {name: norm, type: repeat, times: 2, srclayers: [tok], layers: "
        "[{name: n, type: rmsnorm, srclayers: [norm]}]}\n",
    )
    job = compile_job(text, CTX)
    assert {"norm.0.n/scale", "norm.1.n/scale"} <= set(job.net.named_params())


def test_a_plugin_layer_that_fails_on_its_input_is_located(tmp_path: Path) -> None:
    plugin = tmp_path / "bad_shapes.py"
    plugin.write_text(
        "import torch\nfrom torch import nn\nfrom trainyard.plugins import layer\n\n"
        "@layer('needs_square')\nclass Square(nn.Module):\n"
        "    def __init__(self, in_shape, *, size: int = 3):\n"
        "        super().__init__()\n        self.w = nn.Parameter(torch.ones(size, size))\n"
        "    def forward(self, x):\n        return x @ self.w\n"
    )
    with unloaded_after():
        load_plugins([str(plugin)])
        with pytest.raises(JobSpecError) as err:
            text = JOB.replace("rmsnorm", "needs_square").replace(", KEYS", "")
            compile_job(text.replace("signsgd, momentum: 0.5", "sgd"), CTX)
    [issue] = err.value.issues
    assert issue.path == "neuralnet.layers[2].type"
    assert "the plugin layer failed on inputs of shape [6, 8]" in issue.message


def test_a_name_registered_twice_names_both_origins(tmp_path: Path) -> None:
    plugin = tmp_path / "twice.py"
    plugin.write_text(
        "from torch import nn\nfrom trainyard.plugins import layer\n\n"
        "@layer('layernorm')\nclass Mine(nn.Module):\n"
        "    def __init__(self, in_shape):\n        super().__init__()\n"
        "    def forward(self, x):\n        return x\n"
    )
    with unloaded_after(), pytest.raises(PluginError) as err:
        load_plugins([str(plugin)])
    assert str(err.value) == (
        f"layer type 'layernorm' is registered twice: by Trainyard itself and by plugin twice "
        f"({plugin})"
    )
    assert "twice" not in PLUGINS


def test_a_plugin_that_fails_to_import_is_named(tmp_path: Path) -> None:
    plugin = tmp_path / "broken.py"
    plugin.write_text("import not_a_module_anywhere\n")
    with unloaded_after(), pytest.raises(PluginError) as err:
        load_plugins([str(plugin)])
    assert str(err.value).startswith(
        f"plugin broken ({plugin}) failed to load: ModuleNotFoundError: No module named"
    )
    with unloaded_after(), pytest.raises(PluginError, match="plugin nowhere_at_all"):
        load_plugins(["nowhere_at_all"])


def test_server_shards_run_only_elementwise_plugin_updaters(tmp_path: Path) -> None:
    plugin = tmp_path / "lamb_like.py"
    plugin.write_text(
        "import torch\nfrom trainyard.plugins import updater\n\n"
        "@updater('pertensor')\ndef per_tensor(groups, *, trust: float = 0.01):\n"
        "    return torch.optim.SGD(groups)\n"
    )
    text = (
        "name: ps\ndata: {source: synthetic, task: classification, num_samples: 64, "
        "num_features: 8, batch_size: 8}\nneuralnet:\n  layers:\n"
        "    - {name: data, type: input}\n    - {name: fc, type: dense, srclayers: [data]}\n"
        "    - {name: loss, type: softmax_loss, srclayers: [fc]}\n"
        "updater: {type: UPDATER, lr: {base: 0.01}}\ntrain_steps: 2\n"
        "cluster: {framework: sandblaster}\n"
    )
    ctx = BuildContext(sample_shape=(8,), num_classes=3)
    with unloaded_after():
        load_plugins([str(plugin), str(FIXTURE)])
        with pytest.raises(JobSpecError) as err:
            compile_job(text.replace("UPDATER", "pertensor"), ctx)
        [issue] = err.value.issues
        assert issue.path == "updater.type" and issue.line == 8
        assert "the plugin updater 'pertensor' is not declared elementwise" in issue.message
        compile_job(text.replace("UPDATER", "signsgd"), ctx)  # declared elementwise
        compile_job(text.replace("UPDATER", "pertensor").replace("sandblaster", "allreduce"), ctx)
