"""Idle culling with the real jupyterhub-idle-culler process and timeouts of seconds.

Every hub here runs the culler as the hub-managed service `idle-culler`,
exactly as production does, only with short timeouts.  Kernels are driven
through the proxy with the user's own token, as a script would.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time

import requests

from spawner.inventory import SimulatedInventory

from ..fixtures.hub import wait_for
from ..fixtures.kernels import Kernel


def culling_hub(make_hub, start: bool = True, extra_config: str = "", **env):
    settings = {
        "GPUHUB_CULL": "true",
        "GPUHUB_CULL_EVERY": "1",
        "GPUHUB_CULL_TIMEOUT_GPU": "10",  # spawns here can take 10 s under load
        "GPUHUB_CULL_TIMEOUT_CPU": "600",
    }
    settings.update({k: str(v) for k, v in env.items() if v is not None})
    settings = {k: v for k, v in settings.items() if env.get(k, "") is not None}  # None: left unset
    # GPUHUB_CULL=true: hub_config adds the culler service exactly as in production.
    return make_hub(extra_config, env=settings, start=start)


def leases_of(hub, user: str):
    return hub.ledger().history(user=user)


def ended_lease(hub, user: str):
    """`user`'s one lease, once it has ended.  The hub can report a culled server stopped before
    its lease ends: the lease is released only when Docker confirms the container gone, and on a
    loaded machine Docker's removal may outlast the spawner's settle grace (a fresh run's hub
    logged "stays lent: ... would not stop" 12 s after the stop); the spawner's background watch
    releases it then."""
    def ended():
        leases = leases_of(hub, user)
        return leases if leases and all(le.ended_at is not None for le in leases) else None

    (lease,) = wait_for(ended, 90, f"{user}'s lease to end after the server stopped", hub)
    return lease


def contents(hub, user: str, token: str, path: str, text: str | None = None) -> str | None:
    url = f"{hub.url}/user/{user}/api/contents/{path}"
    headers = {"Authorization": f"token {token}"}
    if text is not None:
        r = requests.put(url, json={"type": "file", "format": "text", "content": text},
                         headers=headers, timeout=30)
        assert r.status_code in (200, 201), r.text
        return text
    r = requests.get(url, headers=headers, timeout=30)
    return r.json()["content"] if r.status_code == 200 else None


def gpu_uuids(hub, user: str) -> list[str]:
    server = hub.server_model(user)
    return list((server or {}).get("state", {}).get("gpu_uuids", []))


# ------------------------------------------------------------------- the tests


def test_idle_gpu_server_is_culled_its_gpu_goes_to_the_waiting_user_and_files_survive(
        make_hub, docker_client):
    # The GPU servers' idle limit from the hub's own config file, not GPUHUB_CULL_TIMEOUT_GPU: the
    # culler takes its options from the file the hub writes from its final config.
    hub = culling_hub(make_hub, GPUHUB_SIMULATED_GPUS=1, GPUHUB_CULL_TIMEOUT_GPU=None,
                      extra_config="c.GPUIdleCuller.gpu_timeout = 10\n")
    for user in ("alice", "bob"):
        hub.create_user(user)
    alice_token = hub.user_token("alice")

    hub.start_server("alice", {"profile": "tf-gpu-1"})
    held = gpu_uuids(hub, "alice")
    assert len(held) == 1
    contents(hub, "alice", alice_token, "kept.txt", "written before the cull\n")

    # Bob wants the only GPU: his spawn waits in the queue.
    r = hub.api("POST", "/users/bob/server", json={"profile": "tf-gpu-1"}, timeout=60)
    assert r.status_code in (201, 202), r.text

    # Alice does nothing: the culler stops her server ...
    hub.wait_stopped("alice", timeout=60)
    alice_lease = ended_lease(hub, "alice")
    assert [c.name for c in hub.containers(docker_client) if c.name.endswith("-alice")] == []
    assert alice_lease.end_reason == "culled"
    assert list(alice_lease.gpu_uuids) == held

    # ... and Bob's queued spawn gets her GPU.
    bob_leases = wait_for(lambda: leases_of(hub, "bob"), 60, "bob got no lease", hub)
    assert list(bob_leases[0].gpu_uuids) == held
    assert bob_leases[0].started_at >= alice_lease.ended_at

    # The ledger's CLI shows who was culled, and when.
    out = subprocess.run(
        [sys.executable, "-m", "spawner.cli", "--db-url", hub.pool_db_url,
         "--json", "history", "--user", "alice"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"culled"' in out.stdout and "alice" in out.stdout
    assert alice_lease.ended_at.isoformat()[:19] in out.stdout

    # Alice comes back (on the CPU profile: Bob may still hold the GPU): her files are there.
    hub.start_server("alice", {"profile": "tf-cpu"})
    assert contents(hub, "alice", alice_token, "kept.txt") == "written before the cull\n"


def test_busy_kernel_and_cpu_server_survive_while_idle_gpu_server_is_culled(make_hub, docker_client):
    hub = culling_hub(make_hub)
    for user in ("alice", "bob", "carol"):
        hub.create_user(user)

    # Alice runs a long silent cell on her GPU server, then closes the tab.
    hub.start_server("alice", {"profile": "tf-gpu-1"})
    kernel = Kernel(hub, "alice", hub.user_token("alice"))
    kernel.execute_and_leave("import time; time.sleep(600)")

    hub.start_server("carol", {"profile": "tf-cpu"})  # CPU, idle, long timeout
    hub.start_server("bob", {"profile": "tf-gpu-1"})  # GPU, idle

    hub.wait_stopped("bob", timeout=60)
    bob_lease = ended_lease(hub, "bob")
    assert bob_lease.end_reason == "culled"

    # Bob's idle server was culled; Alice's, started before his, would have been in the same
    # round but for her busy kernel.  A few more rounds judge her again.
    hub.wait_cull_rounds(3)

    alice = hub.server_model("alice")
    assert alice is not None and alice["ready"], hub.log_tail(80)
    assert kernel.model()["execution_state"] == "busy"
    (alice_lease,) = leases_of(hub, "alice")
    assert alice_lease.active
    carol = hub.server_model("carol")
    assert carol is not None and carol["ready"], hub.log_tail(80)


def test_kernel_waiting_at_a_prompt_or_breakpoint_does_not_hold_its_gpu(make_hub):
    # GPU servers whose cells wait for a person who left: an input() prompt, a
    # pdb prompt, a breakpoint of JupyterLab's debugger.  The kernels stay
    # "busy", but nobody works: the culler gives their GPUs back after the GPU
    # timeout (10 s).
    hub = culling_hub(make_hub)
    prompts = {"alice": "answer = input('Continue training? ')",
               "bob": "import pdb\nx = 1\npdb.set_trace()\ny = 2"}
    for user, code in prompts.items():
        hub.create_user(user)
        hub.start_server(user, {"profile": "tf-gpu-1"})
        kernel = Kernel(hub, user, hub.user_token(user))
        # Alice's browser speaks the JSON protocol, Bob's JupyterLab's binary v1.
        prompt = kernel.prompt_and_leave(code, protocol="v1" if user == "bob" else "")
        assert prompt == "Continue training? " if user == "alice" else prompt.strip() in ("(Pdb)", "ipdb>")
        # The kernel is busy (its cell has not finished) and nobody is connected.
        assert kernel.model()["execution_state"] == "busy"

    # Carol stopped at a breakpoint of JupyterLab's debugger and went home.
    hub.create_user("carol")
    hub.start_server("carol", {"profile": "tf-gpu-1"})
    kernel = Kernel(hub, "carol", hub.user_token("carol"))
    stopped = kernel.stop_in_debugger_and_leave("x = 1\ny = 2\nz = 3", line=2)
    assert stopped["body"]["reason"] == "breakpoint"
    assert kernel.model()["execution_state"] == "busy"

    for user in ("alice", "bob", "carol"):
        hub.wait_stopped(user, timeout=90)
        lease = ended_lease(hub, user)
        assert lease.end_reason == "culled"


def test_gpu_under_threshold_is_culled_even_while_active(make_hub, tmp_path):
    utilization = tmp_path / "utilization.json"
    host = socket.gethostname()
    every_gpu = [SimulatedInventory.uuid_for(host, i) for i in range(4)]
    utilization.write_text(json.dumps({u: 90 for u in every_gpu}))
    hub = culling_hub(
        make_hub,
        GPUHUB_CULL_TIMEOUT_GPU=600,
        GPUHUB_ACTIVITY_INTERVAL=1,  # Bob's running cell keeps his server active in the hub's eyes
        GPUHUB_GPU_IDLE_PERCENT=10,
        GPUHUB_GPU_IDLE_MINUTES=0.1,
        GPUHUB_SIMULATED_UTILIZATION_FILE=str(utilization),
    )
    for user in ("alice", "bob"):
        hub.create_user(user)

    # Alice: idle notebook, GPU hard at work.  Bob: a cell running (active), GPU idle.
    hub.start_server("alice", {"profile": "tf-gpu-1"})
    hub.start_server("bob", {"profile": "tf-gpu-1"})
    (bob_gpu,) = gpu_uuids(hub, "bob")
    Kernel(hub, "bob", hub.user_token("bob")).execute_and_leave("import time; time.sleep(600)")
    low_since = time.monotonic()
    utilization.write_text(json.dumps({u: (0 if u == bob_gpu else 90) for u in every_gpu}))

    hub.wait_stopped("bob", timeout=60)
    assert time.monotonic() - low_since >= 6  # not before its GPU was low for 0.1 min
    bob_lease = ended_lease(hub, "bob")
    assert bob_lease.end_reason == "culled"

    hub.wait_cull_rounds(2)  # judged again with her GPU busy
    alice = hub.server_model("alice")
    assert alice is not None and alice["ready"], hub.log_tail(80)


def test_hub_shutdown_does_not_wait_for_the_culler(make_hub):
    # A hub started with SIGINT ignored, as a background job of a shell script
    # starts it: its services inherit the "ignore", and JupyterHub stops them
    # with SIGINT, escalating to SIGTERM only after 30 s.
    hub = culling_hub(make_hub, start=False, GPUHUB_CULL_EVERY=1)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        hub.start()
    finally:
        signal.signal(signal.SIGINT, previous)
    wait_for(lambda: "Starting service 'idle-culler'" in hub.log_tail(200), 30, "the culler to start", hub)
    hub.wait_cull_rounds(2)

    hub.stop()
    assert hub.process.returncode is not None
    log = hub.log_path.read_text(errors="replace")
    interrupted = re.search(r"Interrupting (\d+)", log)
    assert interrupted, log[-3000:]
    pid = interrupted.group(1)
    # The culler stopped on the hub's first signal: JupyterHub never had to
    # escalate to SIGTERM or SIGKILL, so it did not wait its 30 s for it.
    assert "Received SIGINT: the culler stops" in log, log[-3000:]
    assert f"Terminating {pid}" not in log and f"Killing {pid}" not in log, log[-3000:]
    shutdown = log[re.search(r"Cleaning up \d+ services", log).start():]
    assert "Cleaning up single-user servers" in shutdown, shutdown[-3000:]


def cull_at(hub, user: str, token: str) -> tuple[str | None, str]:
    """(when the pool service says `user`'s server is culled if idle, and why) from api/wait."""
    r = requests.get(f"{hub.url}/services/gpu-pool/api/wait", headers={"Authorization": f"token {token}"},
                     timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["cull_at"].get(user), r.json()["cull_reason"].get(user, "")


def inactive_for(hub, user: str) -> float:
    from datetime import UTC, datetime

    server = hub.server_model(user) or {}
    last = server.get("last_activity") or server.get("started")
    return (datetime.now(UTC) - datetime.fromisoformat(last.replace("Z", "+00:00"))).total_seconds()


def test_an_idle_gpu_server_is_culled_sooner_while_someone_waits_and_the_deadline_shown_moves(make_hub):
    contended = 15
    hub = culling_hub(make_hub, GPUHUB_SIMULATED_GPUS=1, GPUHUB_CULL_TIMEOUT_GPU=600,
                      GPUHUB_CULL_TIMEOUT_GPU_CONTENDED=contended, GPUHUB_LEASE_WAIT_TIMEOUT=120)
    for user in ("alice", "bob"):
        hub.create_user(user)
    token = hub.user_token("alice")
    hub.start_server("alice", {"profile": "tf-gpu-1"})

    # Nobody waits: the usual 600 s hold, and the page says so.
    at, why = cull_at(hub, "alice", token)
    assert at is not None and "GPU servers' idle limit, 10 min" in why
    # Idle past the contended timeout and a few cull passes (GPUHUB_CULL_EVERY=1): still running.
    wait_for(lambda: inactive_for(hub, "alice") > contended + 4, 60, "alice to sit idle", hub)
    assert hub.server_model("alice") is not None
    (lease,) = leases_of(hub, "alice")
    assert lease.ended_at is None

    # Alice touches her server (the hub hears of it within an activity report) ...
    contents(hub, "alice", token, "note.txt", "still here\n")
    wait_for(lambda: inactive_for(hub, "alice") < contended / 2, 30, "alice's activity reaching the hub", hub)
    # ... then Bob waits for the only GPU: the deadline shown moves to the contended one ...
    r = hub.api("POST", "/users/bob/server", json={"profile": "tf-gpu-1"}, timeout=60)
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: "while requests wait for GPUs, 15 s" in cull_at(hub, "alice", token)[1], 30,
             "the contended deadline on api/wait", hub)
    # ... and the culler applies it: alice's idle server goes, bob gets its GPU.
    hub.wait_stopped("alice", timeout=60)
    lease = ended_lease(hub, "alice")
    assert lease.end_reason == "culled"
    bob = wait_for(lambda: leases_of(hub, "bob"), 60, "bob got no lease", hub)
    assert list(bob[0].gpu_uuids) == list(lease.gpu_uuids)


def test_work_after_a_quiet_spell_reaches_the_hub_at_once_and_is_not_culled(make_hub):
    # A server tells the hub of its activity in periodic reports; work that starts after a
    # quiet spell, shortly before a cull pass, would reach the hub too late and the culler
    # would stop a busy server.  The servers' reports come every 120 s here (far later than
    # the 45 s GPU limit allows), so only the immediate post that follows a quiet spell (over
    # a third of the shortest limit, 15 s) can reach the hub in time.
    limit = 45
    hub = culling_hub(make_hub, GPUHUB_CULL_TIMEOUT_GPU=limit, GPUHUB_ACTIVITY_INTERVAL=120)
    hub.create_user("alice")
    token = hub.user_token("alice")
    hub.start_server("alice", {"profile": "tf-gpu-1"})

    # Alice leaves her server quiet for longer than the threshold ...
    wait_for(lambda: inactive_for(hub, "alice") > limit / 3 + 5, 60, "alice's server to sit quiet", hub)
    culled_at = time.time() + limit - inactive_for(hub, "alice")  # by the hub's last_activity
    # ... then starts a long cell, well before the hub's idle deadline.
    kernel = Kernel(hub, "alice", token)
    kernel.execute_and_leave("import time; time.sleep(600)")
    assert time.time() < culled_at - 5
    # The hub hears of it within seconds, not at the next report (two minutes away).
    wait_for(lambda: inactive_for(hub, "alice") < 8, 10, "the hub hearing of alice's work at once", hub)

    # Past the old deadline, and a few cull passes after it: her busy server runs on.
    wait_for(lambda: time.time() > culled_at + 2, limit, "the old idle deadline to pass", hub)
    hub.wait_cull_rounds(2)
    alice = hub.server_model("alice")
    assert alice is not None and alice["ready"], hub.log_tail(80)
    (lease,) = leases_of(hub, "alice")
    assert lease.active
    assert kernel.model()["execution_state"] == "busy"
