"""Action scripts that behave, and pages that cannot be framed or forged (issue 22, items 6 and 8),
against a real hub, its gpu-pool service, the ledger and Docker.

Three running servers.  A pool admin without the exec scope runs nothing; the page's
exec confirmation comes only from a POST and runs exactly in the servers it listed;
output past the 16 KiB cap never reaches the service's memory; CRLF line ends work;
a fan-out longer than a client waits answers 202 with a run id that the API and
`gpu-pool exec` follow; the audit keeps the whole script and every exit code.
"""

from __future__ import annotations

import hashlib
import html
import re
import subprocess
import sys
import time
from pathlib import Path

import requests

from ..fixtures.hub import DUMMY_PASSWORD, wait_for
from .test_poolpage import ADMIN_ENV, logged_in, page_api, wait_for_page

# pam administers the pool (drain, end leases) but may not run code in other people's servers.
ENV = {**ADMIN_ENV, "GPUHUB_ADMIN_USERS": "ada,pam"}
FORGED = "Your session expired: log in again at evil.example"


def service_pid(hub) -> int:
    """The pid of the gpu-pool service the hub started (python -m spawner.poolpage)."""
    out = subprocess.run(["pgrep", "-f", "-P", str(hub.process.pid), "spawner.poolpage"],
                         capture_output=True, text=True, timeout=10).stdout.split()
    assert len(out) == 1, out
    return int(out[0])


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def hidden_inputs(page: str, form_id: str) -> list[tuple[str, str]]:
    form = re.search(rf'<form[^>]*id="{form_id}".*?</form>', page, re.S).group(0)
    return [(html.unescape(n), html.unescape(v))
            for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form)]


