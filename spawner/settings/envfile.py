"""Reading the settings file (/etc/jupyterhub-gpu/gpuhub.env) as systemd's EnvironmentFile= does.

The hub's unit reads the file with systemd's rules; `gpu-pool --env-file FILE`
reads it here with the same rules, so a command run by hand sees what the hub
sees.  The rules (systemd.exec(5), "EnvironmentFile="), written out:

- one `KEY=VALUE` per line; blank lines and lines starting with `#` or `;`
  are skipped; whitespace around the key and before the value is dropped;
- an unquoted value ends at the line's end, trailing whitespace dropped, and a
  backslash takes the next character literally (at a line's end: the value
  goes on on the next line);
- `'...'` is taken literally; `"..."` too, except that a backslash before
  `"`, `\\`, `` ` `` or `$` stands for that character (before a newline: the
  value goes on), before anything else it stays;
- nothing is expanded: `$X` is the two characters `$X`.

The settings file keeps to the subset that a POSIX shell reads the same way
(`set -a; . FILE; set +a`): a value with a space, a quote or one of
`$ \\ # ; & | < > ( ) * ? [ ] ~ { }` and `` ` `` goes in single quotes, and no
value holds a single quote.  `shell_safe_problem` says where a line breaks that.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

from .parsing import SettingsError

_WHITESPACE = " \t\n\r"
_COMMENT = "#;"
_ESCAPABLE_IN_DOUBLE_QUOTES = '"\\`$'
# A key a shell and systemd both accept (systemd drops other keys with a warning).
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters that a shell treats specially in an unquoted word.
_SHELL_SPECIAL = set(" \t\"'$\\#;&|<>()*?[]~{}`")


def parse_env_file(text: str) -> dict[str, str]:
    """{KEY: VALUE} of an EnvironmentFile's `text`, by systemd's rules (the last one of a key wins)."""
    result: dict[str, str] = {}
    key: list[str] = []
    value: list[str] = []
    key_end: int | None = None  # where trailing whitespace of the key starts
    value_end: int | None = None  # where trailing whitespace of an unquoted value starts
    state = "pre_key"

    def push() -> None:
        name = "".join(key[:key_end] if key_end is not None else key)
        if _KEY.fullmatch(name):
            result[name] = "".join(value)

    for c in text:
        if state == "pre_key":
            if c in _COMMENT:
                state = "comment"
            elif c not in _WHITESPACE:
                state, key, key_end = "key", [c], None
        elif state == "key":
            if c in "\n\r":
                state, key = "pre_key", []
            elif c == "=":
                state, value, value_end = "pre_value", [], None
            else:
                if c not in _WHITESPACE:
                    key_end = None
                elif key_end is None:
                    key_end = len(key)
                key.append(c)
        elif state == "pre_value":
            if c in "\n\r":
                push()
                state, key = "pre_key", []
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif c not in _WHITESPACE:
                state = "value"
                value.append(c)
        elif state == "value":
            if c in "\n\r":
                if value_end is not None:
                    del value[value_end:]
                push()
                state, key = "pre_key", []
            elif c == "\\":
                state, value_end = "value_escape", None
            else:
                if c not in _WHITESPACE:
                    value_end = None
                elif value_end is None:
                    value_end = len(value)
                value.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in "\n\r":
                value.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                value.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value.append(c)
        elif state == "double_escape":
            state = "double"
            if c in _ESCAPABLE_IN_DOUBLE_QUOTES:
                value.append(c)
            elif c != "\n":
                value += ["\\", c]
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in "\n\r":
                state = "pre_key"
        elif state == "comment_escape":
            state = "pre_key" if c in "\n\r" else "comment"
    if state not in ("pre_key", "key", "comment", "comment_escape"):
        if state == "value" and value_end is not None:
            del value[value_end:]
        push()
    return result


def shell_safe_problem(line: str) -> str | None:
    """Why a settings line would not mean the same to a shell and to systemd, or None.

    The rule the settings file keeps: `KEY=value` with no space around `=`, and
    a value holding a space or a shell-special character in single quotes.
    """
    stripped = line.strip()
    if not stripped or stripped[0] in _COMMENT:
        return None
    key, sep, raw = stripped.partition("=")
    if not sep or not _KEY.fullmatch(key):
        return "not KEY=value (no spaces around '=')"
    if raw.startswith("'"):
        if len(raw) < 2 or not raw.endswith("'") or "'" in raw[1:-1]:
            return "a single-quoted value must end with its quote and hold no other single quote"
        return None
    if _SHELL_SPECIAL & set(raw):
        return "a value with spaces or any of $ \\ \" ' # ; & | < > ( ) * ? [ ] ~ { } ` must be in single quotes"
    return None


def shell_problems(text: str) -> list[tuple[int, str, str]]:
    """(line number, key, problem) of each line of `text` that breaks the settings file's rule."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        problem = shell_safe_problem(line)
        if problem:
            # The line itself may hold a secret: only its key is told.
            found.append((number, line.strip().partition("=")[0][:40], problem))
    return found


def read_env_file(path: str | Path) -> tuple[dict[str, str], list[tuple[int, str, str]]]:
    """The settings in the file at `path`, read by systemd's rules, and the lines a shell
    would read differently (SettingsError when the file cannot be read)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        hint = " (it is the hub's settings, mode 0600: run this as root)" if exc.errno == errno.EACCES else ""
        raise SettingsError(f"cannot read the settings file {path}: {exc.strerror}{hint}") from None
    return parse_env_file(text), shell_problems(text)
