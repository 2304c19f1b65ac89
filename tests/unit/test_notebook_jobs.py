"""Notebook jobs: what a submission may name (paths inside the home only, symlinks followed
within it), bounded parameters, and the command papermill runs; pure, plus a real directory
standing for a home."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from spawner.jobs import notebook as nb
from spawner.jobs.request import BadJob, check_submission
from spawner.profiles import DEFAULT_PROFILES, load_profiles

PROFILES = load_profiles(DEFAULT_PROFILES)


@pytest.mark.parametrize("path, says", [
    ("../bob/train.ipynb", "'..' is not allowed"), ("a/../../x.ipynb", "'..' is not allowed"),
    ("/home/jovyan/train.ipynb", "relative to it"), ("~/train.ipynb", "relative to it"),
    ("train.py", "ending in .ipynb"), (".ipynb", "ending in .ipynb"), ("dir/", "ending in .ipynb"),
    ("a\nb.ipynb", "control characters"), ("x" * 2000 + ".ipynb", "too long"), ("", "must be the path"),
    (7, "must be the path"), (["train.ipynb"], "must be the path"),
])
def test_a_notebook_path_outside_the_home_is_refused(path, says):
    with pytest.raises(BadJob) as refused:
        nb.check_notebook(path)
    assert refused.value.status == 400 and says in str(refused.value)


def test_a_notebook_path_inside_the_home_is_normalised():
    assert nb.check_notebook("./work//train.ipynb") == "work/train.ipynb"
    assert nb.workdir_of("work/train.ipynb") == "work" and nb.workdir_of("train.ipynb") == ""
    assert nb.outputs("work/train.ipynb", 12) == {"output": "work/train.job-12.ipynb",
                                                 "output_html": "work/train.job-12.html"}


@pytest.mark.parametrize("value, says", [
    ([1, 2], "JSON object"), ({"not a name": 1}, "not a Python name"), ({"x": "y" * 20000}, "max_parameters_bytes"),
    ({f"p{i}": i for i in range(101)}, "at most 100"),
])
def test_parameters_are_bounded(value, says):
    with pytest.raises(BadJob) as refused:
        nb.check_parameters(value, 16 * 1024)
    assert says in str(refused.value)


def test_a_notebook_submission_runs_papermill_with_its_parameters_and_nothing_else():
    sub = check_submission({"profile": "tf-cpu", "notebook": "work/train.ipynb", "parameters": {"epochs": 5}},
                           PROFILES, [], 3600)
    assert (sub.notebook, sub.workdir, sub.parameters) == ("work/train.ipynb", "work", {"epochs": 5})
    assert sub.command[:3] == ("/bin/sh", "-c", nb.NOTEBOOK_SCRIPT)
    assert sub.command[4:] == ("train.ipynb", '{"epochs": 5}')  # arguments of the script, never its text
    for body, says in (({"notebook": "a.ipynb", "command": ["x"]}, "not both"),
                       ({"notebook": "a.ipynb", "workdir": "w"}, "not both"),
                       ({"notebook": "a.ipynb", "workers": 2}, "one container"),
                       ({"command": ["x"], "parameters": {"a": 1}}, "give 'notebook' too"),
                       ({"notebook": "a.ipynb", "parameters": {"a": "b" * 100}}, "JobLimits.max_parameters_bytes")):
        with pytest.raises(BadJob) as refused:
            check_submission({"profile": "tf-cpu", **body}, PROFILES, [], 3600, 4, max_parameters_bytes=50)
        assert says in str(refused.value), (body, str(refused.value))


@pytest.fixture
def home(tmp_path):
    """A home as the service sees a local volume's directory; / stands for the host's root."""
    root = tmp_path / "_data"
    (root / "work").mkdir(parents=True)
    (root / "work" / "train.ipynb").write_text("{}")
    (tmp_path / "secret.ipynb").write_text("{}")  # outside the home
    return root


@pytest.mark.parametrize("link, target, path", [
    ("out", "..", "out/secret.ipynb"),  # a relative link up and out
    ("etc", "/etc", "etc/passwd.ipynb"),  # an absolute link, outside the mount point
    ("sneaky.ipynb", "../secret.ipynb", "sneaky.ipynb"),  # the notebook itself a link out
    ("deep", "work/../..", "deep/secret.ipynb"),
])
def test_a_symlink_out_of_the_home_is_refused(home, link, target, path):
    os.symlink(target, home / link)
    with pytest.raises(BadJob) as refused:
        nb.resolve_in_home(str(home), "/home/jovyan", path)
    assert "leads out of your home" in str(refused.value) and refused.value.status == 400


def test_a_symlink_inside_the_home_is_followed(home):
    os.symlink("work", home / "w")  # relative, inside
    os.symlink("/home/jovyan/work/train.ipynb", home / "abs.ipynb")  # absolute, as the container sees it
    nb.resolve_in_home(str(home), "/home/jovyan", "work/train.ipynb")
    nb.resolve_in_home(str(home), "/home/jovyan", "w/train.ipynb")
    nb.resolve_in_home(str(home), "/home/jovyan", "abs.ipynb")
    os.symlink("loop.ipynb", home / "loop.ipynb")
    for missing, says in (("nope.ipynb", "no notebook"), ("loop.ipynb", "too many symlinks"),
                          ("work", "no notebook")):
        with pytest.raises(BadJob) as refused:
            nb.resolve_in_home(str(home), "/home/jovyan", missing)
        assert says in str(refused.value) or "not a file" in str(refused.value), (missing, str(refused.value))


def test_the_containers_own_check_refuses_a_link_out_before_papermill(tmp_path):
    """The script as the container runs it (a fake papermill and jupyter on PATH record that they ran)."""
    home = tmp_path / "home"
    (home / "work").mkdir(parents=True)
    (home / "work" / "train.ipynb").write_text("{}")
    (tmp_path / "outside.ipynb").write_text("{}")
    os.symlink(str(tmp_path / "outside.ipynb"), home / "work" / "evil.ipynb")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("papermill", "jupyter"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{tmp_path}/ran"\n')
        (bin_dir / tool).chmod(0o755)
    env = {"HOME": str(home), "GPUHUB_JOB_ID": "7", "PATH": f"{bin_dir}:/usr/bin:/bin"}

    def run(name):
        argv = nb.command(f"work/{name}", {"epochs": 5})
        return subprocess.run(list(argv), cwd=home / "work", env=env, capture_output=True, text=True)

    refused = run("evil.ipynb")
    assert refused.returncode == 2 and "leads out of your home" in refused.stderr
    assert not (tmp_path / "ran").exists()
    done = run("train.ipynb")
    assert done.returncode == 0, done.stderr
    ran = (tmp_path / "ran").read_text().splitlines()
    assert ran[0] == f"papermill --log-output --no-progress-bar -y {json.dumps({'epochs': 5})} ./train.ipynb " \
                     "./train.job-7.ipynb"
    assert ran[1] == "jupyter nbconvert --to html --log-level WARN ./train.job-7.ipynb"
