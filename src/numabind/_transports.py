"""Telling transports which RDMA adapter a rank should use (``NUMABIND_NIC``): one table
of transports and their variables, each variable's exact syntax, the keep/replace rule,
and the judgement of a value someone else set (``check`` warns with it).

The table (:data:`TRANSPORTS`), every syntax as the transport's own source documents it:

==========  ==================================  ====================================================
transport   variable(s)                         value numabind writes
==========  ==================================  ====================================================
ucx         ``UCX_NET_DEVICES``                 ``mlx5_0:1`` (device:port, comma list; UCX then
                                                uses only these, and stripes over several)
nvshmem     ``NVSHMEM_HCA_LIST``,               ``mlx5_0:1`` (hca:port, exact names; ``^``
            ``NVSHMEM_ENABLE_NIC_PE_MAPPING``   would exclude) and ``1``: the list takes effect
                                                only with the mapping enabled
nixl        ``UCX_NET_DEVICES``                 NIXL's UCX backend leaves the device to UCX
uccl        ``UCCL_P2P_RDMA_DEV``               ``mlx5_0`` (device names, comma list, no port)
mooncake    ``MC_MS_FILTERS``                   ``mlx5_0``: the whitelist of Mooncake's own
                                                topology discovery, which it runs when the
                                                framework passes no device list
nccl        ``NCCL_IB_HCA``                     ``=mlx5_0:1,mlx5_1:1,...``: exact names (a bare
                                                name is a prefix: ``mlx5_1`` also matches
                                                ``mlx5_10``), the same on every rank of the
                                                node: every rail the node's GPUs are given
vllm        ``VLLM_GPU_NIC_PCIE_MAPPING``,      ``0000:07:00.0=0000:0c:00.0,...``: each GPU of the
            ``VLLM_NIC_SELECTION_VARS``         node (same vendor) = the PCI address of the first
                                                adapter numabind chose for it, the same on every
                                                rank; and ``UCX_NET_DEVICES:1,...``: the
                                                variables vLLM then sets per worker to that
                                                adapter's name (the suffix, the port, appended)
==========  ==================================  ====================================================

**vLLM** (vllm-project/vllm#42083, ``vllm/v1/executor/vllm_net_devices.py``): each worker
looks its GPU's PCI address up in ``VLLM_GPU_NIC_PCIE_MAPPING`` (``GPU_BDF=NIC_BDF``
pairs, comma-separated, compared as numbers, so any spelling of an address matches), finds
the RDMA device whose ``/sys/class/infiniband/*/device`` is that NIC, and sets each
variable of ``VLLM_NIC_SELECTION_VARS`` (``NAME`` or ``NAME:suffix``) to the device's name
with the suffix, *prepending* it to a value already there.  So where ``vllm`` is named, the
adapter variables of the rank's transports named beside it (``ucx``, ``nvshmem``, ``nixl``,
``uccl``, ``mooncake``; ``UCX_NET_DEVICES`` when none is) go into the selection list and
numabind does not set them itself: vLLM would list the adapter twice, or a worker for
another GPU would get its parent's adapter after its own.  NCCL never goes in the list
(one adapter per worker in ``NCCL_IB_HCA`` is what its maintainers advise against).  The
two variables are set together or not at all (vLLM refuses one without the other).

NCCL is told only when named, and then not a per-rank adapter: NCCL builds its rings and
trees from every rank's view of the node's NICs and chooses each GPU's nearest NIC
itself; its maintainers say not to set ``NCCL_IB_HCA`` differently on each rank
(NVIDIA/nccl#1478).  What it is told is the node's rail list, which keeps storage and
management ports out.

**Keep or replace.**  A variable already in the environment is the user's or the
launcher's and is kept, unless numabind set it itself: ``NUMABIND_NIC_SET`` records what it
set (``NAME=value;...``), and a child rank that inherited exactly that value (a
``LOCAL_RANK`` of its own, the parent's ``UCX_NET_DEVICES``: openucx/ucx#11259) gets its
own adapter instead.  A kept value that names an adapter farther from the rank's GPU
than the nearest is said once (and by ``check``).
"""

from __future__ import annotations

from ._model import NIC_TRANSPORTS, Record
from ._sysfs import pci_sort_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping

    from ._environ import Config
    from ._model import Accelerator, Nic, NicChoice
    from ._plan import Plan
    from ._topology import Machine

RECORD = "NUMABIND_NIC_SET"  # what numabind set: NAME=value;NAME=value
MAX_RECORD = 4096
MAX_VALUE = 2048  # longest value judged or written (64 adapters' ``name:port``)


