"""`python -m benchmarks.relay [--broker nats amqp] [--jobs N] [--repeat N] [--probes N]`.

The outbox relay against the raw client, in the same run, per broker:
- raw publish: the client library alone publishes N job-sized messages to the route and
  waits for every confirmation (JetStream publish acks with Nats-Msg-Id; RabbitMQ publisher
  confirms, persistent, mandatory): the ceiling of the hop;
- relay: N jobs committed in one transaction, then a relay (in this process) moves them;
  jobs/s from that commit to the last broker confirmation and delete;
- end to end: a relay and a broker worker running (in this process), one probe job at a
  time: commit of the enqueueing transaction to the handler's start, in ms.
Results go to benchmarks/results/relay.json and the "Past one database" section of
BENCHMARKS.md (which `python -m benchmarks` keeps when it rewrites the file).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from sqla_queue import admin, enqueue, enqueue_many
from sqla_queue.brokers import BrokerWorker, BrokerWorkerConfig, Relay, RelayConfig
from sqla_queue.brokers.cleanup import delete_route
from sqla_queue.brokers.kinds import parse_route
from sqla_queue.brokers.messages import JobMessage
from sqla_queue.brokers.routes import Route

from . import tasks
from .database import LOCAL_URL, BenchDatabase
from .stats import latency_summary, summary

ROOT = Path(__file__).resolve().parent.parent
URLS = {
    "nats": os.environ.get("SQLA_QUEUE_BENCH_NATS_URL", "nats://127.0.0.1:4222"),
    "amqp": os.environ.get("SQLA_QUEUE_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
}
QUEUE = "bench_out"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.relay", description=__doc__)
    p.add_argument("--database-url", default=os.environ.get("SQLA_QUEUE_BENCH_URL", LOCAL_URL))
    p.add_argument("--broker", nargs="+", choices=sorted(URLS), default=sorted(URLS, reverse=True))
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per throughput repetition")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--probes", type=int, default=200, help="latency probes per repetition")
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "relay.json")
    return p.parse_args(argv)


def fresh_route(kind: str) -> Route:
    tag = uuid.uuid4().hex[:8]
    return parse_route(
        f"nats:sqlaqbench.{tag}" if kind == "nats" else f"amqp:sqlaqbench-{tag}/jobs"
    )


def sample_messages(count: int) -> list[JobMessage]:
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    return [JobMessage(i + 1, "noop", {"n": i}, QUEUE, 0, 0, None, now) for i in range(count)]


# -- the raw client ----------------------------------------------------------------------------


async def raw_nats(url: str, route: Route, messages: list[JobMessage]) -> float:
    import nats

    from sqla_queue.brokers.nats import ensure_streams

    nc = await nats.connect(url)
    js = nc.jetstream()
    await ensure_streams(js, route, 120.0)
    bodies = [(m.encode(), {"Nats-Msg-Id": m.message_id}) for m in messages]
    started = time.perf_counter()
    futures = [await js.publish_async(route.subject, b, headers=h) for b, h in bodies]
    await asyncio.gather(*futures)
    elapsed = time.perf_counter() - started
    await nc.close()
    return len(messages) / elapsed


async def raw_amqp(url: str, route: Route, messages: list[JobMessage]) -> float:
    import aio_pika

    from sqla_queue.brokers.amqp import declare_route

    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    exchange, _ = await declare_route(channel, route)
    bodies = [(m.encode(), m.message_id) for m in messages]
    started = time.perf_counter()
    await asyncio.gather(
        *(
            exchange.publish(
                aio_pika.Message(
                    body,
                    message_id=message_id,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    content_type="application/json",
                ),
                route.routing_key,
                mandatory=True,
            )
            for body, message_id in bodies
        )
    )
    elapsed = time.perf_counter() - started
    await connection.close()
    return len(messages) / elapsed


# -- the relay ---------------------------------------------------------------------------------


def route_queue(db: BenchDatabase, route: Route) -> None:
    assert db.engine is not None
    with db.engine.begin() as conn:
        admin.create_queue(conn, QUEUE)
        admin.set_route(conn, QUEUE, str(route))


def relay_throughput(db: BenchDatabase, url: str, route: Route, jobs: int) -> float:
    """A running relay (idle, connected); N jobs committed at once; until the last is acked."""
    assert db.engine is not None
    route_queue(db, route)
    rows = [{"task": "noop", "args": {"n": i}, "queue": QUEUE} for i in range(jobs)]
    relay = Relay(db.engine, RelayConfig(url))
    thread = threading.Thread(target=relay.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        time.sleep(2.0)  # connected and idle, as a relay in production waits
        with Session(db.engine) as session, session.begin():
            enqueue_many(session, rows)
        committed = time.perf_counter()
        deadline = time.monotonic() + 600
        while relay.stats.published < jobs:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"relayed {relay.stats.published} of {jobs}")
            time.sleep(0.002)
        elapsed = time.perf_counter() - committed
    finally:
        relay.stop()
        thread.join(60)
    return jobs / elapsed


def end_to_end(db: BenchDatabase, url: str, route: Route, probes: int) -> dict[str, float]:
    assert db.engine is not None
    route_queue(db, route)
    relay = Relay(db.engine, RelayConfig(url))
    worker = BrokerWorker(db.engine, tasks.registry, BrokerWorkerConfig(url, QUEUE, ack_wait=30))
    threads = [
        threading.Thread(target=runner.run, kwargs={"install_signal_handlers": False})
        for runner in (relay, worker)
    ]
    for thread in threads:
        thread.start()
    latencies = []
    try:
        time.sleep(2.0)
        for seq in range(1, probes + 1):
            key = hash((route.stream, route.amqp_queue, seq)) & 0x7FFFFFFF
            with Session(db.engine) as session, session.begin():
                enqueue(session, "probe", {"seq": key}, queue=QUEUE)
            sent = time.perf_counter()
            deadline = time.monotonic() + 30
            with tasks.probe_event:
                while key not in tasks.probe_started:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"probe {seq} did not start within 30 s")
                    tasks.probe_event.wait(1.0)
            latencies.append((tasks.probe_started[key] - sent) * 1000)
    finally:
        relay.stop()
        worker.stop()
        for thread in threads:
            thread.join(60)
    return latency_summary(latencies)


# -- the report -------------------------------------------------------------------------------

SECTION = "## Past one database: the outbox relay"


def markdown_section(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md section of a `relay.json`."""
    out = [
        SECTION,
        "",
        f"`python -m benchmarks.relay`, {results['when']}, {results['machine']}: the machine was "
        "shared with other sessions running their tests, so the figures are noisy (spread is "
        f"(max - min) / median). Medians of {results['repeat']} repetitions after a warm-up; "
        f"{results['jobs']:,} jobs per throughput repetition, {results['probes']} probes per "
        "latency repetition. Each broker on this machine (NATS 2.9, RabbitMQ 3.10).",
        "",
        "| broker | raw client publish, msg/s | relay, commit to broker ack, jobs/s | relay / raw "
        "| end to end p50, ms | p95, ms | max, ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, res in results["brokers"].items():
        raw, relay, e2e = res["raw_publish_per_s"], res["relay_jobs_per_s"], res["end_to_end_ms"]
        out.append(
            f"| {kind} | {raw['median']:,.0f} (spread {raw['spread']:.0%}) | "
            f"{relay['median']:,.0f} (spread {relay['spread']:.0%}) | "
            f"{res['relay_to_raw']['median']:.2f}x | {e2e['p50']['median']:.1f} | "
            f"{e2e['p95']['median']:.1f} | {e2e['max']['median']:.1f} |"
        )
    out += [
        "",
        "- *raw client publish*: the client library alone (nats-py `publish_async` with "
        "`Nats-Msg-Id`; aio-pika with publisher confirms, persistent, mandatory) publishes "
        "job-sized messages to a fresh route and waits for every confirmation.",
        "- *relay*: a relay already running and idle; the jobs are committed in one "
        "transaction; timed from that commit until the relay has deleted the last job the "
        "broker confirmed (claim, publish, confirmations, delete, commit, 500 per batch).",
        "- *end to end*: a relay and a broker worker running; one probe job at a time, from "
        "the commit of its enqueueing transaction to its handler's start (NOTIFY wakes the "
        "relay; the worker pulls from JetStream or is pushed by RabbitMQ).",
        "- One relay is CPU-bound in Python (the client library's per-message work plus the "
        "relay's row decoding and JSON encoding) on 2 shared cores; more throughput comes "
        "from more relay processes, which split the rows with SKIP LOCKED. Two batches in "
        "flight per relay (each on its own connection) measured no gain here, so a relay keeps "
        "one batch at a time and its claim order.",
    ]
    return "\n".join(out) + "\n"


def update_benchmarks_md(path: Path, section: str) -> None:
    """Replace (or append) the relay section of BENCHMARKS.md."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end + 1 :] if end >= 0 else "")
    path.write_text(text)


# -- the run -----------------------------------------------------------------------------------


def measure(db: BenchDatabase, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    url = URLS[kind]
    raw, relayed, latency = [], [], []
    for rep in range(args.repeat + 1):  # the first is a warm-up, not counted
        routes = [fresh_route(kind) for _ in range(3)]
        try:
            publish = raw_nats if kind == "nats" else raw_amqp
            rate = asyncio.run(publish(url, routes[0], sample_messages(args.jobs)))
            relay_rate = relay_throughput(db, url, routes[1], args.jobs)
            db.sql("DELETE FROM sqla_queue.queues WHERE name = %s", (QUEUE,))
            probes = end_to_end(db, url, routes[2], args.probes if rep else 20)
            db.sql("DELETE FROM sqla_queue.queues WHERE name = %s", (QUEUE,))
        finally:
            for route in routes:
                asyncio.run(delete_route(url, route))
        if rep:
            raw.append(rate)
            relayed.append(relay_rate)
            latency.append(probes)
        label = "warm-up" if not rep else f"repetition {rep}"
        print(
            f"{kind} {label}: raw publish {rate:,.0f} msg/s, relay {relay_rate:,.0f} jobs/s, "
            f"end to end p50 {probes['p50']:.1f} ms p95 {probes['p95']:.1f} ms",
            flush=True,
        )
    return {
        "raw_publish_per_s": summary(raw),
        "relay_jobs_per_s": summary(relayed),
        "relay_to_raw": summary([r / p for r, p in zip(relayed, raw, strict=True)]),
        "end_to_end_ms": {k: summary([run[k] for run in latency]) for k in ("p50", "p95", "max")},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    db = BenchDatabase(args.database_url)
    db.create()
    results: dict[str, Any] = {
        "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other work)",
        "jobs": args.jobs,
        "repeat": args.repeat,
        "probes": args.probes,
        "brokers": {},
    }
    try:
        db.sql("ALTER DATABASE " + db.name + " SET synchronous_commit = on")
        for kind in args.broker:
            results["brokers"][kind] = measure(db, kind, args)
    finally:
        db.drop()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    update_benchmarks_md(ROOT / "BENCHMARKS.md", markdown_section(results))
    for kind, res in results["brokers"].items():
        print(
            f"{kind}: raw publish median {res['raw_publish_per_s']['median']:,.0f} msg/s; relay "
            f"median {res['relay_jobs_per_s']['median']:,.0f} jobs/s "
            f"({res['relay_to_raw']['median']:.2f}x raw); end to end p50 "
            f"{res['end_to_end_ms']['p50']['median']:.1f} ms, p95 "
            f"{res['end_to_end_ms']['p95']['median']:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
