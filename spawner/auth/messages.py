"""What a refused login says, and the errors that carry it.

The login form's texts (MSG_*) and the three exceptions the login flow raises live
here, apart from the flow, so tests and the hub's pages name one source for them.
"""

from __future__ import annotations

from dataclasses import dataclass

# What the person at the login form reads.
MSG_NO_NAME = "Enter your username."
MSG_BAD_NAME = (
    "That is not a valid username. Use your directory account name "
    "(letters, digits, '.', '_' or '-')."
)
MSG_LONG_NAME = "That username is too long: usernames have at most {limit} characters."
MSG_NO_PASSWORD = "Enter your password."
MSG_ACCOUNT = {
    "disabled": "Your directory account is disabled. Ask your IT administrator to enable it.",
    "locked": (
        "Your directory account is locked after too many failed logins. Wait until it "
        "unlocks, or ask your IT administrator to unlock it."
    ),
    "password_expired": (
        "Your directory password has expired or must be changed. Change it, then log in again."
    ),
    "account_expired": "Your directory account has expired. Ask your IT administrator.",
    "restricted": "Your directory account may not log in from here or at this time.",
}
MSG_UNAVAILABLE = (
    "The hub cannot reach the login directory right now. Try again in a few minutes; "
    "if it keeps failing, tell your administrator."
)
MSG_MISCONFIGURED = (
    "The hub cannot check logins because its directory settings need attention. "
    "Tell your administrator."
)
MSG_NOT_ALLOWED = (
    "Your account is valid, but it is not in a group that may use this hub. "
    "Ask your administrator for access."
)


# The deployment setting (spawner/settings/directory.py) behind each DirectoryAuthenticator
# trait: what an admin edits, so what messages about a running directory name.
SETTING = {
    "server_address": "GPUHUB_DIRECTORY_SERVER",
    "server_port": "GPUHUB_DIRECTORY_PORT",
    "tls_strategy": "GPUHUB_DIRECTORY_TLS",
    "tls_ca_file": "GPUHUB_DIRECTORY_CA_FILE",
    "tls_kwargs": "GPUHUB_DIRECTORY_TLS_SERVER_NAME",
    "lookup_dn_search_user": "GPUHUB_DIRECTORY_BIND_DN",
    "lookup_dn_search_password": "GPUHUB_DIRECTORY_BIND_PASSWORD_FILE",
    "user_search_base": "GPUHUB_DIRECTORY_USER_BASE",
    "group_search_base": "GPUHUB_DIRECTORY_GROUP_BASE",
    "allowed_groups": "GPUHUB_DIRECTORY_ALLOWED_GROUPS",
    "admin_groups": "GPUHUB_DIRECTORY_ADMIN_GROUPS",
}


class DirectoryConfigError(ValueError):
    """The authenticator's configuration cannot work; the message says which setting."""


@dataclass
class LoginRefused(Exception):
    """A login is refused.  `log` is for the hub's log, `message` for the login form.

    `message=None` leaves JupyterHub's generic "Invalid username or password".
    """

    log: str
    message: str | None = None
    status: int = 403


class DirectoryUnavailable(Exception):
    """The directory could not be reached or did not answer in time."""


def loggable(name: str) -> str:
    """A login name fit for the log."""
    # Like JupyterHub: never the whole of a long input (it may be a pasted secret).
    return repr(name) if len(name) <= 32 else f"{name[:16]!r}...({len(name)} chars)"