class Variable(Record):
    """One variable a transport reads: its syntax (``ports``: ``dev:port`` list with an
    optional ``^`` deny list, exact names; ``names``: device names; ``nccl``: NCCL's
    prefix list, ``=`` for exact names, ``^`` to exclude; ``flag``: the constant
    ``value``), whether the transport uses every adapter listed (``all``: UCX stripes
    over them, NVSHMEM and UCCL take one of them by their own index) or the nearest of
    them (``nearest``), and where its syntax is documented."""

    name: str
    syntax: str
    picks: str = "all"
    value: str = ""
    source: str = ""


class Transport(Record):
    """A transport ``NUMABIND_NIC`` may name: its variables, and whose adapters they get:
    the rank's (``rank``) or every rail of the node, the same on every rank (``node``)."""

    name: str
    label: str
    variables: tuple[Variable, ...]
    scope: str = "rank"


UCX_NET_DEVICES = Variable(
    name="UCX_NET_DEVICES",
    syntax="ports",
    source="openucx/ucx docs/source/faq.md (Which network devices does UCX use?)",
)
TRANSPORTS: tuple[Transport, ...] = (
    Transport(name="ucx", label="UCX", variables=(UCX_NET_DEVICES,)),
    Transport(
        name="nvshmem",
        label="NVSHMEM (DeepEP)",
        variables=(
            Variable(
                name="NVSHMEM_HCA_LIST",
                syntax="ports",
                source="NVIDIA/nvshmem src/modules/transport/common/env_defs.h (HCA_LIST)",
            ),
            Variable(
                name="NVSHMEM_ENABLE_NIC_PE_MAPPING",
                syntax="flag",
                value="1",
                source="NVIDIA/nvshmem src/include/host/env/env_defs.h (ENABLE_NIC_PE_MAPPING)",
            ),
        ),
    ),
    Transport(name="nixl", label="NIXL (through UCX)", variables=(UCX_NET_DEVICES,)),
    Transport(
        name="uccl",
        label="UCCL P2P",
        variables=(
            Variable(
                name="UCCL_P2P_RDMA_DEV",
                syntax="names",
                source="uccl-project/uccl p2p/README.md (environment variables)",
            ),
        ),
    ),
    Transport(
        name="mooncake",
        label="Mooncake",
        variables=(
            Variable(
                name="MC_MS_FILTERS",
                syntax="names",
                picks="nearest",
                source="kvcache-ai/Mooncake mooncake-store/src/client_service.cpp "
                "(InitTransferEngine: MC_MS_AUTO_DISC, MC_MS_FILTERS)",
            ),
        ),
    ),
    Transport(
        name="nccl",
        label="NCCL",
        variables=(
            Variable(
                name="NCCL_IB_HCA",
                syntax="nccl",
                picks="nearest",
                source="NCCL user guide, Environment Variables (NCCL_IB_HCA); "
                "NVIDIA/nccl src/misc/utils.cc (matchIfList)",
            ),
        ),
        scope="node",
    ),
    Transport(
        name="vllm",
        label="vLLM (its GPU-to-NIC map)",
        variables=(
            Variable(
                name="VLLM_GPU_NIC_PCIE_MAPPING",
                syntax="vllm-map",
                source="vllm-project/vllm vllm/v1/executor/vllm_net_devices.py "
                "(parse_gpu_nic_mapping; vllm#42083)",
            ),
            Variable(
                name="VLLM_NIC_SELECTION_VARS",
                syntax="vllm-vars",
                source="vllm-project/vllm vllm/v1/executor/vllm_net_devices.py "
                "(parse_nic_selection_vars; vllm#42083)",
            ),
        ),
        scope="node",
    ),
)
BY_NAME = {t.name: t for t in TRANSPORTS}
VLLM = BY_NAME["vllm"]
# the variables whose values are lists of adapters (judged, written by numabind._nics' choice)
LISTS = ("ports", "names", "nccl")
VARIABLES: tuple[Variable, ...] = tuple(
    {v.name: v for t in TRANSPORTS for v in t.variables}.values()
)
ADAPTER_VARIABLES: tuple[str, ...] = tuple(v.name for v in VARIABLES if v.syntax in LISTS)
# every word NUMABIND_NIC accepts has its row (numabind._model.NIC_TRANSPORTS is the list)
assert tuple(BY_NAME) == NIC_TRANSPORTS, (tuple(BY_NAME), NIC_TRANSPORTS)


