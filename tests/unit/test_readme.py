"""The README's promises: a two-command quick start first, and a complete configuration reference."""

import re
from pathlib import Path

from tests.harness.config_reference import BEGIN, END, reference

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_starts_with_the_two_command_quick_start():
    head = README[:README.index("---")]
    assert "## Quick start" in head
    commands = re.findall(r"^make (\w+)", head, flags=re.M)
    assert commands == ["demo", "test"]


def test_configuration_reference_lists_every_option_with_its_current_default():
    block = README[README.index(BEGIN):README.index(END) + len(END)]
    assert block == reference(), "run: .venv/bin/python tests/harness/config_reference.py --write README.md"


def test_every_gpuhub_setting_is_documented():
    package = Path(__file__).resolve().parents[2] / "spawner" / "settings"
    source = "".join(p.read_text() for p in sorted(package.glob("*.py")))
    names = set(re.findall(r'"(GPUHUB_[A-Z0-9_]+)"', source))
    missing = sorted(n for n in names if f"`{n}`" not in README)
    assert not missing, f"GPUHUB settings missing from README: {missing}"
