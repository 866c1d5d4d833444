"""Plugins: the user's own layers and updaters, in modules every process imports at start.

A plugin is a Python module named by an entry point of the group `trainyard.plugins` (an
installed distribution) or by the setting `TRAINYARD_PLUGINS` (comma-separated module names or
`.py` paths). `load_plugins` imports them all, then rebuilds the job language's schema so that
the types they registered (dsl/plugin_types.py: `@layer`, `@updater`, published as
`trainyard.plugins`) are part of it. This module imports no torch: a process asks `wanted()`
before it pays for loading.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from importlib.metadata import PackageNotFoundError, entry_points, packages_distributions, version
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.optim import Optimizer

ENTRY_POINT_GROUP = "trainyard.plugins"
SETTING = "TRAINYARD_PLUGINS"


class PluginError(RuntimeError):
    """A plugin that cannot be loaded or that registers what it may not; the process stops."""


@dataclass
class Plugin:
    """One loaded plugin: where it came from and what it registered."""

    name: str  # the module's name (or the .py file's stem)
    origin: str  # "entry point mylayers = mylayers (mylayers 1.2)" or the file's path
    version: str  # its distribution's version; "" for a module of no distribution
    layers: list[str] = field(default_factory=list)
    updaters: list[str] = field(default_factory=list)


# name -> the plugin, in the order they were loaded
PLUGINS: dict[str, Plugin] = {}
# type name -> the plugin that registered it
OWNERS: dict[str, Plugin] = {}
# the plugins being imported, innermost last: what their decorators register is theirs
LOADING: list[Plugin] = []
# updater type -> the function that builds its optimiser (workers/updaters.py reads it), as
# `@updater` registers it (dsl/plugin_types.py)
PLUGIN_UPDATERS: dict[str, Callable[..., Optimizer]] = {}
# The plugin updaters declared elementwise: each element's update depends on that element's
# gradient and state alone, so server shards may apply them to slices of the parameters.
ELEMENTWISE: set[str] = set()


def plugin_of(type_name: str) -> Plugin | None:
    """The plugin that registered the layer or updater type `type_name` (None: built in)."""
    return OWNERS.get(type_name)


def plugin_needs(layer_types: Iterable[str], updater_type: str) -> list[dict[str, str]]:
    """The plugin types a job uses, each {kind, type, plugin, version}: what placement asks of
    a node (its processes must load that plugin, at that version)."""
    needs: dict[str, dict[str, str]] = {}
    kinds = [("layer", name) for name in layer_types] + [("updater", updater_type)]
    for kind, name in kinds:
        owner = OWNERS.get(name)
        if owner is not None and name not in needs:
            needs[name] = {
                "kind": kind,
                "type": name,
                "plugin": owner.name,
                "version": owner.version,
            }
    return list(needs.values())


# -- loading ------------------------------------------------------------------------------


def wanted() -> bool:
    """Whether this process has plugins to load: installed entry points or the setting."""
    return bool(configured()) or bool(entry_points(group=ENTRY_POINT_GROUP))


def configured() -> list[str]:
    """The setting's plugins: module names or .py paths, comma-separated."""
    return [item.strip() for item in os.environ.get(SETTING, "").split(",") if item.strip()]


def load_plugins(extra: list[str] | None = None) -> list[Plugin]:
    """Import every plugin (entry points, then the setting's, then `extra`) not yet loaded,
    and rebuild the job language's schema; PluginError names the plugin that failed."""
    new: list[Plugin] = []
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if entry.module not in PLUGINS:
            dist = f"{entry.dist.name} {entry.dist.version}" if entry.dist else entry.module
            origin = f"entry point {entry.name} = {entry.value} ({dist})"
            new.append(
                _load(entry.module, origin, entry.load, entry.dist.version if entry.dist else "")
            )
    for item in [*configured(), *(extra or [])]:
        if item.endswith(".py"):
            path = Path(item).expanduser().resolve()
            if path.stem not in PLUGINS:
                new.append(_load(path.stem, str(path), partial(_import_file, path)))
        elif item not in PLUGINS:
            new.append(_load(item, f"module {item}", partial(importlib.import_module, item)))
    if new:
        from dsl.schema import rebuild_schema

        rebuild_schema()
    return new


def _load(name: str, origin: str, load: Callable[[], object], known: str = "") -> Plugin:
    plugin = Plugin(name, origin, known or _version_of(name))
    LOADING.append(plugin)
    try:
        load()
    except PluginError:
        raise
    except BaseException as exc:  # a plugin's import may raise anything, SystemExit too
        raise PluginError(
            f"plugin {name} ({origin}) failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        LOADING.pop()
    PLUGINS[name] = plugin
    return plugin


def _import_file(path: Path) -> object:
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path.stem]
        raise
    return module


def _version_of(module: str) -> str:
    """The version of the installed distribution that holds `module`, "" for none."""
    for dist in packages_distributions().get(module.split(".")[0], []):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return ""


def versions() -> dict[str, str]:
    """Each loaded plugin's name -> its version ("" for a module of no distribution)."""
    return {name: plugin.version for name, plugin in PLUGINS.items()}


def seed_for(seed: int, layer_name: str) -> int:
    """The torch seed under which a layer's module is built: the same in every process of a
    job, so that modules that initialise themselves agree between pipeline stages."""
    return zlib.crc32(f"{seed}/{layer_name}".encode())


@contextmanager
def unloaded_after() -> Iterator[None]:
    """Forget the plugins loaded inside the block (their types too) when it ends: for tests,
    which load plugins into a process that goes on."""
    from dsl.layers.base import LAYERS
    from dsl.updater_config import UPDATER_CONFIGS

    before = set(PLUGINS)
    try:
        yield
    finally:
        for name in [n for n in PLUGINS if n not in before]:
            plugin = PLUGINS.pop(name)
            for type_name in plugin.layers:
                LAYERS.unregister(type_name)
                OWNERS.pop(type_name, None)
            for type_name in plugin.updaters:
                UPDATER_CONFIGS.pop(type_name, None)
                PLUGIN_UPDATERS.pop(type_name, None)
                ELEMENTWISE.discard(type_name)
                OWNERS.pop(type_name, None)
            sys.modules.pop(name, None)
        from dsl.schema import rebuild_schema

        rebuild_schema()
