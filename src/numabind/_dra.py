"""Inside a Kubernetes pod: the device metadata DRA drivers publish into containers
(KEP-5304), one more source of where a GPU is.

A container that requests a device through Dynamic Resource Allocation finds, with a
driver that enables device metadata (the DRA kubelet plugin library's
``EnableDeviceMetadata``), one JSON file per driver and request under
:data:`ROOT`::

    /var/run/kubernetes.io/dra-device-attributes/
        resourceclaims/<claimName>/<requestName>/<driverName>-metadata.json
        resourceclaimtemplates/<podClaimName>/<requestName>/<driverName>-metadata.json

Each file is a stream of one or more ``DeviceMetadata`` objects, the same metadata
encoded once per API version, newest first (``apiVersion``
``metadata.resource.k8s.io/v1alpha1``, later ``v1beta1``): the first object of a version
read here is used.  ``requests[].devices[]`` give each allocated device's ``driver``,
``pool``, ``name`` and ``attributes`` in the ResourceSlice's typed form
(``{"string": ...}``, ``{"int": ...}``).  The PCI address is the standard
``resource.kubernetes.io/pciBusID`` (or a driver's own ``pcieBusID``, ``pciAddress``);
the NUMA node has no standard name yet, and drivers spell it ``numaNode`` (AMD's GPU
driver, ``dra.net``), ``numa`` (NVIDIA's VFIO devices) or ``numaNodeID``.  Sources: the
Kubernetes documentation of DRA device metadata (the "device metadata protocol", v1.36
alpha), KEP-5304's README in kubernetes/enhancements, and the attribute names the NVIDIA
and AMD DRA drivers publish.

The files are input: another container's driver, a crafted image or a capture wrote them.
Every read is bounded (claims, requests and files per request, bytes per file, objects
per stream, devices, attributes); a file that does not parse, is of an unknown version or
names no PCI address is one line in the machine's warnings and is otherwise ignored.  The
startup hook pays one ``listdir`` of a folder that does not exist outside such pods.
What sysfs says wins where it says something (the kernel's own answer); the metadata
fills in a ``numa_node`` of -1 (or a device sysfs does not show at all: a masked /sys),
and a disagreement is said.
"""

from __future__ import annotations

from . import _sysfs
from ._model import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    class Root(Protocol):
        """What is read here of a machine's file tree (numabind._sources.Root has it;
        named by shape, so that the reader and this module do not import each other)."""

        def read(self, path: str, cap: int = ...) -> str: ...
        def listdir(self, path: str, cap: int = ...) -> list[str]: ...
        def isdir(self, path: str) -> bool: ...


ROOT = "/var/run/kubernetes.io/dra-device-attributes"
SAID = "DRA device metadata"  # how every line about a file here begins (numabind._devices)
KINDS = ("resourceclaims", "resourceclaimtemplates")
API_GROUP = "metadata.resource.k8s.io/"
VERSIONS = ("v1alpha1", "v1beta1")
MAX_CLAIMS = 64  # per kind
MAX_REQUESTS = 32  # per claim
MAX_FILES = 16  # per request: one per driver
FILE_CAP = 1 << 20  # bytes of one metadata file
MAX_OBJECTS = 8  # DeviceMetadata objects in one stream (one per API version)
MAX_DEVICES = 128  # per request
MAX_ATTRIBUTES = 256  # per device
TOTAL_FILES = 256  # metadata files read in all (a pod has one per driver and request)
TOTAL_BYTES = 16 << 20  # bytes read of them in all
SUFFIX = "-metadata.json"
PCI_NAMES = ("pciBusID", "pcieBusID", "pciAddress", "pciAddr")
NUMA_NAMES = ("numaNode", "numa", "numaNodeID", "numaNodeId")
STANDARD_PCI = "resource.kubernetes.io/pciBusID"
STANDARD_NUMA = "resource.kubernetes.io/numaNode"
# which vendor a driver's devices are, by its name (gpu.nvidia.com, gpu.amd.com, ...)
DRIVER_VENDORS = (("nvidia", "nvidia"), ("amd", "amd"), ("intel", "intel"))


class DraDevice(Record):
    """One device the DRA metadata lists for this container: its PCI address (sysfs
    spelling), its NUMA node where the driver says one, the driver, and where the file
    was (``resourceclaims/<claim>/<request>``)."""

    pci: str
    numa_node: int | None
    driver: str
    name: str
    where: str

    @property
    def vendor(self) -> str | None:
        """The vendor key the driver's name names (None: not a GPU vendor numabind knows)."""
        low = self.driver.lower()
        return next((key for word, key in DRIVER_VENDORS if word in low), None)


def _value(attr: Any) -> object:
    """A ResourceSlice attribute's value (``{"string": "x"}`` -> ``"x"``), or None."""
    if not isinstance(attr, dict) or len(attr) != 1:
        return None
    ((kind, value),) = attr.items()
    if kind in ("string", "version") and isinstance(value, str):
        return value
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _find(attrs: dict[str, Any], standard: str, names: tuple[str, ...]) -> object:
    """The standard attribute, else the first of a driver's own spellings (unqualified
    or in the driver's domain: ``numaNode``, ``gpu.amd.com/numaNode``)."""
    if standard in attrs:
        return _value(attrs[standard])
    for key, attr in list(attrs.items())[:MAX_ATTRIBUTES]:
        if isinstance(key, str) and key.rsplit("/", 1)[-1] in names:
            return _value(attr)
    return None


def _node(value: object) -> int | None:
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value.strip()[:6])
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _sysfs.MAX_NODES:
        return value
    return None


