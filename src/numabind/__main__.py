"""``python -m numabind`` works like the ``numabind`` command."""

import sys

from .cli import main

sys.exit(main())
