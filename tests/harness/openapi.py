"""docs/reference/openapi.json: an OpenAPI 3.1 description of the JSON and text APIs, generated
from the same two sources as the REST reference's check: the routes the apps serve
(tests/harness/routes.py) and each route's entry in docs/reference/rest-api.md (its scope,
parameters, answers and errors, as the operation's description).

    .venv/bin/python tests/harness/openapi.py --write
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.harness import routes  # noqa: E402

FILE = routes.REPO / "docs" / "reference" / "openapi.json"


def entries(text: str) -> dict[str, tuple[str, str]]:
    """{normalised route: (the path as written, the entry's text)} of every `### `METHOD path`` entry."""
    found = {}
    for block in re.split(r"^#+ ", text, flags=re.M)[1:]:
        m = re.match(r"`(" + "|".join(routes.METHODS) + r") (/[^`\s?]*)`[^\n]*\n(.*)", block, re.S)
        if m:
            body = re.split(r"^```", m.group(3).strip(), flags=re.M)[0].strip()
            found[routes.normalise(f"{m.group(1)} {m.group(2)}")] = (m.group(2), body)
    return found


def generate() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        served = {routes.normalise(r) for r in routes.served(Path(tmp))}
    documented = entries(routes.PAGE.read_text())
    paths: dict[str, dict] = {}
    for route in sorted(served & set(documented)):
        method = route.split(" ", 1)[0].lower()
        written, body = documented[route]
        names = re.findall(r"<([^>]*)>", written)
        path = re.sub(r"<([^>]*)>", r"{\1}", written)
        lines = [ln for ln in body.splitlines() if ln.strip()]
        summary = next((ln for ln in lines if not ln.startswith(("-", " "))), f"{method.upper()} {path}")
        operation = {
            "summary": re.split(r" \(\[", summary)[0].rstrip("."),
            "description": body,
            "parameters": [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                           for n in names],
            "responses": {"default": {"description": "see the description; errors are "
                                                     "{\"status\", \"message\"} with a 4xx or 5xx code"}},
        }
        paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "GPU JupyterHub services", "version": "1",
                 "description": "Generated from the apps' route tables and docs/reference/rest-api.md "
                                "(tests/harness/openapi.py)."},
        "components": {"securitySchemes": {"hubToken": {
            "type": "apiKey", "in": "header", "name": "Authorization",
            "description": "`token <a hub API token>` (or the hub's browser login)"}}},
        "security": [{"hubToken": []}],
        "paths": paths,
    }


def text() -> str:
    return json.dumps(generate(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        FILE.write_text(text())
        print(f"wrote {FILE}")
    else:
        sys.stdout.write(text())
