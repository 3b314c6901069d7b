"""Sphinx configuration: MyST Markdown pages, the furo theme, references generated from the code."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).parent / "_ext")]

import primal_dt  # noqa: E402

project = "primal-dt"
author = "the primal-dt developers"
copyright = "2026, the primal-dt developers"
release = primal_dt.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax served from the site itself, so equations render offline
    "sphinxarg.ext",
    "config_reference",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
html_theme = "furo"
html_title = f"primal-dt {release}"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# torch's own types are not in this site's inventory; nitpicky mode (-n) would report each.
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|numpy|np|nn|Tensor|optional|Path)(\..*)?"),
    # register's type variable (a subclass of AttentionLayer) and the standard Callable.
    (r"py:class", r"(primal_dt\.method\.layer\.Kind|collections\.abc\.Callable)"),
]
smartquotes = False  # keep --option as typed (not an en dash)
