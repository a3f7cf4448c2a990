"""``numabind check --format openmetrics``: the binding exporter.

The report ``check`` already builds (:class:`numabind.check._inspect.CheckReport` for
``--all`` and ``--pid``, :class:`numabind.check._job.JobReport` for ``--job`` and
``--store``) written as OpenMetrics text exposition (the format Prometheus scrapes and
node_exporter's textfile collector reads), one series set per rank.  Nothing is judged
here: whether a rank is on plan is the report's ``ok`` (the rule of
numabind.check._inspect, the one the exit status follows), which threads left the plan is
its ``off_plan_threads``, the NIC distance class is numabind._nics.rank_of.  This module
only names, labels and escapes.

Every rank's series carry the labels that join dcgm-exporter's, spelled as it spells
them (``Hostname``, ``UUID``, ``pci_bus_id`` in NVML's ``00000000:3B:00.0`` form, ``gpu``
the GPU's index in PCI order, as NVML counts), and ``pid``, ``job_id``, ``rank``,
``local_rank``.  Label values come from other processes' environments and from the
machine: they are escaped as the format says (backslash, double quote, newline) and a
character that UTF-8 cannot carry is replaced, so that no value can end a label, a line
or the exposition.  A process that exited, one this user cannot read and one with no
plan are series too (``numabind_rank_up 0`` with a ``reason``), never a missing scrape.
"""

from __future__ import annotations

import os
import socket

from .._model import NODE_KINDS
from .._nics import rank_of
from .._sysfs import clean_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._inspect import CheckReport, ProcessCheck
    from ._job import JobReport, RankRow

# why a rank has no verdict (numabind_rank_up 0): a fixed vocabulary, so that a label
# never carries free text and an alert can match it
UP_REASONS: tuple[str, ...] = (
    "checked",  # up 1: looked at, with a plan to compare with
    "no_plan",  # neither registered by numabind nor a rank by its environment
    "unreadable",  # its /proc files are not this user's to read (another user's process)
    "exited",  # gone (or a zombie) by the time it was read
    "not_reached",  # --all's deadline passed first
    "invalid_record",  # --job: its node's record for it did not parse
)


def bound_reasons() -> tuple[str, ...]:
    """Why a rank is bound or not (numabind_rank_bound's ``reason``): ``bound``, else the
    planner's own words for a plan that does not bind (numabind._plan.SKIP_KINDS), else
    ``not-bound``.  The planner is imported when this is asked, not with the module (the
    renderer is imported by the CLI only for ``--format openmetrics``)."""
    from .._plan import SKIP_KINDS

    return ("bound", *SKIP_KINDS, "not-bound")


WRONG_TIER = tuple(name for name, kind in NODE_KINDS.items() if kind.wrong_tier)

# name -> (help, unit); the order families are written in
FAMILIES: dict[str, tuple[str, str]] = {
    "numabind_rank_up": (
        "1 when the rank was checked against a plan; 0 with the reason it was not",
        "",
    ),
    "numabind_rank_on_plan": (
        "1 when every thread, the memory policy and the pages are where the rank's plan says "
        "(check's verdict: exit status 1 when any is 0)",
        "",
    ),
    "numabind_rank_bound": ("1 when numabind's plan binds the rank; reason says why not", ""),
    "numabind_rank_problems": ("The problems check names for the rank", ""),
    "numabind_rank_pages_on_plan_ratio": (
        "Share of the rank's private CPU-memory pages on its plan's nodes (numa_maps)",
        "ratio",
    ),
    "numabind_rank_threads": ("The rank's threads", ""),
    "numabind_rank_threads_off_plan": ("Threads running outside the plan's CPUs", ""),
    "numabind_rank_role_on_plan": (
        "1 when every thread (or child process) of the role runs on the plan's CPUs",
        "",
    ),
    "numabind_rank_role_threads": ("Threads (or child processes) of each role", ""),
    "numabind_rank_main_thread_priority_core": (
        "1 when the rank's main thread runs on a priority core of its node",
        "",
    ),
    "numabind_rank_nic_distance": (
        "PCI distance class from the rank's GPU to each RDMA adapter port chosen for it: "
        "0 PIX, 1 PXB, 2 PHB, 3 NODE, 4 SYS",
        "",
    ),
    "numabind_rank_memory_bytes": ("The rank's private memory per node kind", "bytes"),
    "numabind_rank_pages_far_bytes": (
        "The rank's private memory on GPU-memory and far nodes (kind says which)",
        "bytes",
    ),
    "numabind_node_up": ("1 when the node answered (--job); 0 with the reason", ""),
    "numabind_node_ranks": ("Rank processes checked on the node", ""),
    "numabind_node_numa_balancing": ("1 when automatic NUMA balancing is on", ""),
}


