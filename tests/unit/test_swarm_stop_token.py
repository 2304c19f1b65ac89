"""The token a new hub process makes to ask an adopted Swarm server to exit (engines/swarm/stopping.py).

Real JupyterHub ORM (an in-memory database): the token belongs to the server's user, carries
only access to that one server, expires soon, and is gone once the stop was tried.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest
from jupyterhub import orm, roles
from jupyterhub.utils import utcnow

from spawner.engines.swarm import stopping

pytestmark = pytest.mark.unit


class _User:
    """What the spawner reaches through JupyterHub's User wrapper: the name, the database and
    the ORM user's new_api_token (the wrapper passes attribute reads through to it)."""

    def __init__(self, db, orm_user):
        self.db, self.orm_user, self.name = db, orm_user, orm_user.name

    def __getattr__(self, attr):
        return getattr(self.orm_user, attr)


class _Server:
    url = "http://127.0.0.1:9/user/ada/"  # nothing listens: the request fails, the token still goes


class _Spawner:
    def __init__(self, user, name=""):
        self.user, self.name, self.api_token, self.server = user, name, "", _Server()
        self.log = logging.getLogger("test")
        self.server_label = f"{user.name}:{name}" if name else user.name


@pytest.fixture
def db():
    session = orm.new_session_factory("sqlite:///:memory:")()
    # What a hub's database holds from its first start: its own OAuth client, the default roles.
    session.add(orm.OAuthClient(identifier="jupyterhub"))
    session.commit()
    for role in roles.get_default_roles():
        roles.create_role(session, role)
    yield session
    session.close()


def _user(db, name="ada"):
    orm_user = orm.User(name=name)
    db.add(orm_user)
    db.commit()
    roles.assign_default_roles(db, entity=orm_user)
    return _User(db, orm_user)


def test_the_stop_token_is_the_users_own_for_that_one_server_and_expires_soon(db):
    spawner = _Spawner(_user(db), name="gpu")
    token = stopping.make_stop_token(spawner)
    found = orm.APIToken.find(db, token)
    assert found is not None and found.user.name == "ada"
    assert found.scopes == ["access:servers!server=ada/gpu"]
    assert found.expires_at <= utcnow(with_tz=False) + timedelta(seconds=stopping.STOP_TOKEN_SECONDS)
    stopping.drop_stop_token(spawner, token)
    assert orm.APIToken.find(db, token) is None


def test_an_adopted_server_is_asked_with_a_made_token_that_is_deleted_afterwards(db):
    spawner = _Spawner(_user(db))
    assert stopping.stop_token_scope(spawner) == "access:servers!server=ada/"
    made = []
    real = stopping.make_stop_token

    def recording(sp):
        made.append(real(sp))
        return made[-1]

    stopping.make_stop_token, before = recording, stopping.make_stop_token
    try:
        exited = asyncio.run(stopping.ask_server_to_exit(spawner))
    finally:
        stopping.make_stop_token = before
    assert exited is False  # nothing listened: Swarm's own stop follows
    assert made and made[0] and orm.APIToken.find(db, made[0]) is None
    assert db.query(orm.APIToken).count() == 0


def test_a_server_with_its_own_token_gets_no_new_one(db):
    spawner = _Spawner(_user(db))
    spawner.api_token = "its-own"
    asyncio.run(stopping.ask_server_to_exit(spawner))
    assert db.query(orm.APIToken).count() == 0
