"""A private PostgreSQL cluster for one benchmark run: initdb into a temporary folder, stock
settings (autovacuum on), its own port; stopped and removed at the end.

The machine's shared server may run with settings that distort what the benchmarks measure
(`autovacuum = off` hides what vacuum costs a deep backlog); a cluster of its own gives every
run the same stock server. `--database-url` measures on a server of the user's choice instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINDIR_ENV = "SQLA_QUEUE_PG_BINDIR"


class ClusterError(RuntimeError):
    """The private cluster could not be found, created or started."""


def _version_key(path: str) -> tuple[int, ...]:
    parts = Path(path).parent.name.split(".")
    return tuple(int(p) for p in parts if p.isdigit())


def find_bindir() -> Path:
    """The folder of `initdb` and `pg_ctl`: $SQLA_QUEUE_PG_BINDIR, `pg_config --bindir`,
    or the newest /usr/lib/postgresql/*/bin."""
    candidates: list[Path] = []
    if os.environ.get(BINDIR_ENV):
        candidates.append(Path(os.environ[BINDIR_ENV]))
    pg_config = shutil.which("pg_config")
    if pg_config:
        done = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip():
            candidates.append(Path(done.stdout.strip()))
    for found in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True):
        candidates.append(Path(found))
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    looked = ", ".join(str(c) for c in candidates) or "nowhere (no pg_config on PATH)"
    raise ClusterError(
        "the benchmarks start a private PostgreSQL cluster but found no initdb/pg_ctl "
        f"(looked in {looked}). Install the PostgreSQL server binaries, set {BINDIR_ENV} "
        "to their folder, or measure on a server of your choice with --database-url."
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As PostgreSQL binds: a port left in TIME_WAIT by a server just stopped is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class PrivateCluster:
    """`with PrivateCluster() as cluster: cluster.url` -> a running stock server of our own."""

    def __init__(self, port: int = 0, bindir: Path | None = None) -> None:
        self.bindir = bindir or find_bindir()
        self.port = port
        self.folder: Path | None = None
        self.running = False
        self.as_postgres = os.geteuid() == 0  # initdb refuses to run as root

    @property
    def data(self) -> Path:
        assert self.folder is not None
        return self.folder / "data"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = list(args)
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True)

    def start(self) -> str:
        if self.port and not _port_is_free(self.port):
            raise ClusterError(f"port {self.port} is in use: choose another with --cluster-port")
        self.port = self.port or free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="sqlaq_bench_pg_"))
        if self.as_postgres:
            shutil.chown(self.folder, "postgres", "postgres")
        initdb = self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
            "--auth=trust", "-E", "UTF8", "--no-instructions",
        )  # fmt: skip
        if initdb.returncode != 0:
            self.remove()
            raise ClusterError(f"initdb failed: {initdb.stderr.strip() or initdb.stdout.strip()}")
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.folder}"
        )
        started = self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
            str(self.folder / "server.log"), "-o", options, "-w", "-t", "60", "start",
        )  # fmt: skip
        if started.returncode != 0:
            log = self.folder / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else started.stderr
            self.remove()
            raise ClusterError(f"the private cluster did not start on port {self.port}: {tail}")
        self.running = True
        return self.url

    def restart(self) -> None:
        """Stop and start the server on the same folder and port (its caches emptied)."""
        assert self.running
        assert self.folder is not None
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.folder}"
        )
        done = self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data),
            "-l", str(self.folder / "server.log"),
            "-m", "fast", "-o", options, "-w", "-t", "120", "restart",
        )  # fmt: skip
        if done.returncode != 0:
            raise ClusterError(f"the private cluster did not restart: {done.stderr.strip()}")

    def stop(self) -> None:
        if self.running:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.running = False
        self.remove()

    def remove(self) -> None:
        if self.folder is not None:
            for _ in range(3):
                shutil.rmtree(self.folder, ignore_errors=True)
                if not self.folder.exists():
                    break
                time.sleep(0.5)
            self.folder = None

    def __enter__(self) -> PrivateCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
