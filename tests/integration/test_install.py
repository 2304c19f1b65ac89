"""install.sh's virtual environment, for real: the package from this clone installed
into a staging root, its programs there, and the installed unit verified against it."""

from __future__ import annotations

import os
import subprocess

from tests.fixtures.install import PREFIX, REPO, fake_program, run_install, verify_unit


def _build_outputs() -> dict[str, int]:
    """build/, dist/ and *.egg-info in the clone: each file's path and mtime."""
    found = {}
    for top in [REPO / "build", REPO / "dist", *REPO.glob("*.egg-info")]:
        for path in [top, *(top.rglob("*") if top.is_dir() else [])]:
            if path.exists():
                found[str(path.relative_to(REPO))] = path.stat().st_mtime_ns
    return found


def test_install_builds_a_venv_that_runs_the_hub_and_the_unit_verifies_against_it(tmp_path):
    root = tmp_path / "root"
    # A python3 first on PATH that is not the system's (pyenv's shims live under /root): unused.
    marker = tmp_path / "path-python-ran"
    bin_dir = tmp_path / "bin"
    fake_program(bin_dir, "python3", f'touch {marker}; exit 1\n')
    before = _build_outputs()
    proc = run_install(root, "--skip-proxy", "--skip-images", PATH=f"{bin_dir}:{os.environ['PATH']}")
    venv = root / PREFIX.lstrip("/") / "venv"
    assert "virtual environment:" in proc.stdout
    # The system's Python made the venv, and the clone got no build/ or *.egg-info (out-of-tree wheel).
    assert not marker.exists() and "home = /usr/bin\n" in (venv / "pyvenv.cfg").read_text()
    assert _build_outputs() == before
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
