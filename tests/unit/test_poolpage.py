"""The GPU pool page's view-model, its hub config and its audit records (no hub)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from traitlets.config import Config

from spawner.inventory import GPU, SimulatedInventory
from spawner.pool import SCHEMA_VERSION, GPUPool
from spawner.pool.models import GPUStatus, Lease, Waiter
from spawner.poolpage import ADMIN_SCOPE, views
from spawner.poolpage.app import TEMPLATES
from spawner.settings import load_settings
from spawner.settings.culler import configure_culler
from spawner.settings.pool_service import ACCESS_SCOPE, ADMIN_ROLE, EXEC_ROLE, SERVICE_ROLE
from spawner.settings.pool_service import configure_pool_page as configure_page_options
from spawner.settings.services import set_hub_services

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def status(idx: int, user: str | None = None, drained: bool = False) -> GPUStatus:
    gpu = GPU("node1", f"GPU-{idx}", idx, "NVIDIA H100", 81920)
    lease = Lease(idx, user, "", "node1", (gpu.uuid,), (), T0) if user else None
    return GPUStatus(gpu=gpu, drained=drained, lease=lease)


GPUS = [status(0, "alice"), status(1, "bob"), status(2), status(3, drained=True)]


def test_a_plain_user_sees_their_own_name_only():
    rows = views.gpu_rows(GPUS, views.Viewer("alice"))
    assert [r["state"] for r in rows] == ["lent", "lent", "free", "drained"]
    assert rows[0]["holder"] == "alice" and rows[0]["yours"]
    assert rows[1]["holder"] is None and not rows[1]["yours"]
    assert rows[0]["since"] == T0.isoformat() and rows[2]["since"] is None
    assert rows[0]["model"] == "NVIDIA H100" and rows[0]["memory_mib"] == 81920


@pytest.mark.parametrize("viewer", [views.Viewer("carol", admin=True), views.Viewer("carol", show_holders=True)])
def test_admins_or_a_public_pool_see_every_holder(viewer):
    rows = views.gpu_rows(GPUS, viewer)
    assert [r["holder"] for r in rows] == ["alice", "bob", None, None]


def test_queue_hides_other_waiters():
    waiters = [Waiter(1, "bob", "", 2, T0, 1), Waiter(2, "alice", "x", 1, T0, 2)]
    rows = views.queue_rows(waiters, views.Viewer("alice"))
    assert [(r["position"], r["user"], r["yours"]) for r in rows] == [(1, None, False), (2, "alice", True)]
    assert [r["user"] for r in views.queue_rows(waiters, views.Viewer("z", admin=True))] == ["bob", "alice"]


def test_lease_rows_count_gpu_hours():
    lease = Lease(7, "alice", "big", "node1", ("a", "b"), (), T0, T0 + timedelta(hours=3), "stopped")
    row = views.lease_row(lease)
    assert row["gpu_hours"] == 6.0 and row["gpus"] == 2 and row["end_reason"] == "stopped"
    running = Lease(8, "alice", "", "node1", ("a",), (), T0)
    assert views.lease_row(running, now=T0 + timedelta(minutes=30))["gpu_hours"] == 0.5


def test_usage_all_for_admins_own_for_others():
    usage = {"users": {"alice": 1.23456, "bob": 2.0}, "groups": {"ml": 3.23456}}
    assert views.usage_for(usage, views.Viewer("x", admin=True)) == {
        "users": {"alice": 1.235, "bob": 2.0}, "groups": {"ml": 3.235}}
    assert views.usage_for(usage, views.Viewer("alice")) == {"users": {"alice": 1.235}, "groups": {}}
    assert views.usage_for(usage, views.Viewer("nobody")) == {"users": {"nobody": 0.0}, "groups": {}}


def test_usage_csv_defuses_formulas():
    text = views.usage_csv({"users": {"=cmd": 1.0, "alice": 0.5}, "groups": {"ml": 1.5}})
    assert text.splitlines() == ["kind,name,gpu_hours", "user,'=cmd,1.000", "user,alice,0.500",
                                 "group,ml,1.500"]


@pytest.mark.parametrize("since, until, message", [
    ("yesterday", None, "since='yesterday' is not an ISO 8601"),
    ("2026-02-01", "2026-01-01", "since must be before until"),
    (None, "2026-13-01", "until="),
])
def test_bad_periods_are_refused_with_a_message(since, until, message):
    with pytest.raises(views.BadInput, match=message):
        views.usage_period(since, until)


def test_periods_default_to_utc():
    since, until = views.usage_period("2026-01-01", "2026-01-02T00:00:00+01:00")
    assert since == datetime(2026, 1, 1, tzinfo=UTC) and until.utcoffset() == timedelta(hours=1)
    assert views.usage_period("", None) == (None, None)


def test_summary_counts_states():
    assert views.summary(views.gpu_rows(GPUS, views.Viewer("a"))) == {"free": 1, "lent": 2, "drained": 1,
                                                                      "missing": 0}


def test_the_page_escapes_names():
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(default=True))
    evil = [status(0, "<script>x</script>")]
    viewer = views.Viewer("<b>me</b>", admin=True)
    rows = views.gpu_rows(evil, viewer)
    html = env.get_template("page.html").render(viewer=viewer, gpus=rows, summary=views.summary(rows), queue=[],
                                                active=[], history=[], total_hours=0, audit=[],
                                                base_url="/", prefix="/services/gpu-pool/")
    assert "<script>x" not in html and "&lt;script&gt;x" in html and "&lt;b&gt;me" in html


def configure_pool_page(c, settings):
    """The gpu-pool service's part of the hub's config, as apply_settings makes it (no culler, no jobs)."""
    configure_page_options(c, settings)
    set_hub_services(c, dataclasses.replace(settings, cull=False, jobs=False, ssh=False))


def _settings(**env):
    return load_settings({"GPUHUB_AUTHENTICATOR": "dummy", "GPUHUB_DUMMY_PASSWORD": "x", **env})


def test_the_service_is_configured_with_its_roles(tmp_path):
    c = Config()
    c.JupyterHub.load_roles = [{"name": "other", "scopes": ["read:users"]}]
    settings = _settings(GPUHUB_DATA_DIR=str(tmp_path), GPUHUB_POOL_PAGE_PORT="9123", GPUHUB_ADMIN_USERS="ada")
    configure_pool_page(c, settings)
    configure_pool_page(c, settings)  # twice: still one of each
    [service] = c.JupyterHub.services
    assert service["url"] == "http://127.0.0.1:9123" and service["display"] and service["oauth_no_confirm"]
    assert service["command"][1:] == ["-m", "spawner.poolpage"]
    assert service["environment"]["GPUHUB_POOL_DB_URL"] == settings.pool_db_url
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert set(roles) == {"other", "user", ADMIN_ROLE, EXEC_ROLE, SERVICE_ROLE}
    # the service's own token lists servers and stops one, and nothing more
    assert roles[SERVICE_ROLE]["services"] == ["gpu-pool"]
    assert "delete:servers" in roles[SERVICE_ROLE]["scopes"] and "admin:users" not in roles[SERVICE_ROLE]["scopes"]
    # ...and may reach no one's server itself: an action script goes with a token made per server
    assert not [s for s in roles[SERVICE_ROLE]["scopes"] if s.startswith("access:servers")]
    assert "tokens" in roles[SERVICE_ROLE]["scopes"]
    assert roles["user"]["scopes"] == ["self", ACCESS_SCOPE]
    assert roles[ADMIN_ROLE]["users"] == ["ada"] and ADMIN_SCOPE in roles[ADMIN_ROLE]["scopes"]
    assert roles[ADMIN_ROLE]["groups"] == ["gpu-pool:admin"]  # only the directory login fills it
    assert ADMIN_SCOPE in c.JupyterHub.custom_scopes
    # the hub's pages link to it
    assert c.JupyterHub.template_vars["gpu_pool_url"] == "/services/gpu-pool/"
    assert c.JupyterHub.template_paths[0].endswith("hub_templates") and len(c.JupyterHub.template_paths) == 1


def test_the_service_reads_the_hubs_settings_from_the_one_file_the_hub_writes(tmp_path):
    """What the page shows (holders, cull deadlines, the proxy it reaches servers through) comes
    from the hub's settings, through its file; an option set after hub_config counts."""
    from spawner.poolpage.limits import PoolServiceLimits
    from spawner.poolpage.service_config import CONFIG_FILE_ENV, PoolPageSettings, load_service_config
    from spawner.settings.service_file import render_service_config

    (tmp_path / "c.pem").write_text("x")
    (tmp_path / "k.pem").write_text("x")
    settings = _settings(GPUHUB_DATA_DIR=str(tmp_path), GPUHUB_POOL_PAGE_SHOW_HOLDERS="true",
                         GPUHUB_CULL="true", GPUHUB_CULL_TIMEOUT_GPU="700", GPUHUB_CULL_TIMEOUT_CPU="3000",
                         GPUHUB_BIND_URL="https://0.0.0.0:8443", GPUHUB_SSL_CERT=str(tmp_path / "c.pem"),
                         GPUHUB_SSL_KEY=str(tmp_path / "k.pem"), GPUHUB_JOBS="false")
    c = Config()
    configure_culler(c, settings)  # as apply_settings does first: the culler's options
    configure_pool_page(c, settings)
    [service] = [s for s in c.JupyterHub.services if s["name"] == "gpu-pool"]
    env = service["environment"]
    # Nothing else travels by environment (the authenticator's file: the password re-check, reauth.py).
    assert set(env) == {"GPUHUB_POOL_DB_URL", CONFIG_FILE_ENV, "GPUHUB_POOL_AUTHENTICATOR_FILE"}
    c.PoolServiceLimits.log_followers_per_job = 2  # a later config file
    path = tmp_path / "gpu-pool-service.json"
    assert env[CONFIG_FILE_ENV] == str(path)
    path.write_text(render_service_config(c, settings))
    config = load_service_config(env)
    page = PoolPageSettings(config=config)
    assert page.show_holders and (page.cull_timeout_gpu, page.cull_timeout_cpu) == (700, 3000)
    assert page.proxy_url == "https://127.0.0.1:8443" and not page.proxy_validate_cert  # its own proxy
    assert PoolServiceLimits(config=config).log_followers_per_job == 2
    assert "JobSettings" not in config  # jobs off: the service runs none
    # without culling the page promises no deadline
    off = _settings(GPUHUB_DATA_DIR=str(tmp_path), GPUHUB_CULL="false")
    c = Config()
    configure_pool_page(c, off)
    path.write_text(render_service_config(c, off))
    page = PoolPageSettings(config=load_service_config(env))
    assert (page.cull_timeout_gpu, page.cull_every, page.cull_rules) == (0, 0, "")
    assert page.proxy_url == "http://127.0.0.1:8000" and page.proxy_validate_cert
    # a file the hub named but the service cannot read stops the service, not defaults
    path.unlink()
    with pytest.raises(RuntimeError, match="cannot be read"):
        load_service_config(env)


