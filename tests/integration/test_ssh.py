"""SSH into one's own server with Debian's OpenSSH client, through the hub's gpu-ssh gateway.

Real parts only: a hub process with the directory login against the real OpenLDAP, the
gateway it starts as a service, the notebook image's sshd in the user's container on the
real dockerd, the real idle culler.  `ssh`, `scp`, `sftp` and `ssh -L` are OpenSSH's own.
"""

from __future__ import annotations

import asyncio
import html
import re
import secrets
import statistics
from datetime import datetime

import asyncssh
import requests

from spawner.auth import MSG_NOT_ALLOWED

from ..fixtures.hub import DUMMY_PASSWORD, wait_for
from ..fixtures.services import free_port
from ..fixtures.ssh import SSHClient, host_key_line, ssh_env, wait_for_gateway
from .test_auth_hub import AUTHENTICATOR, form_login

THROTTLE = """
c.SSHGateway.free_failures = 3
c.SSHGateway.failure_delay = 0.2
c.SSHGateway.max_failure_delay = 1.6
"""


def ssh_hub(make_hub, extra_config: str = "", **env):
    settings = ssh_env()
    settings.update({k: str(v) for k, v in env.items()})
    hub = make_hub(extra_config=extra_config, env=settings)
    port = int(settings["GPUHUB_SSH_PORT"])
    wait_for_gateway(port, hub)
    return hub, port


def container_of(hub, docker_client, user: str):
    (container,) = [c for c in hub.containers(docker_client, all=False) if c.name.endswith(f"-{user}")]
    return container


def env_of(container) -> dict:
    return dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])


def contents(hub, user: str, token: str, path: str) -> str | None:
    r = requests.get(f"{hub.url}/user/{user}/api/contents/{path}", headers={"Authorization": f"token {token}"},
                     timeout=30)
    return r.json()["content"] if r.status_code == 200 else None


