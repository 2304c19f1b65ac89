"""`gpu-pool doctor` against the real dockerd (with the NVIDIA hook's test double), real images,
a real SQLite ledger and an unreachable PostgreSQL one; "without the double" is a daemon that
refuses NVIDIA device requests, played by the fault-injecting proxy in front of the real one."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from spawner.cli.doctor import LABEL_DOCTOR, PROBE_USER
from spawner.inventory import SimulatedInventory, StaticInventory
from spawner.pool import GPUPool
from spawner.settings.hub import ledger_url
from tests.fixtures.services import free_port

REPO = Path(__file__).resolve().parents[2]
HOST = "doctor-host"
# The daemon's own words when no nvidia-container-runtime-hook was on its PATH at start.
NO_NVIDIA = 'could not select device driver "nvidia" with capabilities: [[gpu]]'


@pytest.fixture
def hub_env(tmp_path, docker_client, notebook_image):
    """GPUHUB_* settings of a hub on this machine: simulated GPUs, the minimal image, a private data dir."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHUB_", "GPU_POOL_"))}
    env.update(
        GPUHUB_DATA_DIR=str(data), GPUHUB_INVENTORY="simulated", GPUHUB_GPU_HOST=HOST,
        GPUHUB_CPU_IMAGE=notebook_image, GPUHUB_GPU_IMAGE=notebook_image,
        GPUHUB_AUTHENTICATOR="dummy", GPUHUB_DUMMY_PASSWORD="not-used", GPUHUB_CULL="false",
    )
    return env


