"""A numabind.spawn child for the check scenario: holds 50 MB until a marker file appears."""

import os
import time


def hold(rank: int, marker: str) -> None:
    buf = b"\x01" * (50 << 20)
    print("READY", flush=True)
    deadline = time.time() + 300
    while not os.path.exists(marker) and time.time() < deadline:
        time.sleep(0.1)
    del buf
