"""'Create a notebook job' in JupyterLab runs on the hub (issue 40), in real Chromium.

pat's JupyterLab on the MKL image has Jupyter Scheduler with the images' backend
(images/jupyter/gpuhub_scheduler): pat opens a small notebook, presses the notebook's
"Create a notebook job" button, picks the GPU profile in the form's environment menu (which
lists pat's profiles with their free GPUs), adds a parameter and presses Create with "Run
now".  The job is a job of the hub's gpu-pool service (api/jobs: pat's, on a leased GPU, with
the typed parameter), not a process in pat's server; the scheduler's job list shows it
completed, and the executed notebook lands beside the input in pat's home with every cell
run.  Screenshots go to test-artifacts/test_create_a_notebook_job_in_jupyterlab_runs_it_on_the_hub/.
"""

from __future__ import annotations

import json
import time

from ..fixtures.hub import DUMMY_PASSWORD, wait_for
from .test_browser import LAB_TIMEOUT, by_css, click, log_in
from .test_jobs import job_hub, jobs_api, wait_state
from .test_notebook_jobs import NOTEBOOK, in_home


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
    element = browser.wait(lambda d: d.find_elements(*by_css(selector)), 60, f"no {selector} on the form")[0]
    element.send_keys(text)


def test_create_a_notebook_job_in_jupyterlab_runs_it_on_the_hub(make_hub, docker_client, mkl_image, browser):
    hub, tokens = job_hub(make_hub, env={"GPUHUB_CPU_IMAGE": mkl_image, "GPUHUB_GPU_IMAGE": mkl_image})
    pat = tokens["pat"]
    hub.start_server("pat", {"profile": "tf-cpu"}, timeout=180)
    text = json.dumps(NOTEBOOK).replace("'", "'\"'\"'")
    code, out = in_home(hub, docker_client, "pat", f"printf '%s' '{text}' > small.ipynb")
    assert code == 0, out

    b = browser("pat")
    log_in(b, hub, "pat", DUMMY_PASSWORD)
    b.driver.get(f"{hub.url}/user/pat/lab/tree/small.ipynb")
    click(b, '.jp-NotebookPanel-toolbar [data-jp-item-name="create-job"] jp-button', LAB_TIMEOUT,
          "the notebook's toolbar has no 'Create a notebook job' button (Jupyter Scheduler)")
    # The environment menu: pat's profiles, each with its GPUs and how many are free now.
    click(b, "#jp-create-job-environment", 90, "the job form has no environment menu")
    options = b.wait(lambda d: d.find_elements(*by_css('li[role="option"]')), 30, "the environment menu is empty")
    shown = [o.text for o in options]
    assert "tf-gpu-1 (TensorFlow + 1 GPU: 1 GPU, 4 free)" in shown and any(s.startswith("tf-cpu (") for s in shown), \
        shown
    b.shot("1-environments")
    click_xpath(b, "//li[@role='option'][starts-with(normalize-space(), 'tf-gpu-1 (')]", 30, "no tf-gpu-1 option")
    click(b, 'button[title="Add new parameter"]', 30, "no 'Add new parameter' on the job form")
    type_into(b, 'input[name="parameter-0-name"]', "epochs")
    type_into(b, 'input[name="parameter-0-value"]', "3")
    b.shot("2-create-job-form")
    before = time.time()
    click_xpath(b, "//button[normalize-space()='Create']", 30, "no Create button on the job form")

    # A job of the hub, pat's, on a leased GPU, with the parameter as a number: not a process in pat's server.
    jobs = wait_for(lambda: jobs_api(hub, "GET", "", pat).json()["jobs"], timeout=60, hub=hub,
                    what="the job in the hub's api/jobs")
    [job] = jobs
    assert (job["notebook"], job["profile"], job["parameters"]) == ("small.ipynb", "tf-gpu-1", {"epochs": 3}), job
    running = wait_state(hub, pat, job["id"], ("running", "succeeded", "failed"), timeout=180)
    print(f"Create -> job running on the hub: {running['started_at']} ({time.time() - before:.1f} s after the click)")
    done = wait_state(hub, pat, job["id"], ("succeeded", "failed"), timeout=300)
    logs = jobs_api(hub, "GET", f"/{job['id']}/logs", pat).text
    assert done["state"] == "succeeded" and len(done["gpus"]) == 1, (done, logs[-3000:])

    # The scheduler's job list is the hub's: the job, completed.
    row = f"small (job {job['id']})"
    reloaded = [0.0]

    def listed_completed(d) -> bool:
        if d.find_elements(*by_xpath(f"//tr[contains(., '{row}')][contains(., 'Completed')]")):
            return True
        if time.monotonic() - reloaded[0] > 5:  # the list's own Reload, as a person presses it
            reloaded[0] = time.monotonic()
            for button in d.find_elements(*by_xpath("//button[normalize-space()='Reload']")):
                button.click()
        return False

    b.wait(listed_completed, 120, f"the scheduler's job list never showed {row!r} completed")
    b.shot("3-job-list")

    # The executed notebook beside the input, every cell run, the parameter injected.
    code, out = in_home(hub, docker_client, "pat", f"cat {done['output']}")
    assert code == 0, out
    cells = [c for c in json.loads(out)["cells"] if c["cell_type"] == "code"]
    assert all(c["execution_count"] for c in cells), cells
    printed = "".join("".join(o.get("text", "")) for c in cells for o in c["outputs"])
    assert f"trained for 3 epochs on {done['gpus'][0]}" in printed, printed
    assert done["output"] == f"small.job-{job['id']}.ipynb"
