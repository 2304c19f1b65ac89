"""The systemd unit (systemd-analyze verify) and install.sh's layout, into a staging root."""

from __future__ import annotations

import stat

from tests.fixtures.install import PREFIX, UNIT_FILE, run_install, verify_unit

UNIT = UNIT_FILE.read_text()


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_unit_runs_the_hub_from_its_venv_with_the_env_file_and_data_dir():
    lines = set(UNIT.splitlines())
    assert f"ExecStart={PREFIX}/venv/bin/jupyterhub -f {PREFIX}/hub_config/jupyterhub_config.py" in lines
    assert "EnvironmentFile=/etc/jupyterhub-gpu/gpuhub.env" in lines
    assert "WorkingDirectory=/var/lib/jupyterhub-gpu" in lines
    assert "Restart=on-failure" in lines
    assert "ProtectSystem=strict" in lines and "NoNewPrivileges=yes" in lines
    # Hardening that would cut the hub off from Docker or the GPUs is absent.
    assert "AF_UNIX" in UNIT and not any(line.startswith(("PrivateDevices=", "PrivateNetwork=",
                                                          "InaccessiblePaths=/run")) for line in lines)


def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    program = tmp_path / PREFIX.lstrip("/") / "venv" / "bin" / "jupyterhub"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    proc = verify_unit(UNIT, tmp_path)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr
    # ...and verify does look: without the program it fails.
    program.unlink()
    proc = verify_unit(UNIT, tmp_path)
    assert proc.returncode != 0 and "not executable" in proc.stderr


def test_install_makes_the_layout_and_never_overwrites_the_env_file(tmp_path):
    root = tmp_path / "root"
    proc = run_install(root, "--skip-venv", "--skip-proxy", "--skip-images")
    env_file = root / "etc/jupyterhub-gpu/gpuhub.env"
    unit = root / "etc/systemd/system/jupyterhub-gpu.service"
    assert unit.read_text() == UNIT  # the default paths: the shipped unit as it is
    assert _mode(unit) == 0o644
    assert (root / "opt/jupyterhub-gpu/hub_config/jupyterhub_config.py").is_file()
    assert (root / "opt/jupyterhub-gpu/hub_config/examples/production.env").is_file()
    assert _mode(root / "var/lib/jupyterhub-gpu") == 0o700
    assert _mode(env_file) == 0o600
    assert "GPUHUB_DATA_DIR=/var/lib/jupyterhub-gpu\n" in env_file.read_text()
    assert "What a person must still do" in proc.stdout and "systemctl enable" in proc.stdout

    env_file.write_text("GPUHUB_BIND_URL=http://127.0.0.1:9000\n")  # the admin's edits
    proc = run_install(root, "--skip-venv", "--skip-proxy", "--skip-images")
    assert env_file.read_text() == "GPUHUB_BIND_URL=http://127.0.0.1:9000\n"
    assert _mode(env_file) == 0o600
    assert "left as it is" in proc.stdout


def test_install_writes_its_own_paths_into_the_unit_and_env_file(tmp_path):
    root = tmp_path / "root"
    run_install(root, "--skip-venv", "--skip-proxy", "--skip-images", "--prefix", "/srv/hub",
                DATA_DIR="/data/hub", ETC_DIR="/etc/hub")
    unit = (root / "etc/systemd/system/jupyterhub-gpu.service").read_text()
    assert "ExecStart=/srv/hub/venv/bin/jupyterhub -f /srv/hub/hub_config/jupyterhub_config.py" in unit
    assert "EnvironmentFile=/etc/hub/gpuhub.env" in unit and "WorkingDirectory=/data/hub" in unit
    settings = [line for line in unit.splitlines() if "=" in line and not line.startswith("#")]
    assert "ReadWritePaths=/data/hub" in settings
    assert not [line for line in settings if "/jupyterhub-gpu" in line]  # no default path left
    assert "GPUHUB_DATA_DIR=/data/hub\n" in (root / "etc/hub/gpuhub.env").read_text()
    assert (root / "data/hub").is_dir() and (root / "srv/hub/hub_config").is_dir()
