"""The RDMA adapters of a machine, read from its file tree: what
:meth:`numabind._sources.SysfsSource.nics` returns, kept out of that module so that a
rank which does not ask for NICs never loads this code.

The kernel's view, each fact one file (all of it read as hostile input, bounded):

* ``/sys/class/infiniband/<dev>``: one RDMA device; ``device`` leads to its PCI function
  (a soft-RoCE or soft-iWARP device has none: it is not an adapter of this machine's PCI
  tree and is left out); ``ports/<n>/state`` (``4: ACTIVE``), ``rate`` (``200 Gb/sec (4X
  HDR)``), ``link_layer`` (``InfiniBand``, ``Ethernet``) and ``gid_attrs/ndevs/0`` (the
  interface a RoCE port's addresses live on);
* ``device/net/<if>``: the network interfaces of the adapter's PCI function;
* ``/sys/class/net/<if>/bonding/slaves``: ``<if>`` is a bond and these are its members;
  ``/sys/class/net/<if>/bonding_slave/state``: ``<if>`` is enslaved to a bond;
  ``/sys/class/net/<if>/speed``: its speed in Mb/s.

Bonds: with RoCE LAG the driver registers one RDMA device for the bond (``mlx5_bond_0``,
its port's interface the bond master): that device *is* the bond, one adapter.  An RDMA
device whose own interface is enslaved to a bond that no single RDMA device carries (a
bond of two ports without LAG) is a bond *member*: listed, never offered alone.

Names end up in transports' environment variables (``UCX_NET_DEVICES=mlx5_0:1``): a name
with anything but letters, digits, ``_``, ``-`` and ``.`` is refused with a warning, so a
crafted tree cannot inject a second device or a variable's syntax.
"""

from __future__ import annotations

from . import _sysfs
from ._model import Nic, NicPort
from ._sysfs import normalize_pci, pci_sort_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol

    class Tree(Protocol):
        """What this module reads through (:class:`numabind._sources.Root`)."""

        def opt(self, path: str, cap: int = ...) -> str | None: ...
        def listdir(self, path: str, cap: int = ...) -> list[str]: ...
        def realpath(self, path: str) -> str | None: ...


SYS_INFINIBAND = "/sys/class/infiniband"
SYS_NET = "/sys/class/net"
SYS_PCI = "/sys/bus/pci/devices"
MAX_ADAPTERS = 64  # RDMA devices read per machine (a DGX H100 has 12)
MAX_PORTS = 8  # ports read per device (ConnectX: 1 per function; old mlx4: 2)
MAX_IFACES = 8  # network interfaces read per device
MAX_MEMBERS = 16  # members of one bond
MAX_RATE = 100_000.0  # Gb/s: no port is faster (XDR is 800)
# the states of an InfiniBand port (enum ib_port_state): hwloc records the number
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def clean_name(text: str | None, limit: int = 64) -> str | None:
    """A device or interface name numabind may write into a variable, else None."""
    if not text or len(text) > limit or text in (".", "..") or not set(text) <= _NAME_CHARS:
        return None
    return text


def port_state(text: str | None) -> str | None:
    """``4: ACTIVE`` (sysfs) or ``4`` (hwloc's Port1State) as the state's name."""
    if text is None:
        return None
    head, _, word = text.strip().partition(":")
    number = _sysfs.parse_int(head)
    if word.strip():
        word = word.strip().upper()
        return word if word in PORT_STATES.values() else None
    return PORT_STATES.get(number) if number is not None else None


def port_rate(text: str | None) -> float | None:
    """``200 Gb/sec (4X HDR)`` as 200.0; None for anything else."""
    if not text:
        return None
    first = text.strip().split(None, 1)[0] if text.strip() else ""
    if not first or len(first) > 12 or not all(c.isdigit() or c == "." for c in first):
        return None
    try:
        value = float(first)
    except ValueError:
        return None
    return value if 0 < value <= MAX_RATE else None


