"""The ledger <-> Docker reconciler against the real daemon."""

from __future__ import annotations

import contextlib
import secrets
from datetime import UTC, datetime, timedelta

import pytest

from spawner.engines.common.labels import LABEL_GPUS, LABEL_HOST, LABEL_LEASE, LABEL_POOL, pool_identity
from spawner.engines.common.reconcile_containers import reconcile
from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool

HOST = "reconcile-test-host"


@pytest.fixture
def pool(tmp_path):
    inventory = SimulatedInventory(count=4, host=HOST)
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", inventory=inventory)
    yield pool
    pool.close()


@pytest.fixture
def containers(docker_client, base_image):
    made = []
    tag = secrets.token_hex(3)

    def run(name: str, lease_id: int | str, gpus: tuple[str, ...], ledger: str):
        container = docker_client.containers.run(
            base_image, ["sleep", "300"], name=f"gpuhub-reconcile-{tag}-{name}", detach=True,
            network_mode="none",
            labels={LABEL_LEASE: str(lease_id), LABEL_GPUS: ",".join(gpus), LABEL_HOST: HOST,
                    LABEL_POOL: ledger})
        made.append(container)
        return container

    yield run
    for container in made:
        with contextlib.suppress(Exception):
            container.remove(force=True)


def names(docker_client) -> set[str]:
    return {c.name for c in docker_client.containers.list(ignore_removed=True)}


def test_reconcile_keeps_tracked_ends_orphans_and_stops_unleased_containers(pool, containers, docker_client):
    ledger = pool_identity(pool)
    tracked = pool.try_acquire("ann", "", 1)
    orphan_with_container = pool.try_acquire("bob", "", 1)
    orphan_without_container = pool.try_acquire("cat", "", 1)
    kept = containers("ann", tracked.id, tracked.gpu_uuids, ledger)
    orphaned = containers("bob", orphan_with_container.id, orphan_with_container.gpu_uuids, ledger)
    unleased = containers("dan", 9999, ("GPU-nobody-lent-this",), ledger)
    other_hub = containers("eve", 9999, ("GPU-of-another-ledger",), "another-ledger")

    report = reconcile(pool, docker_client, HOST, {tracked.id}, min_age=0,
                       process_started=datetime.now(UTC))

    assert report.kept == [tracked.id]
    assert sorted(report.ended) == sorted([orphan_with_container.id, orphan_without_container.id])
    assert {lease.id for lease in pool.leases()} == {tracked.id}
    assert {lease.end_reason for lease in pool.history() if lease.id != tracked.id} == {"reconciled"}
    running = names(docker_client)
    assert kept.name in running and other_hub.name in running
    assert orphaned.name not in running and unleased.name not in running


def test_a_lease_just_granted_is_not_taken_from_its_spawn(pool, docker_client):
    # The spawn that got it has not recorded it yet: not tracked, but young.
    young = pool.try_acquire("fay", "", 1)
    report = reconcile(pool, docker_client, HOST, set(), min_age=60,
                       process_started=datetime.now(UTC) - timedelta(hours=1))
    assert report.ended == [] and [lease.id for lease in pool.leases()] == [young.id]


def test_the_lease_of_a_spawn_in_progress_is_left_to_it_at_any_age(pool, containers, docker_client):
    # The hub's pass snapshots its servers, then reads the ledger: a spawn granted its lease
    # in between has not recorded it, but it is starting, so the lease is its own.  (A CI run
    # saw this end a restarted kept server's new lease with min_lease_age = 0.)
    ledger = pool_identity(pool)
    starting = pool.try_acquire("gil", "", 1)
    stranger = pool.try_acquire("hal", "", 1)
    started = containers("gil", starting.id, starting.gpu_uuids, ledger)
    report = reconcile(pool, docker_client, HOST, set(), min_age=0, starting={("gil", "")},
                       process_started=datetime.now(UTC))
    assert report.kept == [starting.id] and report.ended == [stranger.id]
    assert started.name in names(docker_client)


def test_a_reconcile_pass_survives_a_container_removed_while_listing(pool, containers, docker_client,
                                                                    docker_faults):
    import docker as docker_sdk

    ledger = pool_identity(pool)
    vanishing = containers("vanishing", 9998, ("GPU-gone",), ledger)
    unleased = containers("unleased", 9999, ("GPU-nobody-lent",), ledger)
    orphan = pool.try_acquire("olive", "", 1)
    # Between the listing and the inspection of each container, one disappears.
    docker_faults.after("GET", r"/containers/json$", lambda: vanishing.remove(force=True))
    client = docker_sdk.DockerClient(base_url=docker_faults.url)
    report = reconcile(pool, client, HOST, set(), min_age=0, process_started=datetime.now(UTC))
    assert report.ended == [orphan.id]
    assert unleased.name in report.containers_stopped


def test_a_paused_container_holding_gpus_without_a_lease_is_removed(pool, containers, docker_client):
    # Paused is not stopped: `docker unpause` would give it its GPUs back.
    paused = containers("paused", 9997, ("GPU-paused-without-lease",), pool_identity(pool))
    paused.pause()
    report = reconcile(pool, docker_client, HOST, set(), min_age=0, process_started=datetime.now(UTC))
    assert paused.name in report.containers_stopped
    assert paused.name not in {c.name for c in docker_client.containers.list(all=True, ignore_removed=True)}