def _objects(text: str) -> list[Any]:
    """The JSON objects of a stream (at most :data:`MAX_OBJECTS`); ValueError if the
    stream does not parse."""
    import json

    decoder = json.JSONDecoder()
    out: list[Any] = []
    at = 0
    while len(out) < MAX_OBJECTS:
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        if at >= len(text):
            break
        try:
            obj, at = decoder.raw_decode(text, at)
        except RecursionError:
            raise ValueError("nested too deeply") from None
        out.append(obj)
    return out


def _metadata(objects: list[Any]) -> dict[str, Any] | None:
    """The first DeviceMetadata object of a version numabind reads."""
    for obj in objects:
        if not isinstance(obj, dict) or obj.get("kind") != "DeviceMetadata":
            continue
        version = obj.get("apiVersion")
        if version in tuple(API_GROUP + v for v in VERSIONS):
            return obj
    return None


def parse(text: str, where: str, warn: list[str]) -> list[DraDevice]:
    """The devices of one metadata file (``where`` names it in the warnings)."""
    try:
        objects = _objects(text)
    except ValueError as err:
        warn.append(f"{where}: not JSON ({_sysfs.clean_line(str(err), 120)}); ignored")
        return []
    meta = _metadata(objects)
    if meta is None:
        seen = [o.get("apiVersion") for o in objects if isinstance(o, dict)][:3]
        warn.append(
            f"{where}: no DeviceMetadata of a version numabind reads ({', '.join(VERSIONS)}; "
            f"found {_sysfs.short(repr(seen), 100)}); ignored"
        )
        return []
    out: list[DraDevice] = []
    requests = meta.get("requests")
    for req in requests[:MAX_REQUESTS] if isinstance(requests, list) else []:
        devices = req.get("devices") if isinstance(req, dict) else None
        for dev in devices[:MAX_DEVICES] if isinstance(devices, list) else []:
            if not isinstance(dev, dict):
                continue
            attrs = dev.get("attributes")
            attrs = attrs if isinstance(attrs, dict) else {}
            raw = _find(attrs, STANDARD_PCI, PCI_NAMES)
            pci = _sysfs.normalize_pci(raw) if isinstance(raw, str) else None
            driver = str(dev["driver"]) if isinstance(dev.get("driver"), str) else "?"
            name = str(dev["name"]) if isinstance(dev.get("name"), str) else "?"
            if pci is None:
                if raw is not None:
                    warn.append(
                        f"{where}: device {_sysfs.short(name, 40)}: PCI address "
                        f"{_sysfs.short(str(raw), 40)} is not one; ignored"
                    )
                continue  # a device without a PCI address (a NIC's VF, a CPU set): not ours
            out.append(
                DraDevice(
                    pci=pci,
                    numa_node=_node(_find(attrs, STANDARD_NUMA, NUMA_NAMES)),
                    driver=_sysfs.clean_line(str(driver), 80),
                    name=_sysfs.clean_line(str(name), 80),
                    where=where,
                )
            )
    return out


def read(root: Root) -> tuple[tuple[DraDevice, ...], list[str]]:
    """Every device the metadata under ``root`` lists (one per PCI address: the first
    file in name order wins), and the lines about files that were ignored.  The work is
    bounded, not the answer: the first :data:`TOTAL_FILES` files, :data:`TOTAL_BYTES` in
    all, are read and used, and a line says how many were left (2,048 files of 128 KiB
    once passed the whole machine's reading budget, and the pod's ranks went unbound)."""
    warn: list[str] = []
    found: dict[str, DraDevice] = {}
    spent = used = 0
    listed = paths(root)
    for path in listed:
        where = path.removeprefix(ROOT + "/")
        kind, claim, request, _ = where.split("/", 3)
        if used >= TOTAL_FILES or spent >= TOTAL_BYTES:
            break
        left = TOTAL_BYTES - spent
        try:
            text = root.read(path, min(FILE_CAP, left))
        except OSError as err:
            if left < FILE_CAP:
                break  # larger than what is left of the whole (refused at its cap): the last
            warn.append(f"{SAID} {where}: unreadable ({err}); ignored")
            used += 1
            continue
        if left < FILE_CAP and len(text) >= left:
            break  # cut at what was left of the whole: not used, and the last one read
        spent += len(text)
        used += 1
        lines: list[str] = []
        for dev in parse(text, f"{SAID} {where}", lines):
            found.setdefault(dev.pci, dev.replace(where=f"{kind}/{claim}/{request}"))
        warn += lines
    if used < len(listed):
        warn.append(
            f"{SAID}: read {used} of {len(listed)} files (at most {TOTAL_FILES}, "
            f"{TOTAL_BYTES >> 20} MiB in all); the rest ignored"
        )
    return tuple(sorted(found.values(), key=lambda d: _sysfs.pci_sort_key(d.pci))), warn


def _names(root: Root, path: str, cap: int) -> list[str]:
    """The entries of one folder of the tree (names that could be a path part only)."""
    try:
        names = root.listdir(path, cap)
    except OSError:
        return []
    return [n for n in names if n not in (".", "..") and "/" not in n and len(n) <= 253][:cap]


def paths(root: Root) -> list[str]:
    """The metadata files under ``root`` (what ``numabind gather`` copies)."""
    out: list[str] = []
    if not root.isdir(ROOT):
        return out
    for kind in KINDS:
        base = f"{ROOT}/{kind}"
        for claim in sorted(_names(root, base, MAX_CLAIMS)):
            for request in sorted(_names(root, f"{base}/{claim}", MAX_REQUESTS)):
                folder = f"{base}/{claim}/{request}"
                names = [n for n in _names(root, folder, MAX_FILES * 4) if n.endswith(SUFFIX)]
                out += [f"{folder}/{n}" for n in sorted(names)[:MAX_FILES]]
    return out