def link_speed(text: str | None) -> float | None:
    """An interface's ``speed`` (Mb/s; -1 or unreadable while the link is down) in Gb/s."""
    value = _sysfs.parse_int(text)
    if value is None or not 0 < value <= MAX_RATE * 1000:
        return None
    return value / 1000


def _ports(tree: Tree, dev: str, warn: Callable[[str], None]) -> tuple[NicPort, ...]:
    base = f"{SYS_INFINIBAND}/{dev}/ports"
    numbers = sorted(
        int(p) for p in tree.listdir(base, 64) if p.isascii() and p.isdigit() and len(p) < 4
    )
    out = []
    for n in numbers[:MAX_PORTS]:
        state_text = tree.opt(f"{base}/{n}/state", 256)
        state = port_state(state_text)
        if state_text is not None and state is None:
            warn(f"{base}/{n}/state: {_sysfs.short(state_text)} is not a port state; ignored")
        layer = tree.opt(f"{base}/{n}/link_layer", 256)
        out.append(
            NicPort(
                number=n,
                state=state,
                rate=port_rate(tree.opt(f"{base}/{n}/rate", 256)),
                link_layer=layer if layer in ("InfiniBand", "Ethernet", "Unknown") else None,
                netdev=clean_name(tree.opt(f"{base}/{n}/gid_attrs/ndevs/0", 256), 15),
            )
        )
    return tuple(out)


class _Iface:
    """What the files of one network interface say (bond master, member, speed): one
    listing tells which of them exist, and only those are read."""

    __slots__ = ("_speed", "_tree", "member", "members", "name")

    def __init__(self, tree: Tree, name: str) -> None:
        self.name = name
        self._tree = tree
        self._speed: float | bool | None = False  # False: not read yet
        here = set(tree.listdir(f"{SYS_NET}/{name}", 512))
        slaves = tree.opt(f"{SYS_NET}/{name}/bonding/slaves", 4096) if "bonding" in here else None
        names = [clean_name(s, 15) for s in (slaves or "").split()[:MAX_MEMBERS]]
        self.members: tuple[str, ...] | None = (
            tuple(n for n in names if n) if slaves is not None else None
        )
        self.member = "bonding_slave" in here and (
            tree.opt(f"{SYS_NET}/{name}/bonding_slave/state", 256) is not None
        )

    @property
    def speed(self) -> float | None:
        """Its speed in Gb/s, read when first asked (a bond's, or a port without a rate)."""
        if self._speed is False:
            self._speed = link_speed(self._tree.opt(f"{SYS_NET}/{self.name}/speed", 256))
        assert not isinstance(self._speed, bool)
        return self._speed


def _bond_of(
    found: list[tuple[str, str, tuple[NicPort, ...], list[str]]],
    facts: dict[str, _Iface],
    bonds: dict[str, tuple[str, ...]],
) -> dict[str, str | None]:
    """Which bond each device belongs to: the bond master among its interfaces, or the
    bond whose member list holds one of its interfaces ("a bond" when none says which)."""
    owner: dict[str, str | None] = {}
    for name, _, _, ifaces in found:
        master = next((i for i in ifaces if i in bonds), None)
        if master is None:
            enslaved = [i for i in ifaces if facts[i].member]
            master = next((b for b, m in bonds.items() for i in enslaved if i in m), None)
            if master is None and enslaved:
                master = "a bond"
        owner[name] = master
    return owner


