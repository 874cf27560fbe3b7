"""The mixing controllers a recipe can name: one registry, consulted by ``[mixing]`` tables and ``Mixing.from_table``.

A controller is registered once, in its own module, with the factory that builds it from its own
recipe keys (``ControllerArgs``) and those keys::

    register_controller("odm", OdmController.from_args, keys=("alpha",))

The built-ins (identity, schedule, odm) are registered so, below. A recipe's ``controller`` names
one of three things (``controller_from``):

- a registered name (``"odm"``);
- an entry point of the group ``zephon.mixing_controllers`` of an installed package, its name the
  controller's (``[project.entry-points."zephon.mixing_controllers"] mine = "mypkg.mine:Mine"``);
- a class by its path, ``"mypkg.mine:Mine"``, imported when the recipe loads.

An entry point or a path names a controller class: ``name`` (what the journal and the steering clock
record), ``params``, ``propose``, ``state``, ``load_state`` (``MixingController``), and optionally
``keys`` (its recipe keys, a tuple of names) and a classmethod ``from_args(args)`` (without one, the
class is called with its keys as keyword arguments). The keys of the table that are not the common
mixing keys must be keys of the chosen controller, which checks their values itself.

Only a recipe imports a controller's module. A checkpoint's journal and steering clock hold the
controller's name as a string, compared with the name of the controller the recipe built
(``MixingLoader.restore``); nothing ever resolves a name read from a state, so loading one never
imports a module or runs code of its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from zephon_core.curriculum.controllers import (
    ControllerArgs,
    IdentityController,
    MixingController,
    OdmController,
    ScheduleController,
)
from zephon_core.errors import ConfigError

GROUP = "zephon.mixing_controllers"
DEFAULT_CONTROLLER = "identity"
_METHODS = ("params", "propose", "state", "load_state")

Factory = Callable[[ControllerArgs], MixingController]


@dataclass(frozen=True)
class Registration:
    """A controller a recipe can name: the factory that builds it from its own recipe ``keys``."""

    name: str
    factory: Factory
    keys: tuple[str, ...]


_REGISTRY: dict[str, Registration] = {}


def register_controller(name: str, factory: Factory, keys: Iterable[str] = ()) -> None:
    """Make ``factory`` the controller a recipe names ``name``; ``keys``: its own keys of the ``[mixing]`` table.

    ``factory(args)`` gets the keys given (``ControllerArgs``) and returns a controller whose ``name`` is
    ``name``. A name registered already to another factory, a name with ``:`` (a path's), or a key that is a
    common mixing key is a ``ValueError``.
    """
    keys = tuple(keys)
    other = _REGISTRY.get(name)
    if other is not None and (other.factory, other.keys) != (factory, keys):
        raise ValueError(f"mixing controller {name!r} is registered already ({other.factory!r})")
    if not name or ":" in name:
        raise ValueError(f"mixing controller name {name!r}: a registered name is not empty and has no ':'")
    clash = sorted(set(keys) & set(COMMON_KEYS))
    if clash:
        raise ValueError(f"mixing controller {name!r}: {clash[0]!r} is a common mixing key; name it otherwise")
    _REGISTRY[name] = Registration(name, factory, keys)


def unregister_controller(name: str) -> None:
    """Forget the controller ``name`` (tests register controllers of their own)."""
    _REGISTRY.pop(name, None)


def registered_controllers() -> list[str]:
    """The registered names, in the order they were registered, then the installed entry points' names."""
    return [*_REGISTRY, *sorted({ep.name for ep in metadata.entry_points(group=GROUP)} - set(_REGISTRY))]


def naming(name: str) -> str:
    """How a recipe names the controller a state records as ``name`` (for a message; nothing is imported)."""
    if name in registered_controllers():
        return f"set controller = {name!r}"
    return f"set controller to the 'module:Class' path of the controller named {name!r}"


#: The keys of a ``[mixing]`` table every controller shares (``pipeline.mixing.Mixing``): not a controller's own.
COMMON_KEYS = ("controller", "interval_steps", "interval_tokens", "min_share", "max_change", "margin_chunks",
               "weight_by")


def controller_from(table: Mapping[str, Any], where: str = "mixing", base: Path | None = None) -> MixingController:
    """The controller a ``[mixing]`` table names (``controller``; default identity), built from its own keys.

    ``base``: the folder its relative paths are read from. Every key of ``table`` must be a common mixing key
    or one of the chosen controller's; what is wrong is a one-line ``ConfigError`` naming ``where.KEY``.
    """
    kind = table.get("controller", DEFAULT_CONTROLLER)
    reg = _resolve(kind, f"{where}.controller")
    own = {k: v for k, v in table.items() if k not in COMMON_KEYS}
    stray = sorted(set(own) - set(reg.keys))
    if stray:
        raise ConfigError(_stray(stray[0], reg, where))
    controller = reg.factory(ControllerArgs(own, where, base))
    if getattr(controller, "name", None) != reg.name:
        built = getattr(controller, "name", None)
        raise ConfigError(f"{where}.controller: the factory of {kind!r} built {type(controller).__name__} named "
                          f"{built!r}, not {reg.name!r}; its name must be the registered one")
    return controller


def _stray(key: str, reg: Registration, where: str) -> str:
    owners = [r.name for r in _REGISTRY.values() if key in r.keys]
    own = f"its keys: {', '.join(reg.keys)}" if reg.keys else "it has no keys of its own"
    if owners:
        return f"{where}.{key} is not a key of controller {reg.name!r} ({own}; {key} is {owners[0]!r}'s); remove it"
    return (f"{where}.{key} is not a mixing key; keys are {', '.join(COMMON_KEYS)} and controller {reg.name!r}'s "
            f"({own})")


def _resolve(kind: Any, where: str) -> Registration:
    """The registration ``kind`` names: registered, an entry point (loaded now), or a ``module:Class`` path."""
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"{where} must be a controller's name or a 'module:Class' path, got {kind!r}")
    if kind in _REGISTRY:
        return _REGISTRY[kind]
    if ":" in kind:
        return _from_path(kind, where)
    found = [ep for ep in metadata.entry_points(group=GROUP) if ep.name == kind]
    if not found:
        raise ConfigError(f"{where} must be one of {', '.join(registered_controllers())} or a 'module:Class' path "
                          f"(an entry point of {GROUP} registers a name), got {kind!r}")
    try:
        cls = found[0].load()
    except Exception as e:  # a user's module: whatever importing it raises is refused in one line
        raise ConfigError(f"{where}: the entry point {kind!r} ({found[0].value}) does not load: "
                          f"{type(e).__name__}: {_line(e)}; install its package or fix it") from None
    reg = _of_class(cls, f"the entry point {kind!r} ({found[0].value})", where)
    if reg.name != kind:
        raise ConfigError(f"{where}: the entry point {kind!r} names a controller called {reg.name!r}; give the "
                          f"entry point the controller's name")
    return reg


