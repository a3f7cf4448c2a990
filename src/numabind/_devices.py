"""Which accelerators this process can reach, and which of them its runtime calls device 0, 1...

sysfs is not namespaced: a container sees every GPU of the host there.  The GPUs that are
really this process's are the ones the NVIDIA driver shows under /proc/driver/nvidia/gpus
(a container runtime mounts only the granted ones) or, under Slurm's device cgroup, those
named by SLURM_STEP_GPUS.  CUDA numbers only those, in PCI order with CUDA_DEVICE_ORDER=
PCI_BUS_ID (and in the default FASTEST_FIRST order too when every GPU is the same model),
and CUDA_VISIBLE_DEVICES then selects and reorders them.  Mapping is by PCI address or
UUID, never by NVML index, which ignores all of this (TRT-LLM #12985, dask-cuda #671).
"""

from __future__ import annotations

from ._model import Accelerator, Record, _set
from ._topology import pci_sort_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._nvml import NvmlBackend
    from ._topology import Machine

# visibility variable -> accelerator family it selects
VISIBILITY_VARIABLES = (
    ("CUDA_VISIBLE_DEVICES", "nvidia"),
    ("ROCR_VISIBLE_DEVICES", "amd"),
    ("HIP_VISIBLE_DEVICES", "amd"),
    ("ZE_AFFINITY_MASK", "intel"),
)
FAMILY_ORDER = ("nvidia", "amd", "intel")


class LazyNvml:
    """NVML for the visibility lists, imported and initialised only if a UUID or MIG id
    cannot be resolved from files (``import pynvml`` alone costs ~30 ms)."""

    def __init__(self) -> None:
        self._backend: NvmlBackend | None = None

    def _get(self) -> NvmlBackend:
        if self._backend is None:
            from ._nvml import PynvmlBackend

            self._backend = PynvmlBackend()
        return self._backend

    def pci_of_uuid(self, uuid: str) -> str | None:
        return self._get().pci_of_uuid(uuid)

    def mig_parent_pci(self, mig_uuid: str) -> str | None:
        return self._get().mig_parent_pci(mig_uuid)


class Visible(Record):
    """The devices this process's runtime will number 0..n-1, in that order.

    ``problem`` is set when the environment named devices numabind cannot find; the plan
    then skips with that message rather than bind next to some other GPU.
    """

    __slots__ = ("devices", "family", "source", "problem", "notes")
    devices: tuple[Accelerator, ...]
    family: str | None
    source: str
    problem: str | None
    notes: tuple[str, ...]

    def __init__(
        self,
        devices: tuple[Accelerator, ...],
        family: str | None,
        source: str,
        problem: str | None = None,
        notes: tuple[str, ...] = (),
    ) -> None:
        _set(self, "devices", devices)
        _set(self, "family", family)
        _set(self, "source", source)
        _set(self, "problem", problem)
        _set(self, "notes", notes)


def _slurm_gpu_minors(environ: Mapping[str, str]) -> tuple[str, frozenset[int]] | None:
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        text = environ.get(var)
        if text:
            try:
                return var, frozenset(int(x) for x in text.split(",") if x.strip())
            except ValueError:
                return None
    return None


def reachable(
    machine: Machine, family: str, environ: Mapping[str, str]
) -> tuple[tuple[Accelerator, ...], list[str]]:
    """The accelerators of ``family`` this process can open, in PCI order, with notes."""
    notes: list[str] = []
    if family == "nvidia":
        driver = machine.nvidia_driver_gpus
        if driver is not None:
            devs = [a for a in (machine.accelerator(b) for b in driver) if a is not None]
        else:
            devs = [a for a in machine.accelerators if a.vendor == "nvidia"]
        slurm = _slurm_gpu_minors(environ)
        if slurm is not None and devs and all(d.minor is not None for d in devs):
            var, minors = slurm
            cvd = environ.get("CUDA_VISIBLE_DEVICES", "")
            cvd_set = {int(x) for x in cvd.split(",") if x.strip().isdigit()}
            # Without a device cgroup Slurm sets CUDA_VISIBLE_DEVICES to the gres indices
            # themselves; with ConstrainDevices CUDA renumbers the granted GPUs from 0.
            if cvd_set != set(minors):
                narrowed = [d for d in devs if d.minor in minors]
                if narrowed:
                    devs = narrowed
                    notes.append(f"{var} limits this process to GPU minors {sorted(minors)}")
    else:
        devs = [a for a in machine.accelerators if a.vendor == family]
    devs.sort(key=lambda a: pci_sort_key(a.pci))
    return tuple(devs), notes


def _match_uuid(token: str, devs: tuple[Accelerator, ...]) -> list[Accelerator]:
    want = token.lower()
    return [d for d in devs if d.uuid and d.uuid.lower().startswith(want)]


