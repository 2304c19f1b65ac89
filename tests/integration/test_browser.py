"""The product as a person uses it, in real Chromium against a real hub.

A directory user logs in through the login form, picks "TensorFlow + 1 GPU",
watches the spawn progress, gets JupyterLab, runs a notebook cell that prints
NVIDIA_VISIBLE_DEVICES, and stops the server from the hub's home page.  An
admin, in a second browser, sees on the admin panel which GPU that server
holds, and that it holds none once stopped.

The hub is the project's one config (hub_config/jupyterhub_config.py) driven
by GPUHUB_* variables, with the directory login against the seeded OpenLDAP,
4 simulated GPUs and the real dockerd (whose NVIDIA device path is real, with
a test double of NVIDIA's hook: see devservices/docker-up.sh).

Screenshots of each step land in test-artifacts/test_browser.../; on failure
also the page's HTML and the browser console.
"""

from __future__ import annotations

import re
import secrets
from urllib.parse import urlparse

from devservices.ldap.common import Directory

# Generous but bounded: 2 cores, a container start and JupyterLab's first load.
SPAWN_TIMEOUT = 180
LAB_TIMEOUT = 180
KERNEL_TIMEOUT = 120


# True once home.js has bound "Stop My Server" (jQuery from the page's require.js).
STOP_BUTTON_READY = """
try {
  var $ = require("jquery");
  var events = $._data(document.getElementById("stop"), "events");
  return !!(events && events.click);
} catch (e) { return false; }
"""


def directory_login_env(directory: Directory, tmp_path) -> dict[str, str]:
    """GPUHUB_* settings for the directory login against the seeded OpenLDAP,
    exactly as a production hub gets them (the service account's password from a file)."""
    password_file = tmp_path / "bind-password"
    password_file.write_text(directory.bind_password + "\n")
    password_file.chmod(0o600)
    return {
        **directory.settings_env(password_file=str(password_file)),
        "GPUHUB_SIMULATED_GPUS": "4",
        "JUPYTERHUB_CRYPT_KEY": secrets.token_hex(32),
    }


def by_css(selector: str):
    from selenium.webdriver.common.by import By

    return By.CSS_SELECTOR, selector


def text_of(browser, selector: str) -> str:
    from selenium.common.exceptions import NoSuchElementException

    try:
        return browser.driver.find_element(*by_css(selector)).text
    except NoSuchElementException:
        return ""


def click(browser, selector: str, timeout: float = 60, message: str = "") -> None:
    """Click what `selector` finds, once it is there and clickable; a page that
    is still being re-rendered (stale or covered element) is waited out."""
    from selenium.common.exceptions import (
        ElementClickInterceptedException,
        ElementNotInteractableException,
        NoSuchElementException,
        StaleElementReferenceException,
    )

    def attempt(d) -> bool:
        try:
            element = d.find_element(*by_css(selector))
            # Bootstrap scrolls smoothly: under load the element is still moving when
            # the click lands.  Bring it into view at once, as a person's scroll ends.
            d.execute_script("arguments[0].scrollIntoView({block: 'center', behavior: 'instant'})", element)
            element.click()
            return True
        except (NoSuchElementException, StaleElementReferenceException,
                ElementClickInterceptedException, ElementNotInteractableException):
            return False

    browser.wait(attempt, timeout, message or f"could not click {selector}")


