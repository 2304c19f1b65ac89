"""SSH logins against Active Directory (the real Samba AD): disabled and locked accounts are
refused with the directory's own reason, exactly as at the hub's login form.

Samba AD listens on the fixed ports 389/636: run this module under the machine's exclusive
lock when other suites run beside it (docs/contributing/testing.md).
"""

from __future__ import annotations

import secrets

from spawner.auth import MSG_ACCOUNT

from ..fixtures.ssh import SSHClient
from .test_auth_hub import AUTHENTICATOR, form_login
from .test_ssh import ssh_hub


def test_disabled_and_locked_ad_accounts_cannot_ssh_in(make_hub, samba_ad, tmp_path):
    hub, port = ssh_hub(make_hub, samba_ad.config_py(authenticator_class=AUTHENTICATOR),
                        GPUHUB_AUTHENTICATOR="ldap", JUPYTERHUB_CRYPT_KEY=secrets.token_hex(32))
    client = SSHClient(port, tmp_path / "ssh")
    for name, problem in (("dave", "disabled"), ("erin", "locked")):
        user = samba_ad.users[name]
        r = client.ssh(name, "echo ran", password=user.password)
        assert r.returncode == 255 and "ran" not in r.stdout
        assert MSG_ACCOUNT[problem] in r.stderr, r.stderr
    # The same directory lets an account in good standing in.
    bob = samba_ad.users["bob"]
    assert form_login(hub, bob.name, bob.password).status_code == 302
    r = client.ssh("bob", "id -u", password=bob.password)
    assert r.returncode == 0 and r.stdout.strip() == str(bob.uid_number), r.stderr
