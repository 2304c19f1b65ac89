"""Hubs that start at once agree on one Docker bridge (a fresh run's named failure).

Docker lets two networks share a name.  On a fresh machine two test workers started their first
hubs at the same moment; each found no `gpuhub-test` bridge and made one, and from then on every
hub failed at start: "network gpuhub-test is ambiguous".  Now each keeps the oldest of that name
and removes the others, so racing starts end with one bridge that all of them use.
"""

from __future__ import annotations

import secrets
import threading

import pytest

from spawner.settings.apply import docker_network_gateway

pytestmark = pytest.mark.integration

ROUNDS = 5
RACERS = 4


def race(name: str) -> tuple[list[str], list[Exception]]:
    """RACERS hub starts at one moment, each finding or making the bridge `name`."""
    start = threading.Barrier(RACERS)
    gateways: list[str] = []
    errors: list[Exception] = []

    def start_hub() -> None:
        start.wait(30)
        try:
            gateways.append(docker_network_gateway(name))
        except Exception as exc:  # reported by the test, with the others
            errors.append(exc)

    threads = [threading.Thread(target=start_hub) for _ in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return gateways, errors


def test_hubs_starting_at_once_make_one_bridge_and_all_use_it(docker_client):
    for _ in range(ROUNDS):
        name = f"gpuhub-race-{secrets.token_hex(3)}"
        try:
            gateways, errors = race(name)
            named = [n for n in docker_client.networks.list(names=[name]) if n.name == name]
            assert not errors, errors
            assert len(named) == 1, f"{len(named)} networks called {name}"
            assert len(set(gateways)) == 1 and len(gateways) == RACERS, gateways
        finally:
            for n in docker_client.networks.list(names=[name]):
                if n.name == name:
                    n.remove()