def log_in(browser, hub, username: str, password: str) -> None:
    """Fill in and submit the hub's login form, as a person does."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support import expected_conditions as EC

    driver = browser.driver
    driver.get(f"{hub.url}/hub/login")
    browser.wait(EC.visibility_of_element_located(by_css("#username_input")), 60, "no login form")
    driver.find_element(*by_css("#username_input")).send_keys(username)
    driver.find_element(*by_css("#password_input")).send_keys(password)
    click(browser, "#login_submit")
    try:
        browser.wait(lambda d: "/hub/login" not in d.current_url, 60)
    except TimeoutException:
        raise AssertionError(f"{username} was not logged in; the form says: "
                             f"{text_of(browser, '.login_error, .alert')!r}") from None


def spawn_with_profile(browser, hub, username: str, slug: str) -> list[str]:
    """Pick `slug` on the spawn form, press Start, and return the progress
    messages the pending page showed until JupyterLab replaced it."""
    from selenium.common.exceptions import TimeoutException, WebDriverException

    driver = browser.driver
    # The form itself (/hub/spawn[/user]), not the pending page (/hub/spawn-pending/user) that
    # a Start clicked while a stop was still pending reaches.
    if not re.search(r"/hub/spawn(/[^/]+)?/?$", urlparse(driver.current_url).path):
        driver.get(f"{hub.url}/hub/spawn")
    click(browser, f'input[name="profile"][value="{slug}"]', 60, f"no profile {slug} on the spawn form")
    browser.shot("spawn-form")
    click(browser, '#spawn_form button[type="submit"]')

    # The pending page streams the spawner's progress; keep every message it
    # shows, until the browser leaves it for the user's server.
    seen: list[str] = []
    shot = False

    def collect(d) -> bool:
        nonlocal shot
        try:
            url = d.current_url
            if "/spawn-pending/" in url:
                # Open "Event log", as a person curious about the GPU would.
                if d.find_element(*by_css("#progress-details")).get_attribute("open") is None:
                    d.find_element(*by_css("#progress-details summary")).click()
                for el in d.find_elements(*by_css("#progress-log .progress-log-event")):
                    message = el.text.strip()
                    if message and message not in seen:
                        seen.append(message)
                if any("Leased" in m for m in seen) and not shot:
                    shot = bool(browser.shot("spawn-pending"))
            return f"/user/{username}/" in url
        except WebDriverException:
            return False  # the page is being replaced

    try:
        browser.wait(collect, SPAWN_TIMEOUT)
    except TimeoutException:
        raise AssertionError(f"the server did not start in {SPAWN_TIMEOUT} s; the page showed: {seen}") from None
    return seen


# The notebook cell (`.jp-Cell`) an element is in.
CELL_OF = "./ancestor::div[contains(concat(' ', normalize-space(@class), ' '), ' jp-Cell ')][1]"


def cell_of(element):
    """The notebook cell that `element` (a cell's editor) is in.  Not `.jp-Cell:first-child`: JupyterLab's
    windowed notebook can keep a hidden (opacity 0, height 0) cell node before the notebook's first cell,
    the one it drew before the file's content came, and that one never runs or shows an output."""
    from selenium.webdriver.common.by import By

    return element.find_element(By.XPATH, CELL_OF)


def run_in_new_notebook(browser, code: str) -> str:
    """Open a new Python notebook from JupyterLab's launcher, run one cell, return its output."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC

    driver = browser.driver
    launcher_card = '.jp-LauncherCard[data-category="Notebook"]'
    browser.wait(EC.visibility_of_element_located(by_css(launcher_card)), LAB_TIMEOUT,
                 "JupyterLab's launcher did not appear")
    browser.shot("jupyterlab")
    click(browser, launcher_card)
    editor = browser.wait(
        EC.element_to_be_clickable(by_css(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content")),
        LAB_TIMEOUT, "the new notebook did not open")
    # Run only once the kernel is up: a cell run while the session is still
    # being made can be dropped by JupyterLab (it stays "[ ]").
    browser.wait(lambda d: "| Idle" in text_of(browser, "#jp-main-statusbar"), KERNEL_TIMEOUT,
                 "the notebook's kernel did not become idle")
    editor.click()
    editor.send_keys(code)
    cell = cell_of(editor)

    def cell_output(d) -> str | None:
        return "".join(el.text for el in cell.find_elements(*by_css(".jp-OutputArea-output"))).strip() or None

    output = None
    for attempt in range(3):
        if attempt:
            editor.click()
        driver.switch_to.active_element.send_keys(Keys.SHIFT, Keys.ENTER)
        try:
            output = browser.wait(cell_output, KERNEL_TIMEOUT / 3)
            break
        except TimeoutException:
            continue
    assert output, "the cell printed nothing in three runs (did the kernel start?)"
    browser.shot("notebook")
    return output


def admin_panel_server_details(browser, hub, username: str) -> tuple[str, str]:
    """(profile column, expanded server details) of `username`'s row on /hub/admin."""
    from selenium.webdriver.support import expected_conditions as EC

    driver = browser.driver
    driver.get(f"{hub.url}/hub/admin")
    row = browser.wait(EC.visibility_of_element_located(by_css(f'[data-testid="user-row-{username}"]')),
                       60, f"no row for {username} on the admin panel")
    profile = row.find_element(*by_css('[data-testid="user-row-profile-used"]')).text
    click(browser, f'[data-testid="{username}-collapse-button"]')
    # Wait for the open (not opening) panel, with the server's table drawn.
    collapse = f'[data-testid="{username}-collapse"]'
    browser.wait(lambda d: "show" in (d.find_element(*by_css(collapse)).get_attribute("class") or "")
                 and "progress_url" in d.find_element(*by_css(collapse)).text,
                 30, "the server's details did not open")
    details = driver.find_element(*by_css(collapse))
    return profile, details.text


def test_directory_user_gets_a_gpu_notebook_and_the_admin_sees_it(make_hub, openldap, browser, tmp_path):
    hub = make_hub(env=directory_login_env(openldap, tmp_path))
    user = openldap.users["alice"]
    admin = next(u for u in openldap.users.values() if openldap.admin_group in openldap.groups_of(u.name))
    assert openldap.admin_group not in openldap.groups_of(user.name)

    # -- the user logs in, picks the 1-GPU profile and watches it start ----
    alice = browser(user.name)
    log_in(alice, hub, user.name, user.password)
    alice.wait(lambda d: "/hub/spawn" in d.current_url, 60, "no spawn form after login")
    assert "4 of 4 free now" in text_of(alice, '#spawn_form')
    progress = spawn_with_profile(alice, hub, user.name, "tf-gpu-1")

    server = hub.server_model(user.name)
    assert server and server["ready"]
    (gpu,) = server["state"]["gpu_uuids"]
    assert server["user_options"]["profile"] == "tf-gpu-1"
    # The pending page told the user which GPU they were lent.
    assert any("Leased 1 GPU" in m and gpu in m for m in progress), progress

    # -- JupyterLab: a notebook cell sees exactly the leased GPU ----------
    output = run_in_new_notebook(
        alice, 'import os; print("visible=" + os.environ.get("NVIDIA_VISIBLE_DEVICES", "none"))')
    assert output.splitlines()[-1] == f"visible={gpu}"

    # -- an admin sees who holds which GPU ------------------------------
    carol = browser(admin.name)
    log_in(carol, hub, admin.name, admin.password)
    carol.wait(lambda d: "/hub/spawn" in d.current_url or "/hub/home" in d.current_url, 60)
    if "/hub/spawn" in carol.driver.current_url:
        # The admin's own spawn form counts alice's GPU as lent.
        assert "3 of 4 free now" in text_of(carol, "#spawn_form")
    profile, details = admin_panel_server_details(carol, hub, user.name)
    carol.shot("admin-panel")
    assert profile == "tf-gpu-1"
    assert "gpu_uuids" in details and gpu in details, details

    # -- the user stops the server from the hub's home page --------------
    alice.driver.get(f"{hub.url}/hub/home")
    from selenium.webdriver.support import expected_conditions as EC

    stop = alice.wait(EC.element_to_be_clickable(by_css("#stop")), 60, "no Stop My Server button")
    # The button works once the page's script has bound its click handler
    # (require.js loads it after the page shows); a person would not notice.
    alice.wait(lambda d: d.execute_script(STOP_BUTTON_READY), 30, "the home page's script did not load")
    stop.click()
    alice.wait(lambda d: not d.find_element(*by_css("#stop")).is_displayed()
               and d.find_element(*by_css("#start")).text.strip() == "Start My Server",
               90, "the server did not stop")
    alice.shot("stopped")
    assert hub.server_model(user.name) is None

    # The GPU is back in the pool: the next person's form says so...
    alice.driver.get(f"{hub.url}/hub/spawn")
    alice.wait(lambda d: "4 of 4 free now" in text_of(alice, "#spawn_form"), 30,
               "the GPU was not returned to the pool")
    # ...and the admin panel shows no GPU held by alice any more.
    _, details = admin_panel_server_details(carol, hub, user.name)
    assert gpu not in details
