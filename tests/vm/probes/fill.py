"""More memory than node 1 holds (its MemTotal plus 96 MiB), under the hook's policy:
preferred spills to the other node, bind refuses (the process dies).  Prints its pages."""

import json

from numabind._kernel import pages_per_node, private_anon_regions


def main() -> None:
    total = 0
    with open("/sys/devices/system/node/node1/meminfo") as f:
        for line in f:
            if "MemTotal" in line:
                total = int(line.split()[-2]) * 1024
    buf = b"\x01" * (total + (96 << 20))
    print(json.dumps({"pages": pages_per_node(private_anon_regions()), "size": len(buf)}))


if __name__ == "__main__":
    main()
