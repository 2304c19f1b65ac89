"""docs/reference/rest-api.md lists every route the project serves (issue 36, item 4): the
routes are read from the apps' route tables (tests/harness/routes.py), never written here."""

from __future__ import annotations

import re

from tests.harness import openapi, routes


def test_every_served_route_is_in_the_rest_reference(tmp_path):
    served = {routes.normalise(r) for r in routes.served(tmp_path)}
    missing = sorted(served - routes.documented())
    assert not missing, f"routes served but not in docs/reference/rest-api.md: {missing}"


def test_the_reference_lists_no_route_that_is_not_served(tmp_path):
    served = {routes.normalise(r) for r in routes.served(tmp_path)}
    stale = sorted(routes.documented() - served)
    assert not stale, f"routes in docs/reference/rest-api.md that nothing serves: {stale}"


def test_the_route_tables_are_read_not_guessed(tmp_path):
    # What a client author looks for first is there, from the apps themselves.
    served = {routes.normalise(r) for r in routes.served(tmp_path)}
    for route in ("GET /services/gpu-pool/api/bookings", "POST /services/gpu-pool/api/bookings",
                  "DELETE /services/gpu-pool/api/bookings/<>", "GET /services/gpu-pool/api/exec/<>",
                  "POST /services/gpu-ssh/api/keys", "DELETE /services/gpu-ssh/api/keys/<>",
                  "POST /services/gpu-pool/api/gpus/<>/drain", "POST /services/gpu-pool/api/gpus/<>/undrain",
                  "GET /user/<>/gpuhub/status", "POST /user/<>/api/gpuhub/script"):
        assert route in served


def test_a_route_taken_out_of_the_reference_fails_the_check(tmp_path):
    page = routes.PAGE.read_text()
    cut = re.sub(r"^.*`DELETE /services/gpu-pool/api/bookings/<id>`.*$", "", page, flags=re.M)
    assert cut != page
    served = {routes.normalise(r) for r in routes.served(tmp_path)}
    assert "DELETE /services/gpu-pool/api/bookings/<>" in served - routes.documented(cut)


def test_each_api_route_says_its_scope_answers_errors_and_a_curl_example():
    # Every API route's entry (a ``### `METHOD path` `` heading, up to the next heading) names the scope, what it
    # answers, its errors and an example; pages and forms (HTML) are listed in tables of their own.
    page = routes.PAGE.read_text()
    entries = re.split(r"^#+ ", page, flags=re.M)[1:]
    entries = [e for e in entries if re.match(r"`(GET|POST|PUT|PATCH|DELETE) /", e)]
    assert len(entries) > 20, "no route entries (### `METHOD /path`) in the page"
    for entry in entries:
        title = entry.splitlines()[0]
        for field in ("**Scope**", "**Answers**", "**Errors**", "curl "):
            assert field in entry, f"{title}: no {field}"


def test_the_openapi_file_is_generated_from_the_routes_and_the_reference():
    assert openapi.FILE.read_text() == openapi.text(), "run: .venv/bin/python tests/harness/openapi.py --write"
    spec = openapi.generate()
    operation = spec["paths"]["/services/gpu-pool/api/bookings/{id}"]["delete"]
    assert "No live booking" in operation["description"] and operation["parameters"][0]["name"] == "id"