def read(
    tree: Tree,
    node_limit: int,
    cpulist: Callable[[str], frozenset[int] | None],
    warn: Callable[[str], None],
) -> tuple[Nic, ...]:
    """The RDMA devices of ``tree`` that hang off a PCI function, in PCI order."""
    found: list[tuple[str, str, tuple[NicPort, ...], list[str]]] = []
    for raw in sorted(tree.listdir(SYS_INFINIBAND, 4096))[:MAX_ADAPTERS]:
        name = clean_name(raw)
        if name is None:
            warn(
                f"{SYS_INFINIBAND}/{_sysfs.short(raw)}: not a device name numabind writes; ignored"
            )
            continue
        real = tree.realpath(f"{SYS_INFINIBAND}/{name}/device")
        bdf = real.rsplit("/", 1)[-1] if real else None
        if not bdf or normalize_pci(bdf) != bdf:
            continue  # soft-RoCE / soft-iWARP: no PCI function of its own
        ports = _ports(tree, name, warn)
        ifaces = [p.netdev for p in ports if p.netdev]
        for i in sorted(tree.listdir(f"{SYS_INFINIBAND}/{name}/device/net", 64))[:MAX_IFACES]:
            clean = clean_name(i, 15)
            if clean:
                ifaces.append(clean)
        found.append((name, bdf, ports, list(dict.fromkeys(ifaces))))
    facts: dict[str, _Iface] = {}
    for _, _, _, ifaces in found:
        for i in ifaces:
            if i not in facts:
                facts[i] = _Iface(tree, i)
    bonds = {i: f.members for i, f in facts.items() if f.members is not None}
    owner = _bond_of(found, facts, bonds)
    carriers: dict[str, list[str]] = {}
    for name, master in owner.items():
        if master is not None:
            carriers.setdefault(master, []).append(name)
    out = []
    for name, bdf, ports, ifaces in found:
        master = owner[name]
        is_bond = master is not None and master in bonds and len(carriers[master]) == 1
        speed = facts[master].speed if is_bond and master in facts else None
        speeds = []
        if speed is None and (not ports or any(p.rate is None for p in ports)):
            speeds = [s for s in (facts[i].speed for i in ifaces) if s is not None]
        node = _sysfs.parse_int(tree.opt(f"{SYS_PCI}/{bdf}/numa_node", 64))
        out.append(
            Nic(
                pci=bdf,
                name=name,
                numa_node=node if node is not None and 0 <= node < node_limit else None,
                local_cpus=cpulist(f"{SYS_PCI}/{bdf}/local_cpulist"),
                kind="rdma",
                ports=ports,
                netdevs=tuple(ifaces),
                bond=master if is_bond else None,
                members=tuple(bonds.get(master) or ()) if is_bond and master else (),
                member_of=master if master is not None and not is_bond else None,
                speed=speed if speed is not None else (max(speeds) if speeds else None),
            )
        )
    return tuple(sorted(out, key=lambda n: (pci_sort_key(n.pci), n.name or "")))


def interfaces(
    tree: Tree, taken: frozenset[str], node_limit: int, limit: int = MAX_ADAPTERS
) -> tuple[Nic, ...]:
    """Network interfaces on a PCI function that carries no RDMA device (``taken``: the
    PCI addresses of those that do, and the names of interfaces a bond of an RDMA device
    holds), as ``netdev`` adapters: listed, never chosen."""
    out: list[Nic] = []
    for raw in sorted(tree.listdir(SYS_NET, 4096))[:1024]:
        name = clean_name(raw, 15)
        if name is None or name in taken or len(out) >= limit:
            continue
        real = tree.realpath(f"{SYS_NET}/{name}/device")
        bdf = real.rsplit("/", 1)[-1] if real else None
        if not bdf or normalize_pci(bdf) != bdf or bdf in taken:
            continue  # virtual (lo, bonds, bridges, veths) or an RDMA adapter's own
        node = _sysfs.parse_int(tree.opt(f"{SYS_PCI}/{bdf}/numa_node", 64))
        iface = _Iface(tree, name)
        out.append(
            Nic(
                pci=bdf,
                name=name,
                numa_node=node if node is not None and 0 <= node < node_limit else None,
                kind="netdev",
                netdevs=(name,),
                member_of="a bond" if iface.member else None,
                speed=iface.speed,
            )
        )
    return tuple(sorted(out, key=lambda n: (pci_sort_key(n.pci), n.name or "")))