def doctor(env: dict, *args: str) -> tuple[int, list[dict], str]:
    proc = subprocess.run([sys.executable, "-m", "spawner.cli", "doctor", "--json", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def by_check(results: list[dict]) -> dict[str, dict]:
    return {r["check"]: r for r in results}


def failed(results: list[dict]) -> list[dict]:
    return [r for r in results if r["status"] == "FAIL"]


def test_a_host_set_up_like_this_one_passes_every_check(hub_env, notebook_image):
    code, results, _ = doctor(hub_env)
    assert failed(results) == [] and code == 0, results
    checks = by_check(results)
    assert {"nvml", "gpus", "docker", "nvidia devices", "one-GPU container", f"image {notebook_image}",
            "ledger", "data directory"} <= set(checks)
    assert "4 to lend on host doctor-host" in checks["gpus"]["detail"]
    assert checks["nvidia devices"]["status"] == "ok"
    gpu = SimulatedInventory.uuid_for(HOST, 0)
    assert checks["one-GPU container"]["status"] == "ok" and gpu in checks["one-GPU container"]["detail"]
    assert checks["docker"]["detail"].startswith("Docker Engine ")
    # The project's images carry the busy-kernel extension; the doctor looked inside.
    assert checks[f"image {notebook_image}: busy kernels"]["status"] == "ok"


def test_text_output_has_one_line_per_check_and_the_fixes(hub_env):
    os.chmod(hub_env["GPUHUB_DATA_DIR"], 0o777)
    proc = subprocess.run([sys.executable, "-m", "spawner.cli", "doctor"], cwd=REPO, env=hub_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert any(line.startswith("ok    docker") for line in lines), proc.stdout
    assert any(line.startswith("FAIL  data directory") and "world-writable" in line for line in lines)
    assert any(line.strip().startswith("fix: chmod o-w") for line in lines)
    assert lines[-1] == "1 check(s) failed"


def test_a_daemon_without_the_nvidia_hook_fails_with_the_toolkit_fix(hub_env, docker_faults):
    docker_faults.fail("POST", r"/containers/create$", 500, NO_NVIDIA)
    code, results, _ = doctor(dict(hub_env, DOCKER_HOST=docker_faults.url))
    assert code == 1
    devices = by_check(results)["nvidia devices"]
    assert devices["status"] == "FAIL" and "could not select device driver" in devices["detail"]
    assert "NVIDIA Container Toolkit" in devices["fix"] and "restart dockerd" in devices["fix"]
    assert [r["check"] for r in failed(results)] == ["nvidia devices"]


def test_a_toolkit_that_cannot_set_up_the_gpu_fails_the_container_check(hub_env, docker_faults):
    # What NVIDIA's hook answers at start on a host whose driver is not loaded.
    docker_faults.fail("POST", r"/containers/[^/]+/start$", 500,
                       "OCI runtime create failed: nvidia-container-cli: initialization error: "
                       "nvml error: driver not loaded: unknown")
    code, results, _ = doctor(dict(hub_env, DOCKER_HOST=docker_faults.url))
    assert code == 1
    container = by_check(results)["one-GPU container"]
    assert container["status"] == "FAIL" and "driver not loaded" in container["detail"]
    assert "nvidia-container-cli info" in container["fix"]
    assert [r["check"] for r in failed(results)] == ["one-GPU container"]


def test_a_missing_image_fails_with_a_fix(hub_env):
    missing = "gpuhub/doctor-no-such-image:never-built"
    code, results, _ = doctor(dict(hub_env, GPUHUB_GPU_IMAGE=missing))
    assert code == 1
    image = by_check(results)[f"image {missing}"]
    assert image["status"] == "FAIL" and "not on this host" in image["detail"]
    assert "docker load" in image["fix"]


def test_an_image_needing_a_newer_cuda_than_the_driver_fails(hub_env, docker_client, notebook_image):
    tag = "gpuhub/test-needs-cuda:13.9"
    dockerfile = f"FROM {notebook_image}\nLABEL org.jupyter.gpuhub.cuda-version=13.9\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    code, results, _ = doctor(dict(hub_env, GPUHUB_GPU_IMAGE=tag))
    assert code == 1
    image = by_check(results)[f"image {tag}"]
    assert image["status"] == "FAIL"
    assert "needs CUDA 13.9 but this host's driver supports up to 12.4" in image["detail"]
    assert "update the NVIDIA driver" in image["fix"]


def test_an_unreachable_ledger_fails_and_hides_its_password(hub_env):
    password = "doctor-s3cret-pw"
    url = f"postgresql+psycopg://gpuhub:{password}@127.0.0.1:{free_port()}/ledger"
    code, results, stderr = doctor(dict(hub_env, GPUHUB_POOL_DB_URL=url))
    assert code == 1
    ledger = by_check(results)["ledger"]
    assert ledger["status"] == "FAIL" and "unavailable" in ledger["detail"], ledger
    assert "start the database" in ledger["fix"]
    assert password not in json.dumps(results) + stderr


def test_a_world_writable_data_directory_fails(hub_env):
    os.chmod(hub_env["GPUHUB_DATA_DIR"], 0o777)
    code, results, _ = doctor(hub_env)
    assert code == 1
    data = by_check(results)["data directory"]
    assert data["status"] == "FAIL" and "world-writable" in data["detail"] and "chmod o-w" in data["fix"]


def _config_file(tmp_path: Path, ledger: Path, image: str) -> Path:
    data = tmp_path / "data"
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(
        "c = get_config()\n"
        "c.GPUDockerSpawner.inventory_kind = 'simulated'\n"
        f"c.Inventory.host = {HOST!r}\n"
        f"c.GPUDockerSpawner.profiles = [{{'slug': 'one', 'display_name': 'One', 'image': {image!r}, 'gpus': 1}}]\n"
        f"c.GPUPool.db_url = 'sqlite:///{ledger.name}'\n"
        f"c.JupyterHub.cookie_secret_file = {str(data / 'jupyterhub_cookie_secret')!r}\n"
    )
    return config


def test_config_file_ledger_that_knows_the_host_passes(hub_env, tmp_path, notebook_image):
    ledger = tmp_path / "gpu-pool.sqlite"
    pool = GPUPool(db_url=f"sqlite:///{ledger}", inventory=SimulatedInventory(host=HOST))
    pool.sync_inventory()
    pool.close()
    code, results, _ = doctor(hub_env, "--config", str(_config_file(tmp_path, ledger, notebook_image)))
    assert code == 0, failed(results)
    assert "lists 4 GPU(s) of host doctor-host" in by_check(results)["ledger"]["detail"]
    # It names no Docker network: the host rules are a warning that says so, not a crash.
    rules = by_check(results)["host rules"]
    assert rules["status"] == "warn" and "network_name is not set" in rules["detail"], rules


def test_a_ledger_holding_these_gpus_under_another_host_name_fails(hub_env, tmp_path, notebook_image):
    ledger = tmp_path / "gpu-pool.sqlite"
    gpus = [{"uuid": SimulatedInventory.uuid_for(HOST, i), "index": i} for i in range(4)]
    pool = GPUPool(db_url=f"sqlite:///{ledger}", inventory=StaticInventory(host="old-name", gpus_list=gpus))
    pool.sync_inventory()
    pool.close()
    code, results, _ = doctor(hub_env, "--config", str(_config_file(tmp_path, ledger, notebook_image)))
    assert code == 1
    ledger_check = by_check(results)["ledger"]
    assert ledger_check["status"] == "FAIL" and "another host name" in ledger_check["detail"]
    assert "gpu-pool rehome 'old-name' 'doctor-host'" in ledger_check["fix"]


def _probe_containers(docker_client, prefix: str, since: float) -> list[str]:
    """Names of the doctor's containers made since `since` whose name starts with `prefix`
    (the daemon's own event log, read up to now: the doctor has finished by then)."""
    events = docker_client.events(since=int(since), until=int(time.time()) + 1, decode=True,
                                  filters={"type": "container", "event": "create",
                                           "label": f"{LABEL_DOCTOR}=gpu-probe"})
    names = [e["Actor"]["Attributes"].get("name", "") for e in events]
    return [n for n in names if n.startswith(prefix)]


def test_the_probe_takes_only_a_free_gpu_through_the_ledger(hub_env, docker_client):
    """Run during an upgrade: every GPU lent, the probe skips with a warning and runs no container;
    one GPU free, it takes that one with a lease of its own, ended as `doctor`, and the
    others' leases stay as they were."""
    pool = GPUPool(db_url=ledger_url(hub_env), inventory=SimulatedInventory(host=HOST))
    leases = [pool.try_acquire(f"user{i}", "", 1) for i in range(4)]
    assert all(leases)
    prefix = f"t{uuid.uuid4().hex[:6]}"
    env = dict(hub_env, GPUHUB_CONTAINER_PREFIX=prefix)
    try:
        since = time.time() - 1
        code, results, _ = doctor(env)
        probe = by_check(results)["one-GPU container"]
        assert probe["status"] == "warn" and "no GPU of this host is free (4 lent" in probe["detail"], probe
        assert "gpu-pool status" in probe["fix"]
        assert _probe_containers(docker_client, prefix, since) == []

        free = leases[2]
        pool.release(free.id, "stopped")
        since = time.time() - 1
        code, results, _ = doctor(env)
        probe = by_check(results)["one-GPU container"]
        assert probe["status"] == "ok" and free.gpu_uuids[0] in probe["detail"], probe
        made = _probe_containers(docker_client, prefix, since)
        assert len(made) == 1 and made[0].startswith(f"{prefix}-doctor-"), made
        assert {l.id for l in pool.leases()} == {leases[i].id for i in (0, 1, 3)}
        (taken,) = [l for l in pool.history() if l.user == PROBE_USER]
        assert taken.gpu_uuids == free.gpu_uuids and taken.end_reason == "doctor" and taken.ended_at
    finally:
        pool.close()
