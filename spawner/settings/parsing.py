"""Reading one GPUHUB_* variable: integers, numbers, switches, choices, group lists.

The helpers every settings module shares, and SettingsError, the one error they
raise: its message names the variable, so the hub stops saying what to fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping


class SettingsError(ValueError):
    """A deployment setting is missing or wrong; the message names it."""


def _number(env: Mapping[str, str], name: str, default, minimum, convert, what: str):
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = convert(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not {what}") from None
    if minimum is not None and value < minimum:
        raise SettingsError(f"{name}={value} must be at least {minimum}")
    return value


def env_int(env: Mapping[str, str], name: str, default: int, minimum: int | None = None) -> int:
    return _number(env, name, default, minimum, int, "an integer")


def env_float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    return _number(env, name, default, minimum, float, "a number")


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} must be true or false")


def env_choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name, "").strip().lower() or default
    if raw not in choices:
        raise SettingsError(f"{name}={raw!r} must be one of: {', '.join(choices)}")
    return raw


def env_groups(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """Group names or DNs.  A DN has commas of its own, so the separator is
    chosen by what the value holds: a JSON list; else `;` or newlines when
    any entry is a DN (has `=`); else commas (plain names)."""
    raw = env.get(name, "").strip()
    if raw.startswith("["):
        try:
            items = json.loads(raw)
        except ValueError as exc:
            raise SettingsError(f"{name} looks like a JSON list but is not one: {exc}") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise SettingsError(f"{name} must be a JSON list of strings")
    elif "=" in raw:
        items = re.split(r"[;\n]", raw)
    else:
        items = raw.split(",")
    return tuple(item.strip() for item in items if item.strip())


def env_key_values(env: Mapping[str, str], name: str) -> dict[str, str]:
    """`key=value,key=value` (spaces around each ignored); an item without `=` is an error."""
    pairs = {}
    for item in env.get(name, "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"{name}: {item.strip()!r} is not key=value (e.g. gpuhub.pool=lab)")
        pairs[key.strip()] = value.strip()
    return pairs
