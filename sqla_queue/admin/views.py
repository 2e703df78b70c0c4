"""A job in full: everything `sqla-queue jobs show --json` and `GET /api/jobs/{id}` give, read
in one place from the modules that own each part."""

from __future__ import annotations

from typing import Any

from sqla_queue.admin.jobs import Bind, get_job, job_journal, job_links, job_steps
from sqla_queue.admin.signals import signal_waits


def job_in_full(bind: Bind, job_id: int) -> dict[str, Any] | None:
    """Job `job_id` as JSON, everything `jobs show --json` and `GET /api/jobs/{id}` give: its
    row, its place in its workflow, its durable steps and sleep, its signal waits, its
    progress and log lines; None when there is no such job."""
    job = get_job(bind, job_id)
    if job is None:
        return None
    links = job_links(bind, job_id)
    sleeping = job.sleeping_until
    return {
        **job.as_dict(),
        "sleeping_until": None if sleeping is None else sleeping.isoformat(),
        "steps": [step.as_dict() for step in job_steps(bind, job_id)],
        "parents": [p.as_dict() for p in links.parents],
        "children": [c.as_dict() for c in links.children],
        "more_children": links.more_children,
        "signal_waits": [w.as_dict() for w in signal_waits(bind, job_id)],
        **job_journal(bind, job_id).as_dict(),
    }
