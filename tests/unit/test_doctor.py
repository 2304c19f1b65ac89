"""The host doctor's pure pieces: versions, the CUDA fit, the container's environment, the data
directory's rules, the report; and a ledger the doctor can reach without Docker."""

from __future__ import annotations

import os
import pwd
import types
from pathlib import Path

import pytest
from traitlets.config import Config

from spawner.cli import doctor
from spawner.cli.doctor import FAIL, OK, WARN, Result
from spawner.inventory import SimulatedInventory, StaticInventory
from spawner.pool import GPUPool

ME = pwd.getpwuid(os.geteuid()).pw_name
LABEL = "org.jupyter.gpuhub.cuda-version"


def test_docker_versions_compare_by_number():
    assert doctor.version_at_least("28.2.0", (28, 2))
    assert doctor.version_at_least("29.0.1", (28, 2))
    assert not doctor.version_at_least("28.1.9", (28, 2))
    assert not doctor.version_at_least("20.10.24+dfsg1", (28, 2))
    assert doctor.version_at_least("28.10.0-ce", (28, 2))
    assert not doctor.version_at_least("nightly", (28, 2))


def test_an_image_fits_a_driver_of_its_cuda_or_newer():
    assert doctor.cuda_fit("img", {LABEL: "12.4"}, 1, (12, 4)).status == OK
    assert doctor.cuda_fit("img", {LABEL: "11.8"}, 1, (12, 4)).status == OK
    too_new = doctor.cuda_fit("img", {LABEL: "12.5"}, 1, (12, 4))
    assert too_new.status == FAIL
    assert too_new.detail == "needs CUDA 12.5 but this host's driver supports up to 12.4"
    assert "12.5" in too_new.fix and too_new.check == "image img"


def test_cpu_images_and_unknowns():
    assert doctor.cuda_fit("img", {LABEL: "none"}, 0, (12, 4)).status == OK
    assert doctor.cuda_fit("img", {}, 0, None).status == OK
    assert doctor.cuda_fit("img", {}, 1, (12, 4)).status == WARN  # a GPU image we cannot judge
    assert doctor.cuda_fit("img", {LABEL: "12.0"}, 1, None).status == WARN


def test_visible_devices_reads_a_proc_environ_dump():
    dump = b"PATH=/usr/bin\0NVIDIA_VISIBLE_DEVICES=GPU-abc\0HOME=/root\0"
    assert doctor.visible_devices(dump) == "GPU-abc"
    assert doctor.visible_devices(b"PATH=/usr/bin\0") == ""
    assert doctor.visible_devices(b"") == ""


def test_data_directory_rules(tmp_path):
    good = tmp_path / "good"
    good.mkdir(mode=0o700)
    assert doctor.data_dir_result(good, ME).status == OK
    missing = doctor.data_dir_result(tmp_path / "nope", ME)
    assert missing.status == FAIL and "does not exist" in missing.detail and "mkdir" in missing.fix
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    world = doctor.data_dir_result(open_dir, ME)
    assert world.status == FAIL and "world-writable" in world.detail and world.fix.startswith("chmod o-w")
    nobody = doctor.data_dir_result(good, "nobody" if ME != "nobody" else "root")
    assert nobody.status == FAIL and "owned by" in nobody.detail and nobody.fix.startswith("chown")
    assert doctor.data_dir_result(good, "no-such-user-here").status == FAIL


def test_the_data_directory_is_where_the_cookie_secret_or_database_lives(tmp_path):
    c = Config()
    c.JupyterHub.cookie_secret_file = str(tmp_path / "data" / "cookie")
    assert doctor.data_dir_of(c, tmp_path) == tmp_path / "data"
    c = Config()
    c.JupyterHub.db_url = f"sqlite:///{tmp_path / 'db' / 'jupyterhub.sqlite'}"
    assert doctor.data_dir_of(c, tmp_path) == tmp_path / "db"
    assert doctor.data_dir_of(Config(), tmp_path) == tmp_path


