"""The documentation's promises: a short README with the two-command quick start, a site that
builds without a warning, references generated from the code, and snippets that run."""

from __future__ import annotations

import posixpath
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import cli_reference, config_reference, module_map, snippets

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_readme_starts_with_the_two_command_quick_start_and_stays_short():
    head = README[:README.index("---")]
    assert "## Quick start" in head
    assert re.findall(r"^make (\w+)", head, flags=re.M) == ["demo", "test"]
    assert len(README.splitlines()) <= 150, "the README links into docs/; put the details there"


def test_configuration_reference_lists_every_option_with_its_current_default():
    assert config_reference.in_page() == config_reference.reference(), \
        "run: .venv/bin/python tests/harness/config_reference.py --write"


def test_every_gpuhub_setting_is_in_the_configuration_reference():
    # The settings read from the environment; culler.py, pool_service.py and pool_jobs.py write the
    # hub's config and hand variables of their own (GPUHUB_JOBS_URL, ...) to the processes it starts.
    handing_over = {"culler.py", "pool_service.py", "pool_jobs.py"}
    source = "".join(p.read_text() for p in sorted((REPO / "spawner" / "settings").glob("*.py"))
                     if p.name not in handing_over)
    names = set(re.findall(r'"(GPUHUB_[A-Z0-9_]+)"', source))
    page = (REPO / "docs" / "reference" / "configuration.md").read_text()
    missing = sorted(n for n in names if f"`{n}`" not in page)
    assert not missing, f"GPUHUB settings missing from docs/reference/configuration.md: {missing}"


def test_command_reference_is_generated_from_the_parsers():
    assert cli_reference.in_page() == cli_reference.reference(), \
        "run: .venv/bin/python tests/harness/cli_reference.py --write"


def test_module_map_lists_every_module_by_its_docstring():
    undocumented = [p.relative_to(REPO).as_posix() for p in module_map.modules() if not module_map.summary(p)]
    assert not undocumented, f"modules without a docstring: {undocumented}"
    assert module_map.in_page() == module_map.reference(), \
        "run: .venv/bin/python tests/harness/module_map.py --write"


def _implementation_words(text: str) -> list[str]:
    """What a notebook user's page must not need: module paths, the code's configurable
    classes (c.GPUPool...), the ledger's schema, the reconciler (issue 36, item 2)."""
    classes = {name for _, name in config_reference.CLASSES}
    found = re.findall(r"\b(?:spawner|hub_config|devservices|images/jupyter)[./][\w./]+", text)
    found += re.findall(r"\bc\.\w+\.\w+", text)
    found += [w for w in re.findall(r"\b[A-Z]\w+\b", text) if w in classes]
    found += re.findall(r"\b(?:schema|reconciler|\w+/[\w/]+\.py)\b", text, flags=re.I)
    return found


def test_the_users_pages_speak_to_a_notebook_user_not_an_engineer():
    pages = sorted((REPO / "docs" / "users").glob("*.md"))
    assert len(pages) >= 8
    found = {p.name: _implementation_words(p.read_text()) for p in pages}
    assert not {k: v for k, v in found.items() if v}, \
        f"implementation words in docs/users/ (move them to how-it-works/ or reference/): {found}"
    # the check itself sees what it must
    assert _implementation_words("see spawner/engines/common/containers.py and c.GPUPool.booking_notice, JobLimits")


def _build(source: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
                           str(source), str(out)], capture_output=True, text=True, timeout=300)


# The site's top-level navigation: one tab per audience (issue 36, item 3), as docs/index.md's table.
AUDIENCES = {"Using it": "users/index.html", "Running it": "admins/index.html",
             "Reference": "reference/index.html", "How it works": "how-it-works/index.html",
             "Contributing": "contributing/index.html"}


def top_navigation(html: Path, page: str) -> dict[str, str]:
    """The header's navigation of a built page (pydata-sphinx-theme's navbar): title -> the page
    each link leads to, relative to the site's root."""
    nav = re.search(r'<ul class="bd-navbar-elements navbar-nav">(.*?)</ul>', (html / page).read_text(), flags=re.S)
    if not nav:
        return {}
    links = re.findall(r'<a class="nav-link[^"]*" href="([^"]+)">(.*?)</a>', nav.group(1), flags=re.S)
    return {re.sub(r"\s+", " ", title).strip(): posixpath.normpath(posixpath.join(posixpath.dirname(page), href))
            for href, title in links}


