"""Notebook jobs and schedules on a real hub, ledger and Docker (issue 40).

A notebook in the user's home runs with papermill in the profile's image on leased GPUs, its
executed copy (and an HTML one) lands beside it; a one-minute schedule (the config lowers
ScheduleLimits.min_interval_minutes) fires by the wall clock with the user's server stopped
and makes an ordinary job; hostile notebook paths and cron strings are refused with 400 and
leave nothing behind.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from devservices.waiting import until

from ..fixtures.hub import Hub, wait_for
from .test_gpu_spawner import container_of
from .test_jobs import job_containers, job_hub, jobs_api, lease_of, wait_state
from .test_poolpage import logged_in, page_api, wait_for_page

NOTEBOOK = {
    "cells": [
        {"id": "defaults", "cell_type": "code", "metadata": {"tags": ["parameters"]}, "execution_count": None,
         "outputs": [],
         "source": "epochs = 1\n"},
        {"id": "train", "cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
         "source": "import os\n"
                   "print(f\"trained for {epochs} epochs on {os.environ.get('NVIDIA_VISIBLE_DEVICES')}\")\n"},
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}
ONE_MINUTE = "c.ScheduleLimits.min_interval_minutes = 1\n"


def utc(stamp: str) -> datetime:
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def in_home(hub: Hub, docker_client, user: str, script: str) -> tuple[int, str]:
    """Run `script` in the user's own server (started for it), as the user, in the home."""
    code, out = container_of(hub, docker_client, user).exec_run(["sh", "-c", script], workdir="/home/jovyan")
    return code, out.decode(errors="replace")


def with_a_notebook_in_the_home(hub: Hub, docker_client, user: str = "pat") -> None:
    """pat's home with work/train.ipynb, links out of it and one within it; then the server stops."""
    hub.start_server(user, {"profile": "tf-cpu"})
    text = json.dumps(NOTEBOOK).replace("'", "'\"'\"'")
    code, out = in_home(hub, docker_client, user,
                        f"mkdir -p work && printf '%s' '{text}' > work/train.ipynb && ln -s /etc etc && "
                        "ln -s ../../.. work/up && ln -s /tmp/x.ipynb work/tmp.ipynb && ln -s work w")
    assert code == 0, out
    hub.stop_server(user)


def schedules_api(hub: Hub, method: str, path: str, token: str, **kwargs):
    return page_api(hub, method, "api/schedules" + path, token, **kwargs)


def test_a_notebook_job_writes_its_executed_notebook_with_the_parameter_beside_it(make_hub, docker_client):
    hub, tokens = job_hub(make_hub)
    pat = tokens["pat"]
    with_a_notebook_in_the_home(hub, docker_client)
    r = jobs_api(hub, "POST", "", pat, json={"profile": "tf-gpu-1", "notebook": "work/train.ipynb",
                                             "parameters": {"epochs": 5}})
    assert r.status_code == 201, r.text
    j = r.json()
    assert (j["notebook"], j["parameters"]) == ("work/train.ipynb", {"epochs": 5})
    assert (j["output"], j["output_html"]) == (f"work/train.job-{j['id']}.ipynb", f"work/train.job-{j['id']}.html")
    done = wait_state(hub, pat, j["id"], ("succeeded", "failed"), timeout=300)
    logs = jobs_api(hub, "GET", f"/{j['id']}/logs", pat).text
    assert done["state"] == "succeeded", (done, logs[-3000:])
    assert len(done["gpus"]) == 1 and lease_of(hub, done["lease_id"]).end_reason == "job-finished"
    assert "trained for 5 epochs" in logs  # papermill's --log-output: the cells' output in the job's log
    wait_for(lambda: not job_containers(hub, docker_client, j["id"]), hub=hub, what="its container removed")

    hub.start_server("pat", {"profile": "tf-cpu"})
    code, out = in_home(hub, docker_client, "pat", f"cat {done['output']}")
    assert code == 0, out
    executed = json.loads(out)
    cells = [c for c in executed["cells"] if c["cell_type"] == "code"]
    assert all(c["execution_count"] for c in cells), cells
    injected = [c for c in cells if "injected-parameters" in c["metadata"].get("tags", [])]
    assert injected and "epochs = 5" in "".join(injected[0]["source"])
    printed = "".join("".join(o.get("text", "")) for c in cells for o in c["outputs"])
    assert f"trained for 5 epochs on {done['gpus'][0]}" in printed, printed  # its leased GPU, as the kernel saw it
    code, html = in_home(hub, docker_client, "pat", f"cat {done['output_html']}")
    assert code == 0 and "<html" in html and "trained for 5 epochs" in html, html[:500]
    code, out = in_home(hub, docker_client, "pat", "ls -l work/train.ipynb")  # the input untouched beside them
    assert code == 0, out


