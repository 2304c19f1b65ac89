"""The gpu-pool service stops at the hub's first SIGINT, whenever it comes, within seconds.

The service is started as the hub starts it (`python -m spawner.poolpage`, its own session,
the hub's environment and settings file) by a hub that ignores SIGINT, as a hub started as a
background job of a shell script does: the service inherits that.  JupyterHub sends SIGINT,
then SIGTERM only `interrupt_timeout` (30 s) later; every stop slower than a few seconds adds
to every hub restart and upgrade.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devservices.hub import REPO, wait_for
from devservices.ports import free_port

# The hub's patience is 30 s; the service's own bound is services.lifecycle.EXIT_GRACE_SECONDS (5 s).
PROMPT = 8.0
JOB_PROFILE = {"slug": "short", "display_name": "Short", "image": "img", "gpus": 1, "job_max_seconds": 60}


def sigint_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_service(directory: Path, settings: dict | None = None,
                  docker_host: str = "") -> tuple[subprocess.Popen, Path]:
    """The service as the hub starts it, from a hub that ignores SIGINT."""
    port = free_port()
    config = directory / "gpu-pool-service.json"
    config.write_text(json.dumps(settings or {}))
    env = {
        **os.environ,
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
        "JUPYTERHUB_SERVICE_PREFIX": "/services/gpu-pool/",
        "JUPYTERHUB_API_URL": f"http://127.0.0.1:{free_port()}/hub/api",
        "JUPYTERHUB_API_TOKEN": "not-a-hub-token",
        "JUPYTERHUB_CLIENT_ID": "service-gpu-pool",
        "GPUHUB_POOL_DB_URL": f"sqlite:///{directory / 'gpu-pool.sqlite'}",
        "GPUHUB_POOL_SERVICE_CONFIG_FILE": str(config),
    }
    env.pop("DOCKER_HOST", None)
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    log = directory / "service.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "spawner.poolpage"], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=sigint_ignored)
    return proc, log


def python_is_up(pid: int) -> bool:
    """The interpreter in the child has initialised (it ignores SIGPIPE from then on; the
    child started with SIGPIPE at its default, subprocess's restore_signals)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return bool(ignored & (1 << (signal.SIGPIPE - 1)))


def interrupt_and_time(proc: subprocess.Popen, log: Path) -> float:
    """SIGINT, as the hub sends it; seconds until the process has exited."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"still running 30 s after SIGINT (the hub would have sent SIGTERM):\n"
                    f"{log.read_text(errors='replace')[-3000:]}")
    return time.monotonic() - sent


def serving(log: Path) -> bool:
    return "GPU pool page on http" in log.read_text(errors="replace")


# Seconds after the interpreter is up: during its imports (a second or two), while it opens the
# ledger, and once it serves (None).  Not earlier: a SIGINT during the interpreter's own start
# (before early_stop.py runs, a tenth of a second) is still lost; the hub cannot send one then,
# as it handles signals only once its services answer.
MOMENTS = [0.4, 0.7, 1.0, 1.5, None]


@pytest.mark.parametrize("attempt", range(2))
def test_a_sigint_at_any_moment_of_the_start_stops_the_service_within_seconds(tmp_path, attempt):
    took = {}
    for moment in MOMENTS:
        directory = tmp_path / f"at-{moment}"
        directory.mkdir()
        proc, log = start_service(directory)
        wait_for(lambda proc=proc: python_is_up(proc.pid) or proc.poll() is not None, timeout=30,
                 what="the service's interpreter to start", interval=0.01)
        if moment is None:
            wait_for(lambda proc=proc, log=log: serving(log) or proc.poll() is not None, timeout=60,
                     what="the service to serve", interval=0.05)
        else:
            time.sleep(moment)  # not a wait: the moment itself is what the test varies: no event to wait on
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        took[moment] = interrupt_and_time(proc, log)
        assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-3000:]
    assert all(seconds < PROMPT for seconds in took.values()), took


def test_a_sigint_stops_the_service_within_seconds_while_its_docker_engine_does_not_answer(tmp_path, blackhole_proxy):
    # With jobs on, the service's jobs runner calls Docker on its own threads; Python waits at
    # exit for those threads, and a call to a daemon that does not answer ends only at the
    # client's 60 s timeout.
    frozen = blackhole_proxy(free_port())
    frozen.blackhole()
    proc, log = start_service(tmp_path, {"JobSettings": {"profiles": [JOB_PROFILE]}},
                              docker_host=f"tcp://127.0.0.1:{frozen.port}")
    wait_for(lambda: serving(log) or proc.poll() is not None, timeout=60, what="the service to serve", interval=0.05)
    # the runner's first reconcile pass is in a Docker call that gets no answer
    wait_for(frozen.connections, timeout=30, what="the service to call the frozen Docker engine",
             interval=0.05)
    took = interrupt_and_time(proc, log)
    text = log.read_text(errors="replace")
    assert took < PROMPT, (took, text[-3000:])
    assert "GPU pool page stopped" in text and "leaves without waiting for gpu-jobs-docker" in text, text[-3000:]

