#!/usr/bin/env python3
"""Print the command-line reference (docs/reference/cli.md), generated from the parsers.

`gpu-pool` (spawner/cli/main.py) and `gpu-job` (images/gpu-job, in the notebook
images) are documented from their own argparse parsers, so a new option shows
up here by itself; tests/unit/test_docs.py checks the page is current:

    .venv/bin/python tests/harness/cli_reference.py --write
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.harness.generated import REPO, current, main, markers  # noqa: E402

PAGE = REPO / "docs" / "reference" / "cli.md"
BEGIN, END = markers("cli-reference", "tests/harness/cli_reference.py")


def gpu_job_parser() -> argparse.ArgumentParser:
    """gpu-job's parser, loaded from the module the images' package installs as `gpu-job`."""
    path = REPO / "images" / "jupyter" / "gpuhub_job" / "__init__.py"
    loader = importlib.machinery.SourceFileLoader("gpu_job", str(path))
    spec = importlib.util.spec_from_loader("gpu_job", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module.build_parser()


def gpu_pool_parser() -> argparse.ArgumentParser:
    from spawner.cli.main import _parser

    return _parser()


PARSERS = {"gpu-pool": gpu_pool_parser, "gpu-job": gpu_job_parser}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers here and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(parser: argparse.ArgumentParser) -> str:
    # A fixed width, so the text does not depend on the terminal that generated it.
    os.environ["COLUMNS"] = "100"
    return parser.format_help().rstrip()


def reference() -> str:
    lines = [BEGIN, ""]
    for name, make in PARSERS.items():
        parser = make()
        lines += [f"## `{name}`", "", "```text", _help(parser), "```", ""]
        for sub, subparser in subcommands(parser).items():
            lines += [f"### `{name} {sub}`", "", "```text", _help(subparser), "```", ""]
    lines.append(END)
    return "\n".join(lines)


def in_page() -> str:
    return current(PAGE, BEGIN, END)


if __name__ == "__main__":
    main(sys.argv, PAGE, BEGIN, END, reference)
