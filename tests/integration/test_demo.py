"""`make demo` as a newcomer runs it (issue 36, item 1): devservices/demo.py started as a
process, its banner read, and each line of it tried: every URL answers, the SSH line logs in
with OpenSSH's `ssh` and alice's demo password, carol runs an action script in alice's server
through the pool page's API, and the bookings answer with the demo's small limits (and one of
the newcomer's own `--config`).

The demo runs on free ports, on the suite's Docker network, with its containers and volumes
under a prefix of its own: given as GPUHUB_* variables, which the demo applies over its own
settings (the way a newcomer changes one).  Bounded: the banner within BANNER_TIMEOUT (the
images are cached by the suite), each step with its own timeout, the stop within 180 s.
"""

from __future__ import annotations

import json
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests

from devservices.hub import REPO, remove_what_a_hub_made
from devservices.ldap import seed
from devservices.ports import free_port_run
from devservices.ssh_client import SSHClient
from spawner.engines.common.labels import LABEL_USER

from .test_browser import LAB_TIMEOUT, by_css, click

# The first run builds the demo's images (cached by the hash of their inputs); the suite's
# image fixtures have built them already.
BANNER_TIMEOUT = 900


def demo_ports() -> dict[str, int]:
    """The demo's ports, all below the kernel's ephemeral range (free_port_run): the demo binds
    them only after its image builds, minutes later, and a port in that range may be taken by
    then (a run's demo failed so: its SSH key page's port was in use).  The hub, its proxy's API,
    the pool page and the SSH key page must be in a row (the demo's --port and the next three)."""
    base = free_port_run(10)
    return {"port": base, "ssh": base + 4, "ldap": base + 5, "ldaps": base + 6, "hub_api": base + 7,
            "smtp": base + 8, "mail": base + 9}


class Banner:
    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {text!r} from the demo in {timeout} s:\n" + "\n".join(self.lines[-40:]))
            try:
                line = self._queue.get(timeout=min(left, 5))
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"the demo exited ({self.proc.wait()}):\n" + "\n".join(self.lines[-40:]))
            self.lines.append(line)
            if text in line:
                return self.lines


def log_in(hub: str, name: str, password: str) -> requests.Session:
    """The hub's login form, as a browser fills it."""
    session = requests.Session()
    session.get(f"{hub}/hub/login", timeout=30)
    r = session.post(f"{hub}/hub/login", timeout=60, data={
        "username": name, "password": password, "_xsrf": session.cookies.get("_xsrf")})
    assert r.status_code == 200 and "/hub/login" not in r.url, (r.url, r.text[:300])
    return session


@dataclass
class Demo:
    """`make demo` running: its process, the banner's lines, its hub's address."""
    proc: subprocess.Popen
    banner: Banner
    lines: list[str]
    url: str
    ssh_port: int
    prefix: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory, docker_client, hub_network) -> Iterator[Demo]:
    """One demo for the module's tests, started as a newcomer starts it, stopped with Ctrl-C."""
    tmp_path = tmp_path_factory.mktemp("demo")
    ports = demo_ports()
    port, ssh_port = ports["port"], ports["ssh"]
    prefix = f"gpuhub-demotest-{secrets.token_hex(3)}"
    env = {**os.environ,
           # A newcomer's own settings, over the demo's: here, what keeps this demo apart from others.
           "GPUHUB_DOCKER_NETWORK": hub_network.name, "GPUHUB_CONTAINER_PREFIX": prefix,
           "GPUHUB_HOME_VOLUME": f"{prefix}-home-{{username}}", "GPUHUB_HUB_PORT": str(ports["hub_api"]),
           "GPUHUB_LEASE_WAIT_TIMEOUT": "60"}
    # ...and a config file of their own, loaded after the demo's.
    mine = tmp_path / "my_demo.py"
    mine.write_text("c.GPUPool.booking_max_per_user = 2\n")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "devservices" / "demo.py"), "--dir", str(tmp_path / "demo"),
         "--port", str(port), "--ssh-port", str(ssh_port), "--config", str(mine),
         "--ldap-port", str(ports["ldap"]), "--ldaps-port", str(ports["ldaps"]),
         "--smtp-port", str(ports["smtp"]), "--mail-port", str(ports["mail"])],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        text=True, start_new_session=True)
    banner = Banner(proc)
    try:
        lines = banner.wait_for("Ctrl-C stops", BANNER_TIMEOUT)
        yield Demo(proc=proc, banner=banner, lines=lines, url=f"http://127.0.0.1:{port}", ssh_port=ssh_port,
                   prefix=prefix)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(180)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        remove_what_a_hub_made(docker_client, prefix, hub_network.name, [int(env["GPUHUB_HUB_PORT"]), port + 2, port])
    assert proc.returncode == 0, "\n".join(banner.lines[-30:])


