"""Periodic tasks for `sqla-queue periodic list --app helpers.apps.periodic_app:registry`."""

from __future__ import annotations

import datetime as dt

from sqla_queue import Registry

registry = Registry()


@registry.periodic(cron="0 3 * * *", timezone="Europe/Paris", name="nightly")
def nightly() -> None:
    """Runs at 03:00 Paris time."""


@registry.periodic(every=dt.timedelta(seconds=30), args={"region": "eu"}, name="rates")
def rates(region: str) -> None:
    """Runs every 30 seconds."""
