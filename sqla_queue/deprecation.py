"""Old spellings that still work for one release, each with a DeprecationWarning naming the new
one: a module's renamed names and a dataclass's renamed arguments."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any


def renamed_name(module: str, name: str, renamed: Mapping[str, tuple[Any, str]]) -> Any:
    """For a module's `__getattr__`: the object `renamed[name]` names, with a warning that
    `module.name` is deprecated and its advice; AttributeError for any other name."""
    if name not in renamed:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    target, advice = renamed[name]
    # 3: past this function and the module's __getattr__, to the code that used the name.
    warnings.warn(f"{module}.{name} is deprecated: {advice}", DeprecationWarning, stacklevel=3)
    return target


def renamed_argument(owner: str, old: str, new: str) -> None:
    """For a dataclass's `__post_init__`: warn that `owner(old=...)` is deprecated for `new`."""
    # 4: past this function, __post_init__ and __init__, to the code that built the object.
    warnings.warn(
        f"{owner}({old}=...) is deprecated: pass {new}=...", DeprecationWarning, stacklevel=4
    )