def value_for(var: Variable, nics: tuple[NicChoice, ...]) -> str:
    """What numabind writes into ``var`` for ``nics`` ("" when there is nothing to say)."""
    if var.syntax == "flag":
        return var.value if nics else ""
    if not nics:
        return ""
    if var.syntax == "names":
        return ",".join(dict.fromkeys(n.name for n in nics))
    labels = ",".join(dict.fromkeys(n.label for n in nics))
    return "=" + labels if var.syntax == "nccl" else labels


def read_record(text: str) -> dict[str, str]:
    """``NUMABIND_NIC_SET`` as {variable: value}; anything malformed counts as unset."""
    out: dict[str, str] = {}
    if not text or len(text) > MAX_RECORD:
        return out
    known = {v.name for v in VARIABLES}
    for item in text.split(";", 16)[:16]:
        name, sep, value = item.partition("=")
        if sep and name in known and len(value) <= MAX_VALUE:
            out[name] = value
    return out


class NicEnv(Record):
    """What :func:`apply_env` did: the variables it set (with values), those it found set
    by someone else and kept, and what to say (``warnings``: always; ``notes``: verbose)."""

    set: tuple[tuple[str, str], ...] = ()
    kept: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def delegated(transports: str) -> tuple[Variable, ...]:
    """With ``vllm`` among ``transports``: the adapter variables vLLM sets per worker from
    its map (those of the rank-scope transports named beside it; ``UCX_NET_DEVICES``, the
    variable of NIXL's UCX backend, when none is), which numabind then leaves to vLLM."""
    words = transports.split(",") if transports else []
    if VLLM.name not in words:
        return ()
    out = {
        v.name: v
        for w in words
        if w in BY_NAME and BY_NAME[w].scope == "rank"
        for v in BY_NAME[w].variables
        if v.syntax in ("ports", "names")
    }
    return tuple(out.values()) or (UCX_NET_DEVICES,)


def vllm_values(transports: str, per_gpu: Mapping[str, tuple[NicChoice, ...]]) -> tuple[str, str]:
    """vLLM's two variables for the node (``per_gpu``: each GPU's PCI address -> the
    adapters numabind chose for it): ``VLLM_GPU_NIC_PCIE_MAPPING`` (GPU=first adapter's PCI
    address, in PCI order) and ``VLLM_NIC_SELECTION_VARS`` (the delegated variables, a port
    suffix on those whose syntax has ports); ("", "") when no GPU has an adapter.  vLLM
    appends one suffix to every adapter: the port of the first choices where they agree,
    else the most common one (an adapter on another port is then named without it)."""
    pairs = [
        (gpu, nics[0])
        for gpu, nics in sorted(per_gpu.items(), key=lambda i: pci_sort_key(i[0]))
        if nics
    ]
    if not pairs:
        return "", ""
    mapping = ",".join(f"{gpu}={nic.pci}" for gpu, nic in pairs)
    ports = [nic.port for _, nic in pairs]
    port = max(dict.fromkeys(ports), key=ports.count)
    names = ",".join(
        f"{v.name}:{port}" if v.syntax == "ports" else v.name for v in delegated(transports)
    )
    return mapping, names


def wanted_values(
    transports: str,
    nics: tuple[NicChoice, ...],
    node_nics: tuple[NicChoice, ...] = (),
    per_gpu: Mapping[str, tuple[NicChoice, ...]] | None = None,
) -> dict[str, str]:
    """{variable: value} for ``transports`` (``NUMABIND_NIC``'s canonical list): the
    rank's ``nics``, or ``node_nics`` (every rail of the node) for a ``node``-scope one;
    vLLM's map from ``per_gpu`` (every GPU's choice), and the variables it takes over
    left out."""
    wanted: dict[str, str] = {}
    handed = {v.name for v in delegated(transports)}
    for name in transports.split(",") if transports else ():
        t = BY_NAME.get(name)
        if t is None:
            continue
        if t is VLLM:
            mapping, names = vllm_values(transports, per_gpu or {})
            wanted.setdefault(VLLM.variables[0].name, mapping)
            wanted.setdefault(VLLM.variables[1].name, names if mapping else "")
            continue
        for var in t.variables:
            if var.name not in handed:
                wanted.setdefault(
                    var.name, value_for(var, node_nics if t.scope == "node" else nics)
                )
    return wanted


