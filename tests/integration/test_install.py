"""install.sh's virtual environment, for real: the package from this clone installed
into a staging root, its programs there, and the installed unit verified against it."""

from __future__ import annotations

import subprocess

from tests.fixtures.install import PREFIX, run_install, verify_unit


def test_install_builds_a_venv_that_runs_the_hub_and_the_unit_verifies_against_it(tmp_path):
    root = tmp_path / "root"
    proc = run_install(root, "--skip-proxy", "--skip-images")
    venv = root / PREFIX.lstrip("/") / "venv"
    assert "virtual environment:" in proc.stdout
    for program in ("python", "jupyterhub", "gpu-pool"):
        assert (venv / "bin" / program).is_file(), program
    # The installed package (not this clone) is what the venv imports, with its entry points.
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import spawner, jupyterhub; from importlib.metadata import entry_points as e; "
         "print(spawner.__file__); print([p.name for p in e(group='jupyterhub.spawners')])"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert str(venv) in probe.stdout and "gpu-docker" in probe.stdout
    assert subprocess.run([str(venv / "bin" / "gpu-pool"), "--help"], capture_output=True,
                          timeout=60).returncode == 0
    # The unit as installed, checked with its ExecStart really there.
    unit = (root / "etc/systemd/system/jupyterhub-gpu.service").read_text()
    verified = verify_unit(unit, root)
    assert verified.returncode == 0 and not (verified.stdout + verified.stderr).strip(), verified.stderr
    # A second run is an upgrade in place: it succeeds and keeps the venv.
    run_install(root, "--skip-proxy", "--skip-images")
    assert (venv / "bin" / "jupyterhub").is_file()
