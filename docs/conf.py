"""Sphinx configuration of horovod-hetero's documentation (``make docs``: warnings are errors)."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))
sys.path.insert(0, os.path.abspath("../lab"))          # the lab's modules the API reference documents
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

project = "horovod-hetero"
author = "The horovod-hetero authors"
copyright = "2026, The horovod-hetero authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3                 # [text](page.md#a-heading) links work
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "horovod-hetero"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "none"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
nitpicky = False