def _resolve_token(
    token: str,
    devs: tuple[Accelerator, ...],
    nvml: NvmlBackend | LazyNvml | None,
) -> tuple[Accelerator | None, str | None]:
    """One entry of a visibility list -> (device, why it could not be resolved)."""
    if token.isdigit():
        i = int(token)
        if i < len(devs):
            return devs[i], None
        return None, f"index {i} is out of range ({len(devs)} reachable)"
    upper = token.upper()
    if upper.startswith("MIG-"):
        rest = token[4:]
        if rest.upper().startswith("GPU-"):
            parent = rest.split("/", 1)[0]  # legacy MIG-GPU-<uuid>/<gi>/<ci>
            found = _match_uuid(parent, devs)
            if len(found) == 1:
                return found[0], None
        if nvml is not None:
            bdf = nvml.mig_parent_pci(token)
            if bdf is not None:
                for d in devs:
                    if d.pci == bdf:
                        return d, None
        if len(devs) == 1:
            return devs[0], None
        return None, f"MIG device {token!r} cannot be mapped to its GPU without NVML"
    if upper.startswith("GPU-"):
        found = _match_uuid(token, devs)
        if not found and nvml is not None:
            bdf = nvml.pci_of_uuid(token)
            found = [d for d in devs if d.pci == bdf]
        if len(found) == 1:
            return found[0], None
        if len(found) > 1:
            return None, f"{token!r} matches {len(found)} GPUs (a UUID prefix must be unique)"
        if not any(d.uuid for d in devs) and nvml is None:
            return None, f"{token!r} cannot be checked: no GPU UUIDs are readable without NVML"
        return None, f"no reachable GPU has UUID {token!r}"
    return None, f"{token!r} is neither an index nor a GPU-/MIG- UUID"


def _parse_list(
    var: str,
    text: str,
    devs: tuple[Accelerator, ...],
    nvml: NvmlBackend | LazyNvml | None,
    keep_subdevice: bool = False,
) -> tuple[tuple[Accelerator, ...], str | None, list[str]]:
    """Resolve a visibility list the way the runtimes do: entries in order, and the
    first entry that is invalid ends the list (CUDA ignores it and everything after it)."""
    notes: list[str] = []
    out: list[Accelerator] = []
    tokens = [t.strip() for t in text.split(",")]
    for pos, token in enumerate(tokens):
        if keep_subdevice and "." in token:
            token = token.split(".", 1)[0]
        dev, why = _resolve_token(token, devs, nvml)
        if dev is not None and dev in out and not keep_subdevice:
            dev, why = None, f"{token!r} repeats a device already listed"
        if dev is None:
            ignored = ",".join(tokens[pos:])
            if not out:
                return (), f"{var}={text!r}: {why}; no device is visible, not bound", notes
            notes.append(f"{var}: {why}; the runtime ignores {ignored!r}")
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
    family: str | None = None
    for var, fam in VISIBILITY_VARIABLES:
        if var in environ:
            family = fam
            break
    notes: list[str] = []
    if family is None:
        for fam in FAMILY_ORDER:
            devs, n = reachable(machine, fam, environ)
            if devs:
                family = fam
                notes.extend(n)
                break
        else:
            return Visible((), None, "no accelerator found")
        return Visible(
            devs,
            family,
            f"all {len(devs)} reachable {family} GPUs",
            None,
            _order_notes(devs, environ, notes),
        )
    devs, n = reachable(machine, family, environ)
    notes.extend(n)
    if family == "nvidia":
        text = environ["CUDA_VISIBLE_DEVICES"].strip()
        if text == "":
            return Visible((), family, "CUDA_VISIBLE_DEVICES is empty", None, tuple(notes))
        out, problem, n = _parse_list("CUDA_VISIBLE_DEVICES", text, devs, nvml)
        notes.extend(n)
        if problem and text.startswith("-"):
            return Visible(
                (), family, f"CUDA_VISIBLE_DEVICES={text} hides every GPU", None, tuple(notes)
            )
        return Visible(
            out, family, f"CUDA_VISIBLE_DEVICES={text}", problem, _order_notes(out, environ, notes)
        )
    if family == "amd":
        source = []
        rocr = environ.get("ROCR_VISIBLE_DEVICES")
        if rocr is not None:
            if rocr.strip() == "":
                return Visible((), family, "ROCR_VISIBLE_DEVICES is empty", None, tuple(notes))
            devs, problem, n = _parse_list("ROCR_VISIBLE_DEVICES", rocr, devs, nvml)
            notes.extend(n)
            source.append(f"ROCR_VISIBLE_DEVICES={rocr}")
            if problem:
                return Visible((), family, source[0], problem, tuple(notes))
        hip = environ.get("HIP_VISIBLE_DEVICES", environ.get("CUDA_VISIBLE_DEVICES"))
        if hip is not None:
            if hip.strip() == "":
                return Visible((), family, "HIP_VISIBLE_DEVICES is empty", None, tuple(notes))
            devs, problem, n = _parse_list("HIP_VISIBLE_DEVICES", hip, devs, nvml)
            notes.extend(n)
            source.append(f"HIP_VISIBLE_DEVICES={hip}")
            if problem:
                return Visible((), family, " + ".join(source), problem, tuple(notes))
        return Visible(devs, family, " + ".join(source), None, tuple(notes))
    text = environ["ZE_AFFINITY_MASK"]
    if text.strip() == "":
        return Visible(devs, family, "ZE_AFFINITY_MASK is empty (all devices)", None, tuple(notes))
    out, problem, n = _parse_list("ZE_AFFINITY_MASK", text, devs, nvml, keep_subdevice=True)
    notes.extend(n)
    return Visible(out, family, f"ZE_AFFINITY_MASK={text}", problem, tuple(notes))


def _order_notes(
    devs: tuple[Accelerator, ...], environ: Mapping[str, str], notes: list[str]
) -> tuple[str, ...]:
    models = {d.model for d in devs}
    if len(models) > 1 and environ.get("CUDA_DEVICE_ORDER", "") != "PCI_BUS_ID":
        notes.append(
            "GPUs of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers "
            "the fastest first, so indices may not follow PCI order; set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID"
        )
    return tuple(notes)
