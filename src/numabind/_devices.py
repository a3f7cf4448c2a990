"""Which accelerators this process can reach, and which of them its runtime calls device 0, 1...

sysfs is not namespaced: a container sees every GPU of the host there.  The GPUs that are
really this process's are the ones the vendor's driver lists (NVIDIA's
/proc/driver/nvidia/gpus: a container runtime mounts only the granted ones) or, under
Slurm's device cgroup, those named by SLURM_STEP_GPUS.  The runtime numbers only those,
in PCI order (CUDA with CUDA_DEVICE_ORDER=PCI_BUS_ID, and in the default FASTEST_FIRST
order too when every GPU is the same model), and the vendor's visibility variables
(the vendor table in :mod:`numabind._model`) then select and reorder them.  Mapping is by
PCI address or
UUID, never by NVML index, which ignores all of this (TRT-LLM #12985, dask-cuda #671).

The environment is input: a list of any length costs at most one step per reachable
device (the runtimes stop at the first entry they cannot use, and so does this), and
every message quotes values with ``repr``.
"""

from __future__ import annotations

from ._model import (
    VENDORS,
    Accelerator,
    Record,
    Vendor,
    Visibility,
    selecting,
    uuid_matches,
)
from ._sysfs import normalize_pci, pci_sort_key, short

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._nvml import NvmlBackend
    from ._topology import Machine

_TOKEN_CAP = 128  # longest list entry looked at (a MIG UUID is 40 characters)


class Visible(Record):
    """The devices this process's runtime will number 0..n-1, in that order.

    What ``Request.visible`` holds (``plan_for`` finds it from ``CUDA_VISIBLE_DEVICES``
    and its kin): ``devices`` in the runtime's order, their ``vendor``, the ``source``
    that said so (a variable's name, or all the devices), and ``notes`` on what was
    resolved how.  ``problem`` is set when the environment named devices numabind cannot
    find; the plan then skips with that message rather than bind next to some other GPU.
    """

    devices: tuple[Accelerator, ...]
    vendor: str | None
    source: str
    problem: str | None = None
    notes: tuple[str, ...] = ()


class LazyNvml:
    """NVML for the visibility lists, imported and initialised only if a UUID or MIG id
    cannot be resolved from files (``import pynvml`` alone costs ~30 ms; even numabind's
    own NVML module stays off the startup path until then)."""

    def __init__(self) -> None:
        self._backend: NvmlBackend | None = None

    def _get(self) -> NvmlBackend:
        if self._backend is None:
            from ._nvml import PynvmlBackend

            self._backend = PynvmlBackend()
        return self._backend

    def gpus(self) -> list[dict[str, object]]:
        return self._get().gpus()

    def pci_of_uuid(self, uuid: str) -> str | None:
        return self._get().pci_of_uuid(uuid)

    def mig_parent_pci(self, mig_uuid: str) -> str | None:
        return self._get().mig_parent_pci(mig_uuid)


# the note of a pod whose DRA files are all unusable (doctor says it too)
DRA_FALLBACK = "no DRA device metadata could be used"


def _slurm_gpu_minors(environ: Mapping[str, str]) -> tuple[str, frozenset[int]] | None:
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        text = environ.get(var)
        if text:
            minors = set()
            for x in text.split(",", 1024)[:1024]:
                x = x.strip()
                if not (x.isascii() and x.isdigit() and len(x) < 6):
                    return None
                minors.add(int(x))
            return var, frozenset(minors)
    return None


