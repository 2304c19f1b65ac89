"""'Create a notebook job' in JupyterLab runs on the hub (issue 40), clicked in real Chromium.

pat's JupyterLab on the MKL image has Jupyter Scheduler with the images' backend
(images/jupyter/gpuhub_scheduler).  Everything is done by clicking, as a person does:

- Run now: pat opens the starter notebook of the home (the demo's), presses the notebook's
  "Create a job" button, sees its path in "Input file", picks the GPU profile in the
  environment menu (pat's profiles with their free GPUs), adds a parameter and presses
  "Create".  The job is a job of the hub's gpu-pool service (api/jobs: pat's, on a leased GPU,
  with the typed parameter), not a process in pat's server; the scheduler's job list shows it
  "Completed" (its status read from the jobs API), and the executed notebook lands beside the
  input with every cell run, the parameter injected and the job's GPU seen by its first cell.
- Run on a schedule: a one-minute schedule made in the same form reaches the hub's
  api/schedules and its pool page; it fires with pat's server stopped and writes its executed
  notebook; the scheduler's list shows the job the schedule made; "Pause" and "Delete" on the
  job definition's page pause and delete the hub's schedule.

The first test's pictures (test-artifacts/<test>/pictures/*.png) are those of the users' page
docs/users/notebook-jobs.md: copy them to docs/users/images/ (docs/contributing/tests.md).
"""

from __future__ import annotations

import json
import shutil
import time

from ..fixtures.hub import DUMMY_PASSWORD, wait_for
from .test_browser import KERNEL_TIMEOUT, LAB_TIMEOUT, by_css, click, log_in, text_of
from .test_jobs import job_hub, jobs_api, wait_state
from .test_notebook_jobs import NOTEBOOK, ONE_MINUTE, in_home, schedules_api
from .test_poolpage import logged_in

STARTER = "tensorflow-examples/starter.ipynb"
# The pictures of docs/users/notebook-jobs.md, as the tests below name them.
PICTURES = ("notebook-job-1-environment", "notebook-job-2-form", "notebook-job-3-list", "notebook-job-4-output")


def picture(b, name: str) -> None:
    """A screenshot for the users' page: test-artifacts/<test>/pictures/<name>.png."""
    shot = b.shot(name)
    assert shot is not None, f"no screenshot {name}"
    (shot.parent / "pictures").mkdir(exist_ok=True)
    shutil.copyfile(shot, shot.parent / "pictures" / f"{name}.png")


def by_xpath(expression: str):
    from selenium.webdriver.common.by import By

    return By.XPATH, expression


def click_xpath(browser, expression: str, timeout: float, message: str) -> None:
    from selenium.common.exceptions import (
        ElementClickInterceptedException,
        ElementNotInteractableException,
        StaleElementReferenceException,
    )

    def attempt(d) -> bool:
        found = d.find_elements(*by_xpath(expression))
        if not found:
            return False
        try:
            found[0].click()
            return True
        except (StaleElementReferenceException, ElementClickInterceptedException, ElementNotInteractableException):
            return False

    browser.wait(attempt, timeout, message)


def type_into(browser, selector: str, text: str) -> None:
    element = browser.wait(lambda d: d.find_elements(*by_css(selector)), 30, f"no {selector} in the form")[0]
    element.click()
    element.send_keys(text)


def open_notebook_and_create_a_job(b, hub, path: str) -> None:
    """Open `path` from JupyterLab's file browser as a person does (its folder, then a double
    click on it), wait for its kernel, press the notebook's "Create a job"; the form opens
    with `path` as its input file.  (Jupyter Scheduler 2.12 takes the input file from the file
    browser's selection, which the double click makes: opened from the address bar, the form
    came up with Input file empty when the browser had not selected the file yet.)"""
    from selenium.webdriver.common.action_chains import ActionChains

    folder, name = path.rsplit("/", 1)
    b.driver.get(f"{hub.url}/user/pat/lab/tree/{folder}")
    item = b.wait(lambda d: d.find_elements(*by_xpath(
        "//li[contains(@class, 'jp-DirListing-item')]"
        f"[.//*[contains(@class, 'jp-DirListing-itemText')][normalize-space()='{name}']]")), LAB_TIMEOUT,
        f"the file browser does not list {name} in {folder}")[0]
    ActionChains(b.driver).double_click(item).perform()
    b.wait(lambda d: "| Idle" in text_of(b, "#jp-main-statusbar"), LAB_TIMEOUT + KERNEL_TIMEOUT,
           "the notebook did not open with an idle kernel")
    click(b, '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar [data-jp-item-name="create-job"] '
             'jp-button', LAB_TIMEOUT,
          "the notebook's toolbar has no 'Create a notebook job' button (Jupyter Scheduler)")
    shown = b.wait(lambda d: ((f := d.find_elements(*by_css("#jp-create-job-inputFile")))
                              and f[0].get_attribute("value")),
                   60, "the job form did not open with its Input file filled")
    assert shown == path, shown


