"""Host buffers (``numabind.host_buffer``, ``bind_range``) and the CUDA driver the
bench's pinned copies use: loaded when a program asks for them, never at startup.

A wing: no module of numabind's core imports it at module level (tests/test_layout.py)."""
