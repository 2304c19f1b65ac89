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

# The look of JupyterHub's own docs: pydata-sphinx-theme, one top-level tab per audience
# (the root toctree), the theme's search page (search.html) and search box.
html_theme = "pydata_sphinx_theme"
html_title = project
html_theme_options = {
    "navbar_align": "left",
    "header_links_before_dropdown": 8,
    "navbar_end": ["theme-switcher", "navbar-icon-links"],
    "navbar_persistent": ["search-button"],
    "secondary_sidebar_items": ["page-toc"],
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}
html_sidebars = {"index": [], "demo": [], "changelog": []}
html_static_path: list[str] = []