def apply_env(
    transports: str,
    nics: tuple[NicChoice, ...],
    environ: MutableMapping[str, str],
    node_nics: tuple[NicChoice, ...] = (),
    judge_kept: Judge | None = None,
    per_gpu: Mapping[str, tuple[NicChoice, ...]] | None = None,
    only: tuple[str, ...] | None = None,
) -> NicEnv:
    """Set the variables of ``transports`` for a rank given ``nics`` (``node_nics`` for a
    ``node``-scope transport, ``per_gpu`` for vLLM's map) under the keep/replace rule, and
    record what was set in ``NUMABIND_NIC_SET``.  ``judge_kept`` says what is wrong with a
    value kept; ``only`` limits the variables touched to those named (a process that is no
    rank sets vLLM's map, and nothing of a rank's)."""
    ours = read_record(environ.get(RECORD, ""))
    wanted = wanted_values(transports, nics, node_nics, per_gpu)
    if only is not None:
        wanted = {k: v for k, v in wanted.items() if k in only}
    done: list[tuple[str, str]] = []
    kept: list[tuple[str, str]] = []
    warnings: list[str] = []
    notes: list[str] = []
    for name, value in wanted.items():
        have = environ.get(name)
        inherited = have is not None and ours.get(name) == have
        if have is not None and not inherited:
            kept.append((name, have))
            why = judge_kept(name, have) if judge_kept is not None else None
            if why:
                warnings.append(f"{why}: kept, as it was set before numabind (NUMABIND_NIC)")
        elif value:
            environ[name] = value
            done.append((name, value))
        elif inherited:
            del environ[name]
            notes.append(f"NUMABIND_NIC: {name} inherited for another GPU, removed")
    record = {**{k: v for k, v in ours.items() if environ.get(k) == v}, **dict(done)}
    text = ";".join(f"{k}={v}" for k, v in record.items())
    if text:
        environ[RECORD] = text
    else:
        environ.pop(RECORD, None)
    if wanted and not nics:
        notes.append("NUMABIND_NIC: no RDMA adapter chosen for this rank: no transport told")
    if done:
        notes.append("NUMABIND_NIC: set " + ", ".join(f"{k}={v}" for k, v in done))
    if kept:
        notes.append("NUMABIND_NIC: left as set: " + ", ".join(f"{k}={v}" for k, v in kept))
    return NicEnv(set=tuple(done), kept=tuple(kept), warnings=tuple(warnings), notes=tuple(notes))


# --- what a value names, and whether it is the nearest ----------------------------------------


def named(var: Variable, value: str, nics: tuple[Nic, ...]) -> list[tuple[Nic, int | None]] | None:
    """The adapters (and ports; None: any port) a value of ``var`` selects among ``nics``,
    by the transport's own matching rule; None when the value selects every adapter or
    cannot be judged (UCX's ``all``, UCCL's numeric indices)."""
    text = value.strip()
    if var.syntax not in LISTS or not text or len(text) > MAX_VALUE:
        return None
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = var.syntax != "nccl"
    if var.syntax == "nccl" and text.startswith("="):
        text, exact = text[1:], True
    tokens = []
    for raw in text.split(",", 64)[:64]:
        token = raw.strip()
        if not token:
            continue
        if token.lower() == "all" and var.syntax == "ports":
            return None
        name, _, port = token.partition(":")
        if var.syntax == "names" and name.isdigit():
            return None  # an index into ibverbs' device list: not judged
        number = int(port) if port.isascii() and port.isdigit() and len(port) < 4 else None
        tokens.append((name, number if port else None))
    out: list[tuple[Nic, int | None]] = []
    for nic in nics:
        if not nic.name:
            continue
        for p in nic.ports or ():
            hit = any(
                (nic.name == name if exact else nic.name.startswith(name))
                and (port is None or port == p.number)
                for name, port in tokens
            )
            if hit != exclude:
                out.append((nic, p.number))
    return out


def mapped(value: str, gpu: str, nics: tuple[Nic, ...]) -> list[tuple[Nic, int | None]] | None:
    """The adapter (every port of it) that a ``VLLM_GPU_NIC_PCIE_MAPPING`` value gives the
    GPU at ``gpu``, addresses compared as numbers as vLLM compares them (any spelling of
    one address matches); [] when the address it names is no adapter of ``nics``; None when
    the map has no entry for the GPU (or is not a map: vLLM would refuse it)."""
    from ._sysfs import normalize_pci

    if len(value) > MAX_VALUE:
        return None
    want = normalize_pci(gpu)
    for seg in value.split(",", 64)[:64]:
        left, sep, right = seg.strip().partition("=")
        if sep and want is not None and normalize_pci(left) == want:
            nic_pci = normalize_pci(right)
            return [
                (n, p.number)
                for n in nics
                if nic_pci is not None and normalize_pci(n.pci) == nic_pci
                for p in n.ports or ()
            ]
    return None


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,:=^")


