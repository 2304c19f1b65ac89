"""HTTPS with JupyterHub's own TLS (GPUHUB_SSL_CERT / GPUHUB_SSL_KEY): a real hub and
proxy on 127.0.0.1 with a certificate from a throw-away CA."""

from __future__ import annotations

import socket
import ssl

import pytest
import requests

from devservices.ldap.tls import make_server_cert
from tests.fixtures.hub import DUMMY_PASSWORD


@pytest.fixture
def tls_hub(make_hub, tmp_path):
    cert = make_server_cert(tmp_path / "tls")
    hub = make_hub(env={"GPUHUB_SSL_CERT": str(cert.cert_file), "GPUHUB_SSL_KEY": str(cert.key_file)},
                   verify=str(cert.ca_file))
    return hub, cert


def test_hub_serves_https_verified_by_its_ca_and_logs_in_through_the_form(tls_hub):
    hub, cert = tls_hub
    assert hub.url.startswith("https://127.0.0.1:")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{hub.url}/hub/login", timeout=10)  # not trusted without the CA

    session = requests.Session()
    ca = str(cert.ca_file)  # per request: REQUESTS_CA_BUNDLE would override session.verify
    r = session.get(f"{hub.url}/hub/login", timeout=30, verify=ca)
    assert r.status_code == 200
    xsrf = session.cookies.get("_xsrf")
    assert xsrf
    r = session.post(f"{hub.url}/hub/login", timeout=30, verify=ca,
                     data={"username": "tess", "password": DUMMY_PASSWORD, "_xsrf": xsrf})
    assert r.status_code == 200
    assert all(resp.url.startswith("https://") for resp in [*r.history, r])
    # The session is a logged-in user's: the hub knows tess now, and her home page answers.
    assert hub.api("GET", "/users/tess").status_code == 200
    r = session.get(f"{hub.url}/hub/home", timeout=30, verify=ca, allow_redirects=False)
    assert r.status_code == 200
    # The login cookie is only ever sent over TLS.
    assert any(c.secure for c in session.cookies if c.name.startswith("jupyterhub-"))


def test_a_notebook_server_is_reached_through_the_https_proxy(tls_hub):
    hub, cert = tls_hub
    hub.create_user("uwe")
    hub.start_server("uwe", {"profile": "tf-gpu-1"})
    token = hub.user_token("uwe")
    r = requests.get(f"{hub.url}/user/uwe/api/status", timeout=30, verify=str(cert.ca_file),
                     headers={"Authorization": f"token {token}"})
    assert r.status_code == 200, r.text
    hub.stop_server("uwe", token=token)


def test_plain_http_is_not_served_on_the_public_port(tls_hub):
    hub, _ = tls_hub
    with socket.create_connection(("127.0.0.1", hub.port), timeout=10) as sock:
        sock.sendall(b"GET /hub/login HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    # No page over plain HTTP: the connection is closed without an answer (at most a
    # "bad request" from a future Node), never the login page or a redirect.
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{hub.port}/hub/login", timeout=10)
    # ...while TLS on the same port works.
    ctx = ssl.create_default_context(cafile=hub.verify)
    with socket.create_connection(("127.0.0.1", hub.port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
