"""`gpu-pool exec`: an action script through the gpu-pool service's REST API.

The command is a client of the service (POST api/exec with a hub API token),
so it takes the same scope check, confirmation-free path and audit record as
the page's form; it runs nowhere the service would not.
"""

from __future__ import annotations

import json

import requests

from . import SERVICE_NAME


class ExecFailed(Exception):
    """The service refused or could not be reached; .code is the command's exit status."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def exec_script(hub_url: str, token: str, script: str, timeout: int, profile=None, group=None, users=None) -> dict:
    """POST the script; the service's answer ({"target", "results": [...]})."""
    if not token:
        raise ExecFailed("No hub API token: set JUPYTERHUB_API_TOKEN or pass --token", 2)
    body = {"script": script, "timeout": timeout, "profile": profile, "group": group, "users": users}
    url = f"{hub_url.rstrip('/')}/services/{SERVICE_NAME}/api/exec"
    try:
        r = requests.post(url, data=json.dumps(body), headers={"Authorization": f"token {token}"},
                          timeout=timeout + 120)
    except requests.RequestException as exc:
        raise ExecFailed(f"The GPU pool service at {url} did not answer: {exc}", 1) from None
    try:
        data = r.json()
    except ValueError:
        raise ExecFailed(f"The GPU pool service answered {r.status_code} without JSON", 1) from None
    if r.status_code != 200:
        raise ExecFailed(data.get("message") or f"HTTP {r.status_code}", 2 if r.status_code < 500 else 1)
    return data


def render(data: dict) -> str:
    lines = [f"Ran in {len(data['results'])} server(s) of {data['target']} (time limit {data['timeout']} s):"]
    for r in data["results"]:
        status = f"exit {r['exit_code']}" if r["exit_code"] is not None else "not run"
        if r["timed_out"]:
            status += ", timed out"
        if r["error"]:
            status += f": {r['error']}"
        lines.append(f"== {r['server']} ({status})")
        if r["output"]:
            lines.append(r["output"].rstrip("\n"))
        if r["truncated"]:
            lines.append("(output cut)")
    return "\n".join(lines)


def exit_status(data: dict) -> int:
    """0 when the script exited 0 everywhere, else 3."""
    return 0 if all(r["exit_code"] == 0 for r in data["results"]) else 3
