"""Notebook jobs: a notebook in the user's home run with papermill, its parameters injected.

The executed notebook and an HTML copy (nbconvert) are written next to the input, named
after the job: `train.ipynb` -> `train.job-12.ipynb` and `train.job-12.html`.  The job's
command is built here, never from what a user typed into a shell: the notebook's name and
the parameters (JSON) are arguments of a fixed script.

A notebook path is relative to the home, with no `..`; `resolve_in_home` follows its
symlinks inside a local copy of the home (the Docker volume's directory on this host) and
refuses one that leads out of it; the container checks the same again before papermill
runs (a schedule fires later, and the home may have changed).  Pure, except
`resolve_in_home`, which reads the directory it is given.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import PurePosixPath
from typing import Any

from ..pool.ledger.job_records import notebook_outputs as outputs  # noqa: F401 (named here too)
from .refusal import MAX_PATH, BadJob, shown

SUFFIX = ".ipynb"
MAX_PARAMETERS = 100  # names; their size is bounded by JobLimits.max_parameters_bytes
MAX_NAME = 100
SYMLINK_HOPS = 40  # as Linux's own limit on symlinks followed in one lookup

# Runs in the notebook's directory (the job's workdir): $1 is the notebook's name there, $2 the
# parameters as JSON (YAML's flow syntax reads JSON), $HOME the home, $GPUHUB_JOB_ID the job.
NOTEBOOK_SCRIPT = (
    'nb="$1"; real=$(realpath -e -- "$nb" 2>/dev/null) || '
    '{ echo "gpu-job: there is no notebook $nb" >&2; exit 2; }; '
    'case "$real" in "$HOME"/*) ;; *) echo "gpu-job: $nb leads out of your home" >&2; exit 2;; esac; '
    'out="${nb%.ipynb}.job-$GPUHUB_JOB_ID"; '
    'papermill --log-output --no-progress-bar -y "$2" "./$nb" "./$out.ipynb" || exit $?; '
    'jupyter nbconvert --to html --log-level WARN "./$out.ipynb"'
)


def check_notebook(value: Any) -> str:
    """The notebook's path relative to the home, normalised; BadJob (400) for anything else."""
    if not isinstance(value, str) or not value:
        raise BadJob("'notebook' must be the path of a notebook in your home, e.g. \"train.ipynb\"")
    if len(value) > MAX_PATH or any(ord(ch) < 32 or ch == "\x7f" for ch in value):
        raise BadJob("'notebook' is too long or contains control characters")
    if value.startswith("/") or value.startswith("~"):
        raise BadJob(f"'notebook' must be a path inside your home, relative to it, not {shown(value)!r}")
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadJob("'notebook' must stay inside your home ('..' is not allowed)")
    if not parts or not parts[-1].endswith(SUFFIX) or parts[-1] == SUFFIX:
        raise BadJob(f"'notebook' must name a notebook file ending in {SUFFIX}, not {shown(value)!r}")
    return "/".join(parts)


def check_parameters(value: Any, max_bytes: int) -> dict:
    """Papermill's parameters: {name: JSON value}; at most `max_bytes` as JSON (JobLimits)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadJob("'parameters' must be a JSON object of names and values, e.g. {\"epochs\": 5}")
    if len(value) > MAX_PARAMETERS:
        raise BadJob(f"'parameters' has {len(value)} names; at most {MAX_PARAMETERS} are allowed")
    for name in value:
        if not (isinstance(name, str) and name.isidentifier() and len(name) <= MAX_NAME):
            raise BadJob(f"parameter name {shown(name)!r} is not a Python name (letters, digits, _)")
    size = len(json.dumps(value).encode())
    if size > max_bytes:
        raise BadJob(f"'parameters' are {size} bytes as JSON; at most {max_bytes} are allowed "
                     "(JobLimits.max_parameters_bytes)")
    return dict(value)


def workdir_of(notebook: str) -> str:
    """The notebook's directory, relative to the home ("" for the home itself)."""
    parent = str(PurePosixPath(notebook).parent)
    return "" if parent == "." else parent


def command(notebook: str, parameters: dict) -> tuple[str, ...]:
    """The job's command: the script above with the notebook's name and the parameters."""
    return ("/bin/sh", "-c", NOTEBOOK_SCRIPT, "gpu-job-notebook", PurePosixPath(notebook).name,
            json.dumps(parameters, sort_keys=True))


def resolve_in_home(home: str, mount_point: str, notebook: str) -> None:
    """Refuse (BadJob 400) a notebook that is missing, not a file, or whose path leads out of
    the home through a symlink.  `home` is the home's directory as this process sees it;
    `mount_point` where the container sees it (an absolute link target inside it is the
    home's).  Each component is looked at with lstat and links are followed by hand, within
    `home`: nothing outside it is ever opened or trusted."""
    mount = PurePosixPath(mount_point)
    todo = list(PurePosixPath(notebook).parts)
    done: list[str] = []  # the resolved path so far, inside the home
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                raise BadJob(f"'notebook' {shown(notebook)!r} leads out of your home (through a symlink)")
            done.pop()
            continue
        here = os.path.join(home, *done, part)
        try:
            info = os.lstat(here)
        except OSError:
            raise BadJob(f"There is no notebook {shown(notebook)!r} in your home") from None
        if stat.S_ISLNK(info.st_mode):
            hops += 1
            if hops > SYMLINK_HOPS:
                raise BadJob(f"'notebook' {shown(notebook)!r} has too many symlinks")
            target = PurePosixPath(os.readlink(here))
            if target.is_absolute():
                if target != mount and mount not in target.parents:
                    raise BadJob(f"'notebook' {shown(notebook)!r} leads out of your home (through a symlink)")
                done = []
                target = target.relative_to(mount)
            todo = list(target.parts) + todo
            continue
        if todo and not stat.S_ISDIR(info.st_mode):
            raise BadJob(f"There is no notebook {shown(notebook)!r} in your home")
        done.append(part)
    if not done or not stat.S_ISREG(os.stat(os.path.join(home, *done)).st_mode):
        raise BadJob(f"'notebook' {shown(notebook)!r} is not a file in your home")
