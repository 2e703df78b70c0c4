"""The keeper: the worker's own heartbeat, its jobs' leases, the reaper, the loop watch.

One thread, ticking every `heartbeat` seconds (sooner when a job lease needs it):
- registers the worker and extends its registration (the workers table), so other
  workers' reapers requeue its jobs within `dead_after` seconds if it dies; the same
  statement says whether any queue has a limit (`limits`, read by the producer); then it
  reads the schema's revisions: one this code does not know stops its claims
  (`schema_refusal`, read by the producer and `/readyz`);
- extends the lease of every held job every quarter of its lease, and reports which
  jobs have started (the reaper refunds the attempt of one that had not);
- reaps: requeues the jobs of expired workers and jobs past their own lease deadline,
  then removes those workers' registrations (kept in `stopped_workers` as lost); and
  queues the jobs parked for a signal past their wait's deadline (they time out as they
  run) and the sleeping jobs whose end comes before its next look (due at their end),
  deleting expired signals and the waits of gone jobs about once a minute;
- looks at the jobs table as it starts and every worker beat, and starts its upkeep on a
  thread of its own when due: a VACUUM once its dead rows pass `vacuum_threshold`, an
  ANALYZE when its statistics are missing or stale (`vacuum`, the one place that decides);
- writes the rollup of the attempts this worker ended (`sqla_queue.job.counts`) about once
  a minute, in one upsert, and prunes it of rows older than a day every few minutes;
- watches the event loop: an async handler that blocks it is reported (in the log, and in
  the worker's registration for `doctor`), and once the loop has been stuck for half a
  lease its jobs' leases are no longer extended.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine

from sqla_queue.db import queries
from sqla_queue.db.database import autocommit_read_committed
from sqla_queue.db.migrate import (
    SCHEMA_REVISION,
    head_revision,
    package_version,
    unknown_revisions,
)
from sqla_queue.db.models import DEFAULT_MAX_ATTEMPTS, JobStatus
from sqla_queue.db.queries import signals as signal_queries
from sqla_queue.db.queries import steps as step_queries
from sqla_queue.db.rollup import RollupWriter
from sqla_queue.errors import SchemaUnknownError
from sqla_queue.registry import Registry
from sqla_queue.runtime.health_server import Pulse
from sqla_queue.worker.board import JobBoard
from sqla_queue.worker.config import WorkerConfig, WorkerStats
from sqla_queue.worker.connection import FailureLog, describe, failure_kind
from sqla_queue.worker.executor import Executor
from sqla_queue.worker.jobs import ClaimedJob
from sqla_queue.worker.vacuum import SelfVacuum

log = logging.getLogger("sqla_queue.worker")

OVERRUN_GRACE = 1.0
"""Seconds a handler may take to return after its timeout or cancel before it is reported."""
OVERRUN_REPORT_EVERY = 60.0
"""Seconds between two log lines about the same handler that has not returned."""
MAX_OVERRUNS_SHOWN = 20
SIGNAL_UPKEEP_EVERY = 60.0
"""Seconds between a worker's deletes of expired signals and of the waits of gone jobs."""
HISTORY_UPKEEP_EVERY = 60.0
"""Seconds between a worker's calls of the history's upkeep (`queries.keep_history`): the
partitions ahead, an ANALYZE of filled ones, a batch of an earlier release's rows moved."""
HISTORY_MOVE_BATCH = 5000
"""Rows of an earlier release's archive (`jobs_archive`), and of the succeeded jobs it left
in `jobs` (`queries.move_kept_done`), one call moves to the history."""
KEPT_MOVE_EVERY = 3600.0
"""Seconds between two looks for succeeded jobs an earlier release left in `jobs` once a
look found none: the look reads every finished job still in `jobs` (the failed ones too),
so it does not run every round; a worker of an earlier release running beside this one
leaves them there until it stops."""
"""Overrunning handlers listed in the worker's registration (the longest first)."""


