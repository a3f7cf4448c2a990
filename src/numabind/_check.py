"""``numabind check``: is a process where its plan says, and is its memory there too?

For each process: its rank and device, the plan it should have (from its registry entry,
else planned from its initial environment), every thread's CPU mask, its memory policy (as
/proc/PID/numa_maps reports it), and its private anonymous pages per node.  Each mismatch
comes with its likely cause.  Exit 0: every checked process is on its plan; 1: one is not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from . import _registry, _sysfs
from ._procmaps import locality, pages_per_node, private_anon_regions
from ._ranks import TRIGGER_VARIABLES
from ._topology import Machine

fmt = _sysfs.format_cpulist
MIN_LOCALITY = 0.9


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        raw = f.read()
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


def _threads(pid: int) -> dict[int, frozenset[int]]:
    out = {}
    for tid in _sysfs.listdir(f"/proc/{pid}/task"):
        text = _sysfs.read_opt(f"/proc/{pid}/task/{tid}/status") or ""
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
    word = fields[1]
    if len(fields) > 2 and fields[2].startswith("(many)"):
        word = "prefer_many" + fields[2][len("(many)") :]
    head, _, nodes = word.partition(":")
    name = head.split("=", 1)[0]
    name = {"prefer": "preferred", "prefer_many": "preferred-many"}.get(name, name)
    try:
        parsed = _sysfs.parse_cpulist(nodes) if nodes else frozenset()
    except ValueError:
        parsed = frozenset()
    return name, parsed


def _policy(pid: int) -> tuple[str, frozenset[int]] | None:
    """The main thread's policy as numa_maps shows it on regions without their own."""
    try:
        with open(f"/proc/{pid}/numa_maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    pick = next((ln for ln in lines if " heap" in ln), None) or next(
        (ln for ln in lines if " anon=" in ln), None
    )
    if pick is None:
        return None
    return parse_policy(pick.split())


def expected_plan(pid: int, machine: Machine) -> tuple[dict[str, Any] | None, str]:
    """The plan a process should have: its registry entry, else planned from its initial
    environment.  Returns (plan as dict, where it came from)."""
    entry = _registry.read(pid)
    if entry is not None:
        return {
            "local_rank": int(entry["local_rank"]) if entry.get("local_rank") else None,
            "rank_source": entry.get("rank_source") or None,
            "device_pci": entry.get("device") or None,
            "numa_node": int(entry["numa_node"]) if entry.get("numa_node") else None,
            "cpus": sorted(_sysfs.parse_cpulist(entry.get("cpus", ""))),
            "memory_policy": entry.get("memory_policy", "none"),
            "memory_nodes": sorted(_sysfs.parse_cpulist(entry.get("memory_nodes", ""))),
            "status": "bound",
            "reason": entry.get("reason", ""),
            "problem": False,
        }, "registry"
    try:
        env = _environ(pid)
    except OSError as err:
        return None, f"cannot read /proc/{pid}/environ ({err.strerror})"
    from ._config import config_from_env
    from ._devices import resolve
    from ._plan import plan, request_for
    from ._ranks import detect

    info = detect(env)
    if info.local_rank is None and info.problem is None:
        return None, "no local rank in its initial environment and not registered by numabind"
    try:
        cfg = config_from_env(env)
    except ValueError as err:
        return None, str(err)
    visible = resolve(machine, env)
    p = plan(
        machine,
        request_for(info, visible, cfg.mode, cfg.memory),
    )
    return p.to_dict(), "its initial environment"


def check_pid(pid: int, machine: Machine, min_locality: float = MIN_LOCALITY) -> dict[str, Any]:
    result: dict[str, Any] = {"pid": pid, "ok": True, "problems": []}
    if not os.path.exists(f"/proc/{pid}"):
        result.update(ok=False, problems=[f"no process {pid}"])
        return result
    expected, source = expected_plan(pid, machine)
    result["plan"], result["plan_source"] = expected, source
    threads = _threads(pid)
    result["threads"] = {str(t): sorted(c) for t, c in threads.items()}
    policy = _policy(pid)
    result["memory_policy"] = (
        None if policy is None else {"policy": policy[0], "nodes": sorted(policy[1])}
    )
    try:
        pages = pages_per_node(private_anon_regions(pid))
    except OSError:
        pages = {}
    result["pages"] = {str(n): c for n, c in pages.items()}
    problems: list[str] = result["problems"]
    if expected is None:
        result["status"] = "unknown"
        problems.append(f"no plan to check against: {source}")
        result["ok"] = False
        return result
    if expected["status"] != "bound":
        result["status"] = "skipped"
        result["locality"] = None
        if expected.get("problem"):
            cause = "cgroup too narrow" if "may use" in expected["reason"] else "bad input"
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
    if policy is not None and want not in ("none",):
        got_name, got_nodes = policy
        same = got_name == want or (want == "local" and got_name == "local")
        if not same or (want not in ("local",) and got_nodes != mem_nodes):
            problems.append(
                f"memory policy is {got_name} {fmt(got_nodes)}, plan {want} {fmt(mem_nodes)}"
            )
    share = locality(pages, mem_nodes) if mem_nodes else None
    result["locality"] = share
    if share is not None and share < min_locality:
        remote = {n: c for n, c in pages.items() if n not in mem_nodes}
        worst = max(remote, key=lambda n: remote[n])
        problems.append(
            f"pages left remote: {share:.1%} on node(s) {fmt(mem_nodes)}, "
            f"{remote[worst] * 4 // 1024} MiB on node {worst}"
        )
    result["status"] = "bound"
    result["ok"] = not problems
    return result


def rank_pids() -> list[int]:
    """Processes on this machine that are ranks: a rank variable in their initial
    environment, or an entry in numabind's registry."""
    found = set(_registry.registered_pids())
    try:
        import psutil

        pids = psutil.pids()
    except ImportError:
        pids = [int(p) for p in _sysfs.listdir("/proc") if p.isdigit()]
    me = os.getpid()
    for pid in pids:
        if pid == me:
            continue
        try:
            env = _environ(pid)
        except OSError:
            continue
        if any(v in env for v in TRIGGER_VARIABLES):
            from ._ranks import detect

            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
            except OSError:
                argv = []
            if detect(env, argv).is_rank:
                found.add(pid)
    return sorted(found)


def _line(r: dict[str, Any]) -> str:
    p = r.get("plan") or {}
    who = f"pid {r['pid']}"
    if p.get("local_rank") is not None:
        who += f" rank {p['local_rank']}"
    if p.get("device_pci"):
        who += f" {p['device_pci']}"
    if r.get("status") == "bound":
        loc = r.get("locality")
        where = (
            f"node {p.get('numa_node')}, CPUs {fmt(p.get('cpus', []))}, "
            f"memory {p.get('memory_policy')} {fmt(p.get('memory_nodes', []))}"
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
    return text


def main(args: argparse.Namespace) -> int:
    machine = Machine.from_root(os.environ.get("NUMABIND_SYSROOT", "/"))
    if args.pid:
        pids = list(args.pid)
    elif args.all:
        pids = rank_pids()
    else:
        pids = [os.getpid()]
    results = [check_pid(pid, machine) for pid in pids]
    if args.json:
        json.dump({"processes": results, "ok": all(r["ok"] for r in results)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        if not results:
            print("numabind check: no rank processes found")
        for r in results:
            print(_line(r))
    if any(r["problems"] == [f"no process {r['pid']}"] for r in results):
        return 2
    return 0 if all(r["ok"] for r in results) else 1
