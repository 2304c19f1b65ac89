"""Who exists in the test directories: one list for OpenLDAP and Samba AD alike.

Tests read these objects (through the `Directory` a fixture yields) instead of
repeating names, passwords and group lists as literals.  The passwords are test
data for throw-away directories on 127.0.0.1; they meet AD's complexity rules.

Group nesting (a -> b means "a is a member of b"):

    alice -> ml-team -> gpu-users        (nested membership)
    carol -> hub-admins -> gpu-users     (nested membership; admins)
    carol -> script-runners              (the demo's action-script runners)
    bob   -> gpu-users                   (direct)
    alice, bob -> research               (posixGroup with memberUid in OpenLDAP)
    frank                                (in no group, no uid/gid numbers)
    dave  (AD only: disabled)  erin (AD only: locked by failed logins)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SeedUser:
    name: str
    password: str
    given_name: str
    surname: str
    uid_number: int | None = None
    gid_number: int | None = None
    # Only Active Directory knows disabled and locked accounts.
    disabled: bool = False
    locked: bool = False

    @property
    def ad_only(self) -> bool:
        return self.disabled or self.locked


@dataclass(frozen=True)
class SeedGroup:
    name: str
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()  # member groups (nesting)
    gid_number: int | None = None
    # OpenLDAP: a posixGroup listing memberUid instead of a groupOfNames listing
    # member DNs.  posixGroups cannot nest, so `groups` must be empty then.
    posix: bool = False
    description: str = field(default="", compare=False)


USERS: tuple[SeedUser, ...] = (
    SeedUser("alice", "Alice-Pass-1", "Alice", "Doe", 20001, 30001),
    # bob's password is full of LDAP filter metacharacters and spaces: a correct
    # authenticator passes passwords through untouched.
    SeedUser("bob", "B0b (x)*\\ pw", "Bob", "Roe", 20002, 30001),
    SeedUser("carol", "Carol-Pass-3", "Carol", "Poe", 20003, 30003),
    SeedUser("frank", "Frank-Pass-6", "Frank", "Loe"),
    SeedUser("dave", "Dave-Pass-4", "Dave", "Moe", 20004, 30001, disabled=True),
    SeedUser("erin", "Erin-Pass-5", "Erin", "Noe", 20005, 30001, locked=True),
)

GROUPS: tuple[SeedGroup, ...] = (
    SeedGroup("ml-team", users=("alice",), description="Machine-learning team"),
    SeedGroup("hub-admins", users=("carol",), gid_number=30003, description="Hub administrators"),
    SeedGroup(
        "gpu-users",
        users=("bob", "dave", "erin"),
        groups=("ml-team", "hub-admins"),
        gid_number=30001,
        description="May use the GPU hub",
    ),
    SeedGroup("research", users=("alice", "bob"), gid_number=30010, posix=True),
    SeedGroup("script-runners", users=("carol",),
              description="May run action scripts in everyone's servers (GPUHUB_DIRECTORY_EXEC_GROUPS)"),
)

# Roles the tests give these groups in the authenticator's configuration.
ALLOWED_GROUP = "gpu-users"
ADMIN_GROUP = "hub-admins"
# The demo's runners of action scripts (custom:gpu-pool:exec), by GPUHUB_DIRECTORY_EXEC_GROUPS.
EXEC_GROUP = "script-runners"

# The account the hub uses to look users up (read-only).
SERVICE_ACCOUNT = SeedUser("svc-hub", "Svc-Hub-Pass-9", "Hub", "Service")

# Failed binds that lock an AD account; the locked user gets exactly this many.
AD_LOCKOUT_THRESHOLD = 5


def users_for(kind: str) -> dict[str, SeedUser]:
    return {u.name: u for u in USERS if kind == "active_directory" or not u.ad_only}


def groups_of(user: str, kind: str) -> set[str]:
    """Every group `user` belongs to in directory `kind`, nested membership included."""
    present = users_for(kind)
    if user not in present:
        return set()
    by_name = {g.name: g for g in GROUPS}
    found = {g.name for g in GROUPS if user in g.users}
    frontier = set(found)
    while frontier:
        frontier = {g.name for g in GROUPS if set(g.groups) & frontier} - found
        found |= frontier
    return {name for name in found if name in by_name}
