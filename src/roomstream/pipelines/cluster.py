"""A Spark standalone cluster (one master, one worker) on loopback, from PySpark's own jars.

For tests and demos: ``with standalone_cluster(tmp) as master_url: spark_session(master_url)``.
Everything binds to 127.0.0.1 on ports the JVMs choose themselves (port 0, read back from
the master's log), so concurrent clusters never collide; both JVMs are stopped (by their
process ids) on exit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pyspark


def spark_home() -> str:
    """PySpark's package directory, which has ``bin/spark-class`` and ``jars/``."""
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _wait_for_log(
    path: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float
) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    regex = re.compile(pattern)
    while time.monotonic() < deadline:
        if path.exists() and (match := regex.search(path.read_text(errors="replace"))):
            return match
        if proc.poll() is not None:
            raise RuntimeError(f"{path.name}: exited with {proc.returncode}:\n{path.read_text()}")
        time.sleep(0.2)
    raise TimeoutError(f"{path.name}: no {pattern!r} within {timeout}s:\n{path.read_text()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # its own process group (start_new_session)
        proc.wait(timeout=15)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)


@contextmanager
def standalone_cluster(
    workdir: str | Path, *, cores: int = 2, memory: str = "1g", timeout: float = 120.0
) -> Iterator[str]:
    """Start a master and one worker; yield the master URL (``spark://127.0.0.1:PORT``)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    home = spark_home()
    env = dict(os.environ)
    env.update(
        SPARK_HOME=home,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_MASTER_HOST="127.0.0.1",
        SPARK_NO_DAEMONIZE="1",
        SPARK_LOG_DIR=str(workdir / "logs"),
        SPARK_WORKER_DIR=str(workdir / "work"),
        SPARK_DAEMON_MEMORY="512m",
        # No REST submission server: it would take the fixed port 6066.
        SPARK_MASTER_OPTS=f"{env.get('SPARK_MASTER_OPTS', '')} -Dspark.master.rest.enabled=false",
    )
    spark_class = os.path.join(home, "bin", "spark-class")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master_log = workdir / "master.log"
        with master_log.open("wb") as out:
            master = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", "0", "--webui-port", "0"],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        procs.append(master)
        master_url = _wait_for_log(
            master_log, r"Starting Spark master at (spark://\S+)", master, timeout
        ).group(1)
        _wait_for_log(master_log, r"I have been elected leader", master, timeout)
        worker_log = workdir / "worker.log"
        with worker_log.open("wb") as out:
            worker = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", master_url,
                 "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
                 "--webui-port", "0", "--work-dir", str(workdir / "work")],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        procs.append(worker)
        _wait_for_log(worker_log, r"Successfully registered with master", worker, timeout)
        yield master_url
    finally:
        for proc in reversed(procs):
            _stop(proc)
