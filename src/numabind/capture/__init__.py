"""Reading a machine from a capture (a tarball, a directory laid out like ``/``, an
hwloc XML export) and the generated example machines: what ``show --input`` and
``--example`` read, never a rank's startup.

A wing: no module of numabind's core imports it at module level (tests/test_layout.py)."""