def test_scripts_run_where_confirmed_bounded_and_followed(make_hub, tmp_path):
    hub = make_hub(env=ENV)
    for name in ("pat", "bob", "cy", "ada", "pam"):
        hub.create_user(name)
    ada, pam = hub.user_token("ada"), hub.user_token("pam")
    wait_for_page(hub, ada)
    for name in ("pat", "bob", "cy"):
        hub.start_server(name, {"profile": "tf-gpu-1"})

    # item 8: no page or API answer of the service may be framed
    for path in ("", "api/gpus", "confirm?action=drain&uuid=x", "api/no-such-thing", "oauth_callback"):
        r = page_api(hub, "GET", path, ada)
        assert r.headers.get("X-Frame-Options") == "DENY", (path, r.headers)
        assert "frame-ancestors 'none'" in r.headers.get("Content-Security-Policy", ""), (path, r.headers)
    # ...and ?done= shows only what the service itself said
    assert FORGED not in page_api(hub, "GET", "?" + "done=" + FORGED.replace(" ", "+"), ada).text

    # item 7: pool admin is not the right to run code in other people's servers
    r = page_api(hub, "POST", "api/exec", pam, json={"script": "id", "users": ["pat"]})
    assert r.status_code == 403 and "custom:gpu-pool:exec" in r.json()["message"], r.text
    assert page_api(hub, "GET", "api/audit", pam).status_code == 200  # still a pool admin

    # item 8: an exec confirmation is not built from GET parameters (a framed or linked page)
    session = logged_in(hub, "ada")
    r = session.get(f"{hub.url}/services/gpu-pool/confirm",
                    params={"action": "exec", "script": "id", "users": "pat"}, timeout=30)
    assert r.status_code in (400, 405) and 'id="targets"' not in r.text, r.status_code
    # ...the page's form posts it, and the confirmed servers are exactly where it runs
    assert hub.api("POST", "/groups/ml", json={"users": ["pat", "bob"]}).status_code == 201
    page = session.get(f"{hub.url}/services/gpu-pool/", timeout=30).text
    xsrf = dict(hidden_inputs(page, "exec-form"))["_xsrf"]
    r = session.post(f"{hub.url}/services/gpu-pool/confirm", timeout=30, data={
        "_xsrf": xsrf, "action": "exec", "script": "echo ran as $JUPYTERHUB_USER", "group": "ml", "timeout": "30"})
    assert r.status_code == 200 and re.search(r'id="targets"', r.text), r.text[-2000:]
    assert "pat" in r.text and "bob" in r.text and "cy" not in re.search(r'<ul id="targets">.*?</ul>', r.text, re.S)[0]
    confirmed = hidden_inputs(r.text, "confirm-form")
    # cy joins the group between the confirmation and the click: the script does not run there
    assert hub.api("POST", "/groups/ml/users", json={"users": ["cy"]}).status_code == 200
    r = session.post(f"{hub.url}/services/gpu-pool/actions/exec", data=confirmed + [("password", DUMMY_PASSWORD)],
                     timeout=90)
    assert r.status_code == 200, r.text[-2000:]
    results = re.search(r'<table[^>]*id="results".*?</table>', r.text, re.S)[0]
    assert "ran as pat" in results and "ran as bob" in results and "cy" not in results, results

    # item 6: output past the cap is read no further into the service (its peak memory stays)
    pid = service_pid(hub)
    before = peak_rss_kib(pid)
    r = requests.post(f"{hub.url}/services/gpu-pool/api/exec", headers={"Authorization": f"token {ada}"},
                      timeout=120, json={"script": "head -c 200000000 /dev/zero | tr '\\0' x; echo; echo end",
                                         "timeout": 60, "users": ["pat"]})
    assert r.status_code == 200, r.text
    [res] = r.json()["results"]
    assert res["exit_code"] == 0 and res["truncated"] and len(res["output"]) == 16 * 1024, \
        {k: v for k, v in res.items() if k != "output"}
    grown = peak_rss_kib(pid) - before
    assert grown < 64 * 1024, f"the service's peak RSS grew by {grown} KiB for 200 MB of output"

    # item 6: CRLF line ends (what a browser's textarea sends) run as the admin meant
    crlf = "cd /tmp\r\npwd\r\nif [ -d /tmp ]; then\r\n  echo in-tmp\r\nfi\r\n"
    r = page_api(hub, "POST", "api/exec", ada, json={"script": crlf, "users": ["pat"]})
    [res] = r.json()["results"]
    assert res["exit_code"] == 0 and res["output"] == "/tmp\nin-tmp\n", res
    normalised = crlf.replace("\r\n", "\n")
    assert r.json()["script_sha256"] == hashlib.sha256(normalised.encode()).hexdigest()

    # item 6: a fan-out longer than a client waits is a run with an id, followed through the API
    slow = "echo started; sleep 4; echo finished; [ $JUPYTERHUB_USER != cy ]"
    r = page_api(hub, "POST", "api/exec", ada, json={"script": slow, "timeout": 600, "users": ["pat", "bob", "cy"]})
    assert r.status_code == 202, r.text
    run = r.json()
    assert run["id"] and run["url"].endswith(f"api/exec/{run['id']}") and run["servers"] == ["bob", "cy", "pat"]
    first = page_api(hub, "GET", f"api/exec/{run['id']}", ada).json()
    assert first["done"] is False and len(first["results"]) == 3
    assert page_api(hub, "GET", f"api/exec/{run['id']}", pam).status_code == 403
    done = wait_for(lambda: (d := page_api(hub, "GET", f"api/exec/{run['id']}", ada).json())["done"] and d,
                    timeout=60, what="the run to finish", interval=1)
    codes = {x["server"]: x["exit_code"] for x in done["results"]}
    assert codes == {"pat": 0, "bob": 0, "cy": 1} and all("finished" in x["output"] for x in done["results"])
    assert page_api(hub, "GET", "api/exec/no-such-run", ada).status_code == 404

    # ...and through `gpu-pool exec`, which follows it to the end
    script = tmp_path / "slow.sh"
    script.write_text(slow)
    started = time.monotonic()
    cli = subprocess.run([sys.executable, "-m", "spawner.cli", "exec", "--users", "pat,cy", "--timeout", "600",
                          str(script), "--hub-url", hub.url, "--token", ada],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 3, (cli.stdout, cli.stderr)
    assert "== pat (exit 0)" in cli.stdout and "== cy (exit 1)" in cli.stdout and "finished" in cli.stdout
    assert time.monotonic() - started < 100

    # item 6: the audit keeps the whole script (under its full SHA-256) and every exit code
    long_script = "".join(f"echo line {i} of a long script\n" for i in range(200)) + "exit 0\n"
    r = page_api(hub, "POST", "api/exec", ada, json={"script": long_script, "users": ["pat", "bob"]})
    assert r.status_code == 200
    digest = hashlib.sha256(long_script.encode()).hexdigest()
    audit = page_api(hub, "GET", "api/audit", ada).json()["audit"]
    details = "\n".join(a["detail"] or "" for a in audit if a["actor"] == "ada")
    assert digest in details and long_script in details
    assert re.search(r"bob: exit 0.*pat: exit 0", details), details[-3000:]
    assert re.search(r"bob: exit 0.*cy: exit 1.*pat: exit 0", details), details[-3000:]


# A server's own config that writes the Authorization header of each script request into the
# home: what a hostile user can do to the server they run (issue 42, item 1).
RECORDER = '''
import os

def _record(handler):
    auth = handler.request.headers.get("Authorization")
    if auth and handler.request.path.endswith("/api/gpuhub/script"):
        with open(os.path.expanduser("~/seen-headers"), "a") as out:
            out.write(auth + "\\n")

c.ServerApp.tornado_settings = {"log_function": _record}
'''


def test_a_server_recording_script_requests_gets_no_credential_beyond_its_own_server(make_hub):
    hub = make_hub(env=ENV)
    for name in ("pat", "bob", "ada"):
        hub.create_user(name)
    ada = hub.user_token("ada")
    wait_for_page(hub, ada)
    for name in ("pat", "bob"):
        hub.start_server(name, {"profile": "tf-cpu"})

    def run(script: str, user: str) -> dict:
        r = page_api(hub, "POST", "api/exec", ada, json={"script": script, "users": [user], "timeout": 30})
        assert r.status_code == 200, r.text
        [res] = r.json()["results"]
        assert res["exit_code"] == 0, res
        return res

    # pat plants the recorder in his own Jupyter config and restarts his server.
    run(f"mkdir -p ~/.jupyter && cat > ~/.jupyter/jupyter_server_config.py <<'PY'\n{RECORDER}PY\n", "pat")
    hub.stop_server("pat")
    hub.start_server("pat", {"profile": "tf-cpu"})
    run("echo a routine script", "pat")
    run("echo and another", "pat")
    recorded = run("cat ~/seen-headers", "pat")["output"].splitlines()
    tokens = {line.split(" ", 1)[1] for line in recorded if line.startswith("token ")}
    assert tokens, recorded

    bob_server = f"{hub.url}/user/bob/api/gpuhub/script"
    for token in tokens:
        auth = {"Authorization": f"token {token}"}
        # Nothing on the hub's API: not the list of servers, not bob, not auth_state.
        for path in ("/users", "/users/bob", "/users?state=active"):
            r = requests.get(f"{hub.url}/hub/api{path}", headers=auth, timeout=30)
            assert r.status_code in (403, 404), (path, r.status_code, r.text[:300])
        # Nothing in bob's server.
        r = requests.post(bob_server, headers=auth, json={"script": "id", "timeout": 5}, timeout=30,
                          allow_redirects=False)
        assert r.status_code != 200 and "uid=" not in r.text, (r.status_code, r.text[:300])
    assert len(tokens) >= 2, recorded  # a fresh token per request, not one reused
    # No token made for a script outlives it in pat's list of tokens (pat's own server may go on
    # taking one for its auth cache's 5 minutes: a credential for what pat holds anyway).
    left = hub.api("GET", "/users/pat/tokens").json()["api_tokens"]
    assert not [t for t in left if "action script" in (t.get("note") or "")], left


def test_a_same_origin_page_cannot_confirm_an_action_script_for_an_admin(make_hub):
    """Issue 42, item 6.  Without subdomain_host a page at /user/mallory/ shares the hub's origin:
    in ada's browser (she may run scripts) it reads the pool page's _xsrf, posts the exec form,
    reads the confirmation and posts that.  Simulated without a browser: a session holding ada's
    hub cookie does exactly that, and then the same as fetch() would to api/exec."""
    hub = make_hub(env=ENV)
    for name in ("pat", "ada", "mallory"):
        hub.create_user(name)
    ada, pat = hub.user_token("ada"), hub.user_token("pat")
    wait_for_page(hub, ada)
    hub.start_server("pat", {"profile": "tf-gpu-1"})
    forged = "echo forged >> ~/forged.txt; echo ran"

    def forged_runs() -> int:
        r = requests.get(f"{hub.url}/user/pat/api/contents/forged.txt", headers={"Authorization": f"token {pat}"},
                         timeout=30)
        return r.json()["content"].count("forged") if r.status_code == 200 else 0

    victim = logged_in(hub, "ada")
    page = victim.get(f"{hub.url}/services/gpu-pool/", timeout=30).text
    xsrf = dict(hidden_inputs(page, "exec-form"))["_xsrf"]
    r = victim.post(f"{hub.url}/services/gpu-pool/confirm", timeout=30, data={
        "_xsrf": xsrf, "action": "exec", "script": forged, "users": "pat", "timeout": "30"})
    assert r.status_code == 200 and 'id="targets"' in r.text, r.text[-2000:]
    confirmed = hidden_inputs(r.text, "confirm-form")
    r = victim.post(f"{hub.url}/services/gpu-pool/actions/exec", data=confirmed, timeout=90)
    assert r.status_code == 403 and "Type your password" in html.unescape(r.text), (r.status_code, r.text[-1500:])
    # ...as fetch() would post api/exec with the cookie and the token in a header: refused the same way.
    r = victim.post(f"{hub.url}/services/gpu-pool/api/exec", headers={"X-XSRFToken": xsrf}, timeout=90,
                    json={"script": forged, "users": ["pat"], "timeout": 30})
    assert r.status_code == 403 and "Type your password" in r.json()["message"], r.text
    # A wrong password: a clear 403, nothing runs.
    r = victim.post(f"{hub.url}/services/gpu-pool/actions/exec", data=confirmed + [("password", "guess")],
                    timeout=90)
    assert r.status_code == 403 and "not your password" in html.unescape(r.text), (r.status_code, r.text[-1500:])
    assert forged_runs() == 0
    audit = page_api(hub, "GET", "api/audit", ada).json()
    assert not any(rec["action"] == "exec" for rec in audit["audit"]), audit

    # Ada herself, with her password: it runs.
    r = victim.post(f"{hub.url}/services/gpu-pool/actions/exec", data=confirmed + [("password", DUMMY_PASSWORD)],
                    timeout=90)
    assert r.status_code == 200 and "ran" in r.text, r.text[-2000:]
    assert forged_runs() == 1
    # `gpu-pool exec` and scripts with a hub API token in the header are not asked.
    r = page_api(hub, "POST", "api/exec", ada, json={"script": "echo by-token", "users": ["pat"]})
    assert r.status_code == 200 and r.json()["results"][0]["output"] == "by-token\n", r.text
    assert DUMMY_PASSWORD not in hub.log_path.read_text(errors="replace")
