"""Shared pytest set-up.

Fixtures that start real services live in tests/fixtures/, one module per
service, and are loaded here as plugins.  Every service fixture is
session-scoped: one dockerd, one hub build, one directory per test session.
"""

import os

import pytest

# The CUDA image downloads ~2.6 GB of wheels: its tests run only when asked for
# (`make test-cuda-image`), and are not even collected otherwise, so a CI run
# shows no skipped test.
collect_ignore = [] if os.environ.get("GPUHUB_TEST_CUDA_IMAGE") == "1" else ["integration/test_images_cuda.py"]

pytest_plugins = [
    "tests.fixtures.services",
    "tests.fixtures.docker",
    "tests.fixtures.hub",
    "tests.fixtures.postgres",
    "tests.fixtures.tcp_proxy",
    "tests.fixtures.directory",
    "tests.fixtures.images",
    "tests.fixtures.browser",
    "tests.fixtures.faults",
    "tests.fixtures.swarm",
]


# --- Running side by side (`make test`: `pytest -n 2`, see Makefile) ---
#
# A module runs whole on one worker, so its module-scoped fixtures start once.
# Modules that use a service bound to fixed ports (Samba AD listens on 389 and
# 636), or the machine's one Swarm, form one work unit, so only one worker ever starts it; a module that
# uses it without being listed here stops the run with a message (below; under xdist the
# controller shows only an INTERNALERROR about a "crashitem", so tests/unit/test_layout.py checks
# the list against the modules' sources as well).
# Long modules are handed out first (`--no-loadscope-reorder` keeps this order)
# so no worker is left alone with a long module at the end.
# (xdist's own `xdist_group` marker has no effect with pytest 9: the work units
# are named by `pytest_xdist_make_scheduler` instead.)
FIXED_PORT_UNITS = {
    "samba-ad": ("samba_ad", {"tests/integration/test_auth_directory.py", "tests/integration/test_auth_hub.py",
                              "tests/integration/test_upgrade.py", "tests/integration/test_ssh_directory_ad.py"}),
    # One Swarm per machine (the manager is the shared dockerd): its modules share one
    # session's `swarm_cluster`, on one worker.
    "swarm": ("swarm_cluster", {"tests/integration/test_swarm.py", "tests/integration/test_swarm_jobs.py",
                                "tests/integration/test_swarm_scripts.py", "tests/integration/test_ssh_swarm.py",
                                "tests/integration/test_job_clusters_swarm.py",
                                "tests/integration/test_swarm_nodes.py",
                                "tests/integration/test_swarm_stack.py",
                                "tests/integration/test_swarm_isolation.py"}),
}
LONG_MODULES_FIRST = [  # by their time in a run (longest first)
    "test_failure_paths.py", "test_swarm.py", "test_apt_install.py", "test_gpu_spawner.py", "test_jobs.py",
    "test_auth_hub.py",
    "test_culling.py", "test_ssh.py", "test_poolpage_actions.py", "test_browser.py", "test_poolpage_browser.py",
    "test_install.py", "test_tensorflow_hub.py", "test_poolpage.py", "test_reconcile.py",
]


def work_unit(nodeid: str) -> str:
    """The unit of tests that one worker runs whole: a module, or a fixed-port service's modules."""
    module = nodeid.split("::", 1)[0]
    for unit, (_fixture, modules) in FIXED_PORT_UNITS.items():
        if module in modules:
            return unit
    return module


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


def _uses(item, fixture: str) -> bool:
    if fixture in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and fixture in callspec.params.values()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        for unit, (fixture, modules) in FIXED_PORT_UNITS.items():
            if _uses(item, fixture) and module not in modules:
                raise pytest.UsageError(
                    f"{module} uses {fixture} (fixed ports): add it to FIXED_PORT_UNITS[{unit!r}] in "
                    "tests/conftest.py so that only one test worker starts it")

    def rank(item) -> int:
        name = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
        return LONG_MODULES_FIRST.index(name) if name in LONG_MODULES_FIRST else len(LONG_MODULES_FIRST)

    # Only the order in which workers are handed modules changes; a serial run keeps pytest's.
    if getattr(config.option, "numprocesses", None):
        items.sort(key=rank)  # stable: within a module, the file's order
