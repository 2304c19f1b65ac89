"""The one wait of the tests (devservices/waiting.py): its deadline says what it waited for."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from devservices.waiting import async_until, until

REPO = Path(__file__).resolve().parents[2]


def test_a_wait_that_runs_out_names_what_it_waited_for_and_what_explain_adds():
    box: list = []
    with pytest.raises(AssertionError) as caught:
        until(lambda: len(box) == 3, timeout=0.05, interval=0.01, explain=lambda: f"box holds {box}")
    message = str(caught.value)
    assert "timed out after 0.05 s waiting for" in message and "len(box) == 3" in message
    assert "box holds []" in message
    with pytest.raises(AssertionError, match="the queue to empty"):
        until(lambda: False, timeout=0.01, what="the queue to empty")
    assert until(lambda: box or "ready", timeout=1) == "ready"


def test_the_async_wait_lets_the_other_tasks_bring_it_about():
    async def scenario():
        box: list = []
        asyncio.get_running_loop().call_later(0.02, box.append, 1)
        return await async_until(lambda: box, timeout=5)
    assert asyncio.run(scenario()) == [1]


def test_no_test_keeps_a_wait_loop_of_its_own():
    copies = [p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("*.py")
              if "condition never came true" in p.read_text() and p.name != "test_waiting.py"]
    assert not copies, f"use devservices.waiting.until / async_until in {copies}"