def test_hostile_notebook_paths_and_cron_strings_are_refused_and_nothing_is_created(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, extra_config=ONE_MINUTE)
    pat = tokens["pat"]
    with_a_notebook_in_the_home(hub, docker_client)
    before = hub.ledger().leases()
    for path, says in (("../bob/train.ipynb", "'..' is not allowed"), ("/home/jovyan/work/train.ipynb", "relative"),
                       ("work/../../x.ipynb", "'..' is not allowed"), ("etc/passwd.ipynb", "leads out of your home"),
                       ("work/up/etc/x.ipynb", "leads out of your home"), ("work/tmp.ipynb", "leads out of your home"),
                       ("work/nope.ipynb", "There is no notebook"), ("work/train.py", "ending in .ipynb")):
        for api in (jobs_api, schedules_api):
            extra = {"cron": "0 3 * * *"} if api is schedules_api else {}
            r = api(hub, "POST", "", pat, json={"profile": "tf-gpu-1", "notebook": path, **extra})
            assert r.status_code == 400 and says in r.json()["message"], (path, r.text)
    r = jobs_api(hub, "POST", "", pat, json={"profile": "tf-cpu", "notebook": "w/train.ipynb",
                                             "parameters": {"blob": "x" * 20000}})
    assert r.status_code == 400 and "JobLimits.max_parameters_bytes" in r.json()["message"], r.text
    for bad in ("nightly", "* * * *", "0 25 * * *", "0 3 * * * *", "@reboot", "0 3 30 2 *"):
        r = schedules_api(hub, "POST", "", pat, json={"cron": bad, "profile": "tf-cpu", "command": ["true"]})
        message = r.json()["message"]
        assert r.status_code == 400 and "'0 3 * * *'" in message and message.count(" UTC") >= 3, (bad, r.text)
    r = schedules_api(hub, "POST", "", pat, json={"cron": "0 3 * * *", "profile": "tf-cpu", "command": ["true"],
                                                  "timeout": 10**6})
    assert r.status_code == 400 and "ScheduleLimits.max_run_seconds" in r.json()["message"], r.text
    # Nothing was created: no job, no schedule, no lease, no container.
    assert jobs_api(hub, "GET", "", pat).json()["jobs"] == []
    assert schedules_api(hub, "GET", "", pat).json()["schedules"] == []
    assert hub.ledger().leases() == before and not job_containers(hub, docker_client)
    # A link within the home is followed: the same notebook through it is taken.
    r = schedules_api(hub, "POST", "", pat, json={"cron": "0 3 * * *", "profile": "tf-cpu",
                                                  "notebook": "w/train.ipynb"})
    assert r.status_code == 201, r.text


