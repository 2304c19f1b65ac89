"""Shared pytest set-up.

Fixtures that start real services live in tests/fixtures/, one module per
service, and are loaded here as plugins.  Every service fixture is
session-scoped: one dockerd, one hub build, one directory per test session.
"""

pytest_plugins = [
    "tests.fixtures.services",
    "tests.fixtures.docker",
    "tests.fixtures.hub",
    "tests.fixtures.postgres",
    "tests.fixtures.directory",
    "tests.fixtures.images",
    "tests.fixtures.browser",
]
