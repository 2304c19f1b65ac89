"""GPU JupyterHub inside JupyterLab, in real Chromium against a real hub (images/jupyter).

pat's JupyterLab shows, in its status bar, the GPU pat's server was lent (index, model,
the pool's utilisation and memory readings, the numbers the pool page's API gives) and
"culled in N min if idle", with the very deadline the
culler applies (the hub's last_activity of the server plus the GPU idle limit).  The
panel shows the same with a chart, the lease, and that busy kernels count; the warning
before the cull appears (the idle limit is shorter than the warning time), and its
"Keep my server" moves the hub's last_activity and the deadline.  bob's lease, on
another GPU, is never in pat's lab or in pat's answer of the pool service; when an admin
drains pat's GPU, pat's lab says so, and when an admin ends pat's lease, pat's lab says so
as the server stops; cy's CPU server says "no GPU".  The hub runs without batch jobs: the
status comes from the pool page's own listener for the servers.  Screenshots of the status
item, the panel, the warning and the notices go to test-artifacts/test_lab_extension_in_chromium/.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import requests

from ..fixtures.hub import DUMMY_PASSWORD, wait_for
from .test_browser import LAB_TIMEOUT, by_css, click, log_in, text_of
from .test_poolpage import ADMIN_ENV, page_api, wait_for_page

GPU_TIMEOUT = 480  # shorter than the warning's 10 minutes: the warning shows at once
CPU_TIMEOUT = 900


def parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(UTC)


def status_item(browser) -> dict:
    """What the status item shows, and the deadline and GPUs it holds."""
    items = browser.driver.find_elements(*by_css("#gpuhub-status"))
    if not items:
        return {"text": "", "deadline": "", "gpus": ""}
    item = items[0]
    return {"text": item.text, "deadline": item.get_attribute("data-deadline") or "",
            "gpus": item.get_attribute("data-gpus") or ""}


def open_lab(browser, hub, user: str) -> None:
    from selenium.common.exceptions import TimeoutException

    browser.driver.get(f"{hub.url}/user/{user}/lab")
    try:
        browser.wait(lambda d: d.find_elements(*by_css("#jp-main-statusbar #gpuhub-status")), LAB_TIMEOUT,
                     "JupyterLab's status bar has no GPU status item")
    except TimeoutException as exc:
        # The page's side is in the message; the server's side says whether the browser ever reached it.
        raise AssertionError(f"{exc.msg}\n{server_report(hub, user)}") from None


def server_report(hub, user: str) -> str:
    """The hub's model of `user`'s server, and the server's own status (its last activity, its
    connections), asked through the proxy as the browser would reach it."""
    try:
        status = requests.get(f"{hub.url}/user/{user}/api/status", timeout=30,
                              headers={"Authorization": f"token {hub.user_token(user)}"})
        answer = f"{status.status_code} {status.text[:300]}"
    except requests.RequestException as exc:
        answer = f"(no answer: {exc})"
    return f"hub's model of the server: {hub.server_model(user)}\nthe server's api/status: {answer}"


def element_shot(browser, selector: str, label: str) -> None:
    browser.artifacts.mkdir(parents=True, exist_ok=True)
    browser.driver.find_element(*by_css(selector)).screenshot(str(browser.artifacts / f"{browser.name}-{label}.png"))


def culler_deadline(hub, user: str, timeout: int = GPU_TIMEOUT) -> datetime:
    """When the culler stops the server: its last_activity in the hub plus its idle limit."""
    return parse(hub.server_model(user)["last_activity"]) + timedelta(seconds=timeout)


def shows_deadline(browser, hub, user: str, timeout: int = GPU_TIMEOUT) -> bool:
    deadline = status_item(browser)["deadline"]
    return bool(deadline) and abs((parse(deadline) - culler_deadline(hub, user, timeout)).total_seconds()) < 1


def test_lab_extension_in_chromium(make_hub, browser, tmp_path):
    utilization = tmp_path / "utilization.json"
    utilization.write_text("{}")
    hub = make_hub(env={**ADMIN_ENV, "GPUHUB_JOBS": "false", "GPUHUB_CULL": "true",
                        "GPUHUB_CULL_TIMEOUT_GPU": str(GPU_TIMEOUT), "GPUHUB_CULL_TIMEOUT_CPU": str(CPU_TIMEOUT),
                        "GPUHUB_GPU_IDLE_PERCENT": "0",
                        "GPUHUB_SIMULATED_UTILIZATION_FILE": str(utilization)})
    for name in ("pat", "bob", "cy", "ada"):
        hub.create_user(name)
    wait_for_page(hub, hub.user_token("pat"))
    hub.start_server("bob", {"profile": "tf-gpu-1"})
    hub.start_server("pat", {"profile": "tf-gpu-1"})
    leases = {l.user: l for l in hub.ledger().leases()}
    [pat_gpu], [bob_gpu] = leases["pat"].gpu_uuids, leases["bob"].gpu_uuids
    # pat's GPU with its memory in use (1229 MiB of 16 GiB), bob's as a plain percent
    utilization.write_text(json.dumps({pat_gpu: {"utilization": 42, "memory_used_mib": 1229}, bob_gpu: 97}))

    pat = browser("pat")
    log_in(pat, hub, "pat", DUMMY_PASSWORD)
    open_lab(pat, hub, "pat")
    # the leased GPU, the pool's reading of it, and the culler's deadline
    pat.wait(lambda d: "42%" in status_item(pat)["text"], 90,
             f"the status item never showed pat's GPU at 42%: {status_item(pat)}")
    pat.wait(lambda d: "1.2 / 16 GiB" in status_item(pat)["text"], 30,
             f"the status item never showed pat's GPU memory in use: {status_item(pat)}")
    shown = status_item(pat)
    assert shown["gpus"] == pat_gpu and "culled in" in shown["text"] and "if idle" in shown["text"]
    index = next(g.gpu.index for g in hub.ledger().gpus() if g.gpu.uuid == pat_gpu)
    assert f"GPU {index} " in shown["text"]
    pat.wait(lambda d: shows_deadline(pat, hub, "pat"), 60,
             f"the deadline {status_item(pat)['deadline']} is not the culler's {culler_deadline(hub, 'pat')}")
    element_shot(pat, "#gpuhub-status", "1-status-item")
    pat.shot("1-jupyterlab")

    # bob's lease is never in pat's lab, nor in what the pool service tells pat
    assert bob_gpu not in pat.driver.page_source and "97%" not in pat.driver.page_source
    mine = page_api(hub, "GET", "api/lab", hub.user_token("pat")).json()
    assert [g["uuid"] for g in mine["lease"]["gpus"]] == [pat_gpu] and bob_gpu not in json.dumps(mine)
    # the same numbers as the pool page's API
    rows = {g["uuid"]: g for g in page_api(hub, "GET", "api/gpus", hub.user_token("pat")).json()["gpus"]}
    assert (rows[pat_gpu]["utilization"], rows[pat_gpu]["memory_used_mib"]) == (42, 1229)
    assert (rows[bob_gpu]["utilization"], rows[bob_gpu]["memory_used_mib"]) == (97, None)
    assert mine["lease"]["gpus"][0]["memory_used_mib"] == 1229 and mine["ending"] is None

    # the panel: the GPU with its chart, the lease, the busy-kernel rule, the pool
    click(pat, "#gpuhub-status")
    pat.wait(lambda d: d.find_elements(*by_css("#gpuhub-panel:not(.lm-mod-hidden) .gpuhub-gpu svg polyline")),
             30, "the GPU panel did not open with a chart")
    panel = text_of(pat, "#gpuhub-panel")
    assert "Busy kernels count as activity" in panel and "GPU-hours so far" in panel
    assert f"Lease {leases['pat'].id} since" in panel and "GPU(s) free now" in panel
    # each GPU profile with the GPUs free for it (jobs are off here: the hub's own profiles)
    free = {g["uuid"] for g in rows.values() if g["state"] == "free"}
    assert mine["free"]["gpus"] == len(free) and mine["free"]["profiles"], mine["free"]
    for profile in mine["free"]["profiles"]:
        assert f"{profile['display_name']}: {profile['free']} GPU(s) free for it" in panel, panel
    element_shot(pat, "#gpuhub-panel", "2-panel")

    # the warning before the idle cull; "Keep my server" is activity the hub sees
    keep = "//div[contains(@class, 'Toastify')]//button[normalize-space()='Keep my server']"
    from selenium.webdriver.common.by import By

    pat.wait(lambda d: d.find_elements(By.XPATH, keep), 60, "no warning before the idle cull")
    assert "will be culled in" in pat.driver.find_element(By.CSS_SELECTOR, ".Toastify").text
    pat.shot("3-warning")
    element_shot(pat, ".Toastify__toast", "3-warning-toast")
    before_activity = parse(hub.server_model("pat")["last_activity"])
    before_deadline = parse(status_item(pat)["deadline"])
    clicked = datetime.now(UTC)
    pat.driver.find_element(By.XPATH, keep).click()
    # The server's own reports come every GPU_TIMEOUT/3 s: a last_activity from after the
    # click within seconds is the keep's.
    wait_for(lambda: parse(hub.server_model("pat")["last_activity"]) >= clicked - timedelta(seconds=1), timeout=20,
             what="the hub's last_activity to move after Keep my server", hub=hub)
    assert parse(hub.server_model("pat")["last_activity"]) > before_activity
    pat.wait(lambda d: status_item(pat)["deadline"] and parse(status_item(pat)["deadline"]) > before_deadline, 30,
             "the status item's deadline did not move after Keep my server")
    assert shows_deadline(pat, hub, "pat")
    pat.shot("4-kept")

    # an admin drains pat's GPU for maintenance: pat's JupyterLab says so (pat keeps it)
    r = page_api(hub, "POST", f"api/gpus/{pat_gpu}/drain", hub.user_token("ada"))
    assert r.status_code == 200, r.text
    pat.wait(lambda d: "An admin drained GPU" in text_of(pat, ".Toastify"), 60, "no notice of the drain")
    assert "drained by an admin" in text_of(pat, "#gpuhub-panel")
    pat.shot("5-drained-notice")

    # an admin ends pat's lease: the server stops, and as it stops pat's lab says why
    r = page_api(hub, "POST", f"api/leases/{leases['pat'].id}/end", hub.user_token("ada"))
    assert r.status_code == 200, r.text
    pat.wait(lambda d: "An admin ended the GPU lease" in text_of(pat, ".Toastify"), 60,
             f"no notice that an admin ended the lease: {text_of(pat, '.Toastify')!r}")
    hub.wait_stopped("pat")
    wait_for(lambda: hub.ledger().lease(leases["pat"].id).end_reason == "admin", timeout=60,
             what="pat's lease ended by the admin", hub=hub)
    pat.shot("6-lease-ended-notice")

    # a CPU server: no GPU
    hub.start_server("cy", {"profile": "tf-cpu"})
    cy = browser("cy")
    log_in(cy, hub, "cy", DUMMY_PASSWORD)
    open_lab(cy, hub, "cy")
    cy.wait(lambda d: "no GPU" in status_item(cy)["text"], 90, f"cy's CPU server: {status_item(cy)}")
    assert status_item(cy)["gpus"] == "" and pat_gpu not in cy.driver.page_source
    assert "if idle" in status_item(cy)["text"]
    cy.wait(lambda d: shows_deadline(cy, hub, "cy", CPU_TIMEOUT), 60,
            f"cy's deadline {status_item(cy)['deadline']} is not the culler's (CPU limit)")
    element_shot(cy, "#gpuhub-status", "7-cpu-status-item")
