"""The decorators a plugin registers its types with (published as `trainyard.plugins`).

`@layer("name")` on a plain `torch.nn.Module` class and `@updater("name")` on a function that
builds a `torch.optim.Optimizer`: the keyword-only arguments of either, with their type hints
and defaults, become the type's YAML keys, validated by a pydantic model built from the
signature; the docstring describes the type. A layer's output shape is found by running its
module on the meta device. dsl/plugins.py loads the modules that use them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar, Literal, TypeVar

import torch
from pydantic import Field, create_model
from torch import nn

from dsl.layers.base import LAYERS, BuildContext, Layer, LayerConfig, LayerShapeError, Shape
from dsl.plugins import ELEMENTWISE, LOADING, OWNERS, PLUGIN_UPDATERS, PluginError
from dsl.updater_config import UPDATER_CONFIGS, UpdaterBase

Optimizer = torch.optim.Optimizer
M = TypeVar("M", bound=type[nn.Module])
F = TypeVar("F", bound=Callable[..., Optimizer])


class PluginLayer(Layer):
    """Mixed into a plugin's module class: the net's contract (parameter roles, defaults)."""

    # The module initialised its parameters itself; the compiler keeps those values unless the
    # job's `param:` section says otherwise.
    initialises_itself: ClassVar[bool] = True


def layer(name: str, *, sources: int | None = 1) -> Callable[[M], M]:
    """Register a `torch.nn.Module` class as the layer type `name`.

    Its `__init__` takes the per-sample input shape first (a tuple; with `sources` other than
    1, a list of tuples, one per source; None: any number), then keyword-only arguments: the
    layer's YAML keys. Its docstring describes the type in the schema and the docs.
    """

    def register(cls: M) -> M:
        _check_name(name, LAYERS.names(), "layer type")
        keys = _keys_of(cls.__init__, f"layer '{name}'", skip=1, reserved=LayerConfig.model_fields)
        module_class = type(cls.__name__, (cls, PluginLayer), {"__module__": cls.__module__})
        config = _layer_config(name, cls, module_class, keys, sources)
        LAYERS.register(name)(config)
        _record(name, "layers")
        return cls

    return register


def updater(name: str, *, elementwise: bool = False) -> Callable[[F], F]:
    """Register a function `(param_groups, *, keys...) -> torch.optim.Optimizer` as the updater
    type `name`. The groups carry their `lr` and `weight_decay`, set from the job's `lr` and
    `weight_decay` keys (every updater takes those and `clip`). `elementwise`: each element's
    update depends on its own gradient and state alone (SGD, Adam, signSGD; not LAMB's
    per-tensor norms), so parameter-server shards, which each update a slice of a parameter,
    may run it; the frameworks with server shards refuse the others."""

    def register(build: F) -> F:
        _check_name(name, [*UPDATER_CONFIGS, *PLUGIN_UPDATERS], "updater")
        keys = _keys_of(build, f"updater '{name}'", skip=1, reserved=UpdaterBase.model_fields)
        fields: dict[str, Any] = {"type": (Literal[name], ...), **keys}
        config = create_model(
            f"{build.__name__}_config",
            __base__=UpdaterBase,
            __module__=build.__module__,
            __doc__=inspect.getdoc(build) or f"The plugin updater '{name}'.",
            **fields,
        )
        UPDATER_CONFIGS[name] = config
        PLUGIN_UPDATERS[name] = build
        if elementwise:
            ELEMENTWISE.add(name)
        _record(name, "updaters")
        return build

    return register


def _check_name(name: str, known: list[str], kind: str) -> None:
    if name not in known:
        return
    existing = OWNERS.get(name)
    first = f"plugin {existing.name} ({existing.origin})" if existing else "Trainyard itself"
    second = f"plugin {LOADING[-1].name} ({LOADING[-1].origin})" if LOADING else "this module"
    raise PluginError(f"{kind} '{name}' is registered twice: by {first} and by {second}")


def _record(name: str, kind: Literal["layers", "updaters"]) -> None:
    if LOADING:
        getattr(LOADING[-1], kind).append(name)
        OWNERS[name] = LOADING[-1]


def _keys_of(
    function: Callable[..., Any], what: str, *, skip: int, reserved: dict[str, Any]
) -> dict[str, Any]:
    """The keyword-only parameters of `function` as pydantic fields: (hint, default)."""
    parameters = list(inspect.signature(function).parameters.values())
    if parameters and parameters[0].name == "self":
        parameters = parameters[1:]
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) != skip:
        raise PluginError(
            f"{what}: takes {skip} positional argument(s) before its keyword-only keys, "
            f"not {len(positional)} ({', '.join(p.name for p in positional) or 'none'})"
        )
    hints = inspect.get_annotations(function, eval_str=True)
    keys: dict[str, Any] = {}
    for parameter in parameters:
        if parameter.kind != parameter.KEYWORD_ONLY:
            continue
        if parameter.name in reserved:
            raise PluginError(
                f"{what}: its key '{parameter.name}' is one every such type has; rename it"
            )
        hint = hints.get(parameter.name, Any)
        default = ... if parameter.default is parameter.empty else parameter.default
        keys[parameter.name] = (hint, Field(default=default))
    return keys


def _layer_config(
    name: str,
    cls: type[nn.Module],
    module_class: type[nn.Module],
    keys: dict[str, Any],
    sources: int | None,
) -> type[LayerConfig]:
    key_names = list(keys)

    def build(self: LayerConfig, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        arg: Any = in_shapes[0] if sources == 1 else list(in_shapes)
        kwargs = {key: getattr(self, key) for key in key_names}
        try:
            module = module_class(arg, **kwargs)
            out_shape = _meta_shape(module_class, arg, kwargs, in_shapes)
        except LayerShapeError:
            raise
        except Exception as exc:  # the plugin's own code: any failure is the user's to see
            raise LayerShapeError(
                f"the plugin layer failed on inputs of shape "
                f"{', '.join(str(list(s)) for s in in_shapes)}: {type(exc).__name__}: {exc}",
                hint=f"see the plugin's documentation of '{name}'",
            ) from None
        assert isinstance(module, Layer)
        return module, out_shape

    arity = (1, 1) if sources == 1 else (sources or 1, sources)
    namespace: dict[str, Any] = {
        "__module__": cls.__module__,
        "__qualname__": f"{cls.__name__}Config",
        "__doc__": inspect.getdoc(cls) or f"The plugin layer '{name}'.",
        "__annotations__": {"type": Literal[name], **{k: hint for k, (hint, _) in keys.items()}},
        **{key: default for key, (_, default) in keys.items()},
        "arity": arity,
        "build": build,
    }
    config: type[LayerConfig] = type(f"{cls.__name__}Config", (LayerConfig,), namespace)
    return config


def _meta_shape(
    module_class: type[nn.Module], arg: Any, kwargs: dict[str, Any], in_shapes: list[Shape]
) -> Shape:
    """The module's output shape per sample: the module run on the meta device (no memory,
    no arithmetic) on a batch of two."""
    with torch.device("meta"):
        probe = module_class(arg, **kwargs)
        out = probe(*(torch.empty(2, *shape) for shape in in_shapes))
    if not isinstance(out, torch.Tensor):
        raise LayerShapeError(
            f"the plugin layer returns {type(out).__name__}, not one tensor",
            hint="a layer's forward returns one tensor of shape (batch, ...)",
        )
    return tuple(out.shape[1:])
