"""`gpu-pool exec`: an action script through the gpu-pool service's REST API.

The command is a client of the service (POST api/exec with a hub API token),
so it takes the same scope check (custom:gpu-pool:exec) and audit record as the
page's form, without the confirmation; it runs nowhere the service would not.
A long fan-out is a run with an id, which it follows until every server is done.
"""

from __future__ import annotations

import json
import math
import re
import time

import requests

from ..poolpage import SERVICE_NAME

# What a terminal would act on rather than print: escape sequences (CSI, OSC such as
# title changes and hyperlinks, DCS and the like, two-byte ones), then every other control
# character but newline and tab (a carriage return or backspace can hide a line).
_ESCAPES = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"      # OSC ... BEL or ST
    r"|\x1b[P^_X][^\x1b]*(?:\x1b\\)?"            # DCS, PM, APC, SOS ... ST
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"           # CSI
    r"|\x1b[ -/]*[0-~]"                          # two- and three-byte sequences
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]")            # other controls (\x1b alone too)


def printable(text: str) -> str:
    """`text` as a terminal shows it safely: without escape sequences or control characters."""
    return _ESCAPES.sub("", text)


class ExecFailed(Exception):
    """The service refused or could not be reached; .code is the command's exit status."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def _answer(r) -> dict:
    try:
        data = r.json()
    except ValueError:
        raise ExecFailed(f"The GPU pool service answered {r.status_code} without JSON", 1) from None
    if r.status_code not in (200, 202):
        raise ExecFailed(printable(str(data.get("message") or f"HTTP {r.status_code}")),
                         2 if r.status_code < 500 else 1)
    return data


def exec_script(hub_url: str, token: str, script: str, timeout: int, profile=None, group=None, users=None,
                progress=None, poll: float = 2.0) -> dict:
    """POST the script; the service's answer ({"target", "results": [...]}).

    A fan-out longer than a client waits is answered with 202 and a run id: this follows
    `api/exec/<id>` until every server has finished (`progress(message)` hears of it).
    """
    if not token:
        raise ExecFailed("No hub API token: set JUPYTERHUB_API_TOKEN or pass --token", 2)
    body = {"script": script, "timeout": timeout, "profile": profile, "group": group, "users": users}
    url = f"{hub_url.rstrip('/')}/services/{SERVICE_NAME}/api/exec"
    headers = {"Authorization": f"token {token}"}
    try:
        r = requests.post(url, data=json.dumps(body), headers=headers, timeout=timeout + 120)
    except requests.RequestException as exc:
        raise ExecFailed(f"The GPU pool service at {url} did not answer: {exc}", 1) from None
    data = _answer(r)
    if r.status_code == 200:
        return data
    run_url = f"{url}/{data['id']}"
    if progress:
        progress(f"Run {data['id']}: {len(data['servers'])} server(s) of {data['target']}; following {run_url}")
    # However long the service may take: every round of 8 servers, plus its own deadline.
    deadline = time.monotonic() + math.ceil(len(data["servers"]) / 8) * (timeout + 30) + 120
    finished = 0
    while True:
        try:
            data = _answer(requests.get(run_url, headers=headers, timeout=60))
        except requests.RequestException as exc:
            raise ExecFailed(f"The GPU pool service stopped answering about run {run_url}: {exc}; "
                             "the audit on the GPU pool page has its exit codes", 1) from None
        done = sum(1 for x in data["results"] if x["state"] == "done")
        if progress and done != finished:
            progress(f"{done} of {len(data['results'])} server(s) finished")
            finished = done
        if data["done"]:
            return data
        if time.monotonic() > deadline:
            raise ExecFailed(f"Run {data['id']} has not finished in time; follow it at {run_url}", 1)
        time.sleep(poll)


def render(data: dict) -> str:
    """The results for a terminal; what the servers printed comes without escape sequences
    (a script's output could otherwise retitle, clear or rewrite the admin's terminal)."""
    lines = [f"Ran in {len(data['results'])} server(s) of {printable(str(data['target']))} "
             f"(time limit {data['timeout']} s):"]
    for r in data["results"]:
        status = f"exit {r['exit_code']}" if r["exit_code"] is not None else "not run"
        if r["timed_out"]:
            status += ", timed out"
        if r["error"]:
            status += f": {printable(r['error'])}"
        lines.append(f"== {printable(r['server'])} ({status})")
        if r["output"]:
            lines.append(printable(r["output"]).rstrip("\n"))
        if r["truncated"]:
            lines.append("(output cut)")
    return "\n".join(lines)


def exit_status(data: dict) -> int:
    """0 when the script exited 0 everywhere, else 3."""
    return 0 if all(r["exit_code"] == 0 for r in data["results"]) else 3
