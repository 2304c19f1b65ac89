"""The password asked again (spawner/reauth.py), with JupyterHub's DummyAuthenticator as the hub's."""

from __future__ import annotations

import asyncio

import pytest
from jupyterhub.auth import DummyAuthenticator
from tornado import web
from traitlets.config import Config

from spawner.reauth import PasswordRecheck


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def recheck(clock) -> PasswordRecheck:
    authenticator = DummyAuthenticator(config=Config({"DummyAuthenticator": {"password": "right-one"}}))
    return PasswordRecheck(authenticator, timeout=5, max_failures=3, window=600, clock=clock)


def status_of(check, name: str, password) -> int:
    try:
        asyncio.run(check.check(name, password))
    except web.HTTPError as exc:
        return exc.status_code
    return 200


def test_wrong_passwords_are_403_then_429_for_that_user_only_until_they_age_out():
    clock = Clock()
    check = recheck(clock)
    assert status_of(check, "alice", None) == 403
    assert status_of(check, "alice", "right-one") == 200
    for _ in range(3):
        assert status_of(check, "alice", "guess") == 403
    # The bound holds even for the right password: a guesser learns nothing more.
    assert status_of(check, "alice", "right-one") == 429
    assert status_of(check, "bob", "right-one") == 200
    clock.now += 601
    assert status_of(check, "alice", "right-one") == 200


def test_no_authenticator_refuses_with_a_message():
    with pytest.raises(web.HTTPError) as refused:
        asyncio.run(PasswordRecheck(None).check("alice", "x"))
    assert refused.value.status_code == 403 and "operator" in refused.value.log_message
