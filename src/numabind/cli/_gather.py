"""``numabind gather``: a tarball of every file numabind reads on this machine, plus the
rank and device variables of this environment, so that ``numabind show --input`` elsewhere
shows the plan this process would get.

What is copied is :func:`numabind._sources.read_paths`, expanded here: a capture holds
what the reader reads, by construction.  The tarball is written with :mod:`tarfile` (what
numabind made itself: no input is parsed) through :class:`~numabind.cli._common.OutputFile`.
"""

from __future__ import annotations

import io
import json
import time

from .._model import VENDORS
from .._sources import SYS_INFINIBAND, SYS_NET, SYS_TIERING, SysfsSource, read_paths
from ..capture._capture import ENV_FILE, RECORDED_VARIABLES
from ._common import OutputFile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import IO

    from .._sources import Root


def _expand(root: Root, pattern: str, cgroup: str | None) -> Iterator[str]:
    """The concrete paths of one :func:`~numabind._sources.read_paths` pattern here."""
    if "{cgroup}" in pattern:
        if cgroup:
            yield pattern.replace("{cgroup}", cgroup)
        return
    fields: dict[str, tuple[str, str]] = {
        "{node}": ("/sys/devices/system/node", "node"),
        "{cpu}": ("/sys/devices/system/cpu", "cpu"),
        "{bdf}": ("/sys/bus/pci/devices", ""),
        "{driver}": (VENDORS[0].driver_dir or "", ""),
        "{tier}": (SYS_TIERING, "memory_tier"),
        # every vendor's partition topology (AMD's KFD nodes): the pattern names its own
        "{partition}": (
            next((v.partition_topology for v in VENDORS if v.partition_topology), ""),
            "",
        ),
        "{ibdev}": (SYS_INFINIBAND, ""),
        "{netdev}": (SYS_NET, ""),
    }
    head, _, rest = pattern.partition("{")
    if not rest:
        yield pattern
        return
    key = "{" + rest.split("}", 1)[0] + "}"
    tail = rest.split("}", 1)[1]
    if key in _LISTED_HERE:  # a directory of the path before it: cache indexes, ports, ...
        base = head.rstrip("/")
        keep = _LISTED_HERE[key]
        for name in root.listdir(base, 64):
            if keep(name):
                yield from _expand(root, f"{base}/{name}{tail}", cgroup)
        return
    base, prefix = fields[key]
    for name in root.listdir(base):
        if not prefix or (name.startswith(prefix) and name[len(prefix) :].isdigit()):
            yield from _expand(root, f"{base}/{name}{tail}", cgroup)


def _is_index(name: str) -> bool:
    return name.startswith("index")


def _is_port(name: str) -> bool:
    return name.isascii() and name.isdigit() and len(name) < 4


def _is_name(name: str) -> bool:
    return "/" not in name and name not in (".", "..")


# the pattern fields that list the directory the path has reached, and which names count
_LISTED_HERE: dict[str, Callable[[str], bool]] = {
    "{index}": _is_index,
    "{port}": _is_port,
    "{fnetdev}": _is_name,
}


def gather_paths(root: Root) -> list[str]:
    """Every file the reader would open on this machine (``read_paths()``, expanded)."""
    from .._dra import ROOT, TOTAL_FILES, paths

    cgroup = SysfsSource(root).allowed(frozenset()).directory
    out: list[str] = []
    for pattern in read_paths():
        if pattern.startswith(ROOT):
            # a pod's DRA device metadata: numabind._dra walks it, and uses no more than
            # its first TOTAL_FILES (nor does gather copy more)
            out.extend(paths(root)[:TOTAL_FILES])
            continue
        out.extend(_expand(root, pattern, cgroup))
    return list(dict.fromkeys(out))


def pci_links(root: Root) -> dict[str, str]:
    """The links that place each PCI device in the PCI tree (``/sys/bus/pci/devices/<bdf>``,
    ``/sys/class/infiniband/<name>/device`` and ``/sys/class/net/<name>/device``) -> where
    they lead: ``show --matrix`` and the NIC choice on the capture need them."""
    from .._sources import SYS_PCI

    links: dict[str, str] = {}
    candidates = [f"{SYS_PCI}/{bdf}" for bdf in root.listdir(SYS_PCI)]
    candidates += [f"{SYS_INFINIBAND}/{n}/device" for n in root.listdir(SYS_INFINIBAND, 64)]
    candidates += [f"{SYS_NET}/{n}/device" for n in root.listdir(SYS_NET, 1024)]
    for path in candidates:
        real = root.realpath(path)
        if real and real != path and real.startswith("/sys/devices/"):
            links[path] = real
    return links


def _through(path: str, links: Mapping[str, str]) -> str:
    """``path`` with a linked prefix replaced by where the link leads."""
    for link, real in links.items():
        if path.startswith(link + "/"):
            return real + path[len(link) :]
    return path


def tar_mode(path: str) -> str:
    """The compression a tarball's name asks for (``tar -a``'s rule): none for ``.tar``,
    bzip2 and xz by their suffixes, gzip otherwise (``-`` included)."""
    if path.endswith(".tar"):
        return "w"
    if path.endswith((".tar.bz2", ".tbz2", ".tbz")):
        return "w:bz2"
    if path.endswith((".tar.xz", ".txz")):
        return "w:xz"
    return "w:gz"


def _write_tar(out: IO[bytes], root: Root, environ: Mapping[str, str], mode: str = "w:gz") -> int:
    import os
    import tarfile  # writing what numabind made itself: no input is parsed here

    count = 0
    prefix = "numabind-capture"
    now = int(time.time())
    links = pci_links(root)
    with tarfile.open(fileobj=out, mode=mode) as tar:  # type: ignore[call-overload]
        for link, real in links.items():
            info = tarfile.TarInfo(prefix + link)
            info.type = tarfile.SYMTYPE
            info.linkname = os.path.relpath(real, os.path.dirname(link))
            info.mtime = now
            tar.addfile(info)
        for path in gather_paths(root):
            text = root.opt(path)
            if text is None:
                continue
            data = (text + "\n").encode()
            info = tarfile.TarInfo(prefix + _through(path, links))
            info.size = len(data)
            info.mtime = now
            tar.addfile(info, io.BytesIO(data))
            count += 1
        env = {k: environ[k] for k in RECORDED_VARIABLES if k in environ}
        data = json.dumps({"environ": env}, indent=1, sort_keys=True).encode()
        info = tarfile.TarInfo(f"{prefix}/{ENV_FILE}")
        info.size = len(data)
        info.mtime = now
        tar.addfile(info, io.BytesIO(data))
    return count


def gather(
    out: OutputFile, environ: Mapping[str, str], root_path: str = "/", root: Root | None = None
) -> int:
    """Write a tarball of the files numabind reads, plus the rank/device environment, to
    ``out`` (the one way a command writes a file: never through a link), compressed as
    its name says (:func:`tar_mode`).  ``root`` reads another tree than ``root_path``'s
    (an example machine).  Returns how many files it holds."""
    from .._roots import for_path

    tree = root if root is not None else for_path(root_path)
    buf = io.BytesIO()
    try:
        n = _write_tar(buf, tree, environ, tar_mode(out.path))
    finally:
        tree.close()
    out.write(buf.getvalue())
    return n