def escape_label(value: str) -> str:
    """A label value as OpenMetrics writes it: backslash, double quote and newline
    escaped; a character UTF-8 cannot encode (a lone surrogate from undecodable bytes)
    replaced."""
    value = value.encode("utf-8", "replace").decode("utf-8")
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text: backslash and newline escaped (quotes stay)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def dcgm_bus_id(pci: str | None) -> str | None:
    """``0000:3b:00.0`` as NVML and dcgm-exporter write it: ``00000000:3B:00.0``."""
    if not pci or ":" not in pci:
        return None
    domain, rest = pci.split(":", 1)
    return f"{domain.upper():0>8}:{rest.upper()}"


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class Exposition:
    """Samples gathered per family, then written family by family (the format wants a
    family's samples together); a second sample with the same labels is dropped, never
    written twice."""

    def __init__(self) -> None:
        self.samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {
            name: {} for name in FAMILIES
        }

    def add(self, name: str, labels: dict[str, str | int | None], value: float) -> None:
        key = tuple((k, str(v)) for k, v in labels.items() if v is not None)
        self.samples[name].setdefault(key, value)

    def text(self) -> str:
        out: list[str] = []
        for name, (help_text, unit) in FAMILIES.items():
            samples = self.samples[name]
            if not samples:
                continue
            out.append(f"# TYPE {name} gauge")
            if unit:
                out.append(f"# UNIT {name} {unit}")
            out.append(f"# HELP {name} {escape_help(help_text)}")
            for key, value in samples.items():
                labels = ",".join(f'{k}="{escape_label(v)}"' for k, v in key)
                series = f"{name}{{{labels}}}" if labels else name
                out.append(f"{series} {_number(value)}")
        out.append("# EOF")
        return "\n".join(out) + "\n"


def _rank_labels(r: ProcessCheck, host: str) -> dict[str, str | int | None]:
    p = r.plan
    return {
        "Hostname": host,
        "pid": r.pid,
        "job_id": r.identity.job_id,
        "rank": r.identity.rank,
        "local_rank": p.local_rank if p is not None else None,
        "gpu": r.gpu.index,
        "UUID": r.gpu.uuid,
        "pci_bus_id": dcgm_bus_id(r.gpu.pci),
    }


def _up_reason(r: ProcessCheck) -> str:
    if r.status != "unknown":
        return "checked"
    return "unreadable" if r.plan_source.startswith("cannot read") else "no_plan"


def _bound_reason(r: ProcessCheck) -> str:
    if r.status == "bound":
        return "bound"
    skip = r.plan.skip if r.plan is not None else None
    return skip if skip is not None and skip in bound_reasons() else "not-bound"


def _rank(e: Exposition, r: ProcessCheck, host: str) -> None:
    """One checked process's series."""
    labels = _rank_labels(r, host)
    reason = _up_reason(r)
    e.add("numabind_rank_up", {**labels, "reason": reason}, reason == "checked")
    e.add("numabind_rank_threads", labels, len(r.threads))
    if r.status == "unknown":
        return
    e.add("numabind_rank_on_plan", labels, r.ok)
    e.add("numabind_rank_bound", {**labels, "reason": _bound_reason(r)}, r.status == "bound")
    e.add("numabind_rank_problems", labels, len(r.problems))
    if r.locality is not None:
        e.add("numabind_rank_pages_on_plan_ratio", labels, r.locality)
    if r.status == "bound":
        e.add("numabind_rank_threads_off_plan", labels, len(r.off_plan_threads))
    for g in r.roles:
        role = {**labels, "role": g.role, "kind": g.kind}
        e.add("numabind_rank_role_threads", role, g.count)
        if g.on_plan is not None:
            e.add("numabind_rank_role_on_plan", role, g.on_plan)
    if r.main_on_priority is not None:
        e.add("numabind_rank_main_thread_priority_core", labels, r.main_on_priority)
    for n in r.nics:
        nic = {**labels, "nic": n.label, "relation": n.relation}
        e.add("numabind_rank_nic_distance", nic, rank_of(n.relation))
    for kind, size in sorted(r.tiers.items()):
        e.add("numabind_rank_memory_bytes", {**labels, "kind": kind}, size)
    for kind in WRONG_TIER:
        e.add("numabind_rank_pages_far_bytes", {**labels, "kind": kind}, r.tiers.get(kind, 0))


