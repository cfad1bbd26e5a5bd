"""The method registry: names to classes, as data. Modules are imported only when a method is asked for."""

from __future__ import annotations

import importlib

from harness.method import Method

METHODS: dict[str, str] = {
    "sgd": "methods.sgd:SGD",
    "ddp": "methods.ddp:DDP",
    "fp16": "methods.fp16:FP16",
    "qsgd": "methods.qsgd:QSGD",
    "terngrad": "methods.terngrad:TernGrad",
    "dgc": "methods.dgc:DGC",
    "onebit": "methods.onebit:OneBit",
    "local": "methods.local:Local",
    "gpipe": "methods.gpipe:GPipe",
    "1f1b": "methods.one_f_one_b:OneFOneB",
    "pipedream": "methods.pipedream:PipeDream",
}


def get(name: str) -> type[Method]:
    """The class registered as `name`; KeyError if there is none."""
    module_name, class_name = METHODS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def names() -> list[str]:
    return sorted(METHODS)
