"""Captures of other machines: open one for ``numabind show --input``, write one with
``numabind gather``.

A capture is a directory mirroring ``/`` (what ``hwloc-gather-topology`` writes), a tarball
of one, or an hwloc XML export.  ``numabind gather`` also records the rank and device
variables of the process that ran it in ``numabind-env.json`` at the capture's root, so the
plan shown elsewhere is the plan that process would get.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import time

from . import _sysfs
from ._devices import VISIBILITY_VARIABLES
from ._ranks import RANK_VARIABLES
from ._topology import Machine, SysfsSource

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ENV_FILE = "numabind-env.json"
RECORDED_VARIABLES = (
    *(name for name, _ in RANK_VARIABLES),
    *(s for _, sizes in RANK_VARIABLES for s in sizes),
    *(name for name, _ in VISIBILITY_VARIABLES),
    "CUDA_DEVICE_ORDER",
    "SLURM_STEP_ID",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID",
)


class CaptureError(Exception):
    """The input is not a capture numabind can read."""


class Capture:
    """An opened capture: the machine and, if it recorded one, the environment."""

    def __init__(
        self, machine: Machine, environ: dict[str, str] | None, cleanup: str | None
    ) -> None:
        self.machine = machine
        self.environ = environ
        self._tmp = cleanup

    def close(self) -> None:
        if self._tmp:
            import shutil

            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def _find_root(path: str) -> str:
    """The directory holding sys/ (hwloc tarballs wrap it in one top-level directory)."""
    if os.path.isdir(os.path.join(path, "sys")):
        return path
    entries = [e for e in _sysfs.listdir(path) if os.path.isdir(os.path.join(path, e))]
    if len(entries) == 1 and os.path.isdir(os.path.join(path, entries[0], "sys")):
        return os.path.join(path, entries[0])
    raise CaptureError(f"{path}: no sys/ directory: not a capture of a machine")


def _read_env(root: str) -> dict[str, str] | None:
    try:
        with open(os.path.join(root, ENV_FILE)) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise CaptureError(f"{root}/{ENV_FILE}: unreadable ({err})") from err
    return {str(k): str(v) for k, v in dict(data.get("environ", {})).items()}


def open_capture(path: str) -> Capture:
    if not os.path.exists(path):
        raise CaptureError(f"{path}: no such file or directory")
    if os.path.isdir(path):
        root = _find_root(path)
        return Capture(Machine(SysfsSource(root)), _read_env(root), None)
    if path.endswith(".xml"):
        from ._hwloc import HwlocError, load

        try:
            return Capture(load(path), None, None)
        except HwlocError as err:
            raise CaptureError(str(err)) from err
    if tarfile.is_tarfile(path):
        tmp = tempfile.mkdtemp(prefix="numabind-capture-")
        try:
            with tarfile.open(path) as tar:
                members = [
                    m
                    for m in tar.getmembers()
                    if not (m.name.startswith("/") or ".." in m.name.split("/"))
                    and (m.isfile() or m.isdir() or m.issym())
                ]
                # the 'tar' filter (Python 3.12, backported to 3.10.12/3.11.4) refuses
                # members and links that would land outside tmp; older Pythons get the
                # same checks from the member list above
                extra: dict[str, Any] = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
                for m in members:
                    if m.issym() and (m.linkname.startswith("/")):
                        continue
                    tar.extract(m, tmp, set_attrs=False, **extra)
            root = _find_root(tmp)
            return Capture(Machine(SysfsSource(root)), _read_env(root), tmp)
        except (tarfile.TarError, OSError, CaptureError) as err:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            raise CaptureError(f"{path}: {err}") from err
    raise CaptureError(f"{path}: neither a directory, a tarball nor an hwloc .xml file")


# --- gather -----------------------------------------------------------------------------

_NODE_FILES = ("cpulist", "cpumap", "meminfo", "distance")
_CPU_TOPO = ("physical_package_id", "core_cpus_list", "thread_siblings_list", "core_id")
_PCI_FILES = ("vendor", "device", "class", "numa_node", "local_cpulist", "local_cpus")


def _gather_paths(root: str = "/") -> list[str]:
    paths = [
        "/sys/devices/system/cpu/online",
        "/sys/devices/system/cpu/present",
        "/sys/devices/system/cpu/possible",
        "/sys/devices/system/node/online",
        "/sys/devices/system/node/possible",
        "/sys/devices/system/node/has_cpu",
        "/proc/self/cgroup",
        "/proc/self/status",
        "/proc/self/mounts",
        "/proc/self/cpuset",
        "/proc/sys/kernel/osrelease",
    ]
    j = _sysfs.join
    for name in _sysfs.listdir(j(root, "/sys/devices/system/node")):
        if name.startswith("node") and name[4:].isdigit():
            paths += [f"/sys/devices/system/node/{name}/{f}" for f in _NODE_FILES]
    for name in _sysfs.listdir(j(root, "/sys/devices/system/cpu")):
        if name.startswith("cpu") and name[3:].isdigit():
            base = f"/sys/devices/system/cpu/{name}"
            paths += [f"{base}/topology/{f}" for f in _CPU_TOPO]
            for idx in _sysfs.listdir(j(root, f"{base}/cache")):
                if idx.startswith("index"):
                    paths += [
                        f"{base}/cache/{idx}/{f}" for f in ("level", "type", "shared_cpu_list")
                    ]
    for bdf in _sysfs.listdir(j(root, "/sys/bus/pci/devices")):
        paths += [f"/sys/bus/pci/devices/{bdf}/{f}" for f in _PCI_FILES]
    for bdf in _sysfs.listdir(j(root, "/proc/driver/nvidia/gpus")):
        paths += [f"/proc/driver/nvidia/gpus/{bdf}/{f}" for f in ("information", "numa_status")]
    allowed = SysfsSource(root).allowed(frozenset())
    if allowed.source.startswith("cgroup"):
        d = allowed.source.split(" ")[-1]
        for f in (
            "cpuset.cpus.effective",
            "cpuset.mems.effective",
            "cpuset.effective_cpus",
            "cpuset.effective_mems",
            "cpuset.cpus",
            "cpuset.mems",
            "cpus",
            "mems",
            "effective_cpus",
            "effective_mems",
        ):
            paths.append(f"{d}/{f}")
    return paths


def gather(out_path: str, environ: dict[str, str], root: str = "/") -> int:
    """Write a tarball of the files numabind reads, plus the rank/device environment.
    Returns how many files it holds."""
    count = 0
    prefix = "numabind-capture"
    with tarfile.open(out_path, "w:gz") as tar:
        for path in _gather_paths(root):
            text = _sysfs.read_opt(_sysfs.join(root, path))
            if text is None:
                continue
            data = (text + "\n").encode()
            info = tarfile.TarInfo(prefix + path)
            info.size = len(data)
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
            count += 1
        env = {k: environ[k] for k in RECORDED_VARIABLES if k in environ}
        data = json.dumps({"environ": env}, indent=1, sort_keys=True).encode()
        info = tarfile.TarInfo(f"{prefix}/{ENV_FILE}")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return count