def test_ssh_scp_and_port_forwarding_land_in_ones_own_server_and_strangers_do_not(
        make_hub, openldap, docker_client, tmp_path):
    directory = openldap
    hub, port = ssh_hub(make_hub, directory.config_py(authenticator_class=AUTHENTICATOR) + THROTTLE,
                        GPUHUB_AUTHENTICATOR="ldap", JUPYTERHUB_CRYPT_KEY=secrets.token_hex(32))
    alice, bob, frank = (directory.users[n] for n in ("alice", "bob", "frank"))
    for user in (alice, bob):
        assert form_login(hub, user.name, user.password).status_code == 302
    client = SSHClient(port, tmp_path / "ssh")

    # No server yet: the first `ssh` starts one (and says so), then runs in it as alice.
    r = client.ssh("alice", "id; pwd", password=alice.password)
    assert r.returncode == 0, r.stderr + hub.log_tail(80)
    assert "starting one" in r.stderr
    home = env_of(container_of(hub, docker_client, "alice"))["HOME"]
    id_line, pwd = r.stdout.strip().splitlines()
    assert id_line.startswith(f"uid={alice.uid_number}(alice) gid={alice.gid_number}")
    assert pwd == home
    assert hub.server_model("alice")["ready"]

    # scp into the home: alice's JupyterLab sees the file (its contents API).
    token = hub.user_token("alice")
    local = tmp_path / "notes.txt"
    local.write_text("copied over ssh\n")
    r = client.scp("alice", local, "notes.txt", password=alice.password)
    assert r.returncode == 0, r.stderr
    assert contents(hub, "alice", token, "notes.txt") == "copied over ssh\n"
    # sftp (what VS Code's Remote-SSH and file managers speak): a directory, a file in it, a listing.
    other = tmp_path / "more.txt"
    other.write_text("put over sftp\n")
    r = client.sftp("alice", f"mkdir from-sftp\nput {other} from-sftp/more.txt\nls -l from-sftp\n",
                    password=alice.password)
    assert r.returncode == 0 and "more.txt" in r.stdout, (r.stdout, r.stderr)
    assert contents(hub, "alice", token, "from-sftp/more.txt") == "put over sftp\n"

    # ssh -L: a port inside the container (its JupyterLab on 8888) on this machine.
    local_port = free_port()
    forward = client.popen("alice", "sleep 300", password=alice.password,
                           extra=("-L", f"127.0.0.1:{local_port}:localhost:8888"))
    try:
        def through_forward():
            try:
                return requests.get(f"http://127.0.0.1:{local_port}/user/alice/api", timeout=5).json()
            except (requests.RequestException, ValueError):
                return None
        answer = wait_for(through_forward, 60, "the forwarded port to answer", hub)
        assert "version" in answer
    finally:
        forward.terminate()
        forward.wait(30)
    # Forwarding anywhere but the container itself is refused.
    r = client.ssh("alice", "true", password=alice.password,
                   extra=("-o", "ExitOnForwardFailure=yes", "-W", "169.254.169.254:80"))
    assert r.returncode != 0 and "Only ports of your own server" in r.stderr

    # A hub API token works as the password; a registered public key works as a key.
    r = client.ssh("alice", "id -u", password=token)
    assert (r.returncode, r.stdout.strip()) == (0, str(alice.uid_number)), r.stderr
    key = asyncssh.generate_private_key("ssh-ed25519", comment="alice@laptop")
    key_file = tmp_path / "id_ed25519"
    key.write_private_key(str(key_file))
    key_file.chmod(0o600)
    keys_api = f"{hub.url}/services/gpu-ssh/api/keys"
    auth = {"Authorization": f"token {token}"}
    r = requests.post(keys_api, json={"key": key.export_public_key().decode()}, headers=auth, timeout=30)
    assert r.status_code == 201, r.text
    r = requests.post(keys_api, json={"key": "ssh-rsa AAAA-not-a-key"}, headers=auth, timeout=30)
    assert r.status_code == 400 and "not an OpenSSH public key" in r.json()["message"]
    r = client.ssh("alice", "whoami", key=key_file)
    assert (r.returncode, r.stdout.strip()) == (0, "alice"), r.stderr
    # The same key does not open bob's account.
    assert client.ssh("bob", "whoami", key=key_file).returncode == 255

    # Bob lands in his own container, as himself: two servers, two uids.
    r = client.ssh("bob", "id -u; hostname", password=bob.password)
    assert r.returncode == 0, r.stderr
    bob_uid, bob_host = r.stdout.split()
    assert bob_uid == str(bob.uid_number)
    assert bob_host == container_of(hub, docker_client, "bob").attrs["Config"]["Hostname"]

    # Refused: a wrong password, an account outside the allowed groups, alice's password
    # under bob's name.  Nothing runs.
    for name, password, says in (("alice", "wrong-" + alice.password, "Permission denied"),
                                 ("frank", frank.password, MSG_NOT_ALLOWED),
                                 ("bob", alice.password, "Permission denied")):
        r = client.ssh(name, "echo ran", password=password)
        assert r.returncode == 255 and "ran" not in r.stdout, (name, r)
        assert says in r.stderr, (name, r.stderr)

    # Guessing is slowed down: 30 wrong passwords in a row take longer and longer.
    times = []
    for _ in range(30):
        r = client.ssh("alice", "true", password="guess-" + secrets.token_hex(4))
        assert r.returncode == 255
        times.append(r.seconds)
    early, late = statistics.median(times[:3]), statistics.median(times[-5:])
    assert late > early + 1.0, times  # the capped delay (1.6 s) dominates the late attempts
    # ... and it grew on the way there, never falling back (beyond a loaded machine's noise).
    assert all(later > earlier - 0.5 for earlier, later in zip(times, times[1:])), times
    # The owner still gets in (slowed down too, as anyone from this address).
    r = client.ssh("alice", "true", password=alice.password)
    assert r.returncode == 0, r.stderr


