"""Why the kernel refused to map memory, in figures: the limit a mapping ran into.

``mmap`` answers ENOMEM for a mapping larger than the process's address-space limit
(``ulimit -v``, RLIMIT_AS), than the commit limit under strict overcommit
(``vm.overcommit_memory=2``: ``CommitLimit`` against ``Committed_AS``), or, under the
default heuristic (0), than the machine's memory and swap together.  A message that
names the size asked and the limit it met tells the user which one to change; the raw
``[Errno 12] Cannot allocate memory`` does not.  Read only after a refusal (never on the
startup path); every file is read bounded, and an unreadable one leaves its figure out.
"""

from __future__ import annotations

from . import _sysfs


def _size(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def _meminfo() -> dict[str, int]:
    """The few /proc/meminfo lines used here, in bytes."""
    out: dict[str, int] = {}
    for line in (_sysfs.read_opt("/proc/meminfo") or "").splitlines()[:128]:
        key, _, rest = line.partition(":")
        fields = rest.split()
        if key in ("MemTotal", "SwapTotal", "CommitLimit", "Committed_AS") and fields:
            value = _sysfs.parse_int(fields[0])
            if value is not None and value >= 0:
                out[key] = value * 1024
    return out


def _address_space_limit() -> int | None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY or soft < 0 else soft


def mapping_refused(caller: str, nbytes: int, err: OSError) -> str:
    """The one line for a mapping of ``nbytes`` the kernel refused with ``err``."""
    head = f"{caller}: {_size(nbytes)} cannot be mapped ({err.strerror or err})"
    limit = _address_space_limit()
    if limit is not None and nbytes > limit // 2:
        return (
            f"{head}: this process's address-space limit (ulimit -v, RLIMIT_AS) is "
            f"{_size(limit)}; nothing was mapped"
        )
    mode = _sysfs.parse_int(_sysfs.read_opt("/proc/sys/vm/overcommit_memory"))
    info = _meminfo()
    if mode == 2 and "CommitLimit" in info:
        used = info.get("Committed_AS", 0)
        return (
            f"{head}: vm.overcommit_memory=2 and the commit limit is "
            f"{_size(info['CommitLimit'])} ({_size(used)} committed already); nothing was "
            "mapped"
        )
    if "MemTotal" in info:
        total = info["MemTotal"] + info.get("SwapTotal", 0)
        setting = "?" if mode is None else str(mode)
        return (
            f"{head}: more than this machine's memory and swap together ({_size(total)}), "
            f"which the kernel's overcommit heuristic (vm.overcommit_memory={setting}) "
            "refuses; nothing was mapped"
        )
    return f"{head}; nothing was mapped"
