"""The pool page's admin actions against a real hub, ledger and Docker: scope checks,
an action script over three running servers (one failing), ending a lease, `gpu-pool exec`."""

from __future__ import annotations

import subprocess
import sys

from ..fixtures.hub import wait_for
from .test_poolpage import ADMIN_ENV, logged_in, page_api, wait_for_page

# Fails for cy, and shows who it ran as and with which capabilities.
SCRIPT = """echo "uid=$(id -u) user=$JUPYTERHUB_USER"
grep CapEff /proc/self/status
if [ "$JUPYTERHUB_USER" = cy ]; then echo "cy's failure" >&2; exit 3; fi
"""


def test_action_scripts_and_ending_leases_are_for_pool_admins(make_hub, tmp_path):
    hub = make_hub(env={**ADMIN_ENV})
    for name in ("pat", "bob", "cy"):
        hub.create_user(name)
    hub.create_user("ada")
    pat, ada = hub.user_token("pat"), hub.user_token("ada")
    wait_for_page(hub, pat)
    for name in ("pat", "bob", "cy"):
        hub.start_server(name, {"profile": "tf-gpu-1"})
    leases = {l.user: l for l in hub.ledger().leases()}

    # a plain user may run no script and end no lease, not even their own
    r = page_api(hub, "POST", "api/exec", pat, json={"script": "id", "users": ["bob"]})
    assert r.status_code == 403 and "custom:gpu-pool:exec" in r.json()["message"]
    for who in ("bob", "pat"):
        assert page_api(hub, "POST", f"api/leases/{leases[who].id}/end", pat).status_code == 403
    assert page_api(hub, "GET", "confirm?action=drain&uuid=x", pat).status_code == 403
    # ...and sees no other user's name, nor in the estimates' API
    for path in ("api/wait", "api/gpus", "api/occupancy", "?period=24h"):
        r = page_api(hub, "GET", path, pat)
        assert r.status_code == 200 and "bob" not in r.text and '"cy"' not in r.text, path

    # the admin's script runs in all three, as each server's own user, without capabilities
    r = page_api(hub, "POST", "api/exec", ada, json={"script": SCRIPT, "timeout": 30,
                                                     "users": ["pat", "bob", "cy"]})
    assert r.status_code == 200, r.text
    results = {x["server"]: x for x in r.json()["results"]}
    assert set(results) == {"pat", "bob", "cy"}
    assert [results[u]["exit_code"] for u in ("pat", "bob", "cy")] == [0, 0, 3]
    assert "cy's failure" in results["cy"]["output"]
    for name, res in results.items():
        assert f"user={name}" in res["output"] and "uid=0" not in res["output"]
        assert "CapEff:\t0000000000000000" in res["output"], res["output"]
    # by profile: the same three servers; a script past its limit is stopped
    r = page_api(hub, "POST", "api/exec", ada, json={"script": "sleep 60", "timeout": 2, "profile": "tf-gpu-1"})
    assert r.status_code == 200 and {x["server"] for x in r.json()["results"]} == {"pat", "bob", "cy"}
    assert all(x["timed_out"] and x["exit_code"] == 124 for x in r.json()["results"])

    # by group: the members' servers only
    r = hub.api("POST", "/groups/ml", json={"users": ["pat", "bob"]})
    assert r.status_code == 201, r.text
    r = page_api(hub, "POST", "api/exec", ada, json={"script": "true", "group": "ml"})
    assert r.status_code == 200 and {x["server"] for x in r.json()["results"]} == {"pat", "bob"}

    # the page's forms: a POST without the hub's XSRF token (another site's form) does nothing
    session = logged_in(hub, "ada")
    page = session.get(f"{hub.url}/services/gpu-pool/", timeout=30)
    assert page.status_code == 200 and 'id="exec-form"' in page.text
    free = next(g["uuid"] for g in page_api(hub, "GET", "api/gpus", ada).json()["gpus"] if g["state"] == "free")
    r = session.post(f"{hub.url}/services/gpu-pool/actions/drain", data={"uuid": free}, timeout=30)
    assert r.status_code == 403 and not any(g.drained for g in hub.ledger().gpus())

    # bad input: 4xx with a message, nothing run
    for body, status in [({"script": "", "users": ["pat"]}, 400), ({"script": "id"}, 400),
                         ({"script": "id", "users": ["pat"], "profile": "tf-gpu-1"}, 400),
                         ({"script": "id", "users": ["pat"], "timeout": 0}, 400),
                         ({"script": "id", "users": ["nobody"]}, 404)]:
        r = page_api(hub, "POST", "api/exec", ada, json=body)
        assert r.status_code == status and r.json()["message"] and "Traceback" not in r.text, (body, r.text)
    assert page_api(hub, "POST", "api/exec", ada, data="not json").status_code == 400
    for path in ("api/occupancy?period=1y", "api/occupancy?buckets=0", "api/occupancy.csv?buckets=x",
                 "api/occupancy?period=24h&since=2026-01-01", "api/occupancy?since=2999-01-01"):
        r = page_api(hub, "GET", path, pat)
        assert r.status_code == 400 and r.json()["message"], (path, r.text)
    assert "use one of 24h, 7d, 30d" in page_api(hub, "GET", "?period=1y", pat).text  # the page says why
    # the three servers' GPUs show in the occupancy of the last hour
    series = page_api(hub, "GET", "api/occupancy?since=" + leases["pat"].started_at.isoformat()
                      .replace("+00:00", "Z") + "&buckets=1", pat).json()["series"]
    assert series["gpus"] == 4 and 1.5 < series["lent"][0] <= 3 and series["queue"] == [0.0]
    assert page_api(hub, "POST", "api/leases/nope/end", ada).status_code == 400
    assert page_api(hub, "POST", "api/leases/99999/end", ada).status_code == 404

    # `gpu-pool exec` through the service, with the admin's token
    script = tmp_path / "s.sh"
    script.write_text(SCRIPT)
    cli = subprocess.run([sys.executable, "-m", "spawner.cli", "exec", "--users", "pat,cy", str(script),
                          "--hub-url", hub.url, "--token", ada], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 3, cli.stderr
    assert "== pat (exit 0)" in cli.stdout and "== cy (exit 3)" in cli.stdout and "user=pat" in cli.stdout
    cli = subprocess.run([sys.executable, "-m", "spawner.cli", "exec", "--users", "pat", str(script),
                          "--hub-url", hub.url, "--token", pat], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "custom:gpu-pool:exec" in cli.stderr

    # the admin ends bob's lease: his server stops and the lease ends as admin
    r = page_api(hub, "POST", f"api/leases/{leases['bob'].id}/end", ada)
    assert r.status_code == 200, r.text
    hub.wait_stopped("bob")
    lease = wait_for(lambda: (l := hub.ledger().lease(leases["bob"].id)).ended_at and l, what="bob's lease to end")
    assert lease.end_reason == "admin"
    assert page_api(hub, "POST", f"api/leases/{leases['bob'].id}/end", ada).status_code == 409
    assert hub.server_model("pat") is not None  # the others run on

    audit = page_api(hub, "GET", "api/audit", ada).json()["audit"]
    actions = [(a["actor"], a["action"]) for a in audit]
    assert actions[0] == ("ada", "end-lease") and f"lease {leases['bob'].id} of bob" in audit[0]["detail"]
    assert actions.count(("ada", "exec")) == 4  # three through the API, one through the command
    assert any("users pat, bob, cy: 3 server(s)" in (a["detail"] or "") for a in audit)