def pick_environment(b, slug: str, shot_as: str | None = None) -> str:
    """Open the form's environment menu, check it lists pat's profiles, choose `slug`'s."""
    click(b, "#jp-create-job-environment", 90, "the job form has no environment menu")
    options = b.wait(lambda d: d.find_elements(*by_css('li[role="option"]')), 30, "the environment menu is empty")
    shown = [o.text for o in options]
    assert "tf-gpu-1 (TensorFlow + 1 GPU: 1 GPU, 4 free)" in shown and any(s.startswith("tf-cpu (") for s in shown), \
        shown
    if shot_as:
        picture(b, shot_as)
    click_xpath(b, f"//li[@role='option'][starts-with(normalize-space(), '{slug} (')]", 30, f"no {slug} option")
    b.wait(lambda d: not d.find_elements(*by_css('li[role="option"]')), 30, "the environment menu stayed open")
    return next(s for s in shown if s.startswith(f"{slug} ("))


def press_create(b) -> None:
    click_xpath(b, "//button[contains(@class, 'MuiButton-contained')][normalize-space()='Create'][not(@disabled)]",
                30, "the form's Create button is missing or disabled")


ENDED = ("Completed", "Failed", "Stopped")


def row_with(b, label: str, what: str, timeout: float = 600):
    """The scheduler's list row that names `label`, once it shows an ended status; the list's
    own Reload button is pressed every few seconds meanwhile (as a person would)."""
    last = [0.0]

    def shown(d):
        rows = [r for r in d.find_elements(*by_xpath(f"//tr[.//*[contains(normalize-space(), '{label}')]]"))]
        if rows and any(status in rows[0].text for status in ENDED):
            return rows[0]
        if time.monotonic() - last[0] > 5:
            last[0] = time.monotonic()
            for button in d.find_elements(*by_xpath("//button[normalize-space()='Reload']")):
                button.click()
        return None
    return b.wait(shown, timeout, f"{what}: no row '{label}' showing an end {ENDED} in the scheduler's list")


def unsatisfied(b) -> list[str]:
    """Console lines of JupyterLab's module federation about a shared package an extension was
    built against and this JupyterLab does not satisfy (Jupyter Scheduler 2.12.1 under 4.6)."""
    return [line for line in b.read_console() if "Unsatisfied version" in line]