def _plain(value: str) -> bool:
    """A value that can be shown as it is (else quoted: it is input)."""
    return 0 < len(value) <= 120 and set(value) <= _PLAIN


if TYPE_CHECKING:
    from collections.abc import Callable

    Judge = Callable[[str, str], "str | None"]


def judge(
    machine: Machine,
    device: Accelerator,
    who: str,
    name: str,
    value: str,
    chosen: tuple[NicChoice, ...],
    node_of: Callable[[Accelerator], int | None],
) -> str | None:
    """What is wrong with ``name=value`` for the rank of ``device`` (``who``: "GPU 0"):
    it names no adapter of this machine, only unusable ones, or one farther than the
    nearest (``UCX_NET_DEVICES=mlx5_3:1 is SYS from GPU 0; mlx5_0 is PIX``); None when it
    is as near as the nearest, or cannot be judged."""
    from ._nics import nic_node, offered, path_class, rank_of
    from ._sysfs import short

    var = next((v for v in VARIABLES if v.name == name), None)
    if var is None:
        return None
    shown = f"{name}={value}" if _plain(value) else f"{name}={short(value, 120)}"
    if var.syntax == "vllm-map":
        picked = mapped(value, device.pci, machine.nics)
        if picked is None:
            return f"{shown} has no entry for {who} ({device.pci}): vLLM's worker there stops"
    else:
        picked = named(var, value, machine.nics)
    if picked is None:
        return None
    if not picked:
        return f"{shown} names no RDMA adapter of this machine"
    units, refused = offered(machine)
    usable = {(u.nic.name, u.port.number) for u in units}
    good = [(n, p) for n, p in picked if (n.name, p) in usable]
    if not good:
        bad = picked[0]
        why = next((r.why for r in refused if r.nic.name == bad[0].name), "not usable")
        return f"{shown} names only adapters never chosen ({bad[0].name}:{bad[1]}: {why})"
    gpu_path = machine.pci_path(device.pci)
    gpu_node = node_of(device)

    def rel(nic: Nic) -> str:
        return path_class(gpu_path, machine.pci_path(nic.pci), gpu_node, nic_node(machine, nic))

    rels = [(rank_of(rel(n)), rel(n), n, p) for n, p in good]
    best_here = min(rank_of(rel(u.nic)) for u in units)
    judged = max(rels, key=lambda r: r[0]) if var.picks == "all" else min(rels, key=lambda r: r[0])
    if judged[0] <= best_here:
        return None
    nearest = (
        f"{chosen[0].name} is {chosen[0].relation}"
        if chosen
        else next(
            f"{u.nic.name} is {rel(u.nic)}" for u in units if rank_of(rel(u.nic)) == best_here
        )
    )
    what = "is" if len(good) == 1 else f"names {judged[2].name}:{judged[3]},"
    return f"{shown} {what} {judged[1]} from {who}; {nearest}"


def enter_nics(
    plan: Plan, machine: Machine | None, cfg: Config, environ: MutableMapping[str, str]
) -> NicEnv:
    """The process applier's NIC step (:func:`numabind._apply.enter`): tell the transports
    ``NUMABIND_NIC`` names about ``plan``'s adapters (a plan that skips binding still has
    them: a one-node machine has a nearest adapter too), judging kept values against the
    machine."""
    node: tuple[NicChoice, ...] = ()
    per_gpu: dict[str, tuple[NicChoice, ...]] = {}
    device = plan.device
    words = cfg.nic.split(",")
    if machine is not None and device is not None and ("nccl" in words or "vllm" in words):
        from ._nics import assign, same_vendor
        from ._plan import device_node

        found = assign(
            machine,
            same_vendor(machine, device),
            lambda d: device_node(machine, d).node,
            cfg.nic_mode,
            cfg.nic_min_rate,
        )
        node = tuple(
            sorted(
                {c for cs in found.per_device.values() for c in cs},
                key=lambda c: (pci_sort_key(c.pci), c.name, c.port),
            )
        )
        per_gpu = found.per_device
    judge_kept: Judge | None = None
    if machine is not None and device is not None:
        from ._plan import device_node

        who = f"GPU {plan.device_index}" if plan.device_index is not None else f"GPU {device.pci}"
        here, gpu, mine = machine, device, plan.placement.nics

        def judge_kept(name: str, value: str) -> str | None:
            return judge(here, gpu, who, name, value, mine, lambda d: device_node(here, d).node)

    return apply_env(cfg.nic, plan.placement.nics, environ, node, judge_kept, per_gpu)
