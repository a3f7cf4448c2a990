"""``numabind check``: is a process where its plan says, and is its memory there too?

For each process: its rank and device, the plan it should have (from its registry entry,
else planned from its initial environment), every thread's CPU mask, its memory policy (as
/proc/PID/numa_maps reports it), its private anonymous pages per node (pages it still
shares copy-on-write with a fork parent reported apart: they are the parent's placement,
not this process's), the thread settings it was given, and each mismatch with its likely
cause.  Everything read about another process is input: bounded, and a process that
vanishes mid-check is reported as such, never a traceback.

Exit status (also in ``numabind check --help`` and docs/cli.rst):

=====  =======================================================================
0      every process checked is on its plan
1      a process is off its plan (its problems say how)
2      usage error (bad arguments)
3      ``--pid``: a process named is gone (or a zombie); under ``--all`` a rank that
       exits mid-check is left out instead
=====  =======================================================================
"""

from __future__ import annotations

import errno
import json
import os
import sys

from . import _registry, _registry_read, _sysfs
from ._config import sysroot
from ._procmaps import locality, pages_per_node, private_anon_regions, shared_pages
from ._ranks import TRIGGER_VARIABLES, detect
from ._threads import VARIABLES as THREAD_VARIABLES
from ._threads import ThreadSettings
from ._topology import Machine

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping
    from typing import Any

fmt = _sysfs.format_cpulist
MIN_LOCALITY = 0.9
ON_PLAN, OFF_PLAN, USAGE, VANISHED = 0, 1, 2, 3


class Vanished(Exception):
    """The process exited (or became a zombie) while it was being checked."""


def _alive(pid: int) -> bool:
    state = _registry.process_state(pid)
    return state is not None and state not in ("Z", "X")


def _threads(pid: int) -> dict[int, frozenset[int]]:
    out = {}
    for tid in _sysfs.listdir(f"/proc/{pid}/task"):
        if not tid.isdigit():
            continue
        text = _sysfs.read_opt(f"/proc/{pid}/task/{tid}/status", 16384) or ""
        for line in text.splitlines():
            if line.startswith("Cpus_allowed_list:"):
                try:
                    out[int(tid)] = _sysfs.parse_cpulist(line.split(":", 1)[1])
                except ValueError:
                    pass
    return out


def parse_policy(fields: list[str]) -> tuple[str, frozenset[int]]:
    """A numa_maps policy field: ``mode[=flags][:nodes]``; the kernel writes
    MPOL_PREFERRED_MANY as ``prefer (many)``, with a space, so it spans two fields."""
    word = fields[1] if len(fields) > 1 else "default"
    if len(fields) > 2 and fields[2].startswith("(many)"):
        word = "prefer_many" + fields[2][len("(many)") :]
    head, _, nodes = word.partition(":")
    name = head.split("=", 1)[0]
    name = {"prefer": "preferred", "prefer_many": "preferred-many"}.get(name, name)
    try:
        parsed = _sysfs.parse_nodelist(nodes) if nodes else frozenset()
    except ValueError:
        parsed = frozenset()
    return name, parsed


def _policy(pid: int) -> tuple[str, frozenset[int]] | None:
    """The main thread's policy as numa_maps shows it on regions without their own."""
    try:
        lines = _sysfs.read_bytes(f"/proc/{pid}/numa_maps", 256 << 20).decode().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    pick = next((ln for ln in lines if " heap" in ln), None) or next(
        (ln for ln in lines if " anon=" in ln), None
    )
    if pick is None:
        return None
    return parse_policy(pick.split())


def _entry_plan(entry: Mapping[str, str]) -> dict[str, Any]:
    def num(key: str) -> int | None:
        v = entry.get(key, "")
        return int(v) if v.isascii() and v.isdigit() else None

    return {
        "local_rank": num("local_rank"),
        "rank_source": entry.get("rank_source") or None,
        "device_pci": entry.get("device") or None,
        "numa_node": num("numa_node"),
        "cpus": sorted(_sysfs.parse_cpulist(entry.get("cpus", ""))),
        "memory_policy": entry.get("memory_policy", "none"),
        "memory_nodes": sorted(_sysfs.parse_nodelist(entry.get("memory_nodes", ""))),
        "status": "bound",
        "skip": None,
        "reason": _sysfs.clean_line(entry.get("reason", ""), 500),
        "problem": None,
        "threads": num("threads"),
    }


