"""Plain immutable records for the machine model.

``dataclasses`` would be the obvious tool, but importing it pulls in ``inspect`` and ``re``
(several milliseconds), and these records are built in every rank process by the startup
hook.  So they are small slotted classes with one shared base that gives them equality,
hashing, a readable ``repr``, pickling and a JSON-ready ``to_dict``.  Positional
constructor arguments always follow ``__slots__`` order; pickling relies on it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_set = object.__setattr__


def jsonable(value: object) -> object:
    """Convert a record value for JSON: sets become sorted lists, records become dicts."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (frozenset, set)):
        return sorted(value)
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


class Record:
    """Base of the model's value objects: immutable once built, compared by value."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _names(self) -> tuple[str, ...]:
        names: tuple[str, ...] = self.__slots__
        return names

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, n) for n in self._names())

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._names())
        return f"{type(self).__name__}({fields})"

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready data (sets as sorted lists)."""
        return {n: jsonable(getattr(self, n)) for n in self._names()}


class Node(Record):
    """One NUMA node.  ``cpus`` are its online CPUs; an empty set means a memory-only node
    (GPU HBM on GH200/GB200/POWER9, CXL memory)."""

    __slots__ = ("id", "cpus", "memory_bytes", "distances")
    id: int
    cpus: frozenset[int]
    memory_bytes: int | None
    distances: tuple[tuple[int, int], ...]

    def __init__(
        self,
        id: int,
        cpus: frozenset[int],
        memory_bytes: int | None = None,
        distances: tuple[tuple[int, int], ...] = (),
    ) -> None:
        _set(self, "id", id)
        _set(self, "cpus", cpus)
        _set(self, "memory_bytes", memory_bytes)
        _set(self, "distances", distances)

    @property
    def has_cpus(self) -> bool:
        return bool(self.cpus)

    def distance_to(self, other: int) -> int | None:
        for node, dist in self.distances:
            if node == other:
                return dist
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "cpus": sorted(self.cpus),
            "has_cpus": self.has_cpus,
            "memory_bytes": self.memory_bytes,
            "distances": {str(n): d for n, d in self.distances},
        }


class CpuInfo(Record):
    """Where one CPU sits: its package, its SMT siblings, and the largest cache domain
    it shares (the L3 on x86, the L2 cluster on some Arm parts)."""

    __slots__ = ("cpu", "package", "siblings", "cache")
    cpu: int
    package: int | None
    siblings: frozenset[int]
    cache: frozenset[int] | None

    def __init__(
        self,
        cpu: int,
        package: int | None,
        siblings: frozenset[int],
        cache: frozenset[int] | None,
    ) -> None:
        _set(self, "cpu", cpu)
        _set(self, "package", package)
        _set(self, "siblings", siblings)
        _set(self, "cache", cache)


class Accelerator(Record):
    """A compute accelerator on PCI.

    ``numa_node`` is None when the firmware does not say (sysfs ``-1``); ``local_cpus`` is
    the device's CPU locality from ``local_cpulist``/``local_cpus`` (None when unreadable).
    ``memory_node`` is the CPU-less node holding the GPU's own memory, where the driver
    exposes one (POWER9 and Grace systems).  Unreadable fields are None, never errors.
    """

    __slots__ = (
        "pci",
        "vendor",
        "vendor_id",
        "device_id",
        "pci_class",
        "numa_node",
        "local_cpus",
        "uuid",
        "memory_node",
        "name",
        "minor",
    )
    pci: str
    vendor: str
    vendor_id: int | None
    device_id: int | None
    pci_class: int | None
    numa_node: int | None
    local_cpus: frozenset[int] | None
    uuid: str | None
    memory_node: int | None
    name: str | None
    minor: int | None

    def __init__(
        self,
        pci: str,
        vendor: str,
        vendor_id: int | None = None,
        device_id: int | None = None,
        pci_class: int | None = None,
        numa_node: int | None = None,
        local_cpus: frozenset[int] | None = None,
        uuid: str | None = None,
        memory_node: int | None = None,
        name: str | None = None,
        minor: int | None = None,
    ) -> None:
        _set(self, "pci", pci)
        _set(self, "vendor", vendor)
        _set(self, "vendor_id", vendor_id)
        _set(self, "device_id", device_id)
        _set(self, "pci_class", pci_class)
        _set(self, "numa_node", numa_node)
        _set(self, "local_cpus", local_cpus)
        _set(self, "uuid", uuid)
        _set(self, "memory_node", memory_node)
        _set(self, "name", name)
        _set(self, "minor", minor)

    @property
    def model(self) -> str:
        """What to compare when asking 'are these GPUs the same model?'."""
        return self.name or f"{self.vendor_id or 0:04x}:{self.device_id or 0:04x}"


class Allowed(Record):
    """The CPUs and memory nodes this process may use, and where that answer came from.

    ``source`` names the cgroup file read, or says that only the current affinity was
    available (which a parent may have narrowed, so it is the weakest answer)."""

    __slots__ = ("cpus", "mems", "source")
    cpus: frozenset[int]
    mems: frozenset[int] | None
    source: str

    def __init__(self, cpus: frozenset[int], mems: frozenset[int] | None, source: str) -> None:
        _set(self, "cpus", cpus)
        _set(self, "mems", mems)
        _set(self, "source", source)
