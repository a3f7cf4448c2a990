"""Sphinx configuration: plain reStructuredText, autodoc for the API, warnings are errors in CI."""

import os
import sys

sys.path.insert(0, os.path.abspath("../src"))
sys.path.insert(0, os.path.abspath("_ext"))

from numabind import __version__

project = "numabind"
author = "numabind developers"
release = version = __version__
extensions = ["sphinx.ext.autodoc", "numabind_gallery", "numabind_examples"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
exclude_patterns = ["_build", "_ext"]
html_theme = "alabaster"
# every cross-reference must resolve (sphinx -n): the build fails on a dangling one.  What
# is left out are type-hint names of the standard library (no intersphinx: the build
# reaches no network) and internal types the signatures name
nitpicky = True
nitpick_ignore = [
    ("py:class", "F"),  # numa_bound's TypeVar
    ("py:class", "Source"),
    ("py:class", "BaseContext"),
    ("py:class", "SkipKind"),  # the Literal aliases of numabind._plan and _model
    ("py:class", "NodeHow"),
    ("py:class", "AllowedKind"),
    ("py:class", "threading.Thread"),
    ("py:class", "mmap.mmap"),
    ("py:class", "multiprocessing.process.BaseProcess"),
]