def dcgm_hostname(environ: Mapping[str, str] | None = None) -> str:
    """The ``Hostname`` dcgm-exporter gives this machine's series: ``NODE_NAME`` where set
    (its Kubernetes DaemonSet sets it), else the host name (its hostname.GetHostname)."""
    env = os.environ if environ is None else environ
    return clean_line(env.get("NODE_NAME") or socket.gethostname(), 255)


def render(report: CheckReport, hostname: str | None = None) -> str:
    """``check --all`` / ``--pid`` as OpenMetrics text; ``hostname`` is the ``Hostname``
    label (default: this machine's, as dcgm-exporter names it: :func:`dcgm_hostname`)."""
    host = hostname if hostname is not None else dcgm_hostname()
    e = Exposition()
    for r in report.processes:
        _rank(e, r, host)
    for pid, reason in [
        *((p, "exited") for p in report.vanished),
        *((p, "not_reached") for p in report.skipped),
    ]:
        e.add("numabind_rank_up", {"Hostname": host, "pid": pid, "reason": reason}, 0)
    e.add("numabind_node_ranks", {"Hostname": host}, len(report.processes))
    if report.numa_balancing is not None:
        e.add("numabind_node_numa_balancing", {"Hostname": host}, report.numa_balancing)
    return e.text()


def _row_labels(r: RankRow) -> dict[str, str | int | None]:
    return {
        "Hostname": r.host,
        "pid": r.pid,
        "job_id": r.job_id,
        "rank": r.rank,
        "local_rank": r.local_rank,
        "gpu": r.gpu_index,
        "UUID": r.gpu_uuid,
        "pci_bus_id": dcgm_bus_id(r.gpu_pci),
    }


def _row(e: Exposition, r: RankRow) -> None:
    """One rank of a job report (the compact record a node's collector sent)."""
    labels = _row_labels(r)
    reason = {"invalid": "invalid_record", "unknown": "no_plan"}.get(r.status, "checked")
    e.add("numabind_rank_up", {**labels, "reason": reason}, reason == "checked")
    if reason != "checked":
        return
    e.add("numabind_rank_on_plan", labels, r.status != "off plan")
    e.add("numabind_rank_problems", labels, len(r.problems))
    if r.locality is not None:
        e.add("numabind_rank_pages_on_plan_ratio", labels, r.locality)
    e.add("numabind_rank_threads", labels, sum(g.count for g in r.threads))
    if any(g.on_plan is not None for g in r.threads):
        off = sum(g.count for g in r.off_plan_threads)
        e.add("numabind_rank_threads_off_plan", labels, off)


def render_job(report: JobReport) -> str:
    """``check --job`` / ``--store`` as OpenMetrics text: every node's ranks, and a node
    that did not answer as ``numabind_node_up 0`` with why."""
    e = Exposition()
    for node in report.nodes:
        up = node.state == "answered"
        reason = "answered" if up else node.state
        e.add("numabind_node_up", {"Hostname": node.host, "reason": reason}, up)
        if up:
            e.add("numabind_node_ranks", {"Hostname": node.host}, len(node.ranks))
        for r in node.ranks:
            _row(e, r)
    return e.text()


def write(text: str) -> None:
    """The exposition on standard output, as UTF-8 whatever the locale."""
    import sys

    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(text)
    else:
        buffer.write(text.encode("utf-8"))
        buffer.flush()
