"""A rank that holds 50 MB until its stdin closes (numabind check looks at it meanwhile)."""

import sys


def main() -> None:
    buf = b"\x01" * (50 << 20)
    print("READY", flush=True)
    sys.stdin.read()
    del buf


if __name__ == "__main__":
    main()
