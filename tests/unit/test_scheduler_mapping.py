"""Jupyter Scheduler's models <-> the hub's jobs and schedules APIs (issue 40): the images'
gpuhub_scheduler/mapping.py, loaded from its source (pure: no jupyter_scheduler needed)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

ROOT, HOME = "/home/jovyan", "/home/jovyan"


@pytest.fixture(scope="module")
def m():
    path = Path(__file__).resolve().parents[2] / "images" / "jupyter" / "gpuhub_scheduler" / "mapping.py"
    loader = importlib.machinery.SourceFileLoader("gpuhub_scheduler_mapping_for_tests", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_run_now_is_a_notebook_job_of_the_chosen_profile_with_typed_parameters(m):
    create = {"input_uri": "work/train.ipynb",
              "runtime_environment_name": "tf-gpu-1 (TensorFlow + 1 GPU: 1 GPU, 0 free)",
              "name": "train",
              "parameters": {"epochs": "5", "rate": "0.1", "tag": "run a", "fast": "true"},
              "output_formats": ["ipynb", "html"], "compute_type": None}
    assert m.create_job(create, ROOT, HOME) == {
        "profile": "tf-gpu-1", "notebook": "work/train.ipynb",
        "parameters": {"epochs": 5, "rate": 0.1, "tag": "run a", "fast": True}}
    # No parameters: none sent.  A server whose root is a folder of the home: the path is the home's.
    assert m.create_job({"input_uri": "nb.ipynb", "runtime_environment_name": "tf-cpu"}, "/home/jovyan/work",
                        HOME) == {"profile": "tf-cpu", "notebook": "work/nb.ipynb"}


def test_a_path_out_of_the_home_is_sent_as_it_is_for_the_hub_to_refuse(m):
    assert m.create_job({"input_uri": "../other/x.ipynb", "runtime_environment_name": "p"}, ROOT, HOME)[
        "notebook"] == "../other/x.ipynb"


def test_a_schedule_is_a_utc_cron_string_on_the_hub(m):
    definition = {"input_uri": "train.ipynb", "runtime_environment_name": "tf-gpu-1", "name": "nightly",
                  "schedule": "0 3 * * *", "timezone": "UTC", "parameters": {"epochs": "2"}}
    assert m.job_definition(definition, ROOT, HOME) == {
        "profile": "tf-gpu-1", "notebook": "train.ipynb", "parameters": {"epochs": 2},
        "cron": "0 3 * * *", "name": "nightly"}
    with pytest.raises(m.MappingError, match="run in UTC; choose UTC, not 'Europe/Berlin'"):
        m.job_definition(dict(definition, timezone="Europe/Berlin"), ROOT, HOME)
    with pytest.raises(m.MappingError, match="needs a schedule"):
        m.job_definition(dict(definition, schedule=None), ROOT, HOME)


def test_ids_carry_a_dash_as_the_scheduler_routes_want_and_map_back(m):
    assert m.job_id(12) == "gpuhub-job-12" and m.hub_id("gpuhub-job-12", m.JOB_PREFIX) == 12
    assert m.schedule_id(3) == "gpuhub-schedule-3" and m.hub_id("gpuhub-schedule-3", m.SCHEDULE_PREFIX) == 3
    for bad in ("gpuhub-job-", "gpuhub-job-1x", "other-12", "gpuhub-schedule-3", "gpuhub-job-" + "9" * 19):
        with pytest.raises(m.MappingError, match="No job"):
            m.hub_id(bad, m.JOB_PREFIX)


JOB = {"id": 12, "state": "running", "profile": "tf-gpu-1", "notebook": "work/train.ipynb",
       "parameters": {"epochs": 5, "tag": "a"}, "output": "work/train.job-12.ipynb",
       "output_html": "work/train.job-12.html", "submitted_at": "2026-01-02T03:04:05+00:00",
       "started_at": "2026-01-02T03:04:07+00:00", "ended_at": None, "message": None, "schedule_id": 3,
       "queue_position": None}


def test_a_hub_job_is_described_with_its_status_times_and_outputs_beside_the_input(m):
    there = {"work/train.ipynb", "work/train.job-12.ipynb"}
    d = m.describe_job(JOB, ROOT, HOME, "/services/gpu-pool/jobs/12", there.__contains__)
    assert d["job_id"] == "gpuhub-job-12" and d["status"] == "IN_PROGRESS"
    assert d["job_definition_id"] == "gpuhub-schedule-3" and d["runtime_environment_name"] == "tf-gpu-1"
    assert d["input_filename"] == "train.ipynb" and d["name"] == "train (job 12)"
    assert d["create_time"] == 1767323045000 and d["start_time"] == 1767323047000 and d["end_time"] is None
    assert d["parameters"] == {"epochs": "5", "tag": "a"}
    assert [(f["file_format"], f["file_path"]) for f in d["job_files"]] == [
        ("ipynb", "work/train.job-12.ipynb"), ("html", None), ("input", "work/train.ipynb")]
    assert d["downloaded"] is False and d["url"] == "/services/gpu-pool/jobs/12"
    # Seen from a server whose root is the folder: the paths are the root's.
    d = m.describe_job(JOB, "/home/jovyan/work", HOME, "", {"train.job-12.ipynb", "train.job-12.html",
                                                           "train.ipynb"}.__contains__)
    assert [f["file_path"] for f in d["job_files"]] == ["train.job-12.ipynb", "train.job-12.html", "train.ipynb"]
    assert d["downloaded"] is True


@pytest.mark.parametrize(("state", "status"), [("queued", "QUEUED"), ("starting", "IN_PROGRESS"),
                                               ("running", "IN_PROGRESS"), ("succeeded", "COMPLETED"),
                                               ("failed", "FAILED"), ("timed-out", "FAILED"),
                                               ("cancelled", "STOPPED")])
def test_every_hub_state_has_a_scheduler_status_and_the_filter_maps_back(m, state, status):
    job = dict(JOB, state=state, queue_position=2 if state == "queued" else None,
               message="All 4 GPUs are lent" if state == "queued" else None)
    d = m.describe_job(job, ROOT, HOME, "")
    assert d["status"] == status and state in m.STATES[status]
    if state == "queued":
        assert d["status_message"] == "Position 2 in the queue: All 4 GPUs are lent"


def test_a_schedule_is_a_job_definition_paused_is_inactive_and_only_pausing_changes(m):
    schedule = {"id": 3, "name": "nightly", "cron": "0 3 * * *", "profile": "tf-gpu-1", "notebook": "train.ipynb",
                "parameters": {"epochs": 2}, "paused": True, "created_at": "2026-01-02T03:04:05Z",
                "last_fired_at": None}
    d = m.describe_definition(schedule, ROOT, HOME)
    assert d["job_definition_id"] == "gpuhub-schedule-3" and d["schedule"] == "0 3 * * *"
    assert d["active"] is False and d["timezone"] == "UTC" and d["parameters"] == {"epochs": "2"}
    assert m.definition_update({"active": True}) is True and m.definition_update({"active": False}) is False
    assert m.definition_update({}) is None
    with pytest.raises(m.MappingError, match="cannot change its schedule; delete it and create a new one"):
        m.definition_update({"schedule": "0 4 * * *", "active": True})


def test_the_environments_are_the_profiles_with_their_free_gpus_and_utc_only(m):
    envs = m.environments([{"slug": "tf-gpu-2", "display_name": "TensorFlow + 2 GPUs", "gpus": 2, "free": 3},
                           {"slug": "tf-cpu", "display_name": "TensorFlow CPU", "gpus": 0, "free": None}])
    # The form's menu shows the name and sends the label: the same text, with the slug first.
    assert [e["name"] for e in envs] == [e["label"] for e in envs] == [
        "tf-gpu-2 (TensorFlow + 2 GPUs: 2 GPUs, 3 free)", "tf-cpu (TensorFlow CPU: no GPU)"]
    assert [m.profile_of(e["name"]) for e in envs] == ["tf-gpu-2", "tf-cpu"] and m.profile_of("tf-cpu") == "tf-cpu"
    assert all(e["utc_only"] and e["file_extensions"] == ["ipynb"] and e["output_formats"] == ["ipynb", "html"]
               for e in envs)