def reachable(
    machine: Machine, vendor: Vendor, environ: Mapping[str, str]
) -> tuple[tuple[Accelerator, ...], list[str]]:
    """The accelerators of ``vendor`` this process can open, in PCI order, with notes."""
    notes: list[str] = []
    driver = machine.driver_gpus(vendor.key) if vendor.driver_dir else None
    if driver is not None:
        devs = [a for a in (machine.accelerator(b) for b in driver) if a is not None]
    else:
        devs = [a for a in machine.accelerators if a.vendor == vendor.key]
        # in a pod without the driver's list, the DRA device metadata says which of the
        # host's GPUs (all in sysfs) were allocated to this container
        dra = {d.pci for d in machine.dra_devices}
        granted = [a for a in devs if a.pci in dra]
        if granted and len(granted) < len(devs):
            devs = granted
            notes.append(
                f"the DRA device metadata limits this process to {len(granted)} of the "
                f"{vendor.key} GPUs in sysfs"
            )
        elif not granted and devs:
            from ._dra import SAID

            if any(w.startswith(SAID) for w in machine.warnings):  # files there, none usable
                notes.append(
                    f"{DRA_FALLBACK}: planned for "
                    f"all {len(devs)} {vendor.key} GPUs in sysfs, which may be more than this "
                    "container was given"
                )
    slurm = _slurm_gpu_minors(environ) if vendor.numbers_by_minor else None
    if slurm is not None:
        devs = [machine.detailed(d) for d in devs]  # the minor numbers are the driver's
    if slurm is not None and devs and all(d.minor is not None for d in devs):
        var, minors = slurm
        cvd = environ.get(vendor.visibility[0].variable, "")
        cvd_set = {
            int(x)
            for x in cvd.split(",", 1024)[:1024]
            if x.strip().isascii() and x.strip().isdigit() and len(x) < 6  # not "²"
        }
        # Without a device cgroup Slurm sets CUDA_VISIBLE_DEVICES to the gres indices
        # themselves; with ConstrainDevices CUDA renumbers the granted GPUs from 0.
        if cvd_set != set(minors):
            narrowed = [d for d in devs if d.minor in minors]
            if narrowed:
                devs = narrowed
                notes.append(f"{var} limits this process to GPU minors {sorted(minors)}")
    devs.sort(key=lambda a: pci_sort_key(a.pci))
    # a GPU split into compute partitions is that many devices to its runtime
    return machine.with_partitions(devs), notes


def _count(devs: tuple[Accelerator, ...], vendor: str) -> str:
    """``8 reachable nvidia GPUs``; ``64 reachable amd devices (8 GPUs in CPX, 8 compute
    partitions each)`` where GPUs are split."""
    gpus = len({d.pci for d in devs})
    if gpus == len(devs):
        return f"{len(devs)} reachable {vendor} GPU{'s' if len(devs) != 1 else ''}"
    modes = sorted({d.compute_partition for d in devs if d.compute_partition})
    mode = f" in {'/'.join(modes)}" if modes else ""
    return (
        f"{len(devs)} reachable {vendor} devices: {gpus} GPU{'s' if gpus != 1 else ''}{mode}, "
        "split into compute partitions"
    )


def _match_uuid(token: str, devs: tuple[Accelerator, ...]) -> list[Accelerator]:
    return uuid_matches(token, ((d.uuid, d) for d in devs))


def _index(token: str, devs: tuple[Accelerator, ...]) -> tuple[Accelerator | None, str | None]:
    if len(token) > 6:
        return None, f"index {short(token)} is out of range ({len(devs)} reachable)"
    i = int(token)
    if i < len(devs):
        return devs[i], None
    return None, f"index {i} is out of range ({len(devs)} reachable)"


def _by_uuid(
    token: str, devs: tuple[Accelerator, ...], nvml: NvmlBackend | LazyNvml | None, vendor: Vendor
) -> tuple[Accelerator | None, str | None]:
    found = _match_uuid(token, devs)
    if not found and nvml is not None and vendor.runtime:
        bdf = nvml.pci_of_uuid(token)
        found = [d for d in devs if d.pci == bdf]
    if len(found) == 1:
        return found[0], None
    if len(found) > 1:
        if len({d.pci for d in found}) == 1 and found[0].partition is not None:
            return None, (
                f"{short(token)} names all {len(found)} compute partitions of {found[0].pci} "
                "(they share its UUID; ROCm takes it as no device): use partition indices"
            )
        return None, f"{short(token)} matches {len(found)} GPUs (a UUID prefix must be unique)"
    if not any(d.uuid for d in devs):
        how = f"without {vendor.runtime}" if vendor.runtime else f"(no {vendor.uuid_file} in sysfs)"
        if not vendor.runtime or nvml is None:
            return None, f"{short(token)} cannot be checked: no GPU UUIDs are readable {how}"
    return None, f"no reachable GPU has UUID {short(token)}"


def _mig_parent(
    token: str, devs: tuple[Accelerator, ...], nvml: NvmlBackend | LazyNvml | None
) -> tuple[Accelerator | None, str | None]:
    """The GPU a MIG instance belongs to: from the legacy ``MIG-GPU-<uuid>/<gi>/<ci>``
    spelling, else NVML, else the only GPU there is."""
    rest = token[4:]
    if rest.upper().startswith("GPU-"):
        found = _match_uuid(rest.split("/", 1)[0], devs)
        if len(found) == 1:
            return found[0], None
    bdf = nvml.mig_parent_pci(token) if nvml is not None else None
    parent = next((d for d in devs if d.pci == bdf), None) if bdf is not None else None
    if parent is not None:
        return parent, None
    if len(devs) == 1:
        return devs[0], None
    return None, f"MIG device {short(token)} cannot be mapped to its GPU without NVML"