def user_token(hub: str, name: str, password: str) -> dict[str, str]:
    """An API token of `name`'s, made through the hub's login form, as an Authorization header."""
    session = log_in(hub, name, password)
    r = session.post(f"{hub}/hub/api/users/{name}/tokens", json={"note": "demo test", "expires_in": 600},
                     headers={"X-XSRFToken": session.cookies.get("_xsrf")}, timeout=30)
    assert r.status_code == 201, r.text
    return {"Authorization": f"token {r.json()['token']}"}


# ------------------------------------------------------------------ the first-day tutorial

TUTORIAL = REPO / "docs" / "users" / "first-day.md"
MODEL = "my-first-model.keras"
NOTEBOOK = "first-day.ipynb"
# TensorFlow's import and the 20 epochs on 2 busy cores, in the demo's image.
TRAIN_TIMEOUT = 240


def tutorial_cell() -> str:
    """The code the tutorial has the student paste (its one Python block), as they would copy it."""
    blocks = re.findall(r"^( *)```python\n(.*?)^\1```", TUTORIAL.read_text(), flags=re.S | re.M)
    assert len(blocks) == 1, "the tutorial has one code cell"
    indent, code = blocks[0]
    return "\n".join(line[len(indent):] for line in code.splitlines())


def contents(hub: str, auth: dict[str, str], user: str, path: str, content: bool = False) -> dict | None:
    """A file of `user`'s home as their server's contents API has it; None when it is not there."""
    r = requests.get(f"{hub}/user/{user}/api/contents/{path}", params={"content": int(content)}, headers=auth,
                     timeout=30)
    if r.status_code == 404:
        return None
    assert r.status_code == 200, (r.status_code, r.text[:300])
    return r.json()


def reported_wait(b, step: str, condition, timeout: float, what: str, report):
    """b.wait; one that times out fails as `step <step>: <what> in <timeout> s`, with a screenshot
    (`<browser>-<step>-timeout.png`) and report(), read then."""
    from selenium.common.exceptions import TimeoutException

    try:
        return b.wait(condition, timeout)
    except TimeoutException:
        shot = b.shot(f"{step}-timeout")
        raise AssertionError(f"step {step}: {what} in {timeout} s; screenshot {shot}\n{report()}") from None


def run_tutorial_cell(b, hub: str, auth: dict[str, str], user: str, before: str | None, step: str,
                      server_log=None) -> str:
    """Steps 5 and 9: the cell typed (or found) in the notebook, Shift+Enter; its output, once the model's
    file is newer than `before` (its last_modified before the run).  A wait that times out says what the
    notebook showed (notebook_report) and keeps a screenshot, `<browser>-<step>-timeout.png`."""
    from selenium.webdriver.common.keys import Keys

    from .test_browser import KERNEL_TIMEOUT, cell_of, text_of

    def wait(condition, timeout: float, what: str):
        return reported_wait(b, step, condition, timeout, what, lambda: (
            f"the model's last_modified before: {before}\n{notebook_report(b, hub, auth, user, server_log)}"))

    panel = ".jp-NotebookPanel:not(.lm-mod-hidden)"
    editor = wait(lambda d: next((e for e in d.find_elements(*by_css(f"{panel} .jp-Cell .cm-content"))
                                  if e.is_displayed()), None), LAB_TIMEOUT, "no notebook is open")
    wait(lambda d: "| Idle" in text_of(b, "#jp-main-statusbar"), KERNEL_TIMEOUT,
         "the notebook's kernel did not become idle")
    editor.click()
    if MODEL not in editor.text:
        editor.send_keys(tutorial_cell())
    b.driver.switch_to.active_element.send_keys(Keys.SHIFT, Keys.ENTER)
    # The output of the cell that ran, the one shown with the editor just clicked (see cell_of).
    cell = cell_of(editor)

    def trained(d) -> str | None:
        model = contents(hub, auth, user, MODEL)
        if model is None or (before is not None and model["last_modified"] <= before):
            return None
        out = "".join(e.text for e in cell.find_elements(*by_css(".jp-OutputArea-output")))
        return out if f"saved {MODEL}" in out else None

    return wait(trained, TRAIN_TIMEOUT, f"the cell saved no {MODEL}")