def expected_plan(
    pid: int, machine: Machine, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any] | None, str]:
    """The plan a process should have: its registry entry, else planned from its initial
    environment (``environ`` given: that one).  Returns (plan as dict, where it came from)."""
    entry = _registry_read.read(pid)
    if entry is not None:
        return _entry_plan(entry), "registry"
    if environ is None:
        try:
            environ = _sysfs.read_environ(pid)
        except FileNotFoundError as err:
            raise Vanished(pid) from err
        except OSError as err:
            return None, f"cannot read /proc/{pid}/environ ({err.strerror or err})"
        source = "its initial environment"
    else:
        source = "its environment"
    from ._config import config_from_env
    from ._devices import resolve
    from ._errors import ConfigError
    from ._plan import plan, request_for

    info = detect(environ)
    if info.local_rank is None and info.problem is None:
        return None, "no local rank in its initial environment and not registered by numabind"
    try:
        cfg = config_from_env(environ)
    except ConfigError as err:
        return None, str(err)
    visible = resolve(machine, environ)
    p = plan(machine, request_for(info, visible, cfg.mode, cfg.memory))
    return p.to_dict(), source


def _thread_settings(
    pid: int, entry_env: Mapping[str, str] | None, entry: Mapping[str, str] | None
) -> dict[str, str]:
    """The thread variables a rank was given: what numabind set (its registry entry; the
    hook sets them after start, so /proc/PID/environ cannot show them), else its initial
    environment."""
    given = (entry or {}).get("thread_env", "")
    if given:
        return ThreadSettings.from_registry(given)
    try:
        env = _sysfs.read_environ(pid) if entry_env is None else dict(entry_env)
    except OSError:
        return {}
    return {k: env[k] for k in THREAD_VARIABLES if k in env}


