"""Sphinx configuration: plain reStructuredText, autodoc for the API, warnings are errors in CI."""

import os
import sys

sys.path.insert(0, os.path.abspath("../src"))
sys.path.insert(0, os.path.abspath("_ext"))

from numabind import __version__

project = "numabind"
author = "numabind developers"
release = version = __version__
extensions = ["sphinx.ext.autodoc", "numabind_gallery"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
exclude_patterns = ["_build", "_ext"]
html_theme = "alabaster"
nitpicky = False
