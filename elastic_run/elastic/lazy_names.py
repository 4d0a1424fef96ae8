"""Names of a mirror package resolved on first use: importing the package imports nothing heavy.

A package's ``__getattr__`` asks :func:`resolve` for a name; the table says which module of
elastic-run defines it. Invariant: a name not in the table is an ``AttributeError``, as for
any module.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["resolve"]


def resolve(package: str, table: Mapping[str, str], name: str) -> Any:
    """Return ``name`` from the module ``table`` names for it.

    Args:
        package: the asking package (for the error message).
        table: name -> the module that defines it.
        name: the attribute asked for.

    Raises:
        AttributeError: ``name`` is not one of the package's names.
    """
    module = table.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
