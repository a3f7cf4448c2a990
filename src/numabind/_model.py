"""Plain immutable records, and the machine model built from them.

``dataclasses`` would be the obvious tool, but importing it pulls in ``inspect`` and ``re``
(several milliseconds), and these records are built in every rank process by the startup
hook.  So :class:`Record` does the few things a frozen, slotted, keyword-only dataclass
would, from the class annotations alone: each field is written once, as ``name: type`` or
``name: type = default``, and the metaclass turns that into ``__slots__``, a keyword-only
constructor, equality, hashing, a readable ``repr``, pickling, :meth:`Record.replace` and
a JSON-ready :meth:`Record.to_dict`.  ``dataclass_transform`` (type checkers only) tells
mypy the same, so constructor calls are checked field by field.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, TypeVar

    from typing_extensions import dataclass_transform

    R = TypeVar("R", bound="Record")
else:

    def dataclass_transform(**_: object) -> object:
        return lambda cls: cls


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


def _restore(cls: type[R], values: dict[str, Any]) -> R:
    """Unpickle a record (a module-level function, so pickle can name it)."""
    return cls(**values)


def _warn_positional(cls: type) -> None:
    import warnings

    warnings.warn(
        f"positional arguments to {cls.__name__}() are deprecated and will be removed in "
        "numabind 0.3; pass every field by name",
        DeprecationWarning,
        stacklevel=3,
    )


class _RecordMeta(type):
    """Turn ``name: type [= default]`` annotations into slots, defaults and field order."""

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> _RecordMeta:
        inherited: tuple[str, ...] = ()
        defaults: dict[str, Any] = {}
        for base in bases:
            inherited += getattr(base, "_fields", ())
            defaults.update(getattr(base, "_defaults", {}))
        own = tuple(
            n
            for n, kind in ns.get("__annotations__", {}).items()
            if not n.startswith("_") and not str(kind).startswith("ClassVar")
        )
        for n in own:
            if n in ns:
                defaults[n] = ns.pop(n)
        ns.setdefault("__slots__", own)
        ns["_fields"] = inherited + own
        ns["_defaults"] = defaults
        return super().__new__(mcs, name, bases, ns)


@dataclass_transform(kw_only_default=True, frozen_default=True)
class Record(metaclass=_RecordMeta):
    """Base of the model's value objects: immutable once built, compared by value.

    Construction is keyword-only.  A record listed in ``numabind.__all__`` sets
    ``_positional`` and still accepts the old positional form, with a
    ``DeprecationWarning`` (see the changelog).
    """

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, Any]] = {}
    _positional: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        fields = cls._fields
        if args:
            if not cls._positional:
                raise TypeError(f"{cls.__name__}() takes keyword arguments only")
            if len(args) > len(fields):
                raise TypeError(f"{cls.__name__}() takes at most {len(fields)} arguments")
            _warn_positional(cls)
            for n, v in zip(fields, args):
                if n in kwargs:
                    raise TypeError(f"{cls.__name__}() got multiple values for {n!r}")
                kwargs[n] = v
        defaults = cls._defaults
        for n in fields:
            if n in kwargs:
                _set(self, n, kwargs.pop(n))
            elif n in defaults:
                _set(self, n, defaults[n])
            else:
                raise TypeError(f"{cls.__name__}() missing required argument {n!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}() got unexpected arguments {sorted(kwargs)}")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, n) for n in self._fields)

    def replace(self: R, **changes: Any) -> R:
        """A copy with some fields changed (``dataclasses.replace`` for records)."""
        values = {n: getattr(self, n) for n in self._fields}
        unknown = set(changes) - set(values)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no fields {sorted(unknown)}")
        values.update(changes)
        return type(self)(**values)

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), {n: getattr(self, n) for n in self._fields}))

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__name__}({fields})"

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready data (sets as sorted lists)."""
        return {n: jsonable(getattr(self, n)) for n in self._fields}


# --- the machine model --------------------------------------------------------------------


class Node(Record):
    """One NUMA node.  ``cpus`` are its online CPUs; an empty set means a memory-only node
    (GPU HBM on GH200/GB200/POWER9, CXL memory)."""

    id: int
    cpus: frozenset[int]
    memory_bytes: int | None = None
    distances: tuple[tuple[int, int], ...] = ()

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

    cpu: int
    package: int | None
    siblings: frozenset[int]
    cache: frozenset[int] | None


class Accelerator(Record):
    """A compute accelerator on PCI.

    ``vendor`` is the key of its entry in :data:`numabind._vendors.VENDORS`.
    ``numa_node`` is None when the firmware does not say (sysfs ``-1``); ``local_cpus`` is
    the device's CPU locality from ``local_cpulist``/``local_cpus`` (None when unreadable).
    ``memory_node`` is the CPU-less node holding the GPU's own memory, where the driver
    exposes one (POWER9 and Grace systems).  ``uuid`` is the token a visibility list can
    name it by (NVIDIA ``GPU-...``; AMD ``GPU-<unique_id>``).  Unreadable fields are None.
    """

    pci: str
    vendor: str
    vendor_id: int | None = None
    device_id: int | None = None
    pci_class: int | None = None
    numa_node: int | None = None
    local_cpus: frozenset[int] | None = None
    uuid: str | None = None
    memory_node: int | None = None
    name: str | None = None
    minor: int | None = None

    @property
    def model(self) -> str:
        """What to compare when asking 'are these GPUs the same model?'."""
        return self.name or f"{self.vendor_id or 0:04x}:{self.device_id or 0:04x}"


if TYPE_CHECKING:
    from typing import Literal

    AllowedKind = Literal["cgroup-v1", "cgroup-v2", "hwloc", "online"]


class Allowed(Record):
    """The CPUs and memory nodes this process may use, and where that answer came from.

    ``kind`` says which: a cgroup v1 or v2 cpuset (``directory`` is the cgroup directory
    read), an hwloc export's allowed sets, or ``online`` when no cpuset could be read
    (``problem`` then says why when one exists but was unreadable)."""

    cpus: frozenset[int]
    mems: frozenset[int] | None
    kind: AllowedKind
    directory: str | None = None
    problem: str | None = None

    @property
    def source(self) -> str:
        """One human line: where ``cpus`` came from."""
        if self.kind == "cgroup-v1":
            return f"cgroup v1 cpuset {self.directory}"
        if self.kind == "cgroup-v2":
            return f"cgroup v2 {self.directory}"
        if self.kind == "hwloc":
            return "hwloc allowed_cpuset/allowed_nodeset"
        if self.problem:
            return f"all online CPUs ({self.problem})"
        return "all online CPUs (no cgroup cpuset is mounted or enabled)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpus": sorted(self.cpus),
            "mems": sorted(self.mems) if self.mems is not None else None,
            "kind": self.kind,
            "directory": self.directory,
            "problem": self.problem,
            "source": self.source,
        }