def test_the_notebook_servers_reach_the_service_on_the_bridge_with_jobs_off(tmp_path):
    """JupyterLab's GPU status needs the service, not jobs: the pool page's configuration gives the
    servers its bridge address and a token that may ask it, and has the service listen there."""
    from spawner.poolpage.app import bridge_ip
    from spawner.poolpage.service_config import PoolPageSettings
    from spawner.settings.pool_service import SERVER_TOKEN_SCOPES
    from spawner.settings.service_file import service_config

    settings = _settings(GPUHUB_DATA_DIR=str(tmp_path), GPUHUB_POOL_PAGE_PORT="9123", GPUHUB_JOBS="false")
    assert not settings.jobs
    c = Config()
    c.JupyterHub.hub_connect_ip = "192.0.2.1"  # the hub's bridge gateway, as the hub sets it
    c.GPUDockerSpawner.environment.update({"OTHER": "kept"})
    configure_pool_page(c, settings)
    [service] = c.JupyterHub.services
    assert service_config(c, settings)["PoolPageSettings"]["bridge_ip"] == "192.0.2.1"
    assert c.GPUDockerSpawner.environment == {
        "OTHER": "kept", "GPUHUB_POOL_URL": "http://192.0.2.1:9123/services/gpu-pool/"}
    assert c.GPUDockerSpawner.server_token_scopes == SERVER_TOKEN_SCOPES and ACCESS_SCOPE in SERVER_TOKEN_SCOPES
    assert not any("jobs" in scope for scope in c.GPUDockerSpawner.server_token_scopes)

    class App:  # what serve() reads: the app's jobs runner (none here) and the page's settings
        settings = {"jobs": None, "page": PoolPageSettings(config=c)}
    assert bridge_ip(App) == "192.0.2.1"
    # Outside the hub (`gpu-pool --config`) there is no bridge: no URL, no listener.
    c = Config()
    configure_pool_page(c, settings)
    App.settings["page"] = PoolPageSettings(config=c)
    assert bridge_ip(App) == ""
    assert "environment" not in c.GPUDockerSpawner  # nothing for the servers: nothing written