def test_create_a_notebook_job_in_jupyterlab_runs_it_on_the_hub(make_hub, docker_client, mkl_image, browser):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_CPU_IMAGE": mkl_image, "GPUHUB_GPU_IMAGE": mkl_image})
    pat = tokens["pat"]
    hub.start_server("pat", {"profile": "tf-cpu"}, timeout=180)

    b = browser("pat")
    log_in(b, hub, "pat", DUMMY_PASSWORD)
    open_notebook_and_create_a_job(b, hub, STARTER)
    # JupyterLab gave Jupyter Scheduler's extension every shared package it was built against.
    assert not unsatisfied(b), unsatisfied(b)
    environment = pick_environment(b, "tf-gpu-1", PICTURES[0])
    from selenium.webdriver.common.keys import Keys

    # A parameter: the starter's `epochs` (its cell tagged "parameters" says 5).
    click(b, 'button[title="Add new parameter"]', 30, "the form has no 'Add new parameter'")
    type_into(b, 'input[name="parameter-0-name"]', "epochs")
    type_into(b, 'input[name="parameter-0-value"]', "2" + Keys.TAB)  # the form checks a value when it is left
    b.wait(lambda d: "No value specified" not in d.find_element(*by_css("#jp-main-dock-panel")).text, 30,
           "the form still says the parameter has no value")
    assert b.driver.find_element(*by_css('input[type="radio"][value="Job"]')).is_selected()  # Run now
    picture(b, PICTURES[1])
    before = time.time()
    press_create(b)

    # A job of the hub, pat's, on a leased GPU, with the parameter as a number: not a process in pat's server.
    jobs = wait_for(lambda: jobs_api(hub, "GET", "", pat).json()["jobs"], timeout=60, hub=hub,
                    what="the job in the hub's api/jobs after Create")
    [job] = jobs
    assert (job["notebook"], job["profile"], job["parameters"]) == (STARTER, "tf-gpu-1", {"epochs": 2}), job
    running = wait_state(hub, pat, job["id"], ("running", "succeeded", "failed"), timeout=180)
    print(f"Create -> job running on the hub: {running['started_at']} ({time.time() - before:.1f} s after Create), "
          f"environment {environment!r}")

    # The scheduler's job list is the hub's: the job, its status from api/jobs, until it completes.
    label = f"starter (job {job['id']})"
    row = row_with(b, label, "the job in JupyterLab's list", timeout=600)
    done = wait_state(hub, pat, job["id"], ("succeeded", "failed"), timeout=30)
    logs = jobs_api(hub, "GET", f"/{job['id']}/logs", pat).text
    assert done["state"] == "succeeded" and len(done["gpus"]) == 1, (done, logs[-3000:])
    assert "Completed" in row.text, row.text
    picture(b, PICTURES[2])

    # The executed notebook beside the input: every code cell run, the parameter injected after
    # the notebook's own, the training for 2 epochs, the job's GPU seen by the first cell.
    assert done["output"] == f"tensorflow-examples/starter.job-{job['id']}.ipynb", done
    code, out = in_home(hub, docker_client, "pat", f"cat {done['output']}")
    assert code == 0, out
    cells = [c for c in json.loads(out)["cells"] if c["cell_type"] == "code"]
    assert all(c["execution_count"] for c in cells), [c["source"][:80] for c in cells if not c["execution_count"]]
    assert any("injected-parameters" in c["metadata"].get("tags", []) and "epochs = 2" in "".join(c["source"])
               for c in cells), cells
    def printed(c) -> str:
        return "".join("".join(o.get("text", "")) for o in c["outputs"])
    [training] = [printed(c) for c in cells if "train.py --epochs {epochs}" in "".join(c["source"])]
    assert "epoch 2/2" in training and "epoch 3/" not in training, training
    assert f"(NVIDIA_VISIBLE_DEVICES): {done['gpus'][0]}" in printed(cells[0]), cells[0]

    # The executed notebook, opened in JupyterLab, at the training's output.
    b.driver.get(f"{hub.url}/user/pat/lab/tree/{done['output']}")
    output = b.wait(lambda d: d.find_elements(*by_xpath(
        "//*[contains(@class, 'jp-OutputArea-output')][contains(., 'epoch 2/2')]")), LAB_TIMEOUT,
        "the executed notebook did not open with the training's output")[0]
    b.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", output)
    picture(b, PICTURES[3])