# What the open notebook shows, read in one go: each cell node's prompt ("[ ]:" not run, "[*]:" running,
# "[1]:" done), whether a person sees it (JupyterLab can keep a hidden one, see cell_of), whether it is
# the active one, its source's start and its output's end.
NOTEBOOK_STATE = """
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
const notebook = panel && panel.querySelector('.jp-Notebook');
const a = document.activeElement;
return {
  tabs: [...document.querySelectorAll('#jp-main-dock-panel .lm-TabBar-tab')].map(
    t => (t.classList.contains('lm-mod-current') ? '*' : '') + t.innerText),
  mode: notebook ? (notebook.classList.contains('jp-mod-editMode') ? 'edit' : 'command') : null,
  focus: a ? `${a.tagName}.${a.className}` : null,
  cells: panel ? [...panel.querySelectorAll('.jp-Cell')].map(c => ({
    shown: c.offsetHeight > 0 && getComputedStyle(c).opacity !== '0',
    prompt: (c.querySelector('.jp-InputPrompt') || {}).innerText,
    active: c.classList.contains('jp-mod-active'),
    source: ((c.querySelector('.cm-content') || {}).innerText || '').slice(0, 60),
    output: [...c.querySelectorAll('.jp-OutputArea-output')].map(e => e.innerText).join('\\n').slice(-1500)})) : [],
  statusbar: (document.querySelector('#jp-main-statusbar') || {}).innerText,
  dialogs: [...document.querySelectorAll('.jp-Dialog')].map(d => d.innerText),
};
"""


def notebook_report(b, hub: str, auth: dict[str, str], user: str, server_log=None) -> str:
    """What a person would look at when the cell saved nothing: the notebook's cells (prompt, output),
    the status bar, any dialog, the model's contents-API entry, the server's kernels, its log's end."""
    lines: list[str] = []

    def add(label: str, read) -> None:
        try:
            value = read()
        except Exception as exc:  # a report that says why a part is missing, never a second error
            value = f"(unreadable: {type(exc).__name__}: {exc})"
        lines.append(f"{label}: {value if isinstance(value, str) else json.dumps(value, indent=1)}")

    add("page", lambda: b.driver.current_url)
    add("notebook", lambda: b.driver.execute_script(NOTEBOOK_STATE))
    add(f"contents API {MODEL}", lambda: contents(hub, auth, user, MODEL))
    add("kernels", lambda: requests.get(f"{hub}/user/{user}/api/kernels", headers=auth, timeout=30).json())
    if server_log is not None:
        add("server log (end)", server_log)
    return "\n".join(lines)


