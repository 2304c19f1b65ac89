"""Bounds on every container (c.ContainerLimits) without a daemon: the options, the host
config of jobs and helpers, the job service's settings, and a job log read by its tail."""

from __future__ import annotations

import asyncio
import json

import pytest
from traitlets import TraitError
from traitlets.config import Config

from spawner.engines import make_job_engine
from spawner.engines.common.containers import HELPER_PIDS_LIMIT, ContainerLimits
from spawner.jobs.runner_settings import JobSettings
from spawner.profiles import DEFAULT_PROFILES, load_profiles

from .test_jobs import _job, _settings, container_spec


def test_defaults_bound_processes_and_the_log_and_each_option_is_documented():
    host = ContainerLimits().host_config()
    assert host["pids_limit"] == 4096
    assert host["log_config"] == {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "3"}}
    assert ContainerLimits(pids_limit=10000).host_config(helper=True)["pids_limit"] == HELPER_PIDS_LIMIT
    assert ContainerLimits(pids_limit=20).host_config(helper=True)["pids_limit"] == 20
    assert ContainerLimits(log_driver="local").host_config()["log_config"]["Type"] == "local"
    for trait in ContainerLimits.class_own_traits(config=True).values():
        assert len(trait.help) > 40, trait.name


@pytest.mark.parametrize("options, message", [
    ({"pids_limit": 0}, "pids_limit"), ({"log_max_files": 0}, "log_max_files"),
    ({"log_driver": "none"}, "log_driver"), ({"log_max_size": "10 MB"}, "log_max_size"),
])
def test_bad_bounds_are_refused_with_the_options_name(options, message):
    with pytest.raises(TraitError, match=message):
        ContainerLimits(**options)


def test_a_jobs_container_is_bounded_as_the_hub_configured(tmp_path):
    from spawner.settings.pool_jobs import job_settings

    c = Config()
    c.ContainerLimits.pids_limit = 128
    c.ContainerLimits.log_max_size = "2m"
    js = JobSettings(**json.loads(json.dumps(job_settings(c, _settings(tmp_path)).as_dict())))  # as the file has it
    profile = next(p for p in load_profiles(DEFAULT_PROFILES) if p.slug == "tf-gpu-1")
    _, host = container_spec(_job(), profile, js, "v", "l")
    assert host["pids_limit"] == 128
    assert host["log_config"] == {"Type": "json-file", "Config": {"max-size": "2m", "max-file": "3"}}
    # Without the hub's word (an older hub's settings): the defaults, never unbounded.
    _, host = container_spec(_job(), profile, JobSettings(), "v", "l")
    assert host["pids_limit"] == 4096 and host["log_config"]["Config"]["max-size"] == "10m"


class _LogOnlyAPI:
    """Docker's `logs` over a long log, as the daemon answers it: `tail` counts entries."""

    def __init__(self, entries: list[bytes]):
        self.entries = entries
        self.served = 0
        self.calls: list = []

    def logs(self, container, stdout=True, stderr=True, tail="all", **kwargs):
        self.calls.append(tail)
        chosen = self.entries if tail == "all" else self.entries[-tail:] if tail else []
        out = b"".join(chosen)
        self.served += len(out)
        return out


def _runner(tmp_path, api, limit):
    from spawner.jobs.runner import JobRunner
    from spawner.pool import GPUPool

    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    return pool, JobRunner(pool, js := JobSettings(profiles=DEFAULT_PROFILES, log_max_bytes=limit),
                           make_job_engine(js, api))


def test_a_job_log_is_read_by_its_tail_never_whole(tmp_path):
    # 300,000 short lines (about 3.5 MB); 4 KiB kept.
    api = _LogOnlyAPI([b"line %d\n" % i for i in range(300_000)])
    pool, runner = _runner(tmp_path, api, 4096)
    try:
        shown = asyncio.run(runner.read_log(_job(container="gpuhub-job-12")))
    finally:
        pool.close()
    assert shown.endswith("line 299999\n") and shown.startswith("[... earlier output not kept ...]\n")
    assert len(shown.encode()) <= 4096 + 64
    assert "all" not in api.calls and api.served < 20 * 4096, (api.calls, api.served)


def test_a_short_job_log_is_read_whole_and_said_so(tmp_path):
    api = _LogOnlyAPI([b"hello\n", b"world\n"])
    pool, runner = _runner(tmp_path, api, 4096)
    try:
        assert asyncio.run(runner.read_log(_job(container="c"))) == "hello\nworld\n"
        # One line longer than the limit, in 16 KiB entries: its last bytes, cut where it says.
        api.entries = [b"y" * 16384] * 4
        shown = asyncio.run(runner.read_log(_job(container="c")))
    finally:
        pool.close()
    assert shown.endswith("y" * 4096) and "not kept" in shown