def _from_path(path: str, where: str) -> Registration:
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ConfigError(f"{where}: {path!r} is not a 'module:Class' path; write e.g. 'mypkg.mixing:MyController'")
    try:
        cls: Any = importlib.import_module(module)
        for part in attr.split("."):
            cls = getattr(cls, part)
    except AttributeError:
        raise ConfigError(f"{where}: module {module!r} has no {attr!r} (from {path!r}); name a class it "
                          "defines") from None
    except Exception as e:  # a user's module: whatever importing it raises is refused in one line
        raise ConfigError(f"{where}: cannot import {module!r} (from {path!r}): {type(e).__name__}: {_line(e)}; put "
                          "its folder on the Python path (PYTHONPATH) of every rank or install its package") from None
    reg = _of_class(cls, repr(path), where)
    other = _REGISTRY.get(reg.name)
    if other is not None and getattr(other.factory, "__self__", other.factory) is not cls:
        raise ConfigError(f"{where}: {path!r} is named {reg.name!r}, the name of the registered controller "
                          f"{other.name!r}; give the class another name (a checkpoint tells them apart by it)")
    return reg


def _of_class(cls: Any, what: str, where: str) -> Registration:
    """A controller class as a registration (``name``, ``keys``, ``from_args`` or the class itself)."""
    lacks = [m for m in _METHODS if not callable(getattr(cls, m, None))]
    name = getattr(cls, "name", None)
    if not isinstance(cls, type) or lacks or not isinstance(name, str) or not name or ":" in name:
        why = (f"a {type(cls).__name__}, not a class" if not isinstance(cls, type) else
               f"it lacks {', '.join(lacks)}" if lacks else f"its name is {name!r}, not a name without ':'")
        raise ConfigError(f"{where}: {what} is not a mixing controller ({why}); name a class with a str name and "
                          f"{', '.join(_METHODS)} (zephon_core.curriculum.controllers.MixingController)")
    keys = getattr(cls, "keys", ())
    if not isinstance(keys, (tuple, list)) or not all(isinstance(k, str) for k in keys) or set(keys) & set(COMMON_KEYS):
        raise ConfigError(f"{where}: {what}.keys must be a tuple of its own key names (none of "
                          f"{', '.join(COMMON_KEYS)}), got {keys!r}")
    from_args = getattr(cls, "from_args", None)
    return Registration(name, from_args if callable(from_args) else _keywords(cls, where), tuple(keys))


def _keywords(cls: type, where: str) -> Factory:
    """A factory calling ``cls`` with its keys as keyword arguments; what it refuses, refused naming the table."""
    def build(args: ControllerArgs) -> MixingController:
        try:
            return cls(**args.keys)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {cls.__module__}:{cls.__qualname__} refused its keys "
                              f"{dict(args.keys)!r}: {_line(e)}") from None
    return build


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


for _cls in (IdentityController, ScheduleController, OdmController):
    register_controller(_cls.name, _cls.from_args, keys=_cls.keys)
