"""The admin pages (docs/admins/): they exist, link to each other, walk the install in the order
an admin goes, and say what listens where for every port the hub opens."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from spawner.settings import Settings
from spawner.settings.hub import standing_default
from tests.fixtures.install import run_install

ADMINS = Path(__file__).resolve().parents[2] / "docs" / "admins"
PAGES = ("install.md", "https.md", "backups.md", "upgrades.md", "ports.md")


def test_every_page_has_one_title_and_its_links_resolve():
    for name in PAGES:
        text = (ADMINS / name).read_text()
        assert text.startswith("# ") and len(re.findall(r"^# ", text, flags=re.M)) == 1, name
        for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", text):
            assert (ADMINS / target).is_file(), f"{name} links to {target}"


def test_the_install_page_goes_in_the_order_an_admin_does():
    headings = re.findall(r"^## (.+)$", (ADMINS / "install.md").read_text(), flags=re.M)
    words = ["Prerequisites", "code", "make install", "settings file", "directory", "HTTPS", "doctor",
             "First start"]
    positions = [next(i for i, h in enumerate(headings) if w in h) for w in words]
    assert positions == sorted(positions), headings


def test_the_doctor_command_of_the_docs_is_the_one_install_prints(tmp_path):
    printed = run_install(tmp_path / "root", "--skip-venv", "--skip-proxy", "--skip-images").stdout
    command = re.search(r"with the hub's settings: (.+)$", printed, flags=re.M).group(1)
    for name in ("install.md", "upgrades.md"):
        assert command in (ADMINS / name).read_text(), name


def test_the_ports_page_has_every_port_with_its_default_and_where_it_listens():
    text = (ADMINS / "ports.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    for f in fields(Settings):
        if f.name.endswith("_port"):
            name = f"GPUHUB_{f.name.upper()}"
            assert any(name in row and f"`{standing_default(f.name)}`" in row for row in rows), name
    assert any("GPUHUB_BIND_URL" in row and Settings.bind_url in row for row in rows)
    # The servers' door to the gpu-pool service (JupyterLab's GPU status, and the jobs API).
    jobs = next(row for row in rows if row.startswith("| the in-lab GPU status and the jobs API"))
    assert "bridge" in jobs and "GPUHUB_POOL_PAGE_PORT" in jobs and "GPUHUB_POOL_URL" in jobs
