"""The periodic task of `apps.included_app:registry`, registered from its own module."""

from __future__ import annotations

import datetime as dt

from helpers.apps.included_app import registry


@registry.periodic(every=dt.timedelta(hours=1), name="hourly_report")
def hourly_report() -> None:
    """Runs every hour."""
