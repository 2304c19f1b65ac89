"""The settings file means one thing to systemd (EnvironmentFile=) and to a shell (`set -a; . FILE`).

systemd's rules are those of spawner.settings.envfile (which `gpu-pool --env-file` uses),
checked here against the cases systemd.exec(5) describes; the shipped example is then read
both ways and must give the same values, every one of them whole.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from spawner.settings.envfile import parse_env_file, read_env_file, shell_problems

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "hub_config" / "examples" / "production.env"


def read_by_shell(path: Path) -> tuple[dict[str, str], str]:
    """What `set -a; . FILE; set +a` exports, in a clean environment, and what the shell said."""
    proc = subprocess.run(
        ["bash", "-c", 'set -a; . "$1"; set +a; env -0', "_", str(path)],
        env={"PATH": os.environ["PATH"]}, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    env = dict(item.split("=", 1) for item in proc.stdout.decode().split("\0") if "=" in item)
    return env, proc.stderr.decode()


@pytest.mark.parametrize("text, expected", [
    ("A=1\nB = two\n", {"A": "1", "B": "two"}),  # whitespace around the key and before the value
    ("A=one two   \n", {"A": "one two"}),  # unquoted: whole line, trailing whitespace dropped
    ("A='x y $HOME \\n'\n", {"A": "x y $HOME \\n"}),  # single quotes: literal
    ('A="a \\"b\\" \\$c \\\\ \\n"\n', {"A": 'a "b" $c \\ \\n'}),  # double: only \" \\ \` \$ unescape
    ("# c\n; c\n\nA=1 # not a comment\n", {"A": "1 # not a comment"}),
    ("A=a\\\nb\n", {"A": "ab"}),  # a backslash at the line's end continues the value
    ("A=$B\n", {"A": "$B"}),  # no expansion
    ("A=1\nA=2\n", {"A": "2"}),  # the last one wins
    ("A=\nB=x", {"A": "", "B": "x"}),  # empty, and no newline at the end
    ("1BAD=x\nGOOD=y\n", {"GOOD": "y"}),  # keys systemd would drop
])
def test_systemds_environment_file_rules(text, expected):
    assert parse_env_file(text) == expected


def test_the_example_settings_read_the_same_by_systemd_and_by_a_shell(tmp_path):
    by_systemd = parse_env_file(EXAMPLE.read_text())
    by_shell, said = read_by_shell(EXAMPLE)
    assert said == ""  # no "command not found" from a value with a space
    assert {k: by_shell.get(k) for k in by_systemd} == by_systemd
    # The values with spaces arrive whole (the admin group, the service account's DN).
    assert by_systemd["GPUHUB_DIRECTORY_ADMIN_GROUPS"] == "JupyterHub Admins"
    assert "OU=Service Accounts," in by_systemd["GPUHUB_DIRECTORY_BIND_DN"]
    assert shell_problems(EXAMPLE.read_text()) == []


def test_lines_that_a_shell_reads_differently_are_named_by_key_only(tmp_path):
    path = tmp_path / "gpuhub.env"
    path.write_text("GPUHUB_DIRECTORY_ADMIN_GROUPS=JupyterHub Admins\nGPUHUB_X='ok value'\n"
                    "GPUHUB_DIRECTORY_BIND_PASSWORD=s3cret;x\nGPUHUB_Y = 1\n")
    values, problems = read_env_file(path)
    assert values["GPUHUB_DIRECTORY_ADMIN_GROUPS"] == "JupyterHub Admins"
    assert [(n, key) for n, key, _ in problems] == [
        (1, "GPUHUB_DIRECTORY_ADMIN_GROUPS"), (3, "GPUHUB_DIRECTORY_BIND_PASSWORD"), (4, "GPUHUB_Y ")]
    assert "single quotes" in problems[0][2]
    assert "s3cret" not in repr(problems)
    # ...and a shell does read them differently:
    by_shell, said = read_by_shell(path)
    assert by_shell.get("GPUHUB_DIRECTORY_ADMIN_GROUPS") != values["GPUHUB_DIRECTORY_ADMIN_GROUPS"]
    assert "command not found" in said


def test_every_port_the_hub_opens_is_in_the_example_with_its_default():
    """A port the admin never saw cannot clash unseen: each *_port setting, and the public
    address, is in the example with the default the hub would use without it."""
    from dataclasses import fields

    from spawner.settings import Settings
    from spawner.settings.hub import standing_default

    example = parse_env_file(EXAMPLE.read_text())
    ports = {f"GPUHUB_{f.name.upper()}": str(standing_default(f.name))
             for f in fields(Settings) if f.name.endswith("_port")}
    assert ports.keys() >= {"GPUHUB_HUB_PORT", "GPUHUB_PROXY_API_PORT", "GPUHUB_POOL_PAGE_PORT"}
    assert {name: example.get(name) for name in ports} == ports
    assert example["GPUHUB_BIND_URL"] == Settings.bind_url