def test_the_page_can_be_turned_off_and_its_port_must_be_free(tmp_path):
    assert not _settings(GPUHUB_POOL_PAGE="false").pool_page
    assert _settings().pool_page_port == 8091 and not _settings().pool_page_show_holders
    from spawner.settings import SettingsError

    with pytest.raises(SettingsError, match="GPUHUB_POOL_PAGE_PORT"):
        _settings(GPUHUB_POOL_PAGE_PORT="8081")


def test_drains_by_someone_are_audited(tmp_path):
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'l.sqlite'}", inventory=SimulatedInventory(count=2))
    try:
        pool.sync_inventory()
        uuid = pool.gpus()[0].gpu.uuid
        pool.drain(uuid, by="ada")
        pool.drain(uuid, by="ada")
        pool.undrain(uuid)  # no `by`: not an audited action
        audit = pool.audit()
        assert [(a["actor"], a["action"], a["uuid"]) for a in audit] == [("ada", "drain", uuid)] * 2
        assert audit[0]["detail"] == "already drained" and audit[1]["detail"] is None
    finally:
        pool.close()


@pytest.mark.parametrize("old", [1, 2, 3])
def test_older_ledgers_gain_the_audit_and_queue_tables_in_place(tmp_path, old):
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    pool = GPUPool(db_url=url, inventory=SimulatedInventory(count=1))
    pool.sync_inventory()
    pool.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # make it look as an older release left it
        conn.execute(sa.text("DROP TABLE gpu_pool_queue_log"))
        if old < 3:
            conn.execute(sa.text("DROP TABLE gpu_pool_audit"))
        if old == 1:
            conn.execute(sa.text("ALTER TABLE gpu_pool_leases DROP COLUMN problem"))
        conn.execute(sa.text(f"UPDATE gpu_pool_meta SET value='{old}' WHERE key='schema_version'"))
    pool = GPUPool(db_url=url, inventory=SimulatedInventory(count=1))
    try:
        pool.drain(pool.gpus()[0].gpu.uuid, by="ada")
        assert [a["actor"] for a in pool.audit()] == ["ada"]
        assert pool.leases() == []  # the problem column is back
        pool.undrain(pool.gpus()[0].gpu.uuid)
        assert pool.try_acquire("bob", "", 1) is not None and pool.try_acquire("cy", "", 1) is None
        assert pool.timeline(datetime.now(UTC) - timedelta(hours=1)).gpus == 1
    finally:
        pool.close()
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT value FROM gpu_pool_meta WHERE key='schema_version'")).scalar()
        assert version == str(SCHEMA_VERSION)
    engine.dispose()