def _iso(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_ssh_session_keeps_its_server_from_being_culled_and_the_host_key_survives_a_restart(
        make_hub, tmp_path):
    hub, port = ssh_hub(make_hub, "c.SSHGateway.activity_interval = 2\n", GPUHUB_CULL="true",
                        GPUHUB_CULL_EVERY="1", GPUHUB_CULL_TIMEOUT_GPU="10", GPUHUB_CULL_TIMEOUT_CPU="600")
    hub.create_user("alice")
    started = hub.start_server("alice", {"profile": "tf-gpu-1"})
    client = SSHClient(port, tmp_path / "ssh")

    # A session with no traffic at all: the person is there, the server is in use.
    session = client.popen("alice", "sleep 600", password=DUMMY_PASSWORD)
    try:
        began = _iso(started["started"])

        def activity_or_gone():
            server = hub.server_model("alice")
            if server is None:
                return "culled"
            if server.get("last_activity") and _iso(server["last_activity"]) > began + 30:
                return "active"
            return None
        # Three culling timeouts later, the culler (every second) has left it alone.
        assert wait_for(activity_or_gone, 120, "SSH activity reports", hub) == "active"
    finally:
        session.terminate()
        session.wait(30)
    # Without the session, the same server is culled.
    hub.wait_stopped("alice", timeout=90)
    (lease,) = hub.ledger().history(user="alice")
    assert lease.end_reason == "culled"

    # The host key is the same after a restart: the known_hosts entry still checks.
    before = host_key_line(port, client.known_hosts)
    assert before
    hub.stop()
    hub.start()
    wait_for_gateway(port, hub)
    r = client.ssh("alice", "echo back", password=DUMMY_PASSWORD, strict=True)
    assert r.returncode == 0 and r.stdout.strip() == "back", r.stderr
    assert host_key_line(port, client.known_hosts) == before
    # It started alice's last profile, and said so.
    assert "tf-gpu-1" in r.stderr


def test_ssh_waits_in_the_gpu_queue_saying_so_and_limits_connections_per_user(make_hub, tmp_path):
    hub, port = ssh_hub(make_hub, "c.SSHGateway.max_connections_per_user = 1\n", GPUHUB_SIMULATED_GPUS="1")
    client = SSHClient(port, tmp_path / "ssh")
    for user in ("alice", "bob"):
        hub.create_user(user)
    # Alice's last profile has a GPU; Bob holds the only one.
    hub.start_server("alice", {"profile": "tf-gpu-1"})
    hub.stop_server("alice")
    hub.start_server("bob", {"profile": "tf-gpu-1"})
    waiting = client.popen("alice", "echo in", password=DUMMY_PASSWORD)
    try:
        # Her connection started her last profile, which waits in the queue for Bob's GPU ...
        wait_for(lambda: [w for w in hub.ledger().queue() if w.user == "alice"], 120, "alice to queue", hub)
        hub.stop_server("bob")
        out, err = waiting.communicate(timeout=240)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    # ... and she was told where she stood, then got in.
    assert (waiting.returncode, out.strip()) == (0, "in"), err
    assert "tf-gpu-1" in err and "you are 1st in the queue" in err, err

    held = client.popen("alice", "echo held; sleep 300", password=DUMMY_PASSWORD)
    try:
        assert held.stdout.readline().strip() == "held"  # logged in, its session running
        r = client.ssh("alice", "echo second", password=DUMMY_PASSWORD)
        assert r.returncode == 255 and "second" not in r.stdout
        assert "You have 1 SSH connections open" in r.stderr and "max_connections_per_user = 1" in r.stderr
    finally:
        held.terminate()
        held.wait(30)
    r = client.ssh("alice", "echo ok", password=DUMMY_PASSWORD)
    assert r.stdout.strip() == "ok", r.stderr


# Given after a restart: alice blocked, and the user role (everyone's) cut down to no server
# access, so only an admin's role still reaches a server; 4 channels per connection.
BANS_AND_ROLES = """
c.SSHGateway.max_channels_per_connection = 4
c.Authenticator.blocked_users = {"alice"}
for role in c.JupyterHub.load_roles:
    if role["name"] == "user":
        role["scopes"] = [s for s in role["scopes"] if s != "self"] + ["read:users!user"]
"""


def _register_key(hub, keys_api: str, name: str, tmp_path):
    key = asyncssh.generate_private_key("ssh-ed25519", comment=f"{name}@laptop")
    key_file = tmp_path / f"id_{name}"
    key.write_private_key(str(key_file))
    key_file.chmod(0o600)
    r = requests.post(keys_api, json={"key": key.export_public_key().decode()},
                      headers={"Authorization": f"token {hub.user_token(name)}"}, timeout=30)
    assert r.status_code == 201, r.text
    return key_file


def test_ssh_honours_bans_and_roles_for_keys_registered_before_and_keeps_the_bind_password_out_of_its_file(
        make_hub, openldap, docker_client, tmp_path):
    directory = openldap
    password_file = tmp_path / "bind-password"
    password_file.write_text(directory.bind_password + "\n")
    password_file.chmod(0o600)
    hub, port = ssh_hub(make_hub, "", JUPYTERHUB_CRYPT_KEY=secrets.token_hex(32),
                        **directory.settings_env(password_file=str(password_file)))
    # The hand-over names the password's file; the password is not in it.
    hand_over = (hub.directory / "ssh" / "gateway.json").read_text()
    assert directory.bind_password not in hand_over and str(password_file) in hand_over
    users = {n: directory.users[n] for n in ("alice", "bob", "carol")}
    for user in users.values():
        assert form_login(hub, user.name, user.password).status_code == 302
    keys_api = f"{hub.url}/services/gpu-ssh/api/keys"
    key_files = {name: _register_key(hub, keys_api, name, tmp_path) for name in users}
    client = SSHClient(port, tmp_path / "ssh")
    # The keys work (the gateway read the lookup password from its file for the directory check).
    r = client.ssh("alice", "whoami", key=key_files["alice"])
    assert (r.returncode, r.stdout.strip()) == (0, "alice"), r.stderr + hub.log_tail(60)
    hub.stop_server("alice")

    hub.stop()
    with open(hub.config_file, "a") as config:
        config.write(BANS_AND_ROLES)
    hub.start()
    wait_for_gateway(port, hub)

    # Alice's key, registered before the ban: refused, and nothing started for her.
    r = client.ssh("alice", "echo ran", key=key_files["alice"])
    assert r.returncode == 255 and "ran" not in r.stdout, r
    assert "may not log in" in r.stderr, r.stderr
    # Bob's roles no longer reach his server: his key and his password are refused, saying so.
    for credentials in ({"key": key_files["bob"]}, {"password": users["bob"].password}):
        r = client.ssh("bob", "echo ran", **credentials)
        assert r.returncode == 255 and "ran" not in r.stdout, (credentials, r)
        assert "no access to its own server" in r.stderr, (credentials, r.stderr)
    for name in ("alice", "bob"):
        assert hub.server_model(name) is None
        assert not [c for c in hub.containers(docker_client, all=True) if c.name.endswith(f"-{name}")]
    # Carol, an admin (her role reaches every server), still gets in.
    r = client.ssh("carol", "whoami", key=key_files["carol"])
    assert (r.returncode, r.stdout.strip()) == (0, "carol"), r.stderr + hub.log_tail(60)

    # A burst of 8 channel opens on one connection (asyncssh as the client): 4 run, 4 are refused.
    async def burst():
        async with asyncssh.connect("127.0.0.1", port, username="carol", client_keys=[str(key_files["carol"])],
                                    known_hosts=None, agent_path=None, config=[]) as conn:
            return await asyncio.gather(*(conn.run("sleep 1; echo ok") for _ in range(8)), return_exceptions=True)
    results = asyncio.run(burst())
    refused = [r for r in results if isinstance(r, asyncssh.ChannelOpenError)]
    ran = [r for r in results if not isinstance(r, BaseException) and r.stdout.strip() == "ok"]
    assert (len(ran), len(refused)) == (4, 4), results
    assert all("max_channels_per_connection = 4" in r.reason for r in refused)


def _xsrf_in(page: str) -> str:
    match = re.search(r'name="_xsrf" value="([^"]+)"', page)
    assert match, page[:2000]
    return html.unescape(match.group(1))


def test_a_same_origin_page_cannot_add_a_key_to_a_visitors_account(make_hub, openldap, tmp_path):
    """Issue 42, item 6.  Without subdomain_host a page at /user/mallory/ shares the hub's origin:
    in alice's browser it fetches the key page with her cookies, reads its _xsrf and posts a key.
    Simulated without a browser: a session holding alice's hub cookie does exactly that."""
    directory = openldap
    hub, port = ssh_hub(make_hub, "", JUPYTERHUB_CRYPT_KEY=secrets.token_hex(32), **directory.settings_env())
    alice = directory.users["alice"]
    victim = requests.Session()
    page = victim.get(f"{hub.url}/hub/login", timeout=30)
    r = victim.post(f"{hub.url}/hub/login", allow_redirects=False, timeout=60, data={
        "username": "alice", "password": alice.password, "_xsrf": _xsrf_in(page.text)})
    assert r.status_code == 302, r.text[:500]
    token = hub.user_token("alice")
    keys_api = f"{hub.url}/services/gpu-ssh/api/keys"

    def alices_keys() -> list:
        r = requests.get(keys_api, headers={"Authorization": f"token {token}"}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["keys"]

    mallory = asyncssh.generate_private_key("ssh-ed25519", comment="mallory@evil")
    mallory_line = mallory.export_public_key().decode()
    # Mallory's page: the key page with alice's cookies, its _xsrf, the form's post.
    page = victim.get(f"{hub.url}/services/gpu-ssh/", timeout=30)
    assert page.status_code == 200 and "Add a public key" in page.text, page.text[:500]
    xsrf = _xsrf_in(page.text)
    r = victim.post(keys_api, data={"_xsrf": xsrf, "key": mallory_line, "from_page": "1"},
                    allow_redirects=False, timeout=30)
    assert r.status_code == 403 and "Type your password" in html.unescape(r.text), (r.status_code, r.text[:500])
    # ...or as fetch() would post JSON with the token in a header: refused the same way.
    r = victim.post(keys_api, json={"key": mallory_line}, headers={"X-XSRFToken": xsrf}, timeout=30)
    assert r.status_code == 403 and "Type your password" in r.json()["message"], r.text
    # A wrong password: a clear 403, nothing registered.
    r = victim.post(keys_api, data={"_xsrf": xsrf, "key": mallory_line, "from_page": "1",
                                    "password": "guess-" + alice.password}, allow_redirects=False, timeout=30)
    assert r.status_code == 403 and "not your password" in html.unescape(r.text), (r.status_code, r.text[:500])
    assert alices_keys() == []
    client = SSHClient(port, tmp_path / "ssh")
    mallory_file = tmp_path / "id_mallory"
    mallory.write_private_key(str(mallory_file))
    mallory_file.chmod(0o600)
    assert client.ssh("alice", "whoami", key=mallory_file).returncode == 255

    # Alice herself, with her password: the key is added and shown at the top of the page.
    own = asyncssh.generate_private_key("ssh-ed25519", comment="alice@laptop")
    r = victim.post(keys_api, data={"_xsrf": xsrf, "key": own.export_public_key().decode(), "from_page": "1",
                                    "password": alice.password}, allow_redirects=False, timeout=30)
    assert r.status_code == 302, (r.status_code, r.text[:500])
    [added] = alices_keys()
    page = victim.get(f"{hub.url}/services/gpu-ssh/", timeout=30).text
    banner = re.search(r'<div class="banner" id="new-keys".*?</div>', page, re.S)
    assert banner and added["fingerprint"] in banner[0] and "added" in banner[0], page[:3000]
    # A hub API token (which the page does not hold) still adds keys without the password (scripts).
    second = asyncssh.generate_private_key("ssh-ed25519", comment="alice@desktop")
    r = requests.post(keys_api, json={"key": second.export_public_key().decode()},
                      headers={"Authorization": f"token {token}"}, timeout=30)
    assert r.status_code == 201, r.text

    # Guessing is bounded per user: after 5 wrong passwords even the right one waits (429).
    for _ in range(5):
        r = victim.post(keys_api, json={"key": mallory_line, "password": "guess"},
                        headers={"X-XSRFToken": xsrf}, timeout=30)
        assert r.status_code == 403, r.text
    r = victim.post(keys_api, json={"key": mallory_line, "password": alice.password},
                    headers={"X-XSRFToken": xsrf}, timeout=30)
    assert r.status_code == 429 and "try again in" in r.json()["message"], r.text
    assert len(alices_keys()) == 2
    assert alice.password not in hub.log_path.read_text(errors="replace")
