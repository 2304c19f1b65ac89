"""Public keys people registered for SSH: one small JSON file per person, bounded in count and size.

Only the gpu-ssh service writes them (one process; writes are atomic renames).  A key is
checked when registered: one OpenSSH public key line, a known type, RSA of at least
`min_rsa_bits`, at most `max_key_bytes` long, not already registered by anyone (a key
names one person).  A key registered already is refused with the same 409 whoever holds it:
a public key is public, and the answer must not tell a stranger whether, or by whom, it is
used here.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import asyncssh

ALLOWED_ALGORITHMS = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                      "ssh-rsa", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
MAX_COMMENT = 200
MSG_KEY_TAKEN = ("This key is registered already (your keys are listed on this page); to use it for "
                 "another account, make a key of its own (ssh-keygen -t ed25519)")


class KeyRefused(ValueError):
    """A key that cannot be registered; the message says why (shown as a 400)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RegisteredKey:
    fingerprint: str
    algorithm: str
    comment: str
    line: str
    added: float

    def public(self) -> dict:
        return {"fingerprint": self.fingerprint, "algorithm": self.algorithm, "comment": self.comment,
                "added": self.added}


def parse_key(line: str, max_bytes: int, min_rsa_bits: int) -> tuple[asyncssh.SSHKey, str, str]:
    """(key, algorithm, comment) of one OpenSSH public key line, or KeyRefused."""
    if not isinstance(line, str) or not line.strip():
        raise KeyRefused("Paste one public key line, e.g. the contents of ~/.ssh/id_ed25519.pub")
    line = line.strip()
    if len(line.encode()) > max_bytes:
        raise KeyRefused(f"That key is {len(line.encode())} bytes long; the limit is {max_bytes} bytes "
                         "(SSHGateway.max_key_bytes)")
    if "PRIVATE KEY" in line:
        raise KeyRefused("That is a private key: paste the public one (the .pub file) and keep the "
                         "private key to yourself")
    if "\n" in line or "\r" in line:
        raise KeyRefused("Paste exactly one public key line")
    try:
        key = asyncssh.import_public_key(line)
    except (asyncssh.KeyImportError, ValueError):
        raise KeyRefused("That is not an OpenSSH public key line (type, base64, comment)") from None
    algorithm = key.get_algorithm()
    if algorithm not in ALLOWED_ALGORITHMS:
        raise KeyRefused(f"Keys of type {algorithm} are not accepted; use ssh-ed25519, ecdsa or rsa")
    if algorithm == "ssh-rsa":
        bits = getattr(getattr(key, "pyca_key", None), "key_size", 0)
        if bits and bits < min_rsa_bits:
            raise KeyRefused(f"That RSA key has {bits} bits; at least {min_rsa_bits} are needed")
    parts = line.split(None, 2)
    comment = re.sub(r"[^\w.@ +:/-]", "", parts[2])[:MAX_COMMENT] if len(parts) > 2 else ""
    return key, algorithm, comment


class KeyStore:
    def __init__(self, state_dir: str | Path, max_keys: int, max_bytes: int, min_rsa_bits: int):
        self.dir = Path(state_dir) / "keys"
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self.min_rsa_bits = min_rsa_bits

    def _file(self, user: str) -> Path:
        return self.dir / f"{quote(user, safe='')}.json"

    def keys(self, user: str) -> list[RegisteredKey]:
        try:
            rows = json.loads(self._file(user).read_text())
        except (FileNotFoundError, ValueError):
            return []
        return [RegisteredKey(**row) for row in rows]

    def _save(self, user: str, keys: list[RegisteredKey]) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._file(user)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump([k.__dict__ for k in keys], f)
        tmp.replace(path)

    def _owner_of(self, fingerprint: str) -> str | None:
        if not self.dir.is_dir():
            return None
        for path in self.dir.glob("*.json"):
            try:
                rows = json.loads(path.read_text())
            except ValueError:
                continue
            if any(row.get("fingerprint") == fingerprint for row in rows):
                return path.stem
        return None

    def add(self, user: str, line: str) -> RegisteredKey:
        key, algorithm, comment = parse_key(line, self.max_bytes, self.min_rsa_bits)
        fingerprint = key.get_fingerprint("sha256")
        keys = self.keys(user)
        if any(k.fingerprint == fingerprint for k in keys) or self._owner_of(fingerprint) is not None:
            raise KeyRefused(MSG_KEY_TAKEN, 409)
        if len(keys) >= self.max_keys:
            raise KeyRefused(f"You have {len(keys)} keys registered, the most one person may have "
                             f"(SSHGateway.max_keys_per_user = {self.max_keys}); remove one first", 409)
        entry = RegisteredKey(fingerprint=fingerprint, algorithm=algorithm, comment=comment,
                              line=key.export_public_key().decode().strip(), added=time.time())
        self._save(user, keys + [entry])
        return entry

    def remove(self, user: str, fingerprint: str) -> bool:
        keys = self.keys(user)
        kept = [k for k in keys if k.fingerprint != fingerprint]
        if len(kept) == len(keys):
            return False
        self._save(user, kept)
        return True

    def accepts(self, user: str, key: asyncssh.SSHKey) -> bool:
        fingerprint = key.get_fingerprint("sha256")
        return any(k.fingerprint == fingerprint for k in self.keys(user))
