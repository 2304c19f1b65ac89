"""Batch jobs without services: what a submission may hold, the container it becomes,
the hub config that enables it, the kept log, and the ledger's job records."""

from __future__ import annotations

import dataclasses

import pytest
from traitlets.config import Config

from spawner.engines.common.containers import HARDENING
from spawner.engines.common.job_containers import DockerJobEngine
from spawner.engines.common.labels import LABEL_GPUS, LABEL_JOB, LABEL_LEASE, LABEL_POOL, LABEL_SERVER, LABEL_USER
from spawner.jobs import JOBS_SCOPE
from spawner.jobs.group import cap
from spawner.jobs.request import BadJob, check_submission
from spawner.jobs.runner_settings import JobSettings
from spawner.jobs.spec import unit_spec
from spawner.profiles import DEFAULT_PROFILES, load_profiles
from spawner.services.hub_api import SERVICE_SCOPES
from spawner.settings import load_settings
from spawner.settings.pool_jobs import configure_jobs
from spawner.settings.pool_service import ACCESS_SCOPE, SERVICE_ROLE, configure_pool_page
from spawner.settings.services import set_hub_services

PROFILES = load_profiles(DEFAULT_PROFILES + [
    {"slug": "short", "display_name": "Short", "image": "img", "gpus": 1, "job_max_seconds": 60,
     "job_network": True},
    {"slug": "staff", "display_name": "Staff", "image": "img", "gpus": 2, "groups": ["staff"]},
])


def submission(body, groups=()):
    return check_submission(body, PROFILES, groups, default_max=3600)


def test_a_submission_takes_a_profile_a_command_a_workdir_and_a_timeout():
    sub = submission({"profile": "tf-gpu-1", "command": ["python", "train.py", "--epochs", "5"],
                      "workdir": "./tensorflow-examples//", "timeout": 120})
    assert (sub.profile.slug, sub.command, sub.workdir, sub.timeout_s) == (
        "tf-gpu-1", ("python", "train.py", "--epochs", "5"), "tensorflow-examples", 120)
    # no timeout: the profile's maximum (its own, else the hub's); no workdir: the home
    assert submission({"profile": "tf-gpu-1", "command": ["true"]}).timeout_s == 3600
    short = submission({"profile": "short", "command": ["true"]})
    assert (short.timeout_s, short.workdir) == (60, "")


@pytest.mark.parametrize("body, status, message", [
    ({"profile": "tf-gpu-1", "command": ["true"], "image": "evil"}, 400, "'image'"),
    ({"profile": "tf-gpu-1", "command": ["true"], "env": {}}, 400, "'env'"),
    ({"profile": "tf-gpu-1", "command": ["true"], "volumes": {}}, 400, "'volumes'"),
    ({"profile": "tf-gpu-1", "command": ["true"], "workdir": "/etc"}, 400, "relative"),
    ({"profile": "tf-gpu-1", "command": ["true"], "workdir": "~root"}, 400, "relative"),
    ({"profile": "tf-gpu-1", "command": ["true"], "workdir": "a/../.."}, 400, "'..'"),
    ({"profile": "tf-gpu-1", "command": ["true"], "workdir": "a\nb"}, 400, "control"),
    ({"profile": "tf-gpu-1", "command": ["true"], "workdir": 5}, 400, "string"),
    ({"profile": "tf-gpu-1", "command": "python train.py"}, 400, "list of strings"),
    ({"profile": "tf-gpu-1", "command": []}, 400, "non-empty"),
    ({"profile": "tf-gpu-1", "command": ["python", None]}, 400, "string"),
    ({"profile": "tf-gpu-1", "command": ["a\0b"]}, 400, "NUL"),
    ({"profile": "tf-gpu-1", "command": ["x"] * 300}, 400, "at most 256"),
    ({"profile": "tf-gpu-1", "command": ["x" * 20000]}, 400, "bytes"),
    ({"profile": "tf-gpu-1", "command": [""]}, 400, "program"),
    ({"profile": "short", "command": ["true"], "timeout": 61}, 400, "between 1 and 60"),
    ({"profile": "tf-gpu-1", "command": ["true"], "timeout": 0}, 400, "between"),
    ({"profile": "tf-gpu-1", "command": ["true"], "timeout": "5"}, 400, "number"),
    ({"profile": "tf-gpu-1", "command": ["true"], "timeout": True}, 400, "number"),
    ({"profile": "staff", "command": ["true"]}, 403, "staff"),
    ({"profile": ["tf-gpu-1"], "command": ["true"]}, 400, "string"),
    ({"command": ["true"]}, 400, "required"),
    ("tf-gpu-1", 400, "JSON object"),
])
def test_anything_else_is_refused_with_a_message(body, status, message):
    with pytest.raises(BadJob) as refused:
        submission(body)
    assert refused.value.status == status and message in str(refused.value)