def stop_server(b, hub: str, auth: dict[str, str], user: str) -> None:
    """Step 7: File > Hub Control Panel > Stop My Server; done once the hub has no server of `user`'s.
    The home page shows "Start My Server" as soon as the hub accepts the stop (202, still stopping):
    a Start pressed then reaches a "Server not running" page, not the profile form."""
    from selenium.webdriver.support import expected_conditions as EC

    from .test_browser import STOP_BUTTON_READY

    b.driver.get(f"{hub}/hub/home")
    stop = b.wait(EC.element_to_be_clickable(by_css("#stop")), 60, "no Stop My Server button")
    b.wait(lambda d: d.execute_script(STOP_BUTTON_READY), 30, "the home page's script did not load")
    stop.click()
    b.wait(lambda d: not d.find_element(*by_css("#stop")).is_displayed()
           and d.find_element(*by_css("#start")).text.strip() == "Start My Server", 90, "the server did not stop")

    def stopped(_) -> bool:
        r = requests.get(f"{hub}/hub/api/users/{user}", headers=auth, timeout=30)
        return r.status_code == 200 and "" not in r.json().get("servers", {})

    b.wait(stopped, 90, "the hub still lists the server 90 s after Stop My Server")


def test_the_first_day_tutorial_on_the_demo(demo, browser, docker_client):
    """docs/users/first-day.md, step by step, in Chromium: its screenshots are the page's pictures."""
    from types import SimpleNamespace

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC

    from .test_browser import spawn_with_profile

    alice = seed.users_for("openldap")["alice"]
    assert f"`{alice.name}`, password `{alice.password}`" in TUTORIAL.read_text()
    hub, server = demo.url, SimpleNamespace(url=demo.url)
    b = browser("first-day")

    def server_log() -> str:
        """The end of alice's server's log (its kernels' restarts, a traceback), without the polls' 200s."""
        mine = [c for c in docker_client.containers.list(filters={"label": f"{LABEL_USER}={alice.name}"})
                if c.name.startswith(demo.prefix)]
        return "\n".join(f"{c.name}:\n" + "\n".join(
            [line for line in c.logs(tail=400).decode(errors="replace").splitlines()
             if " 200 GET " not in line and "/api/contents/my-first-model" not in line][-40:])
            for c in mine) or "(no container)"

    # The page's pictures, named as docs/users/images/ has them: copied from here after a passing run.
    pictures = b.artifacts / "tutorial"
    pictures.mkdir(parents=True, exist_ok=True)
    for old in pictures.glob("*.png"):
        old.unlink()

    def shot(step: str, taken: str | None = None) -> None:
        """The screenshot of step `step`: taken now, or one spawn_with_profile took (`taken`)."""
        path = pictures / f"first-day-{step}.png"
        if taken:
            shutil.copy(b.artifacts / f"{b.name}-{taken}.png", path)
        else:
            b.driver.save_screenshot(str(path))

    # 1. Log in.
    b.driver.get(f"{hub}/hub/login")
    b.wait(EC.visibility_of_element_located(by_css("#username_input")), 60, "no login form")
    b.driver.find_element(*by_css("#username_input")).send_keys(alice.name)
    b.driver.find_element(*by_css("#password_input")).send_keys(alice.password)
    shot("1-login")
    click(b, "#login_submit")
    b.wait(lambda d: "/hub/spawn" in d.current_url, 60, "no profile form after the login")
    auth = user_token(hub, alice.name, alice.password)

    # 2-3. The GPU profile; the server starts with the GPU it was lent.
    progress = spawn_with_profile(b, server, alice.name, "tf-gpu-1")  # shots spawn-form, spawn-pending
    assert any("Leased 1 GPU" in m for m in progress), progress
    shot("2-profile", "spawn-form")
    shot("3-starting", "spawn-pending")

    # 4. JupyterLab's launcher: a new Python notebook.
    card = '.jp-LauncherCard[data-category="Notebook"]'
    b.wait(EC.visibility_of_element_located(by_css(card)), LAB_TIMEOUT, "JupyterLab's launcher did not appear")
    b.wait(lambda d: d.find_elements(*by_css("#jp-main-statusbar #gpuhub-status")), LAB_TIMEOUT,
           "JupyterLab's status bar shows no GPU")
    shot("4-jupyterlab")
    click(b, card)

    # 5. The tutorial's cell trains and saves the model, in the home.
    assert contents(hub, auth, alice.name, MODEL) is None
    output = run_tutorial_cell(b, hub, auth, alice.name, None, "5", server_log)
    assert "GPUs: 0" in output, output  # the demo's GPUs are simulated: TensorFlow runs on the CPU
    shot("5-trained")
    gpu_model = contents(hub, auth, alice.name, MODEL)
    assert gpu_model and gpu_model["type"] == "file" and gpu_model["size"] > 1000, gpu_model

    # 6. The model in the file browser; Ctrl+S saves the notebook with the cell.
    def listed(*names: str):
        return lambda d: set(names) <= {e.text for e in d.find_elements(*by_css(".jp-DirListing-itemText"))}

    b.wait(listed(MODEL), 60, f"the file browser does not show {MODEL}")
    b.driver.switch_to.active_element.send_keys(Keys.CONTROL, "s")
    name = b.wait(EC.element_to_be_clickable(by_css(".jp-Dialog input")), 30, "Ctrl+S asked for no name")
    name.send_keys(Keys.CONTROL, "a")
    name.send_keys(NOTEBOOK)
    click(b, ".jp-Dialog button.jp-mod-accept")
    b.wait(lambda d: MODEL in json.dumps((contents(hub, auth, alice.name, NOTEBOOK, content=True) or {})
                                         .get("content")), 60, "Ctrl+S did not save the notebook with its cell")
    b.wait(listed(MODEL, NOTEBOOK), 60, f"the file browser does not show {NOTEBOOK}")
    shot("6-model-file")

    # 7. Stop the server; the model stays in the home.
    stop_server(b, hub, auth, alice.name)
    shot("7-stopped")

    # 8. Start again with the CPU profile.
    click(b, "#start")
    spawn_with_profile(b, server, alice.name, "tf-cpu")
    shot("8-cpu-profile", "spawn-form")
    kept = contents(hub, auth, alice.name, MODEL)
    assert kept and kept["last_modified"] == gpu_model["last_modified"], (kept, gpu_model)

    # 9. The notebook again.  JupyterLab reopens the tabs its saved layout names, and that layout still
    # names the notebook as it was before Ctrl+S renamed it (Untitled.ipynb, gone): so JupyterLab shows a
    # Launcher, and the notebook comes with a double-click in the file browser.  That double-click waits
    # until the file browser has restored (a single one made while it restored once left nothing open:
    # "no notebook is open" 180 s later), and is made again when one did not take.  The same cell,
    # Shift+Enter.
    opened = {"at": 0.0, "times": 0}

    def notebook_in_front(d) -> bool:
        if (not d.find_elements(*by_css(".jp-FileBrowser"))
                or d.find_elements(*by_css(".jp-FileBrowser.jp-mod-restoring"))):
            return False  # JupyterLab still restoring its layout and file browser
        if any(e.is_displayed() for e in d.find_elements(*by_css(".jp-NotebookPanel:not(.lm-mod-hidden) .cm-content"))):
            return True
        item = next((e for e in d.find_elements(*by_css(".jp-DirListing-itemText"))
                     if e.text == NOTEBOOK and e.is_displayed()), None)
        if item is not None and time.monotonic() - opened["at"] > 15:
            ActionChains(d).double_click(item).perform()
            opened.update(at=time.monotonic(), times=opened["times"] + 1)
        return False

    reported_wait(b, "9", notebook_in_front, LAB_TIMEOUT, f"{NOTEBOOK} not in front", lambda: (
        f"{opened['times']} double-clicks\n{notebook_report(b, hub, auth, alice.name, server_log)}"))
    output = run_tutorial_cell(b, hub, auth, alice.name, gpu_model["last_modified"], "9", server_log)
    assert "GPUs: 0" in output, output
    shot("9-cpu-trained")
    cpu_model = contents(hub, auth, alice.name, MODEL)
    assert cpu_model and cpu_model["size"] > 1000, cpu_model

    # 10. Stop it again.
    stop_server(b, hub, auth, alice.name)

    # Each picture of the page is one of these screenshots, and each screenshot is on the page.
    page = TUTORIAL.read_text()
    assert (sorted(re.findall(r"\(images/(first-day-[\w-]+\.png)\)", page))
            == sorted(p.name for p in pictures.glob("*.png")))


