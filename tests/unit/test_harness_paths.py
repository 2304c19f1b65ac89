"""The harness keeps what it makes inside the checkout it runs from."""

from pathlib import Path

from devservices.ldap.common import repo_root

REPO = Path(__file__).resolve().parents[2]


def test_the_directories_cache_lives_in_the_repository_not_beside_it():
    # It was one folder too high: the Samba AD provision cache went to the checkout's parent,
    # shared by every clone there and surviving the checkout (a "fresh" run reused it).
    assert repo_root() == REPO
    assert (repo_root() / "pyproject.toml").is_file()