def check_pid(
    pid: int,
    machine: Machine,
    min_locality: float = MIN_LOCALITY,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Check one process; raises :class:`Vanished` if it is gone or a zombie."""
    if not _alive(pid):
        raise Vanished(pid)
    result: dict[str, Any] = {"pid": pid, "ok": True, "problems": [], "notes": []}
    expected, source = expected_plan(pid, machine, environ)
    result["plan"], result["plan_source"] = expected, source
    threads = _threads(pid)
    if not threads and not _alive(pid):
        raise Vanished(pid)
    result["threads"] = {str(t): sorted(c) for t, c in threads.items()}
    policy = _policy(pid)
    result["memory_policy"] = (
        None if policy is None else {"policy": policy[0], "nodes": sorted(policy[1])}
    )
    try:
        regions = private_anon_regions(pid)
    except OSError:
        if not _alive(pid):
            raise Vanished(pid) from None
        regions = []
    pages = pages_per_node(regions)
    shared = _shared(pid, regions)
    own = {n: c - shared["nodes"].get(n, 0) for n, c in pages.items()}
    own = {n: c for n, c in own.items() if c > 0}
    result["pages"] = {str(n): c for n, c in pages.items()}
    result["shared_pages"] = {
        "pages": sum(shared["nodes"].values()),
        "nodes": {str(n): c for n, c in shared["nodes"].items()},
        "how": shared["how"],
    }
    problems: list[str] = result["problems"]
    notes: list[str] = result["notes"]
    if machine.numa_balancing:
        notes.append(_balancing_note(expected))
    if expected is None:
        result["status"] = "unknown"
        problems.append(f"no plan to check against: {source}")
        result["ok"] = False
        return result
    settings = _thread_settings(
        pid, environ, _registry_read.read(pid) if source == "registry" else None
    )
    result["thread_settings"] = settings
    if expected["status"] != "bound":
        result["status"] = "skipped"
        result["locality"] = None
        if expected.get("problem"):
            cause = "cgroup too narrow" if expected.get("skip") == "cgroup" else "bad input"
            problems.append(f"{cause}: {expected['reason']}")
            result["ok"] = False
        return result
    cpus = frozenset(expected["cpus"])
    mem_nodes = frozenset(expected["memory_nodes"])
    escaped = {t: c for t, c in threads.items() if not c <= cpus}
    if escaped and len(escaped) == len(threads):
        sample = next(iter(escaped.values()))
        problems.append(
            f"bound by someone else: every thread runs on CPUs {fmt(sample)}, plan {fmt(cpus)}"
        )
    elif escaped:
        tids = ", ".join(str(t) for t in sorted(escaped)[:5])
        problems.append(
            f"threads that escaped the plan's CPUs {fmt(cpus)}: {tids}"
            + (" ..." if len(escaped) > 5 else "")
        )
    want = expected["memory_policy"]
    if want not in ("none", "not-permitted") and source != "registry" and not _permitted():
        want = "not-permitted"  # this container refuses the calls: so it did for the rank
    if want == "not-permitted":
        notes.append(
            "memory policy: not permitted (a seccomp filter refused the memory-policy calls); "
            "locality is from /proc/PID/numa_maps"
        )
        mem_nodes = frozenset()
    elif policy is not None and want != "none":
        got_name, got_nodes = policy
        if got_name != want or (want != "local" and got_nodes != mem_nodes):
            problems.append(
                f"memory policy is {got_name} {fmt(got_nodes)}, plan {want} {fmt(mem_nodes)}"
            )
    check_nodes = mem_nodes or (
        frozenset({expected["numa_node"]}) if expected.get("numa_node") is not None else frozenset()
    )
    share = locality(own, check_nodes) if check_nodes else None
    result["locality"] = share
    if share is not None and share < min_locality:
        remote = {n: c for n, c in own.items() if n not in check_nodes}
        worst = max(remote, key=lambda n: remote[n])
        text = (
            f"pages left remote: {share:.1%} on node(s) {fmt(check_nodes)}, "
            f"{remote[worst] * 4 // 1024} MiB on node {worst}"
        )
        if mem_nodes:
            problems.append(text)
        else:  # the plan set no memory policy: where pages are is not its promise
            notes.append(f"{text} (no memory policy was planned)")
    if result["shared_pages"]["pages"]:
        sp = result["shared_pages"]
        notes.append(
            f"{sp['pages'] * 4 // 1024} MiB of its pages are still shared copy-on-write with "
            f"another process (a fork parent), on node(s) {', '.join(sp['nodes'])}: not counted "
            "against its plan; start children with spawn or forkserver where it matters"
        )
    _thread_notes(settings, expected, notes)
    result["status"] = "bound"
    result["ok"] = not problems
    return result


def _permitted() -> bool:
    """Whether this process may make memory-policy calls (a seccomp filter says EPERM)."""
    from . import _kernel

    try:
        _kernel.get_mempolicy()
    except OSError as err:
        return err.errno != errno.EPERM
    return True


def _shared(pid: int, regions: list[Any]) -> dict[str, Any]:
    """Pages shared copy-on-write, per node: pagemap's exclusive bit finds them, move_pages
    (querying, moving nothing) says where they are; where either is refused, numa_maps'
    per-region ``mapmax`` gives an upper bound instead.

    With automatic NUMA balancing on (the default of most distributions), the kernel
    unmaps a running process's pages for hinting faults, and move_pages then answers
    EFAULT for those pages although they are resident (seen on Linux 6.1 in the VM: 25,089
    of 26,042 shared pages after 3 s of CPU time).  Such pages are given the nodes of
    their region's other unexplained pages, in proportion, from numa_maps, which still
    counts them; for a region shared as a whole (a fork child's inherited buffers) that
    is exact."""
    if not any(getattr(r, "mapmax", 1) > 1 for r in regions):
        return {"nodes": {}, "how": "none"}
    addrs, _ = shared_pages(regions, pid)
    if addrs:
        try:
            from . import _kernel

            where: list[int] = []
            for i in range(0, len(addrs), 16384):
                where.extend(_kernel.move_pages(addrs[i : i + 16384], None, pid))
        except OSError:
            pass
        else:
            return _place_shared(regions, addrs, where)
    nodes: dict[int, int] = {}
    for r in regions:
        if getattr(r, "mapmax", 1) > 1:
            for n, c in r.pages.items():
                nodes[n] = nodes.get(n, 0) + c
    return {"nodes": dict(sorted(nodes.items())), "how": "numa_maps mapmax (upper bound)"}


def _place_shared(regions: list[Any], addrs: list[int], where: list[int]) -> dict[str, Any]:
    """Shared pages per node from move_pages' answers; the pages it could not see are
    placed from their region's numa_maps counts (see ``_shared``)."""
    import bisect

    order = sorted(range(len(regions)), key=lambda i: regions[i].start)
    starts = [regions[i].start for i in order]
    known: dict[int, dict[int, int]] = {}  # region index -> node -> shared pages
    unseen: dict[int, int] = {}  # region index -> shared pages move_pages did not see
    for a, w in zip(addrs, where):
        k = bisect.bisect_right(starts, a) - 1
        if k < 0 or a >= regions[order[k]].end:
            continue
        idx = order[k]
        if w >= 0:
            per = known.setdefault(idx, {})
            per[w] = per.get(w, 0) + 1
        else:
            unseen[idx] = unseen.get(idx, 0) + 1
    nodes: dict[int, int] = {}
    for per in known.values():
        for n, c in per.items():
            nodes[n] = nodes.get(n, 0) + c
    for idx, count in unseen.items():
        rest = {n: max(c - known.get(idx, {}).get(n, 0), 0) for n, c in regions[idx].pages.items()}
        for n, c in _apportion(count, rest).items():
            nodes[n] = nodes.get(n, 0) + c
    hidden = sum(unseen.values())
    how = "pagemap"
    if hidden:
        how += (
            f"; {hidden} pages placed from numa_maps (move_pages could not see them: "
            "NUMA balancing had unmapped them)"
        )
    return {"nodes": dict(sorted(nodes.items())), "how": how}


def _apportion(count: int, weights: dict[int, int]) -> dict[int, int]:
    """``count`` split over ``weights``' keys in proportion (largest remainders), never
    more per key than its weight."""
    total = sum(weights.values())
    if total <= 0 or count <= 0:
        return {}
    count = min(count, total)
    share = {n: count * w // total for n, w in weights.items()}
    left = count - sum(share.values())
    for n in sorted(weights, key=lambda n: (-(count * weights[n] % total), n))[:left]:
        share[n] += 1
    return {n: c for n, c in share.items() if c}


def _balancing_note(expected: dict[str, Any] | None) -> str:
    policy = (expected or {}).get("memory_policy")
    if policy in ("preferred", "preferred-many", "bind", "interleave"):
        return (
            "automatic NUMA balancing is on: this rank's private memory is under a task "
            "memory policy, which the kernel does not scan; its shared and file pages still are"
        )
    return (
        "automatic NUMA balancing is on: the kernel scans this process's memory and may move "
        "pages and stall it (DeepEP measured 16-31 ms); a memory policy (NUMABIND_MEMORY="
        "preferred) spares private memory"
    )


def _thread_notes(settings: dict[str, str], expected: dict[str, Any], notes: list[str]) -> None:
    cpus = len(expected["cpus"])
    budget = expected.get("threads")
    omp = settings.get("OMP_NUM_THREADS", "")
    if omp.isascii() and omp.isdigit() and len(omp) < 7:
        n = int(omp)
        if n > cpus:
            notes.append(
                f"OMP_NUM_THREADS={n} oversubscribes its {cpus} CPUs"
                + (f" (budget {budget})" if budget else "")
            )
        elif budget and n < budget:
            notes.append(
                f"OMP_NUM_THREADS={n} uses fewer threads than its budget of {budget} "
                "(NUMABIND_THREADS=auto sizes it)"
            )
    elif settings:
        notes.append("thread settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))


def rank_pids() -> tuple[list[int], _registry_read.Scan]:
    """Processes on this machine that are ranks: a rank variable in their initial
    environment, or an entry in numabind's registry."""
    scan = _registry_read.scan(all_users=True)
    found = set(scan.entries)
    me = os.getpid()
    for name in _sysfs.listdir("/proc", 1 << 22):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me or pid in found:
            continue
        try:
            env = _sysfs.read_environ(pid)
        except OSError:
            continue
        if any(v in env for v in TRIGGER_VARIABLES[:6]):
            cmd = _sysfs.read_opt(f"/proc/{pid}/cmdline", 1 << 16) or ""
            argv = [a for a in cmd.split("\0") if a]
            if detect(env, argv).is_rank:
                found.add(pid)
    return sorted(found), scan


def _line(r: dict[str, Any]) -> str:
    p = r.get("plan") or {}
    who = f"pid {r['pid']}"
    if p.get("local_rank") is not None:
        who += f" rank {p['local_rank']}"
    if p.get("device_pci"):
        who += f" {p['device_pci']}"
    if r.get("status") == "bound":
        loc = r.get("locality")
        policy = p.get("memory_policy")
        policy_text = "not permitted" if policy == "not-permitted" else policy
        where = (
            f"node {p.get('numa_node')}, CPUs {fmt(p.get('cpus', []))}, "
            f"memory {policy_text} {fmt(p.get('memory_nodes', []))}".rstrip()
        )
        where += (
            f", {loc:.1%} of private pages local" if loc is not None else ", no private pages yet"
        )
    else:
        where = f"not bound ({p.get('reason', r.get('status'))})" if p else "no plan"
    verdict = "OK" if r["ok"] else "OFF PLAN"
    text = f"{verdict:8} {who}: {where}"
    for problem in r["problems"]:
        text += f"\n         - {problem}"
    for note in r.get("notes", []):
        text += f"\n         note: {note}"
    return text


def main(args: argparse.Namespace) -> int:
    machine = Machine.from_root(sysroot(os.environ))
    results: list[dict[str, Any]] = []
    vanished: list[int] = []
    notes: list[str] = []
    ignored: dict[str, int] = {}
    own_env: Mapping[str, str] | None = None
    if args.pid:
        pids = list(dict.fromkeys(args.pid))
    elif args.all:
        pids, scan = rank_pids()
        notes.extend(scan.notes)
        ignored = scan.ignored
    else:
        info = detect(os.environ)
        if info.local_rank is None and info.problem is None:
            print(
                "numabind check: this process has no local rank; give --pid PID or --all "
                "(numabind check --help)",
                file=sys.stderr,
            )
            return USAGE
        pids, own_env = [os.getpid()], os.environ
    for pid in pids:
        try:
            results.append(check_pid(pid, machine, environ=own_env))
        except Vanished:
            vanished.append(pid)
    if vanished and args.pid:
        notes.extend(f"no process {pid} (it exited, or is a zombie)" for pid in vanished)
    elif vanished:
        notes.append(f"{len(vanished)} rank(s) exited while being checked: left out")
    if getattr(args, "verbose", False) and ignored:
        notes.append(
            "registry entries ignored: " + ", ".join(f"{n} {k}" for k, n in sorted(ignored.items()))
        )
    problems = [f"pid {r['pid']}: {p}" for r in results for p in r["problems"]]
    shared_total = sum(r.get("shared_pages", {}).get("pages", 0) for r in results)
    ok = all(r["ok"] for r in results)
    if args.json:
        shared_nodes: dict[str, int] = {}
        for r in results:
            for n, c in r.get("shared_pages", {}).get("nodes", {}).items():
                shared_nodes[n] = shared_nodes.get(n, 0) + c
        json.dump(
            {
                "processes": results,
                "ok": ok and not (vanished and args.pid),
                "problems": problems,
                "shared_pages": {"pages": shared_total, "nodes": shared_nodes},
                "vanished": vanished,
                "registry_ignored": ignored,
                "numa_balancing": machine.numa_balancing,
                "notes": notes,
            },
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
    else:
        if not results and not vanished:
            print("numabind check: no rank processes found")
        for r in results:
            print(_line(r))
        for note in notes:
            print(f"note: {note}")
    machine.close()
    if vanished and args.pid:
        return VANISHED
    return ON_PLAN if ok else OFF_PLAN
