"""Sphinx configuration of the documentation site (`make docs`).

Pages are Markdown (MyST).  Warnings are errors in `make docs` and in the
suite (tests/unit/test_docs.py), so a broken internal link fails the build.
"""

project = "GPU JupyterHub"
author = "The GPU JupyterHub contributors"
copyright = "2026, " + author

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# `[text](page.md#a-heading)` links resolve to headings down to level 4.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

html_theme = "alabaster"
html_title = project
html_theme_options = {"description": "Exclusive NVIDIA GPUs for a lab's JupyterHub", "fixed_sidebar": True}
html_static_path: list[str] = []
