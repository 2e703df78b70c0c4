"""The optional extras: `all` installs every optional feature, `test` what the tests import."""

from __future__ import annotations

import re
import sys

import pytest
from helpers.support import REPO_ROOT

if sys.version_info < (3, 11):
    pytest.skip("tomllib is new in Python 3.11", allow_module_level=True)
import tomllib

NOT_FEATURES = {"all", "test", "dev", "docs", "bench", "examples"}
"""Extras for working on sqla-queue itself, not features of it."""


def extras() -> dict[str, list[str]]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["optional-dependencies"])


def self_extras(requirements: list[str]) -> set[str]:
    """The extras named by `sqla-queue[a,b]` requirements."""
    found: set[str] = set()
    for requirement in requirements:
        match = re.fullmatch(r"sqla-queue\[([\w,-]+)\]", requirement.replace(" ", ""))
        if match:
            found.update(match[1].split(","))
    return found


def test_all_installs_every_optional_feature() -> None:
    everything = extras()
    features = set(everything) - NOT_FEATURES
    assert {"metrics", "otel"} <= features
    assert self_extras(everything["all"]) == features


def test_the_test_extra_installs_metrics_and_otel() -> None:
    assert {"metrics", "otel"} <= self_extras(extras()["test"])
