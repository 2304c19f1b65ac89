"""The one wait of the tests (devservices/waiting.py): its deadline says what it waited for."""

from __future__ import annotations

import ast
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


SLEEPS = {("time", "sleep"), ("asyncio", "sleep")}


def _is_sleep(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return (func.value.id, func.attr) in SLEEPS
    return isinstance(func, ast.Name) and func.id == "sleep"


def _sleeps(node: ast.AST, in_loop: bool = False):
    """(line, in a loop) of each sleep call under node; a function body starts outside any loop."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _sleeps(child, False)
            continue
        if isinstance(child, ast.Call) and _is_sleep(child):
            yield child.lineno, in_loop
        yield from _sleeps(child, in_loop or isinstance(child, (ast.While, ast.For, ast.AsyncFor)))


def fixed_sleeps(root: Path) -> tuple[list[str], list[str]]:
    """(sleeps that poll in a loop, sleeps that do not say why) in the test files under root.

    A sleep inside a loop is a wait loop of its own unless its line says `not a wait` (a pace a
    scenario sets: a burst spread over time); any other sleep says on its line, after `#`, why it
    is not a wait (the time itself is what the test is about)."""
    loops: list[str] = []
    unexplained: list[str] = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        where = path.relative_to(root).as_posix()
        for lineno, in_loop in _sleeps(ast.parse(source)):
            line = lines[lineno - 1]
            if in_loop and "not a wait" not in line:
                loops.append(f"{where}:{lineno}")
            elif "#" not in line.split("sleep", 1)[1]:
                unexplained.append(f"{where}:{lineno}")
    return loops, unexplained


def test_the_sleep_rule_tells_a_polling_loop_and_an_unexplained_sleep(tmp_path):
    (tmp_path / "test_a.py").write_text(
        "import time\n"
        "def test_x():\n"
        "    while not ready():\n"
        "        time.sleep(0.1)\n"
        "    for _ in range(3):\n"
        "        time.sleep(0.1)  # not a wait: three requests a tenth apart\n"
        "    time.sleep(1)\n"
        "    time.sleep(1)  # the lease must outlive its deadline\n")
    assert fixed_sleeps(tmp_path) == (["test_a.py:4"], ["test_a.py:7"])


def test_no_test_polls_in_a_loop_of_its_own_or_sleeps_without_saying_why():
    loops, unexplained = fixed_sleeps(REPO / "tests")
    assert not loops, f"wait with devservices.waiting.until / async_until instead of a loop: {loops}"
    assert not unexplained, f"say after '#' on the line why this sleep is not a wait: {unexplained}"
