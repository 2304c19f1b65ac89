"""The systemd unit (systemd-analyze verify) and install.sh's layout, into a staging root."""

from __future__ import annotations

import os
import stat

from tests.fixtures.install import PREFIX, REPO, UNIT_FILE, fake_program, run_install, verify_unit

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
    # Where the doctor's image fixes build from: this clone.
    assert (root / "opt/jupyterhub-gpu/hub_config/clone").read_text() == f"{REPO}\n"
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


def test_the_closing_list_checks_the_host_with_the_installed_settings(tmp_path):
    proc = run_install(tmp_path / "root", "--skip-venv", "--skip-proxy", "--skip-images")
    assert (f"{PREFIX}/venv/bin/gpu-pool --env-file /etc/jupyterhub-gpu/gpuhub.env doctor"
            in proc.stdout), proc.stdout
    assert not any(line.rstrip().endswith("gpu-pool doctor") for line in proc.stdout.splitlines())


def test_a_python_under_root_is_refused_before_any_venv_is_made(tmp_path):
    """A pyenv-style interpreter under /root (ProtectHome=yes hides it from the unit)."""
    fake = fake_program(tmp_path / "bin", "python3",
                        'echo /root/.pyenv/versions/3.11.9/bin/python3.11\n')
    root = tmp_path / "root"
    proc = run_install(root, "--skip-proxy", "--skip-images", expect_ok=False, PYTHON=str(fake))
    assert proc.returncode == 1
    assert "ProtectHome=yes" in proc.stderr and "PYTHON=/usr/bin/python3" in proc.stderr, proc.stderr
    assert not (root / PREFIX.lstrip("/") / "venv").exists()


def test_a_venv_made_from_a_python_under_home_is_refused(tmp_path):
    root = tmp_path / "root"
    venv_bin = root / PREFIX.lstrip("/") / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to("/home/someone/.local/python3.12")
    proc = run_install(root, "--skip-proxy", "--skip-images", expect_ok=False)
    assert proc.returncode == 1 and "rm -rf" in proc.stderr and "ProtectHome=yes" in proc.stderr


def _image_todo(tmp_path, nvidia_smi: str) -> str:
    bin_dir = tmp_path / "bin"
    fake_program(bin_dir, "nvidia-smi", nvidia_smi)
    proc = run_install(tmp_path / "root", "--skip-venv", "--skip-proxy", "--skip-images",
                       PATH=f"{bin_dir}:{os.environ['PATH']}")
    return proc.stdout


def test_a_host_with_a_gpu_gets_the_cuda_image_too(tmp_path):
    out = _image_todo(tmp_path, 'echo "GPU 0: NVIDIA H100 (UUID: GPU-0f2c)"\n')
    assert f"PYTHON={PREFIX}/venv/bin/python" in out and "images/build-images.sh mkl cuda" in out, out
    assert "CUDA image" not in out


def test_a_host_without_a_gpu_is_told_how_to_build_the_cuda_image(tmp_path):
    out = _image_todo(tmp_path, 'echo "NVIDIA-SMI has failed" >&2; exit 9\n')
    assert "images/build-images.sh mkl\n" in out
    assert "CUDA image (GPUHUB_GPU_IMAGE" in out and "images/build-images.sh cuda" in out, out
