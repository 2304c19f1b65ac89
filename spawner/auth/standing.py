"""Whether an account may log in now, without its password: for logins proven another way
(an SSH key the person registered, a hub API token).

The same directory work as a password login (login.py), by the lookup account: the entry
found, its state (disabled, locked, expired), `search_filter`, the groups; only the user's
own bind is left out.  The caller applies `allowed_groups` as the login form does
(DirectoryAuthenticator.check_allowed).  Needs `lookup_dn` (a service account).
"""

from __future__ import annotations

from .login import DirectoryLogin
from .messages import LoginRefused


class StandingCheck(DirectoryLogin):
    """DirectoryLogin.run, minus the password: the auth model of an account in good standing."""

    def check_input(self, login: str, password: str | None) -> None:
        super().check_input(login, "-")  # the name's checks; there is no password to check

    def bind_user(self, dn: str, password: str):
        return None  # proven by the caller; the lookup account reads everything else

    def run(self, login: str, password: str | None = None) -> dict:
        if not self.a.lookup_dn:
            raise LoginRefused("an account's standing needs lookup_dn (a service account)")
        return super().run(login, "-")
