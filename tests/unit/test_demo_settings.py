"""The demo's settings without starting it (issue 36, item 1): every feature on, the newcomer's
own GPUHUB_* variables over the demo's, their --config loaded after the demo's limits."""

from __future__ import annotations

import os

from devservices import demo


def _demo(tmp_path, *argv: str) -> demo.Demo:
    return demo.Demo(demo.build_parser().parse_args(["--dir", str(tmp_path / "d"), "--port", "18000", *argv]))


def test_every_feature_is_on_and_a_newcomers_settings_win(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHUB_SSH", "false")
    monkeypatch.setenv("GPUHUB_GPU_HOUR_BUDGET", "2")
    monkeypatch.setenv("GPUHUB_TEST_SOMETHING", "1")
    d = _demo(tmp_path, "--ssh-port", "12222")
    env = d.hub_env({"GPUHUB_DIRECTORY_EXEC_GROUPS": "script-runners"}, 0, "cpu", "gpu")
    assert env["GPUHUB_SSH"] == "false" and env["GPUHUB_GPU_HOUR_BUDGET"] == "2"
    assert "GPUHUB_TEST_SOMETHING" not in env
    assert env["GPUHUB_SSH_PORT"] == "12222" and env["GPUHUB_SSH_ADDRESS"] == "127.0.0.1"
    assert env["GPUHUB_JOBS"] == "true" and env["GPUHUB_DIRECTORY_EXEC_GROUPS"] == "script-runners"
    lines = "\n".join(d.feature_lines())
    assert "SSH:" not in lines and "2 GPU-hours per 1 h" in lines and "#exec-form" in lines
    for feature in ("Notebook jobs: ", "Schedules: ", "Borrowing: "):
        assert feature in lines, f"no {feature!r} line in the banner"


def test_the_ssh_line_is_ready_to_paste(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("GPUHUB_")]:
        monkeypatch.delenv(name)
    d = _demo(tmp_path, "--ssh-port", "12222")
    d.hub_env({}, 0, "cpu", "gpu")
    ssh = next(line for line in d.feature_lines() if line.startswith("SSH:"))
    assert ssh.startswith("SSH: ssh -p 12222 alice@127.0.0.1 (password Alice-Pass-1;")


def test_the_config_loads_production_then_the_demos_limits_then_yours(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("c.GPUPool.booking_max_hours = 4\n")
    d = _demo(tmp_path, "--config", str(mine))
    d.dir.mkdir(parents=True)
    text = d.write_config().read_text()
    production = text.index("hub_config/jupyterhub_config.py")
    limits = text.index("c.GPUPool.booking_notice = 60.0")
    assert production < limits < text.index(str(mine))