@pytest.mark.docs_cli
def test_the_site_builds_without_a_warning(tmp_path):
    proc = _build(REPO / "docs", tmp_path / "html")
    assert proc.returncode == 0, proc.stderr[-4000:]
    html = tmp_path / "html"
    assert (html / "users" / "jobs.html").exists()
    # The ecosystem's look (pydata-sphinx-theme, as JupyterHub's docs), with its search page and index.
    search = (html / "search.html").read_text()
    assert "pydata-sphinx-theme.css" in search and 'id="search-results"' in search
    assert "searchindex.js" in search and (html / "searchindex.js").stat().st_size > 10_000
    # Every audience a tab of the header, on the front page and on a page deep down.
    for page in ("index.html", "users/jobs.html", "reference/cli.html"):
        nav = top_navigation(html, page)
        assert nav.items() >= AUDIENCES.items(), (page, nav)


@pytest.mark.docs_cli
def test_a_broken_internal_link_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs, ignore=shutil.ignore_patterns("_build"))
    shutil.copy(REPO / "CHANGELOG.md", tmp_path / "CHANGELOG.md")
    page = docs / "users" / "jobs.md"
    page.write_text(page.read_text() + "\nSee [the queue](pool-page.md#no-such-heading).\n")
    proc = _build(docs, tmp_path / "html")
    assert proc.returncode != 0
    assert "no-such-heading" in proc.stderr


def _failing_imports(statements: list[str]) -> dict[str, str]:
    """Each import statement that fails in a fresh interpreter, with its error."""
    script = (
        "import sys\n"
        "for s in sys.argv[1:]:\n"
        "    try:\n"
        "        exec(s, {})\n"
        "    except Exception as e:\n"
        "        print(s + '\\t' + type(e).__name__ + ': ' + str(e).splitlines()[0])\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, *statements], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("\t", 1) for line in proc.stdout.splitlines())


@pytest.mark.docs_cli
def test_every_python_snippet_imports_what_it_names():
    where: dict[str, str] = {}
    for doc in snippets.documents():
        for snip in snippets.snippets(doc):
            if snip.language in ("python", "py"):
                for statement in snippets.python_imports(snip.code):
                    where.setdefault(statement, f"{snip.page}:{snip.line}")
    assert where, "the docs show Python snippets; none were found"
    failing = _failing_imports(sorted(where))
    assert not failing, "\n".join(f"{where[s]}: {s} -> {err}" for s, err in failing.items())


@pytest.mark.docs_cli
def test_the_import_check_catches_a_moved_name():
    # An old Python API line: the module inventory_kinds became the package spawner.inventory.
    statements = snippets.python_imports("from spawner.inventory_kinds import inventory_from_config\n"
                                         "pool = await make_pool()\n")
    assert statements == ["from spawner.inventory_kinds import inventory_from_config"]
    assert statements[0] in _failing_imports(statements)


def _parse(argv: list[str]) -> str | None:
    """None when `argv` parses with its command's own parser, else the error."""
    name = snippets.checked_command(argv)
    if name == "make":
        targets = [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
        unknown = sorted(set(targets) - snippets.makefile_targets())
        return f"no make target {unknown}" if unknown else None
    parser = (cli_reference.gpu_pool_parser if name == "gpu-pool" else cli_reference.gpu_job_parser)()
    try:
        parser.parse_args(argv[1:])
    except SystemExit as e:
        return None if e.code == 0 else f"exit {e.code}"
    except Exception as e:  # gpu-pool's parser raises its one-line CLIError
        return str(e)
    return None


def test_every_command_line_the_docs_show_parses(capsys):
    checked, failures = 0, []
    for doc in snippets.documents():
        for snip in snippets.snippets(doc):
            if snip.language not in snippets.SHELL:
                continue
            for argv in snippets.shell_commands(snip.code):
                if snippets.checked_command(argv):
                    checked += 1
                    if error := _parse(argv):
                        failures.append(f"{snip.page}:{snip.line}: {' '.join(argv)} -> {error}")
    capsys.readouterr()
    assert checked >= 10, f"only {checked} command lines found in the docs"
    assert not failures, "\n".join(failures)


def test_the_command_line_check_catches_a_flag_that_does_not_exist():
    assert _parse(["gpu-pool", "history", "--users", "alice"]) is not None
    assert _parse(["gpu-job", "logs", "--tail", "12"]) is not None
    assert _parse(["make", "no-such-target"]) is not None
    assert _parse(["gpu-pool", "history", "--user", "alice"]) is None


@pytest.mark.docs_cli
@pytest.mark.parametrize("argv", [["gpu-pool", "--help"], ["gpu-pool", "doctor", "--help"]])
def test_help_runs_offline(argv):
    proc = subprocess.run([str(Path(sys.executable).parent / argv[0]), *argv[1:]], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "usage: gpu-pool" in proc.stdout