def test_a_one_minute_schedule_fires_with_the_server_stopped_and_makes_an_ordinary_job(make_hub, docker_client):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_ADMIN_USERS": "ada"}, users=("pat", "bob", "ada"),
                          extra_config=ONE_MINUTE)
    pat = tokens["pat"]
    assert hub.server_model("pat") is None  # no server: the hub fires it
    r = schedules_api(hub, "POST", "", pat, json={"cron": "* * * * *", "profile": "tf-cpu", "name": "tick",
                                                  "command": ["sh", "-c", "echo fired by the hub"]})
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["name"] == "tick" and not made["paused"] and len(made["next_times"]) == 3
    assert schedules_api(hub, "GET", f"/{made['id']}", tokens["bob"]).status_code == 404  # not bob's

    def fired_job():
        jobs = jobs_api(hub, "GET", "", pat).json()["jobs"]
        return [j for j in jobs if j["schedule_id"] == made["id"]]
    first = wait_for(fired_job, timeout=150, hub=hub, what="the schedule's first firing (by the wall clock)")[-1]
    done = wait_state(hub, pat, first["id"], ("succeeded", "failed"), timeout=120)
    assert done["state"] == "succeeded", done
    assert "fired by the hub" in jobs_api(hub, "GET", f"/{first['id']}/logs", pat).text
    assert hub.server_model("pat") is None  # it never needed pat's server
    seen = schedules_api(hub, "GET", f"/{made['id']}", pat).json()
    assert seen["fired"] >= 1 and seen["last_job_id"] >= first["id"] and seen["last_error"] is None
    # The pool page lists it: to pat (theirs), to the admin (everyone's), not to bob.
    def page(user):
        return logged_in(hub, user).get(f"{hub.url}/services/gpu-pool/", timeout=30).text
    mine = wait_for(lambda: (p := page("pat")) and 'id="schedules"' in p and p, hub=hub,
                    what="pat's schedule on the page")
    assert "tick" in mine and "<code>* * * * *</code>" in mine
    assert "tick" in page("ada") and 'id="schedules"' not in page("bob")
    assert [s["user"] for s in schedules_api(hub, "GET", "?all=1", tokens["ada"]).json()["schedules"]] == ["pat"]

    r = schedules_api(hub, "POST", f"/{made['id']}/pause", pat)
    assert r.status_code == 200 and r.json()["paused"] and r.json()["next_at"] is None, r.text
    r = schedules_api(hub, "POST", f"/{made['id']}/resume", pat)
    assert r.status_code == 200 and not r.json()["paused"] and r.json()["next_at"], r.text
    assert schedules_api(hub, "DELETE", f"/{made['id']}", tokens["bob"]).status_code == 404
    assert schedules_api(hub, "DELETE", f"/{made['id']}", pat).status_code == 204
    assert schedules_api(hub, "GET", f"/{made['id']}", pat).status_code == 404
    assert schedules_api(hub, "GET", "", pat).json()["schedules"] == []


def test_a_schedule_missed_while_the_hub_was_down_fires_once_when_it_is_back(make_hub, docker_client):
    """The wall clock, a real hub stop and start: the hub (with its gpu-pool service) stops right
    after a one-minute schedule is made and stays down past two of its slots; back up, the
    schedule fires once (one job, not one per missed slot), then on its slots again."""
    hub, tokens = job_hub(make_hub, extra_config=ONE_MINUTE)
    pat = tokens["pat"]
    # Made early in a minute, so the hub is down before the first slot comes.
    until(lambda: datetime.now(UTC).second < 20, 45, "the first 20 s of a minute")
    r = schedules_api(hub, "POST", "", pat, json={"cron": "* * * * *", "profile": "tf-cpu", "name": "missed",
                                                  "command": ["sh", "-c", "echo caught up"]})
    assert r.status_code == 201, r.text
    made = r.json()
    first_slot = utc(made["next_at"])
    hub.stop()
    assert datetime.now(UTC) < first_slot, "the hub stopped after the schedule's first slot"
    until(lambda: datetime.now(UTC) >= first_slot + timedelta(seconds=65), 150,
          "two slots of the schedule passing with the hub down")
    back = datetime.now(UTC)
    hub.start()
    wait_for_page(hub, pat)

    def fired():
        return [j for j in jobs_api(hub, "GET", "", pat).json()["jobs"] if j["schedule_id"] == made["id"]]
    caught_up = wait_for(fired, timeout=60, hub=hub, what="the missed firing once the hub is back")[-1]
    submitted = utc(caught_up["submitted_at"])
    assert submitted >= back, (caught_up, back)  # fired by the hub that came back
    # One job for the two missed slots: every other firing is on a slot after the catch-up's.
    next_slot = submitted.replace(second=0, microsecond=0) + timedelta(minutes=1)
    assert [j["id"] for j in fired() if utc(j["submitted_at"]) < next_slot] == [caught_up["id"]], fired()
    seen = schedules_api(hub, "GET", f"/{made['id']}", pat).json()
    assert utc(seen["next_at"]) >= next_slot and seen["last_error"] is None, seen
    done = wait_state(hub, pat, caught_up["id"], ("succeeded", "failed"), timeout=120)
    assert done["state"] == "succeeded", done
    assert schedules_api(hub, "DELETE", f"/{made['id']}", pat).status_code == 204