class Keeper:
    """The keeper thread and the liveness statements it sends."""

    def __init__(
        self,
        engine: Engine,
        config: WorkerConfig,
        registry: Registry,
        board: JobBoard,
        executor: Executor,
        stats: WorkerStats,
        on_reaped: Callable[[], None],
    ) -> None:
        self.engine = engine
        self.config = config
        self.registry = registry
        self.board = board
        self.executor = executor
        self.stats = stats
        self._on_reaped = on_reaped
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.pulse = Pulse()
        """Busy during a round (its statements), idle between: `/livez` (worker.health)."""
        self.failures = FailureLog()
        self.vacuum = SelfVacuum(engine, config.vacuum_threshold, FailureLog())
        self.rollup = RollupWriter(executor.runner.counts)
        """Writes the attempts this worker ended to `job_counts` (`sqla_queue.db.rollup`)."""
        self.task_leases: dict[str, float] = {}
        for name in registry:
            lease = registry[name].lease
            if lease is not None:
                self.task_leases[name] = lease
        # Every task's budget, the default included: the claim writes it on jobs without one.
        self.task_max_attempts = {
            name: registry[name].max_attempts or DEFAULT_MAX_ATTEMPTS for name in registry
        }
        shortest = min([config.lease, *self.task_leases.values()])
        self.beat_jobs_every = max(0.25, shortest / 4)
        self._next_signal_upkeep = 0.0
        self._next_history_upkeep = 0.0  # the first round makes the partitions it needs
        self._history_refused = False
        self._next_kept_move = 0.0  # the first round looks for an earlier release's rows
        self.tick = min(config.heartbeat, self.beat_jobs_every)
        self.last_job_beat = time.monotonic()
        self._loop_warned = False
        self.schema_refusal: str | None = None
        """Why this worker claims no more jobs: the database records a schema revision this
        code does not know (a newer sqla-queue migrated it while it ran); None: it claims.
        Checked at each worker beat; `/readyz` reports it."""
        self.limits = True
        """Whether some queue has a concurrency or rate limit, as of the last worker beat:
        the producer's claim takes the statement that honours limits only then."""
        self._registration = {
            "worker_id": config.worker_id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "queues": list(config.queues) if config.queues is not None else None,
            "concurrency": config.concurrency,
            "stale_after": config.dead_after,
            "loop_blocked_for": None,  # seconds, while the event loop is blocked
            "overruns": None,  # handlers past their timeout or cancel (`_watch_overruns`)
            "version": package_version(),
            "schema_revision": SCHEMA_REVISION,  # what `migrate` checks a contract revision by
            "session_pid": None,  # the held connection's backend (`session_pid`)
        }
        self.session_pid: Callable[[], int | None] = lambda: None
        """The server process id of the connection the worker holds open while it runs
        (its listener's; None without one: `poll_only`, or reconnecting), written with
        each worker beat: the autoscaling signal's sign of a live session."""

    def register(self, conn: Connection) -> None:
        """Register the worker (called once before its first claim)."""
        self.limits = bool(conn.execute(queries.beat_worker(), self._registration).scalar())

    def deregister(self, conn: Connection) -> None:
        conn.execute(queries.deregister_worker(), {"worker_id": self.config.worker_id})

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sqla-queue-keeper", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread | None:
        """The keeper thread, once started."""
        return self._thread

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5)
        self.vacuum.stop(1.0)

    def behind(self) -> bool:
        """Whether job heartbeats have failed for half the shortest lease: claim no more."""
        return time.monotonic() - self.last_job_beat > 2 * self.beat_jobs_every

    def _run(self) -> None:
        now = time.monotonic()
        next_worker_beat = now + self.config.heartbeat
        next_job_beat = now + self.beat_jobs_every
        next_reap = now + random.uniform(0, self.config.heartbeat)
        next_upkeep = now  # the first claims are planned with the statistics it refreshes
        beat_worker, reap = queries.beat_worker(), queries.reap_stale_jobs()
        notify, expired = queries.notify_queues(), queries.delete_expired_workers()
        pulse = self.pulse
        wait = 0.0
        while True:
            pulse.idle()
            if self._stopping.wait(wait):
                return
            wait = self.tick
            pulse.busy()
            self._watch_loop()  # needs no database: watched even while it is away
            self._watch_overruns()
            try:
                with autocommit_read_committed(self.engine) as conn:
                    now = time.monotonic()
                    if now >= next_worker_beat:
                        next_worker_beat = now + self.config.heartbeat
                        self._registration["session_pid"] = self.session_pid()
                        self.limits = bool(conn.execute(beat_worker, self._registration).scalar())
                        self._check_schema(conn)
                    if now >= next_upkeep:
                        next_upkeep = now + self.config.heartbeat
                        self.vacuum.check(conn)  # starts its own thread: never waits here
                    jobs = self.board.snapshot()
                    if now >= next_job_beat:
                        next_job_beat = now + self.beat_jobs_every
                        self._beat_jobs(conn, jobs)
                    else:  # between full beats, only report newly started jobs
                        self._beat_jobs(
                            conn, [j for j in jobs if j.started and not j.reported_started]
                        )
                    if now >= next_reap:
                        next_reap = now + self.config.heartbeat * random.uniform(0.75, 1.25)
                        self._reap(conn, reap, notify)
                        self._record_lost(conn, expired)
                        self._wake_waiting(conn, notify)
                        self._keep_history(conn)
                self.failures.recovered()
            except Exception as exc:
                self.failures.failed(
                    failure_kind(exc),
                    "heartbeat/reaper round failed (%s); will retry",
                    describe(exc),
                )
            self.rollup.tick(self.engine)  # about once a minute; logs its own failures

    def _check_schema(self, conn: Connection) -> None:
        """Stop claiming once the database records a revision this code does not know (its
        jobs may need what that revision added: a sequence, a limit), and say why; claim
        again once it no longer does."""
        unknown = unknown_revisions(conn)
        refusal = None
        if unknown:
            why = SchemaUnknownError(found=", ".join(unknown), known=head_revision())
            refusal = f"claiming no more jobs (those running finish): {why}"
            if refusal != self.schema_refusal:
                log.error("worker %s is %s", self.config.worker_id, refusal)
        elif self.schema_refusal is not None:
            log.info("the schema is at a revision this worker knows again: claiming again")
        self.schema_refusal = refusal

    def _beat_jobs(self, conn: Connection, jobs: list[ClaimedJob]) -> None:
        if self._loop_stuck():  # an async handler blocks the loop: let its jobs be reaped
            jobs = [j for j in jobs if not (j.future is not None and not j.future.done())]
        if not jobs:
            self.last_job_beat = time.monotonic()
            return
        leases = [self.task_leases.get(j.task) or self.config.lease for j in jobs]
        started = [j.started for j in jobs]
        params: dict[str, Any] = {
            "job_ids": [j.id for j in jobs],
            "job_attempts": [j.attempt for j in jobs],
        }
        beaten = conn.execute(
            queries.heartbeat_jobs(), {**params, "job_leases": leases, "job_started": started}
        ).all()
        owned = {job_id for job_id, _ in beaten}
        cancelled = {job_id for job_id, status in beaten if status == JobStatus.cancelled.value}
        missing = [j for j in jobs if j.id not in owned]
        if missing:  # skipped because locked elsewhere, or no longer ours?
            ids = {"job_ids": [j.id for j in missing], "job_attempts": [j.attempt for j in missing]}
            still = set(conn.execute(queries.held_jobs(), ids).scalars())
            for job in missing:
                if job.id not in still and not job.settled and not job.ctx.parked:
                    log.warning("job %s is no longer ours (reaped or cancelled)", job.id)
                    job.ctx.mark_lost()
        for job in jobs:  # cancelled while it runs (a poll-only worker hears of it here)
            if job.id in cancelled and not job.ctx.cancelled:
                self.executor.give_up(job, "cancelled")
        for job, was_started in zip(jobs, started, strict=True):
            if was_started and job.id in owned:
                job.reported_started = True
        self.last_job_beat = time.monotonic()

    def beat_one(self, job: ClaimedJob) -> bool:
        """A handler's own `ctx.heartbeat()`: extend its lease now."""
        if job.ctx.cancelled:
            return False
        lease = self.task_leases.get(job.task) or self.config.lease
        with autocommit_read_committed(self.engine) as conn:
            params = {
                "job_ids": [job.id],
                "job_attempts": [job.attempt],
                "job_leases": [lease],
                "job_started": [True],
            }
            owned = conn.execute(queries.heartbeat_jobs(), params).all()
            # A row locked at this instant (the keeper's own beat, a cancel in progress) was
            # skipped, not lost: ask without a lock whether this attempt still holds it.
            if not owned:
                owned = conn.execute(
                    queries.held_jobs(), {"job_ids": [job.id], "job_attempts": [job.attempt]}
                ).all()
        if any(status == JobStatus.cancelled.value for _, status in owned):
            self.executor.give_up(job, "cancelled")
            return False
        if not owned:
            job.ctx.mark_lost()
        return bool(owned)

    def _reap(self, conn: Connection, reap: Any, notify: Any) -> None:
        held = {
            "worker_id": self.config.worker_id,
            "job_ids": [j.id for j in self.board.held_jobs()],
        }
        conn.execute(queries.free_unheld_cancelled_jobs(), held)  # their slots are free
        reaper = {"task_max_attempts": self.task_max_attempts, "reaper_id": self.config.worker_id}
        reaped = conn.execute(reap, reaper).mappings().all()
        if not reaped:
            return
        self.stats.reaped += len(reaped)
        counts = self.executor.runner.counts
        for row in reaped:  # lost on its last attempt: the reaper failed it
            if row["status"] == JobStatus.failed.value:
                counts.add(row["queue"], row["task"], failed=1)
        log.warning(
            "requeued %d job(s) whose worker stopped heartbeating or whose lease expired: %s",
            len(reaped),
            [row["id"] for row in reaped][:20],
        )
        queued = sorted({row["queue"] for row in reaped if row["status"] == "queued"})
        if queued:
            conn.execute(notify, {"queues": queued})
        self._on_reaped()

    def _wake_waiting(self, conn: Connection, notify: Any) -> None:
        """Queue the jobs parked for a signal whose wait's deadline passed (they time out
        when they run) or whose signal came unseen, and the sleeping jobs whose end comes
        before the next look (due at their end); and, about once a minute, delete
        expired signals and the waits of jobs that are gone."""
        woken = list(conn.execute(signal_queries.wake_waiting_jobs()).scalars())
        # sleepers whose end comes before the next look: queued now, due at their end
        ahead = {"ahead": self.config.heartbeat * 1.25 + self.tick}
        woken += conn.execute(step_queries.wake_sleeping_jobs(), ahead).scalars()
        if woken:
            conn.execute(notify, {"queues": sorted(set(woken))})
        now = time.monotonic()
        if now >= self._next_signal_upkeep:
            self._next_signal_upkeep = now + SIGNAL_UPKEEP_EVERY * random.uniform(0.75, 1.25)
            conn.execute(signal_queries.delete_expired_signals())
            conn.execute(signal_queries.delete_orphan_waits())

    def _keep_history(self, conn: Connection) -> None:
        """About once a minute, the history's upkeep: partitions made ahead, strays moved out
        of its DEFAULT partition, filled partitions analyzed, and a batch of the rows an
        earlier release archived (`jobs_archive`) or left `done` in `jobs` moved in; again at
        once while such rows remain. A failure is logged once and does not stop the round."""
        now = time.monotonic()
        if now < self._next_history_upkeep:
            return
        params = {
            "period_days": self.config.history_period_days,
            "ahead": self.config.history_ahead,
            "batch": HISTORY_MOVE_BATCH,
        }
        try:
            moved = conn.execute(queries.keep_history(), params).scalar_one()
            done = 0
            if now >= self._next_kept_move:
                batch = {"batch": HISTORY_MOVE_BATCH}
                done = conn.execute(queries.move_kept_done(), batch).rowcount
                self._next_kept_move = now + (0 if done else KEPT_MOVE_EVERY)
        except Exception as exc:
            self._next_history_upkeep = now + HISTORY_UPKEEP_EVERY
            if not self._history_refused:
                self._history_refused = True
                log.warning("the history's upkeep failed (%s); will retry", describe(exc))
            return
        self._history_refused = False
        if moved:
            log.info("moved %d archived job(s) of an earlier release into the history", moved)
        if done:
            log.info("moved %d kept job(s) an earlier release left in jobs into the history", done)
        full = max(moved, done) >= HISTORY_MOVE_BATCH  # more wait: the next round goes on
        self._next_history_upkeep = now + (0 if full else HISTORY_UPKEEP_EVERY)

    def _record_lost(self, conn: Connection, expired: Any) -> None:
        """Remove expired registrations that hold no job any more, recorded as lost."""
        for worker_id, hostname, pid in conn.execute(expired, {"reaper_id": self.config.worker_id}):
            log.warning(
                "worker %s (host %s, pid %s) stopped heartbeating: recorded as lost",
                worker_id,
                hostname,
                pid,
            )

    def _watch_overruns(self) -> None:
        """Report handlers that have not returned `OVERRUN_GRACE` seconds after their
        timeout or cancel: logged once, then every `OVERRUN_REPORT_EVERY` seconds, counted,
        and listed in the worker's registration (`workers.overruns`) for `doctor` and the
        metrics. Each keeps its slot of this worker and of its queue's limit."""
        now = time.monotonic()
        overruns: list[dict[str, Any]] = []
        for job in self.board.snapshot():
            if not job.started or not job.ctx.cancelled:
                continue
            if job.gave_up_at is None:  # cancelled or lost: from when the keeper saw it
                job.gave_up_at = now
            overran = now - job.gave_up_at
            if overran < OVERRUN_GRACE:
                continue
            reason = job.ctx.lost_reason or "lost"
            overruns.append(
                {
                    "job": job.id,
                    "attempt": job.attempt,
                    "task": job.task,
                    "queue": job.queue,
                    "reason": reason,
                    "seconds": round(overran, 1),
                }
            )
            if now < job.next_report:
                continue
            first = not job.next_report
            job.next_report = now + OVERRUN_REPORT_EVERY
            if first:
                self.stats.overran += 1
            overrun = (
                f"has overrun its timeout by {overran:.0f} s"
                if reason == "timed out"
                else f"was {reason} {overran:.0f} s ago"
            )
            log.log(
                logging.WARNING if first else logging.ERROR,
                "job %s (%s) %s and its handler has not returned: it keeps its slot of this "
                "worker and of queue %s until it does",
                job.id,
                job.task,
                overrun,
                job.queue,
            )
        overruns.sort(key=lambda o: -float(o["seconds"]))
        self._registration["overruns"] = overruns[:MAX_OVERRUNS_SHOWN] or None

    def _loop_stuck(self) -> bool:
        return self.executor.loop_lag() > self.config.lease / 2

    def _watch_loop(self) -> None:
        lag = self.executor.probe_loop()
        if lag is None:
            return
        blocked = lag > max(1.0, 2 * self.config.heartbeat)
        # the next worker beat records it for `doctor` (workers.loop_blocked_since)
        self._registration["loop_blocked_for"] = lag if blocked else None
        if blocked:
            if not self._loop_warned:
                running = [
                    f"{j.id} ({j.task})"
                    for j in self.board.snapshot()
                    if j.future is not None and not j.future.done()
                ]
                log.error(
                    "the event loop has not run for %.1f s: an async handler is calling "
                    "blocking code (running: %s); its timeout is still enforced, and after "
                    "half a lease its jobs are left to be reaped",
                    lag,
                    ", ".join(running[:10]) or "none",
                )
                self._loop_warned = True
        else:
            self._loop_warned = False