def test_report_text_json_and_exit_status():
    results = [Result("docker", OK, "Docker Engine 28.2.0"), Result("ledger", FAIL, "down", "start it"),
               Result("gpus", WARN, "simulated", "use nvml")]
    text = doctor.render(results)
    assert text.splitlines()[0].startswith("ok    docker")
    assert "fix: start it" in text and "fix: use nvml" in text
    assert text.splitlines()[-1] == "1 check(s) failed"
    assert doctor.exit_status(results) == 1
    assert doctor.exit_status(results[:1]) == 0 and doctor.render(results[:1]).endswith("all checks passed")
    assert doctor.as_json(results)[1] == {"check": "ledger", "status": FAIL, "detail": "down", "fix": "start it"}


def _doctor_for(config: Config, tmp_path) -> doctor.Doctor:
    config.GPUDockerSpawner.inventory_kind = "simulated"
    config.Inventory.host = "unit-host"
    d = doctor.Doctor(doctor.Target(config, tmp_path, ME))
    d.check_inventory()
    return d


def _ledger_checked(path, recorded) -> doctor.Doctor:
    """A ledger at `path` that recorded `recorded`'s GPUs, checked by a doctor of simulated host unit-host."""
    pool = GPUPool(db_url=f"sqlite:///{path}", inventory=recorded)
    pool.sync_inventory()
    pool.close()
    c = Config()
    c.GPUPool.db_url = f"sqlite:///{path}"
    d = _doctor_for(c, path.parent)
    d.check_ledger()
    return d


def test_ledger_check_knows_the_host_and_refuses_another_name(tmp_path):
    d = _ledger_checked(tmp_path / "ledger.sqlite", SimulatedInventory(host="unit-host"))
    assert d.results[-1].status == OK and "4 GPU(s) of host unit-host" in d.results[-1].detail

    gpus = [{"uuid": SimulatedInventory.uuid_for("unit-host", 0), "index": 0}]
    d = _ledger_checked(tmp_path / "other.sqlite", StaticInventory(host="old-name", gpus_list=gpus))
    assert d.results[-1].status == FAIL and "gpu-pool rehome 'old-name' 'unit-host'" in d.results[-1].fix
    # Read-only: the doctor recorded nothing under the new name.
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'other.sqlite'}")
    assert {s.gpu.host for s in pool.gpus()} == {"old-name"}
    pool.close()


def test_a_missing_sqlite_ledger_is_a_warning_and_is_not_created(tmp_path):
    c = Config()
    c.GPUPool.db_url = f"sqlite:///{tmp_path / 'absent.sqlite'}"
    d = _doctor_for(c, tmp_path)
    d.check_ledger()
    assert d.results[-1].status == WARN and not (tmp_path / "absent.sqlite").exists()


