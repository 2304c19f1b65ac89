"""Shared pytest set-up.

Fixtures that start real services live in tests/fixtures/, one module per
service, and are loaded here as plugins.  Every service fixture is
session-scoped: one dockerd, one hub build, one directory per test session.
"""

import os

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
