"""Every default of a deployment setting is written once, on its trait (or the one record that
owns it), and everything else reads it from there: a second literal of it drifts.

The rule reads the package's source (no imports): a *default site* is a literal number given
as a trait's default (`Int(300, ...)`), a dataclass field's or a module constant's value, a
parameter's default, a `.get("name", 300)` fallback or an `env_int(env, "GPUHUB_X", 300)`
fallback.  Each setting below is known by the names that hold it; two default sites of one
setting with its value fail, naming both.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "spawner"

TRAIT_TYPES = {"Int", "Integer", "Float", "CFloat", "CInt", "Unicode", "Bool"}

# setting: (the names that hold it, `module.name` for one module's only, its default values)
SETTINGS = {
    "lease wait": ({"lease_wait_timeout", "GPUHUB_LEASE_WAIT_TIMEOUT"}, {300}),
    "CPU cull timeout": ({"cpu_timeout", "cull_timeout_cpu", "GPUHUB_CULL_TIMEOUT_CPU"}, {3600}),
    "GPU cull timeout": ({"gpu_timeout", "cull_timeout_gpu", "GPUHUB_CULL_TIMEOUT_GPU"}, {900}),
    "GPU idle threshold": ({"gpu_idle_percent", "DEFAULT_GPU_IDLE_PERCENT", "GPUHUB_GPU_IDLE_PERCENT"}, {5}),
    "GPU idle time": ({"gpu_idle_seconds", "gpu_idle_minutes", "GPUHUB_GPU_IDLE_MINUTES"}, {1800, 30}),
    "simulated GPUs": ({"simulated_gpus", "count", "GPUHUB_SIMULATED_GPUS"}, {4}),
    "job time limit": ({"job_max_seconds", "max_seconds", "GPUHUB_JOB_MAX_SECONDS"}, {86400}),
    "job log size": ({"job_log_max_bytes", "log_max_bytes", "GPUHUB_JOB_LOG_MAX_BYTES"}, {1024 * 1024}),
    "hub port": ({"hub_port", "GPUHUB_HUB_PORT"}, {8081}),
    "proxy API port": ({"proxy_api_port", "GPUHUB_PROXY_API_PORT"}, {8001}),
    "pool page port": ({"pool_page_port", "GPUHUB_POOL_PAGE_PORT"}, {8091}),
    "SSH page port": ({"ssh_page_port", "GPUHUB_SSH_PAGE_PORT"}, {8092}),
    "booking length": ({"booking_max_hours", "max_hours"}, {8}),
    "booking lead": ({"booking_max_days_ahead", "max_days_ahead"}, {14}),
    "booking week": ({"booking_max_gpu_hours_per_week", "max_gpu_hours_per_week"}, {40}),
    "bookings per user": ({"booking_max_per_user", "bookings.max_per_user"}, {10}),
    "booking grace": ({"booking_grace", "grace_s"}, {900}),
    "booking notice": ({"booking_notice", "notice_s"}, {3600}),
    "budget period": ({"budget_period", "period_s"}, {7 * 86400}),
    "fair-share half-life": ({"fairshare_half_life", "DEFAULT_HALF_LIFE", "half_life_s"}, {7 * 86400}),
}


def _literal(node):
    """The number `node` writes as a literal (constants and arithmetic on them), else None."""
    try:
        value = ast.literal_eval(node)
    except ValueError:
        if isinstance(node, ast.BinOp):
            left, right = _literal(node.left), _literal(node.right)
            if left is not None and right is not None:
                return {ast.Mult: lambda a, b: a * b, ast.Add: lambda a, b: a + b,
                        ast.Div: lambda a, b: a / b}.get(type(node.op), lambda a, b: None)(left, right)
        return None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def default_sites(package: Path):
    """(name, value, "file:line") of every default site under `package`; a name also as
    `module.name`."""
    for path in sorted(package.rglob("*.py")):
        for name, value, line in _sites(ast.parse(path.read_text())):
            for known in (name, f"{path.stem}.{name}"):
                yield known, value, f"{path.relative_to(package.parent)}:{line}"


def _sites(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
                     for t in targets]
            value = node.value
            while isinstance(value, ast.Call) and _call_name(value) == "tag":  # Int(...).tag(config=True)
                value = value.func.value  # type: ignore[attr-defined]
            if isinstance(value, ast.Call) and _call_name(value) in TRAIT_TYPES and value.args:
                value = value.args[0]
            literal = _literal(value)
            if literal is not None:
                yield from ((n, literal, node.lineno) for n in names if n)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            for arg, d in pairs:
                if (literal := _literal(d)) is not None:
                    yield arg.arg, literal, d.lineno
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            key, fallback = None, None
            if name == "get" and len(node.args) == 2:
                key, fallback = node.args
            elif name.startswith("env_") and len(node.args) >= 3:
                key, fallback = node.args[1], node.args[2]
            literal = _literal(fallback) if fallback is not None else None
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and literal is not None:
                yield key.value, literal, node.lineno


def written_twice(package: Path) -> dict[str, list[str]]:
    """{setting: its default sites} for each setting of SETTINGS whose default is written more than once."""
    found: dict[str, list[str]] = {}
    for name, value, where in default_sites(package):
        for setting, (names, values) in SETTINGS.items():
            if name in names and value in values:
                found.setdefault(setting, []).append(where)
    return {setting: sites for setting, sites in found.items() if len(sites) > 1}


def test_every_settings_default_is_written_once():
    assert written_twice(PACKAGE) == {}


def test_the_rule_finds_a_default_written_a_second_time(tmp_path):
    (tmp_path / "spawner").mkdir()
    (tmp_path / "spawner" / "a.py").write_text(
        "from traitlets import Float\nclass S:\n    lease_wait_timeout = Float(300.0, config=True)\n")
    (tmp_path / "spawner" / "b.py").write_text(
        "from dataclasses import dataclass\n@dataclass\nclass Settings:\n    lease_wait_timeout: float = 300.0\n"
        "def f(env):\n    return env_int(env, 'GPUHUB_HUB_PORT', 8081), c.get('hub_port', 8081)\n")
    assert written_twice(tmp_path / "spawner") == {"lease wait": ["spawner/a.py:3", "spawner/b.py:4"],
                                                   "hub port": ["spawner/b.py:6", "spawner/b.py:6"]}