def test_each_line_of_the_demos_banner_works(demo, tmp_path):
    lines, prefix, ssh_port, hub = demo.lines, demo.prefix, demo.ssh_port, demo.url
    text = "\n".join(lines)
    assert f"your setting: GPUHUB_CONTAINER_PREFIX={prefix}" in text
    for feature in ("Start a server:", "Pool page:", "Bookings:", "Jobs:", "Borrowing:", "Action scripts:", "SSH:",
                    "Mail:"):
        assert any(feature in line for line in lines), f"no {feature} line in the banner:\n{text}"

    # Every URL of the banner answers (a page, or the hub's login page it sends you to).
    urls = sorted(set(re.findall(r"http://127\.0\.0\.1:\d+[^\s,;)]*", text)))
    assert f"{hub}/services/gpu-pool/" in urls
    for url in urls:
        r = requests.get(url, timeout=30)
        assert r.status_code == 200, (url, r.status_code, r.text[:300])

    # The SSH line, as printed, with OpenSSH's client and the password it names.
    ssh_line = next(line for line in lines if "SSH: ssh -p" in line)
    m = re.search(r"ssh -p (\d+) (\w+)@127\.0\.0\.1 \(password ([^;]+);", ssh_line)
    assert m and int(m.group(1)) == ssh_port, ssh_line
    user, password = m.group(2), m.group(3)
    assert password == seed.users_for("openldap")[user].password
    log_in(hub, user, password)  # the SSH line's "once alice has logged in" (the gateway says so before)
    result = SSHClient(ssh_port, tmp_path / "ssh").ssh(user, "echo demo-ssh-ok; whoami", password=password,
                                                        timeout=300)
    assert result.returncode == 0 and "demo-ssh-ok" in result.stdout, (result.stdout, result.stderr)
    assert user in result.stdout

    # The Borrowing line's profile is in the spawn form, said to borrow beyond one's share.
    borrow_line = next(line for line in lines if "Borrowing:" in line)
    profile = re.search(r"the profile '([^']+)'", borrow_line).group(1)
    bob = seed.users_for("openldap")["bob"]  # no server of his runs: the form, not a redirect
    form = log_in(hub, bob.name, bob.password).get(f"{hub}/hub/spawn", timeout=60).text
    assert profile in form and "may borrow idle GPUs beyond your share" in form, form[:2000]

    # carol (the banner's action-script runner) runs one in alice's server, by the pool page's API.
    carol = seed.users_for("openldap")["carol"]
    assert "log in as carol" in next(line for line in lines if "Action scripts:" in line)
    auth = user_token(hub, carol.name, carol.password)
    # The hub mails (through the demo's sink: its page answered above).
    mine = requests.get(f"{hub}/services/gpu-pool/api/notifications", headers=auth, timeout=30).json()
    assert mine["channels"]["email"]["enabled"] and mine["channels"]["browser"]["enabled"], mine
    r = requests.post(f"{hub}/services/gpu-pool/api/exec", headers=auth, timeout=120,
                      json={"script": "echo ran-by-carol", "timeout": 30, "users": [user]})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["exit_code"] for x in results] == [0] and "ran-by-carol" in results[0]["output"], results

    # The bookings answer with the demo's limits (an hour at most, a minute's notice), and --config's.
    limits = requests.get(f"{hub}/services/gpu-pool/api/bookings", headers=auth, timeout=30).json()["limits"]
    assert limits["max_hours"] == 1.0 and limits["notice_s"] == 60.0, limits
    assert limits["max_per_user"] == 2, limits
    # ...and the GPU-hour budget the banner names, as the pool page shows it.
    budgets = requests.get(f"{hub}/services/gpu-pool/api/wait", headers=auth, timeout=30).json()["budgets"]
    assert [b["limit_gpu_hours"] for b in budgets] == [0.25], budgets
    assert "0.25 GPU-hours per 1 h" in next(line for line in lines if "Pool page:" in line)
