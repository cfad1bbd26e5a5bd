"""The registry: method and workload names to their objects, built in, from installed packages, or by import path.

A name is looked up in three places, in order:
1. the built-in table (`methods/` and `harness/workloads/builtin.py`), imported only when asked for;
2. the entry points of installed packages, groups `dtbench.methods` and `dtbench.workloads`;
3. a `package.module:Attribute` reference, importable from the environment or PYTHONPATH.
Every lookup returns the object and an `Entry` that says where it came from (written to spec.json).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Generic, TypeVar

T = TypeVar("T")

BUILTIN_METHODS: dict[str, str] = {
    "sgd": "methods.reference.sgd:SGD",
    "single": "methods.reference.sgd:SGD",  # the same reference under a name that fits any optimizer (adamw too)
    "ddp": "methods.reference.ddp:DDP",
    "fp16": "methods.compression.fp16:FP16",
    "qsgd": "methods.compression.qsgd:QSGD",
    "terngrad": "methods.compression.terngrad:TernGrad",
    "dgc": "methods.compression.dgc:DGC",
    "onebit": "methods.compression.onebit:OneBit",
    "powersgd": "methods.compression.powersgd:PowerSGD",
    "local": "methods.local.local:Local",
    "gpipe": "methods.pipeline.flushed.gpipe:GPipe",
    "1f1b": "methods.pipeline.flushed.one_f_one_b:OneFOneB",
    "pipedream": "methods.pipeline.pipedream.pipedream:PipeDream",
    "interleaved-1f1b": "methods.pipeline.flushed.interleaved:Interleaved1F1B",
    "zb-h1": "methods.pipeline.flushed.zb_h1:ZBH1",
    "pb": "methods.pipeline.pb.pb:PipelinedBackprop",
    "qfb": "methods.pipeline.qfb.qfb:QFB",
    "apapo": "methods.pipeline.apapo.apapo:APapo",
}


class RegistryError(LookupError):
    """A name that resolves to nothing usable. The message is one line saying what is wrong and what is known."""


@dataclass(frozen=True)
class Entry:
    """Where a registered object comes from. `origin` is one line: 'builtin REF', 'entry-point DIST==VERSION REF'
    or 'path REF', with REF the `module:attribute` it was imported from."""

    name: str
    reference: str
    kind: str  # builtin, entry-point, path
    distribution: str | None = None

    @property
    def origin(self) -> str:
        where = f"entry-point {self.distribution}" if self.kind == "entry-point" else self.kind
        return f"{where} {self.reference}"

    @property
    def id_name(self) -> str:
        """The name run ids and labels use: the registered name (a path's last part for a path reference)."""
        return self.name if self.kind != "path" else self.reference.rsplit(":", 1)[-1]


def _import(reference: str) -> Any:
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise RegistryError(f"{reference!r} is not of the form package.module:Attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RegistryError(f"cannot import {module_name!r} for {reference!r}: {exc}") from None
    try:
        obj: Any = module
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise RegistryError(f"module {module_name!r} has no attribute {attribute!r}") from None
    return obj


class Registry(Generic[T]):
    """Names of one kind (methods or workloads) -> objects, with their origin.

    `builtin` returns the built-in table {name: 'module:attribute'}; `group` is the entry-point group; `check(obj)`
    returns None when `obj` is a valid object of this kind, else the reason in a few words; `adapt` turns a checked
    object into the registered value (e.g. calling a factory).
    """

    def __init__(self, kind: str, group: str, builtin: Callable[[], dict[str, str]],
                 check: Callable[[Any], str | None], adapt: Callable[[Any], T] = lambda obj: obj):
        self.kind, self.group, self._builtin, self._check, self._adapt = kind, group, builtin, check, adapt

    def entries(self) -> dict[str, Entry]:
        """Every registered name (built-ins, then installed entry points whose names are not built in)."""
        out = {name: Entry(name, ref, "builtin") for name, ref in self._builtin().items()}
        for point in metadata.entry_points(group=self.group):
            if point.name in out:
                continue  # a built-in name is never shadowed by an installed package
            dist = f"{point.dist.name}=={point.dist.version}" if point.dist is not None else "unknown"
            out[point.name] = Entry(point.name, point.value.replace(" ", ""), "entry-point", dist)
        return out

    def names(self) -> list[str]:
        return sorted(self.entries())

    def resolve(self, name: str) -> tuple[T, Entry]:
        """The object registered or referenced as `name`, and its entry. RegistryError (one line) otherwise."""
        entry = self.entries().get(name)
        if entry is None:
            if ":" not in name:
                raise RegistryError(f"unknown {self.kind} {name!r} (known: {', '.join(self.names())}; or give "
                                    f"package.module:Attribute)")
            entry = Entry(name, name, "path")
        obj = _import(entry.reference)
        problem = self._check(obj)
        if problem:
            raise RegistryError(f"{entry.reference!r} ({entry.origin.split()[0]}) {problem}")
        return self._adapt(obj), entry

    def get(self, name: str) -> T:
        """The object alone (see resolve); RegistryError when there is none."""
        return self.resolve(name)[0]


def _check_method(obj: Any) -> str | None:
    from harness.method import Method

    if not isinstance(obj, type) or not issubclass(obj, Method):
        return "is not a subclass of harness.method.Method"
    if obj.__abstractmethods__:
        return f"is abstract (does not implement {', '.join(sorted(obj.__abstractmethods__))})"
    missing = [attr for attr in ("name", "family", "summary") if not isinstance(getattr(obj, attr, None), str)]
    return f"lacks the class attribute(s) {', '.join(missing)}" if missing else None


def _builtin_workloads() -> dict[str, str]:
    from harness.workloads.builtin import BUILTIN

    return {name: f"harness.workloads.builtin:{attribute}" for name, attribute in BUILTIN.items()}


def _check_workload(obj: Any) -> str | None:
    from harness.workloads.workload import Workload

    if isinstance(obj, Workload):
        return None
    return None if callable(obj) and not isinstance(obj, type) else "is neither a Workload nor a function returning one"


def _adapt_workload(obj: Any) -> Any:
    from harness.workloads.workload import Workload

    if isinstance(obj, Workload):
        return obj
    try:
        made = obj()
    except Exception as exc:  # a plug-in's factory, or a function that is none (os.path:join): one line, no traceback
        raise RegistryError(f"{obj!r} raised {type(exc).__name__} when called to make the workload: {exc}") from None
    if not isinstance(made, Workload):
        raise RegistryError(f"{obj!r} returned a {type(made).__name__}, not a harness.workloads.workload.Workload")
    return made


METHODS: Registry[Any] = Registry("method", "dtbench.methods", lambda: dict(BUILTIN_METHODS), _check_method)
WORKLOADS: Registry[Any] = Registry("workload", "dtbench.workloads", _builtin_workloads, _check_workload,
                                    _adapt_workload)