@pytest.mark.parametrize("workers, message", [
    (0, "between 1 and 4"), (-1, "between 1 and 4"), (10**9, "between 1 and 4 (JobLimits.max_workers)"),
    (5, "between 1 and 4"), ("2", "whole number"), ([2], "whole number"), (2.0, "whole number"),
    (True, "whole number"), ({"n": 2}, "whole number"),
])
def test_a_cluster_asks_for_a_whole_number_of_workers_within_the_maximum(workers, message):
    body = {"profile": "tf-gpu-1", "command": ["python", "train.py"], "workers": workers}
    with pytest.raises(BadJob) as refused:
        check_submission(body, PROFILES, (), default_max=3600, max_workers=4)
    assert refused.value.status == 400 and message in str(refused.value)
    sub = check_submission({**body, "workers": 4}, PROFILES, (), default_max=3600, max_workers=4)
    assert sub.workers == 4
    assert submission({"profile": "tf-gpu-1", "command": ["true"]}).workers == 1  # a plain job
    with pytest.raises(BadJob, match="between 1 and 1"):  # max_workers 1: no clusters
        submission({**body, "workers": 2})


def test_a_profile_of_the_users_group_is_allowed():
    assert submission({"profile": "staff", "command": ["true"]}, groups=["staff"]).profile.gpus == 2


def test_profiles_check_their_job_keys():
    from spawner.profiles import ProfileConfigError

    with pytest.raises(ProfileConfigError, match="job_max_seconds"):
        load_profiles([{"slug": "x", "display_name": "X", "image": "i", "job_max_seconds": 0}])
    with pytest.raises(ProfileConfigError, match="job_network"):
        load_profiles([{"slug": "x", "display_name": "X", "image": "i", "job_network": "yes"}])


def container_spec(job, profile, settings, home_volume, pool_id):
    """What the Docker engine asks of the daemon for the job's unit: (create, host config)."""
    return DockerJobEngine(settings).create_args(unit_spec(job, profile, settings, home_volume, pool_id))


def _job(**overrides):
    from datetime import UTC, datetime

    from spawner.pool.ledger.job_records import Job

    values = dict(id=12, user="pat", groups=(), profile="tf-gpu-1", command=("python", "train.py"),
                  workdir="tensorflow-examples", timeout_s=600, host="node1", uid=5001, gid=5000,
                  state="starting", lease_id=7, container=None, gpu_uuids=("GPU-a",), exit_code=None,
                  message=None, submitted_at=datetime.now(UTC), started_at=None, ended_at=None)
    values.update(overrides)
    return Job(**values)


