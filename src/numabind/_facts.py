"""What the machine layer is asked, and for how long each answer stays true: the table
of facts a cached reading holds, and the two sources that record and replay them.

Every answer a :class:`~numabind._sources.Source` gives has one row of :data:`FACTS`,
and each row says how long its answer stays true (``truth``; no default, so that a new
fact must choose; a test fails on a method with no row):

* ``boot``: fixed while the machine is up (the topology, the PCI tree, node distances);
* ``witnessed``: changeable while it is up, and cheap to check (CPUs and nodes online, a
  node's size, a device's node, the GPUs present, the driver's per-GPU files, memory tiers,
  RDMA adapters, GPU partitions, the cpuset): a cached reading keeps *witnesses*, (kind,
  path, what it said) for the files behind the answer (:func:`witnesses`), and every
  reader compares them before it trusts it (``_numabind_base.machine_holds``);
* ``live``: cheaper to read than to witness (one sysctl: ``numa_balancing``): never kept,
  read every time;
* ``expensive``: changeable but slow (the frequency files behind core kinds, which an
  SST-PP/TF profile or a partition change moves): kept for the boot for the ranks' sake;
  the verifiers (check, doctor, show) never read a cached reading at all.

:class:`Recording` keeps what an inner source answered; :class:`Cached` answers from a
kept record and asks the machine for what it lacks.  The file they are kept in is
numabind._cache's.
"""

from __future__ import annotations

import _numabind_base as base

