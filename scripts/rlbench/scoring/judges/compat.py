"""Importing the alpaca_eval package (its prompts, parsers and metrics) on current setuptools.

alpaca_eval 0.6.6 imports pkg_resources for two version helpers (parse_version,
get_distribution), which setuptools >= 81 no longer ships. When the real module is missing, a
stand-in built on importlib.metadata and packaging is registered before the import; nothing else
of alpaca_eval is touched.
"""

from __future__ import annotations

import importlib
import sys
import types
from types import ModuleType


def _install_pkg_resources_shim() -> None:
    try:
        import pkg_resources  # noqa: F401
    except ImportError:
        from importlib import metadata

        from packaging.version import parse

        shim = types.ModuleType("pkg_resources")
        shim.parse_version = parse
        shim.get_distribution = lambda name: types.SimpleNamespace(version=metadata.version(name))
        # What pytest's monkeypatch.syspath_prepend (and other callers) expect once the module
        # is loaded; there are no pkg_resources-style namespace packages to fix up here.
        shim.fixup_namespace_packages = lambda *args, **kwargs: None
        sys.modules["pkg_resources"] = shim


def alpaca_eval_module(name: str = "alpaca_eval") -> ModuleType:
    """An alpaca_eval module (e.g. "alpaca_eval.metrics"), importable whatever setuptools is installed."""
    _install_pkg_resources_shim()
    return importlib.import_module(name)