def test_the_container_is_the_servers_lockdown_with_the_leased_gpus_only():
    settings = JobSettings(prefix="gpuhub", network="gpuhub-net")
    profile = next(p for p in PROFILES if p.slug == "tf-gpu-1")
    create, host = container_spec(_job(), profile, settings, "gpuhub-home-pat", "ledger1")
    assert create["name"] == "gpuhub-job-12" and create["user"] == "5001:5000"
    assert create["image"] == profile.image
    # the user's argv, unparsed, in the workdir inside the home
    assert create["command"][:2] == ["/bin/sh", "-c"]
    assert create["command"][3:] == ["/home/jovyan/tensorflow-examples", "python", "train.py"]
    labels = create["labels"]
    assert (labels[LABEL_JOB], labels[LABEL_LEASE], labels[LABEL_GPUS], labels[LABEL_POOL]) == (
        "12", "7", "GPU-a", "ledger1")
    assert (labels[LABEL_USER], labels[LABEL_SERVER]) == ("pat", "job/12")
    for key, value in HARDENING.items():
        assert host[key] == value
    [request] = host["device_requests"]
    assert request["DeviceIDs"] == ["GPU-a"]
    assert host["network_mode"] == "none" and create["network_disabled"]
    assert host["binds"] == {"gpuhub-home-pat": {"bind": "/home/jovyan", "mode": "rw"}}
    assert host["nano_cpus"] == 4 * 10**9 and host["mem_limit"] == "16G"  # the profile's limits
    assert create["environment"]["OMP_NUM_THREADS"] == "4"
    # a profile that allows it joins the hub's network; a CPU job gets no GPU at all
    short = next(p for p in PROFILES if p.slug == "short")
    create, host = container_spec(_job(gpu_uuids=(), lease_id=None), short, settings, "v", "l")
    assert host["network_mode"] == "gpuhub-net" and not create["network_disabled"]
    assert host["device_requests"] == [] and create["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_the_kept_log_is_its_last_bytes():
    assert cap(b"short", 10) == "short"
    kept = cap(b"a" * 50 + b"THE END", 10)
    assert kept.endswith("aaaTHE END") and "first 47 bytes not kept" in kept


def _settings(tmp_path, **env):
    return load_settings({"GPUHUB_AUTHENTICATOR": "dummy", "GPUHUB_DUMMY_PASSWORD": "x",
                          "GPUHUB_DATA_DIR": str(tmp_path), **env})


def test_the_hub_config_gives_users_the_jobs_scope_and_the_service_what_it_needs(tmp_path):
    c = Config()
    settings = _settings(tmp_path, GPUHUB_POOL_PAGE_PORT="9123", GPUHUB_MAX_GPUS_PER_USER="1")
    c.GPUDockerSpawner.profiles = DEFAULT_PROFILES
    c.GPUPool.max_gpus_per_user = 1
    c.JupyterHub.hub_connect_ip = "192.0.2.1"
    c.GPUDockerSpawner.environment.update({"OTHER": "kept"})  # as the culler adds its own
    configure_pool_page(c, settings)
    configure_jobs(c, settings)
    set_hub_services(c, dataclasses.replace(settings, cull=False))
    set_hub_services(c, dataclasses.replace(settings, cull=False))  # twice: still one of each
    assert JOBS_SCOPE in c.JupyterHub.custom_scopes
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles["user"]["scopes"].count(JOBS_SCOPE) == 1
    assert roles[SERVICE_ROLE]["services"] == ["gpu-pool"]
    # The pool page's role, extended (not replaced) by what running jobs needs, each scope once.
    scopes = roles[SERVICE_ROLE]["scopes"]
    assert set(scopes) == {"read:users", "admin:auth_state", *SERVICE_SCOPES} and len(scopes) == len(set(scopes))
    [service] = c.JupyterHub.services
    assert service["oauth_client_allowed_scopes"].count(JOBS_SCOPE) == 1
    js = JobSettings.from_config(as_the_service_reads_it(c, settings, service))
    assert [p["slug"] for p in js.profiles] == [p["slug"] for p in DEFAULT_PROFILES]
    assert js.pool == {"max_gpus_per_user": 1} and js.bridge_ip == "192.0.2.1"
    assert js.max_seconds == 86400 and js.log_max_bytes == 1024 * 1024
    # notebook servers submit with their own token, to the bridge address
    assert {JOBS_SCOPE, ACCESS_SCOPE} <= set(c.GPUDockerSpawner.server_token_scopes)
    env = c.GPUDockerSpawner.environment
    url = "http://192.0.2.1:9123/services/gpu-pool/"
    assert env == {"OTHER": "kept", "GPUHUB_JOBS_URL": url, "GPUHUB_POOL_URL": url}
    assert js.prefix == "gpuhub"
    # the hub's final config, written at its start, is what the service reads: a later option counts
    c.GPUDockerSpawner.prefix = "late"
    assert JobSettings.from_config(as_the_service_reads_it(c, settings, service)).prefix == "late"
    # with jobs off the service gets no JobSettings section, and runs no jobs
    off = _settings(tmp_path, GPUHUB_JOBS="false")
    assert JobSettings.from_config(as_the_service_reads_it(c, off, service)) is None


def as_the_service_reads_it(c, settings, service):
    """The file the hub writes from config `c` at its start, read by the service's own loader."""
    from spawner.poolpage.service_config import CONFIG_FILE_ENV, load_service_config
    from spawner.settings.service_file import render_service_config

    path = service["environment"][CONFIG_FILE_ENV]
    assert path == str(settings.data_dir / "gpu-pool-service.json")
    with open(path, "w") as f:
        f.write(render_service_config(c, settings))
    return load_service_config(service["environment"])


def test_jobs_settings(tmp_path):
    assert _settings(tmp_path).jobs
    assert not _settings(tmp_path, GPUHUB_JOBS="false").jobs
    assert not _settings(tmp_path, GPUHUB_POOL_PAGE="false").jobs  # they run in the page's service
    s = _settings(tmp_path, GPUHUB_JOB_MAX_SECONDS="7200", GPUHUB_JOB_LOG_MAX_BYTES="4096")
    assert (s.job_max_seconds, s.job_log_max_bytes) == (7200, 4096)


def test_job_records_and_the_in_place_migration_from_schema_3(tmp_path):
    import sqlalchemy as sa

    from spawner.inventory import SimulatedInventory
    from spawner.pool import SCHEMA_VERSION, GPUPool
    from spawner.pool.ledger.job_records import QUEUED, RUNNING, JobLedger

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    GPUPool(db_url=url, inventory=SimulatedInventory(count=1)).sync_inventory()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # as schema 3 left it
        conn.execute(sa.text("DROP TABLE gpu_pool_jobs"))
        conn.execute(sa.text("UPDATE gpu_pool_meta SET value='3' WHERE key='schema_version'"))
    pool = GPUPool(db_url=url, inventory=SimulatedInventory(count=1))
    try:
        jobs = JobLedger(pool)
        job = jobs.create("pat", ["b", "a"], "tf-gpu-1", ["python", "x.py"], "ex", 60, "node1", 1000, 100)
        assert (job.state, job.groups, job.command, job.lease_id) == (QUEUED, ("a", "b"), ("python", "x.py"), None)
        started = jobs.update(job.id, (QUEUED,), "started_at", state=RUNNING, gpu_uuids=["GPU-a"])
        assert started.state == RUNNING and started.gpu_uuids == ("GPU-a",) and started.started_at
        assert jobs.update(job.id, (QUEUED,), state="failed") is None  # not queued any more
        assert [j.id for j in jobs.jobs("pat", active_only=True)] == [job.id]
        assert jobs.jobs("bob") == []
    finally:
        pool.close()
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT value FROM gpu_pool_meta WHERE key='schema_version'")).scalar()
    assert version == str(SCHEMA_VERSION)
    engine.dispose()


@pytest.mark.parametrize("escape, volume", [(None, "gpuhub-home-a-2eb-40c"), ("legacy", "gpuhub-home-a_2Eb_40c")])
def test_a_jobs_home_is_the_volume_the_servers_escape_names(tmp_path, escape, volume):
    from spawner.engines.common.job_containers import render_user
    from spawner.settings.pool_jobs import job_settings

    c = Config()
    if escape:
        c.DockerSpawner.escape = escape
    js = job_settings(c, _settings(tmp_path))
    assert render_user(js.home_volume, "a.b@c", js.home_name_escape) == volume


def test_an_escape_the_jobs_service_cannot_follow_stops_the_hub_saying_what_to_do(tmp_path):
    from spawner.settings.pool_jobs import job_settings

    c = Config()
    c.GPUDockerSpawner.escape = str.lower
    with pytest.raises(ValueError, match="GPUHUB_JOBS=false"):
        job_settings(c, _settings(tmp_path))


def test_the_jobs_mirror_the_servers_home_options_whose_defaults_are_written_once_on_their_traits(tmp_path):
    """A job mounts the home the servers mount: the options the spawner reads (its most specific
    section first), and without them the spawner's own defaults, not copies of them."""
    from pathlib import Path

    from spawner.engines.docker.spawner import GPUDockerSpawner
    from spawner.settings.apply import apply_settings
    from spawner.settings.pool_jobs import job_settings

    c = Config()
    settings = _settings(tmp_path)
    apply_settings(c, settings)
    assert "home_volume_name" not in c.GPUDockerSpawner  # GPUHUB_HOME_VOLUME unset: the trait's own
    js = job_settings(c, settings)
    traits = GPUDockerSpawner.class_traits()
    assert (js.home_volume, js.home_mount_point, js.shm_size, js.fallback_uid) == tuple(
        traits[n].default_value for n in ("home_volume_name", "home_mount_point", "shm_size", "fallback_uid"))
    assert JobSettings().home_volume == traits["home_volume_name"].default_value
    # Set by the deployment, or in a section the servers read after c.GPUDockerSpawner (Swarm's).
    c = Config()
    swarm = _settings(tmp_path, GPUHUB_SPAWNER="swarm", GPUHUB_HUB_CONNECT_IP="10.0.1.2",
                      GPUHUB_HOME_VOLUME="lab-{username}", GPUHUB_POOL_DB_URL="postgresql+psycopg://u:p@db/ledger")
    apply_settings(c, swarm)
    c.GPUDockerSpawner.home_mount_point = "/home/docker-section"
    c.GPUSwarmSpawner.home_mount_point = "/home/swarm-section"
    js = job_settings(c, swarm)
    assert (js.home_volume, js.home_mount_point) == ("lab-{username}", "/home/swarm-section")
    # The default the issue found in three places is written once, on its trait.
    sources = [p for p in Path("spawner").rglob("*.py") if "gpuhub-home-{username}" in p.read_text()]
    assert [str(p) for p in sources] == ["spawner/engines/common/container_spawner.py"]
