"""The demo's settings without starting it (issue 36, item 1): every feature on, the newcomer's
own GPUHUB_* variables over the demo's, their --config loaded after the demo's limits."""

from __future__ import annotations

import os
import smtplib
from email.message import EmailMessage

import pytest
import requests

from devservices import demo
from tests.fixtures.services import free_port


def _demo(tmp_path, *argv: str) -> demo.Demo:
    return demo.Demo(demo.build_parser().parse_args(["--dir", str(tmp_path / "d"), "--port", "18000", *argv]))


def test_every_feature_is_on_and_a_newcomers_settings_win(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHUB_SSH", "false")
    monkeypatch.setenv("GPUHUB_GPU_HOUR_BUDGET", "2")
    monkeypatch.setenv("GPUHUB_TEST_SOMETHING", "1")
    d = _demo(tmp_path, "--ssh-port", "12222")
    env = d.hub_env({"GPUHUB_DIRECTORY_EXEC_GROUPS": "script-runners"}, 0, "cpu", "gpu")
    assert env["GPUHUB_SSH"] == "false" and env["GPUHUB_GPU_HOUR_BUDGET"] == "2"
    assert "GPUHUB_TEST_SOMETHING" not in env
    assert env["GPUHUB_SSH_PORT"] == "12222" and env["GPUHUB_SSH_ADDRESS"] == "127.0.0.1"
    assert env["GPUHUB_JOBS"] == "true" and env["GPUHUB_DIRECTORY_EXEC_GROUPS"] == "script-runners"
    lines = "\n".join(d.feature_lines())
    assert "SSH:" not in lines and "2 GPU-hours per 1 h" in lines and "#exec-form" in lines
    for feature in ("Notebook jobs: ", "Schedules: ", "Borrowing: "):
        assert feature in lines, f"no {feature!r} line in the banner"


def test_the_ssh_line_is_ready_to_paste(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("GPUHUB_")]:
        monkeypatch.delenv(name)
    d = _demo(tmp_path, "--ssh-port", "12222")
    d.hub_env({}, 0, "cpu", "gpu")
    ssh = next(line for line in d.feature_lines() if line.startswith("SSH:"))
    assert ssh.startswith("SSH: ssh -p 12222 alice@127.0.0.1 (password Alice-Pass-1;")


def test_the_config_loads_production_then_the_demos_limits_then_yours(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("c.GPUPool.booking_max_hours = 4\n")
    d = _demo(tmp_path, "--config", str(mine))
    d.dir.mkdir(parents=True)
    text = d.write_config().read_text()
    production = text.index("hub_config/jupyterhub_config.py")
    limits = text.index("c.GPUPool.booking_notice = 60.0")
    assert production < limits < text.index(str(mine))


def test_the_hub_mails_through_the_demos_sink_and_the_banner_names_its_page(tmp_path):
    d = _demo(tmp_path, "--smtp-port", "12525", "--mail-port", "18025")
    d.dir.mkdir(parents=True)
    text = d.write_config().read_text()
    for line in ("c.EmailNotifications.enabled = True", 'c.EmailNotifications.smtp_host = "127.0.0.1"',
                 "c.EmailNotifications.smtp_port = 12525", 'c.EmailNotifications.security = "none"',
                 "c.EmailNotifications.public_url = 'http://127.0.0.1:18000'",
                 'c.DirectoryAuthenticator.auth_state_attributes = ["mail"]'):
        assert line in text, f"{line!r} not in the demo's config"
    d.hub_env({}, 0, "cpu", "gpu")
    mail = next(line for line in d.feature_lines() if line.startswith("Mail:"))
    assert mail.startswith("Mail: http://127.0.0.1:18025/ lists what the hub mailed (SMTP sink on 127.0.0.1:12525)")


def test_the_mail_sink_keeps_what_it_received_escaped_and_bounded():
    pytest.importorskip("aiosmtpd.controller")
    from devservices.mail_sink import MESSAGE_MAX, MailSink

    sink = MailSink(free_port(), free_port(), keep=2)
    sink.start()
    try:
        for n in range(3):
            msg = EmailMessage()
            msg["Subject"], msg["From"], msg["To"] = f"Mail {n} <script>", "hub@gpuhub.test", "alice@gpuhub.test"
            msg.set_content(f"Keep it: https://hub.example.org/keep?user=alice&n={n}\n<b>not bold</b>")
            with smtplib.SMTP("127.0.0.1", sink.smtp_port, timeout=10) as smtp:
                smtp.send_message(msg)
        page = requests.get(sink.page_url, timeout=10)
        assert page.status_code == 200
        assert "Mail 2 &lt;script&gt;" in page.text and "<script>" not in page.text
        assert "&lt;b&gt;not bold" in page.text
        assert '<a href="https://hub.example.org/keep?user=alice&amp;n=2">' in page.text
        kept = requests.get(sink.page_url + "messages.json", timeout=10).json()
        assert [m["subject"] for m in kept] == ["Mail 2 <script>", "Mail 1 <script>"]  # the newest 2 of 3
        assert kept[0]["to"] == ["alice@gpuhub.test"]
        big = EmailMessage()
        big["Subject"], big["From"], big["To"] = "big", "hub@gpuhub.test", "alice@gpuhub.test"
        big.set_content("x" * (MESSAGE_MAX + 10))
        with smtplib.SMTP("127.0.0.1", sink.smtp_port, timeout=10) as smtp, pytest.raises(smtplib.SMTPException):
            smtp.send_message(big)
        assert len(requests.get(sink.page_url + "messages.json", timeout=10).json()) == 2
        assert requests.get(sink.page_url + "other", timeout=10).status_code == 404
    finally:
        sink.stop()