def test_doctor_with_a_config_file_that_is_not_there_is_one_line_and_exit_2(tmp_path, capsys):
    from spawner.cli import main

    assert main(["doctor", "--config", str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-pool: No config file at") and len(err.strip().splitlines()) == 1


def test_doctor_with_a_bad_setting_names_it(monkeypatch, capsys):
    from spawner.cli import main

    monkeypatch.setenv("GPUHUB_INVENTORY", "quantum")
    assert main(["doctor"]) == 2
    assert "GPUHUB_INVENTORY" in capsys.readouterr().err


def test_without_a_driver_the_nvml_inventory_fails_with_the_fix(tmp_path):
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    c = Config()
    c.GPUDockerSpawner.inventory_kind = "nvml"
    d = doctor.Doctor(doctor.Target(c, tmp_path, ME))
    d.check_nvml()
    d.check_inventory()
    nvml, gpus = d.results
    assert nvml.status == FAIL and "NVML does not load" in nvml.detail and "NVIDIA driver" in nvml.fix
    assert gpus.status == FAIL and "nvml inventory cannot be read" in gpus.detail and "static" in gpus.fix


def test_a_missing_notebook_image_gets_the_exact_command_that_builds_it(tmp_path):
    """The settings name the CUDA image: its fix builds the CUDA variant, not just `make images`."""
    import sys

    from spawner.settings import DEFAULT_CPU_IMAGE, DEFAULT_GPU_IMAGE

    class NoImages:
        class images:
            @staticmethod
            def get(name):
                raise LookupError(f"No such image: {name}")

    c = Config()
    c.GPUDockerSpawner.profiles = [
        {"slug": "cpu", "display_name": "CPU", "image": DEFAULT_CPU_IMAGE, "gpus": 0},
        {"slug": "gpu", "display_name": "GPU", "image": DEFAULT_GPU_IMAGE, "gpus": 1},
        {"slug": "own", "display_name": "Own", "image": "registry.example/own:1.0", "gpus": 0}]
    d = doctor.Doctor(doctor.Target(c, tmp_path, ME))
    d.docker = NoImages()
    d.check_images()
    fixes = {r.check: r.fix for r in d.results}
    repo = Path(__file__).resolve().parents[2]  # this checkout is the package's clone
    build = f"build it: PYTHON={sys.executable} {repo}/images/build-images.sh"
    assert fixes[f"image {DEFAULT_GPU_IMAGE}"] == f"{build} cuda"
    assert fixes[f"image {DEFAULT_CPU_IMAGE}"] == f"{build} mkl"
    assert "docker load" in fixes["image registry.example/own:1.0"]


def test_doctor_without_the_settings_says_it_checks_defaults(monkeypatch, tmp_path):
    for name in [n for n in os.environ if n.startswith("GPUHUB_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    target = doctor.target_from_env(ME, {"GPUHUB_AUTHENTICATOR": "dummy", "GPUHUB_DUMMY_PASSWORD": "x"})
    (note,) = target.notes
    assert "GPUHUB_DATA_DIR is not set" in note[0] and "--env-file /etc/jupyterhub-gpu/gpuhub.env" in note[1]


def test_the_doctor_warns_about_settings_lines_a_shell_reads_differently(monkeypatch, tmp_path):
    from spawner.cli.main import load_env_file

    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("GPUHUB_")})
    env_file = tmp_path / "gpuhub.env"
    env_file.write_text(f"GPUHUB_DATA_DIR={tmp_path}\nGPUHUB_AUTHENTICATOR=dummy\nGPUHUB_DUMMY_PASSWORD=x y\n")
    problems = load_env_file(str(env_file))
    assert os.environ["GPUHUB_DUMMY_PASSWORD"] == "x y"  # read as systemd reads it
    d = doctor.Doctor(doctor.target_from_env(ME, env_file_problems=problems))
    d.check_settings()
    (warning,) = d.results
    assert warning.status == WARN and "line 3 (GPUHUB_DUMMY_PASSWORD)" in warning.detail
    assert "x y" not in warning.detail + warning.fix and "production.env" in warning.fix


def test_a_profile_image_without_the_busy_kernel_extension_is_named(tmp_path):
    # Without gpuhub_activity a cell that computes silently looks idle: the culler may stop it.
    class Container:
        def __init__(self, image):
            self.image = image

        def start(self):
            pass

        def wait(self, timeout):
            return {"StatusCode": 0 if self.image == "ours" else 1}

        def remove(self, force):
            pass

    class Images:
        class images:
            @staticmethod
            def get(name):
                return types.SimpleNamespace(labels={})

        class containers:
            made = []

            @classmethod
            def create(cls, image, **kwargs):
                cls.made.append(kwargs)
                return Container(image)

    c = Config()
    c.GPUDockerSpawner.profiles = [{"slug": "a", "display_name": "A", "image": "ours", "gpus": 0},
                                   {"slug": "b", "display_name": "B", "image": "theirs", "gpus": 0}]
    d = doctor.Doctor(doctor.Target(c, tmp_path, ME))
    d.docker = Images()
    d.check_images()
    busy = {r.check: r for r in d.results if r.check.endswith("busy kernels")}
    assert busy["image ours: busy kernels"].status == doctor.OK
    assert busy["image theirs: busy kernels"].status == doctor.WARN
    assert "culler may stop it" in busy["image theirs: busy kernels"].detail
    # The look inside is a locked-down container: no network, no capabilities, not root.
    made = Images.containers.made[0]
    assert made["network_mode"] == "none" and made["cap_drop"] == ["ALL"] and made["user"] != "0"
