"""Admin rights that cannot be borrowed (issue 22, item 7), against a real OpenLDAP and hub.

In this directory people may make groups (ou=projects under the groups' base), and bob
made one called "hub-admins" like the real admin group.  A hub told to make the name
"hub-admins" admins refuses to start and says why; told the real group's DN, it makes
carol (a member of the real one) pool admin at her login and bob nothing, and running
code in other people's servers is a scope of its own.
"""

from __future__ import annotations

import secrets

import pytest

from devservices.apt import InstallError
from devservices.ldap.common import PortBusy
from devservices.ldap.openldap import GROUP_BASE, OpenLDAP, group_dn, user_dn
from tests.fixtures.services import free_port, service_unavailable

from .test_auth_hub import form_login
from .test_poolpage import page_api, wait_for_page

ROGUE_LDIF = f"""
dn: ou=projects,{GROUP_BASE}
objectClass: organizationalUnit
ou: projects

dn: cn=hub-admins,ou=projects,{GROUP_BASE}
objectClass: groupOfNames
cn: hub-admins
description: made by bob, who may make project groups
member: {user_dn("bob")}
"""


@pytest.fixture(scope="module")
def borrowing_directory(tmp_path_factory):
    server = OpenLDAP(tmp_path_factory.mktemp("openldap-rogue"), free_port(), free_port(), extra_ldif=ROGUE_LDIF)
    try:
        directory = server.start()
    except (InstallError, PortBusy, FileNotFoundError) as e:
        service_unavailable(f"OpenLDAP cannot run here: {e}")
    try:
        yield directory
    finally:
        server.stop()


def hub_env(directory, admin_groups: str, **more) -> dict:
    return {**directory.settings_env(admin_groups=admin_groups), "JUPYTERHUB_CRYPT_KEY": secrets.token_hex(32),
            **more}


def test_a_name_that_two_directory_groups_carry_is_refused_at_start(make_hub, borrowing_directory):
    hub = make_hub(env=hub_env(borrowing_directory, "hub-admins"), start=False)
    with pytest.raises(RuntimeError):
        hub.start(timeout=90)
    log = hub.log_path.read_text(errors="replace")
    assert "hub-admins" in log and group_dn("hub-admins") in log and "cn=hub-admins,ou=projects" in log, log[-3000:]
    assert "DN" in log


def test_privileged_roles_come_from_the_dn_decision_at_login(make_hub, borrowing_directory):
    d = borrowing_directory
    real = group_dn("hub-admins")
    hub = make_hub(env=hub_env(d, real, GPUHUB_DIRECTORY_EXEC_GROUPS=real))
    bob, carol = d.users["bob"], d.users["carol"]
    for user in (bob, carol):
        r = form_login(hub, user.name, user.password)
        assert r.status_code == 302, r.text[-2000:]
    models = {u: hub.api("GET", f"/users/{u}").json() for u in ("bob", "carol")}
    assert models["carol"]["admin"] is True and models["bob"]["admin"] is False
    # bob's own group is a hub group by its name, and carries nothing
    assert "hub-admins" in models["bob"]["groups"]
    bob_token, carol_token = hub.user_token("bob"), hub.user_token("carol")
    wait_for_page(hub, carol_token)
    assert page_api(hub, "GET", "api/audit", carol_token).status_code == 200
    r = page_api(hub, "GET", "api/audit", bob_token)
    assert r.status_code == 403 and "custom:gpu-pool:admin" in r.json()["message"]
    # exec: carol may (no server runs, so 404), bob may not
    assert page_api(hub, "POST", "api/exec", carol_token, json={"script": "id", "users": ["alice"]}).status_code == 404
    r = page_api(hub, "POST", "api/exec", bob_token, json={"script": "id", "users": ["alice"]})
    assert r.status_code == 403 and "custom:gpu-pool:exec" in r.json()["message"]