def _resolve_token(
    token: str, devs: tuple[Accelerator, ...], nvml: NvmlBackend | LazyNvml | None, vis: Visibility
) -> tuple[Accelerator | None, str | None]:
    """One entry of a visibility list -> (device, why it could not be resolved)."""
    vendor = owner_of(vis)
    if len(token) > _TOKEN_CAP:
        return None, f"{short(token)} is not a device"
    if token.isascii() and token.isdigit():
        return _index(token, devs)
    upper = token.upper()
    if vis.grammar == "cuda" and upper.startswith("MIG-"):
        return _mig_parent(token, devs, nvml)
    if vis.grammar in ("cuda", "rocm") and upper.startswith("GPU-"):
        return _by_uuid(token, devs, nvml, vendor)
    if vis.grammar == "level-zero":
        return None, f"{short(token)} is not a Level Zero device index (N or N.M)"
    return None, f"{short(token)} is neither an index nor a GPU-/MIG- UUID"


def _parse_list(
    vis: Visibility,
    text: str,
    devs: tuple[Accelerator, ...],
    nvml: NvmlBackend | LazyNvml | None,
    machine: Machine,
) -> tuple[tuple[Accelerator, ...], str | None, list[str]]:
    """Resolve a visibility list the way the runtimes do: entries in order, and the
    first entry that is invalid ends the list (CUDA ignores it and everything after it).
    At most one entry more than there are devices is ever looked at."""
    var = vis.variable
    notes: list[str] = []
    out: list[Accelerator] = []
    subdevice = vis.grammar == "level-zero"
    limit = len(devs) + 1
    tokens = text.split(",", limit)
    if any(not t.strip().isdigit() for t in tokens[:limit]):
        devs = tuple(machine.detailed(d) for d in devs)  # UUIDs are the driver's facts
    for pos, raw in enumerate(tokens[:limit]):
        token = raw.strip()
        if subdevice and "." in token:
            head, _, sub = token.partition(".")
            if sub.isascii() and sub.isdigit() and len(sub) < 4:
                token = head
        dev, why = _resolve_token(token, devs, nvml, vis)
        if dev is not None and dev in out and not subdevice:
            dev, why = None, f"{short(token)} repeats a device already listed"
        if dev is None:
            ignored = ",".join(tokens[pos:])
            if not out:
                return (), f"{var}={short(text)}: {why}; no device is visible, not bound", notes
            notes.append(f"{var}: {why}; the runtime ignores {short(ignored)}")
            break
        if dev not in out:
            out.append(dev)
    return tuple(out), None, notes


def resolve(
    machine: Machine,
    environ: Mapping[str, str],
    nvml: NvmlBackend | LazyNvml | None = None,
) -> Visible:
    """Turn the environment's visibility variables into the ordered visible devices."""
    vendor = selecting(environ)
    notes: list[str] = []
    if vendor is not None:
        vendor = _fallback_owner(machine, vendor, environ)
    if vendor is None:
        for v in VENDORS:
            devs, n = reachable(machine, v, environ)
            if devs:
                notes.extend(n)
                return Visible(
                    devices=devs,
                    vendor=v.key,
                    source=f"all {_count(devs, v.key)}",
                    notes=_order_notes(v, devs, environ, notes),
                )
        return Visible(devices=(), vendor=None, source="no accelerator found")
    devs, n = reachable(machine, vendor, environ)
    notes.extend(n)
    sources: list[str] = []
    for vis in vendor.visibility:
        if vis.fallback_for is not None and vis.fallback_for in environ:
            continue
        text = environ.get(vis.variable)
        if text is None:
            continue
        shown = f"{vis.variable}={short(text.strip(), 120)}"
        if text.strip() == "":
            if vis.grammar == "level-zero":
                sources.append(f"{vis.variable} is empty (all devices)")
                continue
            return Visible(
                devices=(), vendor=vendor.key, source=f"{vis.variable} is empty", notes=tuple(notes)
            )
        if vis.grammar == "cuda" and text.strip().startswith("-"):
            return Visible(
                devices=(),
                vendor=vendor.key,
                source=f"{shown} hides every GPU",
                notes=tuple(notes),
            )
        devs, problem, n = _parse_list(vis, text.strip(), devs, nvml, machine)
        notes.extend(n)
        sources.append(shown)
        if problem:
            return Visible(
                devices=(),
                vendor=vendor.key,
                source=" + ".join(sources),
                problem=problem,
                notes=tuple(notes),
            )
    return Visible(
        devices=devs,
        vendor=vendor.key,
        source=" + ".join(sources) or f"all {_count(devs, vendor.key)}",
        notes=_order_notes(vendor, devs, environ, notes),
    )


