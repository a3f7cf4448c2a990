"""``python -m numabind`` works like the ``numabind`` command (useful where the console
script is not on PATH, and in tests that must run this checkout's code)."""

import sys

from .cli import main

sys.exit(main())