from ._dra import DraDevice
from ._model import (
    BY_KEY,
    VENDORS,
    Accelerator,
    Allowed,
    CoreKinds,
    KfdNode,
    Nic,
    NicPort,
    Node,
    OtherDevice,
    Record,
)
from ._sources import (
    SYS_CPU,
    SYS_INFINIBAND,
    SYS_NET,
    SYS_NODE,
    SYS_PCI,
    SYS_TIERING,
    Source,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Literal, TypeVar

    T = TypeVar("T")
    Truth = Literal["boot", "witnessed", "live", "expensive"]

_escape: Callable[[str], str] = base.escape
_unescape: Callable[[str], str] = base.unescape


# --- what is recorded: one row per kind of answer --------------------------------------------


class Fact(Record):
    """One kind of answer a :class:`Source` gives: the method, how a call's arguments
    name the answer (``argkey``: ``None`` for a method without arguments), how long the
    answer stays true (``truth``, see the module docstring; no default: a new fact must
    choose) and, for a witnessed one, the files that witness it (``witness``: from the
    answers given, (kind, path) pairs, ``_numabind_base.witness`` reads them)."""

    method: str
    truth: Truth
    argkey: Callable[..., str] | None = None
    records: tuple[type[Record], ...] = ()  # the record classes its answers hold
    witness: Callable[[dict[str, object]], list[tuple[str, str]]] | None = None


TRUTHS = ("boot", "witnessed", "live", "expensive")


def _node_key(node_id: int, online: object, ids: object, full: bool = True) -> str:
    return f"{node_id}.{int(bool(full))}"


def _cpu_key(cpu: int) -> str:
    return str(cpu)


def _acc_key(bdf: str, detail: bool = False) -> str:
    return f"{bdf}.{int(bool(detail))}"


def _text_key(value: str) -> str:
    return _escape(value)


def _vendor_key(vendor: object, arg: object) -> str:
    return f"{_escape(str(getattr(vendor, 'key', vendor)))}.{_escape(str(arg))}"


def _sets_key(*sets: frozenset[str]) -> str:
    return _escape(repr([sorted(s) for s in sets]))


# --- witnesses: the files behind a changeable answer ---------------------------------------------


def _w_nodes(answers: dict[str, object]) -> list[tuple[str, str]]:
    """A node's CPUs and size (a memory block taken offline changes MemTotal), the memory
    tiers, and the list of nodes itself."""
    out = [("l", SYS_NODE), ("l", SYS_TIERING)]
    for key in answers:
        node = key.partition(".")[0]
        out += [("f", f"{SYS_NODE}/node{node}/cpulist"), ("m", f"{SYS_NODE}/node{node}/meminfo")]
    return out


def _devices_of(answers: dict[str, object]) -> list[Accelerator]:
    found: dict[str, Accelerator] = {}
    for value in answers.values():
        for acc in value if isinstance(value, tuple) else (value,):
            if isinstance(acc, Accelerator):
                found.setdefault(acc.pci, acc)
    return list(found.values())


def _w_devices(answers: dict[str, object]) -> list[tuple[str, str]]:
    """Each GPU's node (root rewrites it: a firmware workaround; a GPU taken off the bus
    takes the file with it), its driver's directory (a GH200's GPU memory node is learned
    when the driver loads: its numa_status file appears) and its partition modes (amd-smi
    switches them): a few files per GPU, read by every warm rank."""
    out = []
    for acc in _devices_of(answers):
        out.append(("f", f"{SYS_PCI}/{acc.pci}/numa_node"))
        vendor = BY_KEY.get(acc.vendor)
        if vendor is None:
            continue
        if vendor.driver_dir:
            out.append(("l", vendor.driver_dir))
            if vendor.driver_numa_file:
                out.append(("f", f"{vendor.driver_dir}/{acc.pci}/{vendor.driver_numa_file}"))
        out += [("f", f"{SYS_PCI}/{acc.pci}/{n}") for n in vendor.partition_files or ()]
    return out


def _w_driver(answers: dict[str, object]) -> list[tuple[str, str]]:
    return [
        ("l", v.driver_dir) for v in VENDORS if v.driver_dir and v.key in map(_unescape, answers)
    ]


def _w_modes(answers: dict[str, object]) -> list[tuple[str, str]]:
    out = []
    for key in answers:  # vendor.bdf
        vendor, _, pci = key.partition(".")
        for v in VENDORS:
            if v.key == _unescape(vendor):
                out += [("f", f"{SYS_PCI}/{_unescape(pci)}/{n}") for n in v.partition_files or ()]
    return out


def _w_file(*paths: str) -> Callable[[dict[str, object]], list[tuple[str, str]]]:
    return lambda answers: [("f", p) for p in paths]


# Every answer the machine layer asks for.  A new fact a branch adds to Source (memory
# tiers, NICs read only when asked) is one row here, and the cache holds it as its truth says.
FACTS: tuple[Fact, ...] = (
    Fact(method="online_cpus", truth="witnessed", witness=_w_file(f"{SYS_CPU}/online")),
    # the node list is read from the node directory: its names are the witness
    Fact(method="node_ids", truth="witnessed", witness=lambda answers: [("l", SYS_NODE)]),
    Fact(method="node", truth="witnessed", argkey=_node_key, records=(Node,), witness=_w_nodes),
    Fact(method="cpu_package", truth="boot", argkey=_cpu_key),
    Fact(method="cpu_siblings", truth="boot", argkey=_cpu_key),
    Fact(method="cpu_cache", truth="boot", argkey=_cpu_key),
    # the cpuset's files are the key's witnesses (cpuset_files): read by every rank
    Fact(method="allowed", truth="witnessed", records=(Allowed,)),
    Fact(method="core_kinds", truth="expensive", records=(CoreKinds,)),
    Fact(  # a scan of the bus: the devices present are its witness too (a GPU added)
        method="accelerators",
        truth="witnessed",
        argkey=lambda detail=False: str(int(bool(detail))),
        records=(Accelerator,),
        witness=lambda answers: [("l", SYS_PCI), *_w_devices(answers)],
    ),
    Fact(
        method="accelerator",
        truth="witnessed",
        argkey=_acc_key,
        records=(Accelerator,),
        witness=_w_devices,
    ),
    Fact(
        method="locate",
        truth="witnessed",
        argkey=lambda acc: _escape(acc.pci),
        records=(Accelerator,),
        witness=_w_devices,
    ),
    Fact(method="pci_path", truth="boot", argkey=_text_key),
    Fact(
        method="nics",
        truth="witnessed",
        records=(Nic, NicPort),
        witness=lambda answers: [("l", SYS_INFINIBAND)],
    ),
    Fact(
        method="ethernet",
        truth="witnessed",
        argkey=_sets_key,
        records=(Nic, NicPort),
        witness=lambda answers: [("l", SYS_NET)],
    ),
    Fact(method="others", truth="boot", records=(OtherDevice,)),
    Fact(method="driver_gpus", truth="witnessed", argkey=_text_key, witness=_w_driver),
    Fact(method="dra_devices", truth="boot", records=(DraDevice,)),  # the pod's, in its mnt ns
    Fact(method="kernel_release", truth="boot"),
    Fact(method="numa_balancing", truth="live"),
    Fact(method="sched_ext", truth="live"),  # a scheduler starts and stops at any time
    Fact(method="cpu_vendor", truth="boot"),
    Fact(
        method="partition_nodes",
        truth="witnessed",
        argkey=_vendor_key,
        records=(KfdNode,),
        witness=lambda answers: [
            ("l", v.partition_topology) for v in VENDORS if v.partition_topology
        ],
    ),
    Fact(method="partition_modes", truth="witnessed", argkey=_vendor_key, witness=_w_modes),
)
BY_METHOD = {f.method: f for f in FACTS}
# the record classes a machine file may hold, by name (numabind._text decodes by these)
RECORDS: dict[str, type[Record]] = {cls.__name__: cls for f in FACTS for cls in f.records}


# --- the sources: one that records, one that answers from the record --------------------------


class Recording(Source):
    """A source that asks ``inner`` and keeps every answer (``memo``: method -> argkey ->
    value), so that what one rank read can be written for the others."""

    def __init__(self, inner: Source, memo: dict[str, dict[str, object]] | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.description = inner.description
        self.budget = inner.budget
        self.environ = inner.environ
        self.memo: dict[str, dict[str, object]] = memo if memo is not None else {}
        self.warnings = inner.warnings  # the same list: what it warns of is kept

    def _ask(self, method: str, key: str, call: Callable[[], T]) -> T:
        answers = self.memo.setdefault(method, {})
        if key not in answers:
            answers[key] = call()
        return answers[key]  # type: ignore[return-value]  # what call() gave, kept

    def locate(self, acc: Accelerator) -> Accelerator:
        if acc.read != "id":
            return acc
        return self._ask("locate", _escape(acc.pci), lambda: self.inner.locate(acc))

    def close(self) -> None:
        self.inner.close()


def _recorded(fact: Fact) -> Callable[..., object]:
    """The :class:`Recording` method of ``fact``: the inner source's answer, kept under
    the method's name and the call's argkey."""
    name, argkey = fact.method, fact.argkey

    def ask(self: Recording, *args: object, **kwargs: object) -> object:
        if fact.truth == "live":  # never kept: the machine's answer, now
            return getattr(self.inner, name)(*args, **kwargs)
        key = argkey(*args, **kwargs) if argkey is not None else "-"
        return self._ask(name, key, lambda: getattr(self.inner, name)(*args, **kwargs))

    ask.__name__ = ask.__qualname__ = name
    ask.__doc__ = f"``{name}`` of the inner source, recorded."
    return ask


for _fact in FACTS:  # one row of FACTS is one recorded method
    if _fact.method not in Recording.__dict__:
        setattr(Recording, _fact.method, _recorded(_fact))


class Cached(Recording):
    """A source that answers from a cache file's record; what it does not hold is asked of
    the machine itself (opened on the first such question), kept, and counted in
    ``misses`` (the rank then writes the file again with it)."""

    def __init__(
        self,
        memo: dict[str, dict[str, object]],
        description: str,
        open_live: Callable[[], Source],
        environ: dict[str, str] | None,
        warnings: list[str],
        keep: Callable[[Cached], None] | None = None,
    ) -> None:
        Source.__init__(self)
        self._keep = keep
        self.memo = memo
        self.description = description
        self.environ = environ
        self.warnings = warnings
        self._open_live = open_live
        self._live: Source | None = None
        self.misses = 0
        self.missed: list[str] = []  # the facts (by method) the file lacked, first asked first

    @property
    def inner(self) -> Source:
        if self._live is None:
            self._live = self._open_live()
            self.budget = self._live.budget
        return self._live

    @inner.setter
    def inner(self, value: Source) -> None:
        self._live = value

    def _ask(self, method: str, key: str, call: Callable[[], T]) -> T:
        answers = self.memo.setdefault(method, {})
        if key not in answers:
            self.misses += 1
            if method not in self.missed:
                self.missed.append(method)
            answers[key] = call()
            for w in self.inner.warnings:
                if w not in self.warnings:
                    self.warnings.append(w)
        return answers[key]  # type: ignore[return-value]  # the file's answer, or call()'s

    def close(self) -> None:
        """Release the machine; where this reading asked it for facts the file did not
        hold, write the file again with them (so the next rank, or show, has them), before
        the machine's files are let go (the key's cpuset files are read again)."""
        if self.misses and self._keep is not None:
            keep, self._keep = self._keep, None
            try:
                keep(self)
            except Exception:
                pass  # the cache is an optimisation: a failure to extend it is nothing
        if self._live is not None:
            self._live.close()


# --- witnesses and the cpuset ------------------------------------------------------------------


def cpuset_files(allowed: Allowed) -> list[tuple[str, str]] | None:
    """The cpuset files behind ``allowed`` (kind ``f``, path), read through ``source``'s
    root; None when the allowed set cannot be witnessed (a cpuset that exists but is
    unreadable)."""
    if allowed.problem:
        return None
    from ._sources import _V1, _V1_NOPREFIX, _V2

    if allowed.kind == "online":
        names = [f"{SYS_CPU}/online"]
    elif allowed.directory is not None and allowed.kind in ("cgroup-v1", "cgroup-v2"):
        tables = (_V2,) if allowed.kind == "cgroup-v2" else (_V1, _V1_NOPREFIX)
        names = [f"{allowed.directory}/{n}" for t in tables for n in t if n]
    else:
        return None
    return [("f", path) for path in dict.fromkeys(names)]


def witnesses(source: Recording, sysroot: str) -> list[tuple[str, str, str]] | None:
    """(kind, path, what it says now) for every witnessed answer ``source`` gave, read
    under ``sysroot``; None when the machine cannot be witnessed (its cpuset unreadable, a
    file or directory too large to witness: ``_numabind_base.witness``)."""
    allowed = source.memo.get("allowed", {}).get("-")
    if allowed is None:  # a plan that did not ask (one node): the cpuset is witnessed all the same
        allowed = source.allowed(source.online_cpus())
    if not isinstance(allowed, Allowed):
        return None
    files = cpuset_files(allowed)
    if files is None:
        return None
    paths: dict[tuple[str, str], None] = dict.fromkeys(files)
    for fact in FACTS:
        answers = source.memo.get(fact.method)
        if answers and fact.witness is not None:
            paths.update(dict.fromkeys(fact.witness(answers)))
    prefix = base.tree(sysroot)
    found = [(kind, path, base.witness(kind, prefix + path)) for kind, path in paths]
    return None if any(said == "+" for _, _, said in found) else found