def _fallback_owner(machine: Machine, vendor: Vendor, environ: Mapping[str, str]) -> Vendor:
    """Another vendor whose runtime reads the variable that selected ``vendor`` as a
    fallback (ROCm reads CUDA_VISIBLE_DEVICES where HIP_VISIBLE_DEVICES is unset), on a
    machine with that vendor's devices and none of ``vendor``'s; else ``vendor``."""
    named = {vis.variable for vis in vendor.visibility if vis.variable in environ}
    others = [
        o
        for o in VENDORS
        if o is not vendor and any(v.fallback_for and v.variable in named for v in o.visibility)
    ]
    if not others or reachable(machine, vendor, environ)[0]:
        return vendor
    return next((o for o in others if reachable(machine, o, environ)[0]), vendor)


def _order_notes(
    vendor: Vendor, devs: tuple[Accelerator, ...], environ: Mapping[str, str], notes: list[str]
) -> tuple[str, ...]:
    """A note where the runtime may number mixed models out of PCI order (the vendor's
    ``device_order`` variable is not set to PCI order)."""
    order = vendor.device_order
    models = {d.model for d in devs}
    if order is not None and len(models) > 1 and environ.get(order[0], "") != order[1]:
        var, value = order
        notes.append(
            f"GPUs of different models and {var} is not {value}: the runtime numbers the "
            f"fastest first, so indices may not follow PCI order; set {var}={value}"
        )
    return tuple(notes)


def owner_of(vis: Visibility) -> Vendor:
    """The vendor whose table row holds ``vis`` (the grammar alone does not say it)."""
    return next(v for v in VENDORS if vis in v.visibility)


def find_device(
    spec: int | str, visible: Visible, machine: Machine
) -> tuple[Accelerator | None, str | None]:
    """The one device ``spec`` names: an index into the visible devices, a PCI address
    (any spelling: ``0000:3b:00.0``, NVML's ``00000000:3B:00.0``) or a UUID (a prefix that
    only one device has).  A PCI address or UUID may name a device outside the visible
    list (an engine driving every GPU).  Returns (device, None) or (None, why not)."""
    devs = visible.devices
    if isinstance(spec, int):
        if 0 <= spec < len(devs):
            return devs[spec], None
        return None, f"device index {spec} is not visible ({len(devs)} are)"
    pci = normalize_pci(spec)
    pool = tuple(dict.fromkeys((*devs, *machine.accelerators)))
    if pci is not None:
        found = [a for a in pool if a.pci == pci]
    else:
        found = _match_uuid(spec, tuple(machine.detailed(a) for a in pool))
    if len(found) == 1:
        return found[0], None
    if len(found) > 1:
        return None, f"{short(spec)} matches {len(found)} devices (a UUID prefix must be unique)"
    return None, f"no accelerator {short(spec)} on this machine"


MAX_DEVICES = 64  # devices one process may ask to be bound to (NUMABIND_DEVICES, devices=)


def find_devices(
    specs: str | tuple[int | str, ...], visible: Visible, machine: Machine
) -> tuple[tuple[Accelerator, ...], str | None]:
    """The devices a process asks to drive: ``"all"`` (every visible device) or specs as
    :func:`find_device` takes them (an index, a PCI address, a UUID), in the order given,
    each once.  Returns (devices, None) or ((), why not): one spec that names no device
    refuses them all, rather than bind to some of them."""
    if specs == "all":
        if not visible.devices:
            return (), f"no device is visible ({visible.source})"
        return visible.devices, None
    items: tuple[int | str, ...] = (
        tuple(_spec(t) for t in specs.split(",")[: MAX_DEVICES + 1])
        if isinstance(specs, str)
        else specs
    )
    if not items or len(items) > MAX_DEVICES:
        return (), f"give 1 to {MAX_DEVICES} devices, not {len(items)}"
    found: list[Accelerator] = []
    for spec in items:
        dev, why = find_device(spec, visible, machine)
        if dev is None:
            return (), f"device {short(str(spec))}: {why}"
        found.append(dev)
    return tuple(dict.fromkeys(found)), None


def _spec(token: str) -> int | str:
    token = token.strip()
    return int(token) if token.isascii() and token.isdigit() and len(token) < 5 else token