def test_a_schedule_made_in_jupyterlab_fires_with_the_server_stopped_and_is_paused_and_deleted_there(
        make_hub, docker_client, mkl_image, browser):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_CPU_IMAGE": mkl_image, "GPUHUB_GPU_IMAGE": mkl_image},
                          extra_config=ONE_MINUTE)
    pat = tokens["pat"]
    hub.start_server("pat", {"profile": "tf-cpu"}, timeout=180)
    text = json.dumps(NOTEBOOK).replace("'", "'\"'\"'")
    code, out = in_home(hub, docker_client, "pat", f"mkdir -p work && printf '%s' '{text}' > work/small.ipynb")
    assert code == 0, out

    b = browser("pat")
    log_in(b, hub, "pat", DUMMY_PASSWORD)
    open_notebook_and_create_a_job(b, hub, "work/small.ipynb")
    pick_environment(b, "tf-gpu-1")
    click_xpath(b, "//label[contains(normalize-space(), 'Run on a schedule')]", 30, "no 'Run on a schedule'")
    click(b, "#jp-create-job-createType-definition-interval", 30, "no schedule interval menu")
    click_xpath(b, "//li[@role='option'][normalize-space()='Minute']", 30, "no 'Minute' interval")
    b.shot("schedule-form")
    press_create(b)

    # The hub keeps it (not pat's server): api/schedules has it, the pool page lists it.
    [made] = wait_for(lambda: schedules_api(hub, "GET", "", pat).json()["schedules"], timeout=60, hub=hub,
                      what="the schedule in the hub's api/schedules after Create")
    assert (made["notebook"], made["profile"], made["cron"], made["paused"]) == \
        ("work/small.ipynb", "tf-gpu-1", "* * * * *", False), made
    session = logged_in(hub, "pat")
    wait_for(lambda: 'id="schedules"' in (page := session.get(f"{hub.url}/services/gpu-pool/", timeout=30).text)
             and made["name"] in page and "<code>* * * * *</code>" in page, timeout=30, hub=hub,
             what="the schedule on pat's pool page")

    # It fires by the wall clock with pat's server stopped, and its notebook runs on the hub.
    hub.stop_server("pat")

    def fired():
        return [j for j in jobs_api(hub, "GET", "", pat).json()["jobs"] if j["schedule_id"] == made["id"]]
    earlier = {j["id"] for j in fired()}  # a slot that came before the stop
    first = wait_for(lambda: [j for j in fired() if j["id"] not in earlier], timeout=150, hub=hub,
                     what="the schedule firing with pat's server stopped")[-1]
    done = wait_state(hub, pat, first["id"], ("succeeded", "failed"), timeout=300)
    assert done["state"] == "succeeded" and hub.server_model("pat") is None, done
    assert done["output"] == f"work/small.job-{first['id']}.ipynb", done

    # Back in JupyterLab: the list shows the job the schedule made; the job definition's page
    # pauses and deletes the hub's schedule.
    hub.start_server("pat", {"profile": "tf-cpu"}, timeout=180)
    code, out = in_home(hub, docker_client, "pat", f"cat {done['output']}")
    assert code == 0 and all(c["execution_count"] for c in json.loads(out)["cells"] if c["cell_type"] == "code"), out
    open_notebook_and_create_a_job(b, hub, "work/small.ipynb")
    click_xpath(b, "//button[normalize-space()='Cancel']", 30, "the form has no Cancel")  # to the list
    row = row_with(b, f"small (job {first['id']})", "the schedule's job in JupyterLab's list", timeout=60)
    assert "Completed" in row.text, row.text
    click_xpath(b, "//button[@role='tab'][normalize-space()='Job Definitions']", 30, "no Job Definitions tab")
    click_xpath(b, f"//tr//*[starts-with(@title, 'Open detail view for')][normalize-space()='{made['name']}']", 60,
                "the schedule is not in the Job Definitions list")
    click_xpath(b, "//button[normalize-space()='Pause']", 60, "the job definition's page has no Pause")
    wait_for(lambda: schedules_api(hub, "GET", f"/{made['id']}", pat).json()["paused"], timeout=30, hub=hub,
             what="the hub's schedule paused from JupyterLab")
    b.wait(lambda d: d.find_elements(*by_xpath("//button[normalize-space()='Resume']")), 30,
           "the page did not offer Resume after Pause")
    b.shot("schedule-paused")
    click_xpath(b, "//button[normalize-space()='Delete Job Definition']", 30, "no Delete Job Definition")
    click_xpath(b, "//div[@role='dialog']//button[normalize-space()='Delete']", 30, "no Delete in the dialog")
    wait_for(lambda: schedules_api(hub, "GET", "", pat).json()["schedules"] == [], timeout=30, hub=hub,
             what="the hub's schedule deleted from JupyterLab")
    assert schedules_api(hub, "GET", f"/{made['id']}", pat).status_code == 404
    assert not unsatisfied(b), unsatisfied(b)
