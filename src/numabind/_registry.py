"""Processes numabind bound register themselves, so ``numabind check --all`` finds them.

/proc/PID/environ holds only a process's *initial* environment: a Callable child whose rank
arrived later (torch.multiprocessing.spawn, elastic_launch) is invisible there.  So every
process numabind binds writes one small file, /dev/shm/numabind/<pid>, in a ``key=value``
line format (no json: this runs in the startup hook).  An entry whose process is gone, or
whose pid was reused (the start time differs), is stale and is pruned when read.
"""

from __future__ import annotations

import os

from . import _sysfs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._apply import Binding

DIRECTORY = os.environ.get("NUMABIND_REGISTRY", "/dev/shm/numabind")


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def register(binding: Binding, directory: str | None = None) -> str | None:
    """Record this process's plan; returns the file written, or None when it could not be
    (a read-only or absent /dev/shm must not matter to the rank)."""
    p = binding.plan
    if not p.bound:
        return None
    d = directory or DIRECTORY
    pid = os.getpid()
    lines = {
        "pid": str(pid),
        "start": _start_time(pid) or "",
        "local_rank": "" if p.local_rank is None else str(p.local_rank),
        "rank_source": p.rank_source or "",
        "local_world_size": "" if p.local_world_size is None else str(p.local_world_size),
        "device": p.device.pci if p.device else "",
        "device_index": "" if p.device_index is None else str(p.device_index),
        "numa_node": "" if p.numa_node is None else str(p.numa_node),
        "cpus": _sysfs.format_cpulist(p.cpus),
        "memory_policy": binding.policy_applied or p.memory_policy,
        "memory_nodes": _sysfs.format_cpulist(binding.policy_nodes or p.memory_nodes),
        "mode": p.mode,
        "reason": p.reason.replace("\n", " "),
    }
    try:
        os.makedirs(d, mode=0o1777, exist_ok=True)
        tmp = f"{d}/.{pid}.tmp"
        with open(tmp, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in lines.items()))
        os.replace(tmp, f"{d}/{pid}")
    except OSError:
        return None
    return f"{d}/{pid}"


def read(pid: int, directory: str | None = None) -> dict[str, str] | None:
    """The registered entry of ``pid`` if it is current, else None (a stale one is removed)."""
    path = f"{directory or DIRECTORY}/{pid}"
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    entry = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if _start_time(pid) != entry.get("start"):
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    return entry


def registered_pids(directory: str | None = None) -> list[int]:
    """Every pid with a current entry (stale entries are pruned on the way)."""
    out = []
    for name in _sysfs.listdir(directory or DIRECTORY):
        if name.isdigit() and read(int(name), directory) is not None:
            out.append(int(name))
    return out
