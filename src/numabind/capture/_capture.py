"""Captures of other machines, opened for ``numabind show --input`` and
:meth:`numabind.Machine.from_capture` (``numabind gather`` writes them: numabind.cli._gather).

A capture is a directory mirroring ``/`` (what ``hwloc-gather-topology`` writes), a tarball
of one, or an hwloc XML export.  ``numabind gather`` also records the rank and device
variables of the process that ran it in ``numabind-env.json`` at the capture's root, so the
plan shown elsewhere is the plan that process would get.

A capture is input someone sent you.  It is read through :mod:`numabind._roots`: never
extracted, never followed outside itself, every member and size capped; its recorded
environment is only the variables numabind records, each bounded.
"""

from __future__ import annotations

import errno
import json
import os
import stat

from .. import _sysfs
from .._errors import CaptureError
from .._model import RANK_VARIABLE_NAMES, SIZE_VARIABLE_NAMES, VISIBILITY_VARIABLES
from .._roots import DirRoot
from .._sources import Root, Source, SysfsSource
from ._tarroot import TarRoot, is_tar, read_file

ENV_FILE = "numabind-env.json"
ENV_CAP = 1 << 20
RECORDED_VARIABLES = (
    *RANK_VARIABLE_NAMES,
    *SIZE_VARIABLE_NAMES,
    *VISIBILITY_VARIABLES,
    "CUDA_DEVICE_ORDER",
    "SLURM_STEP_ID",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID",
    "NUMABIND_MODE",
    "NUMABIND_MEMORY",
)
_VALUE_CAP = 4096


class _Prefixed(Root):
    """A root one directory down (hwloc tarballs wrap the tree in one top directory)."""

    def __init__(self, inner: Root, prefix: str, description: str) -> None:
        self.inner = inner
        self.prefix = prefix
        self.description = description
        self.budget = inner.budget

    def read(self, path: str, cap: int = _sysfs.READ_CAP) -> str:
        return self.inner.read(self.prefix + path, cap)

    def listdir(self, path: str, cap: int = _sysfs.LIST_CAP) -> list[str]:
        return self.inner.listdir(self.prefix + path, cap)

    def isdir(self, path: str) -> bool:
        return self.inner.isdir(self.prefix + path)

    def realpath(self, path: str) -> str | None:
        found = self.inner.realpath(self.prefix + path)
        return found.removeprefix(self.prefix) if found is not None else None

    def close(self) -> None:
        self.inner.close()


def _find_root(root: Root, path: str) -> Root:
    """The directory holding sys/ (hwloc tarballs wrap it in one top-level directory)."""
    if root.isdir("/sys"):
        return root
    entries = [e for e in root.listdir("/", 64) if root.isdir(f"/{e}/sys")]
    if len(entries) == 1:
        return _Prefixed(root, f"/{entries[0]}", path)
    root.close()
    raise CaptureError(f"{path}: no sys/ directory: not a capture of a machine")


def parse_env(text: str, where: str) -> dict[str, str]:
    """The recorded environment: only the variables numabind records, each a bounded
    string (a local world size of 10^11 in it is then the designed message, not a hang;
    a document nested a million deep is refused, not a RecursionError)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise CaptureError(f"{where}: not JSON ({why})") from None
    env = data.get("environ") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        raise CaptureError(f"{where}: no 'environ' object")
    out: dict[str, str] = {}
    for k, v in env.items():
        if k in RECORDED_VARIABLES and isinstance(v, (str, int)) and not isinstance(v, bool):
            out[k] = str(v)[:_VALUE_CAP]
    return out


def _read_env(root: Root, path: str) -> dict[str, str] | None:
    try:
        text = root.read(f"/{ENV_FILE}", ENV_CAP)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CaptureError(f"{path}: {ENV_FILE} unreadable ({err})") from err
    return parse_env(text, f"{path}: {ENV_FILE}")


def looks_like_xml(data: bytes) -> bool:
    """Whether a file's content is XML (of any encoding: the hwloc reader then says
    which encodings it reads)."""
    head = data[:64].lstrip(b" \t\r\n")
    return head.startswith(
        (b"<", b"\xef\xbb\xbf<", b"\xfe\xff", b"\xff\xfe", b"\x00\x00\xfe\xff")
    ) or (head[:2] == b"\x00<")


def open_source(path: str) -> Source:
    """Open a capture for reading (raises :class:`~numabind.CaptureError`, one line): the
    :class:`~numabind._sources.Source` of its machine, with the environment it recorded
    (``source.environ``; None when it recorded none).

    What the path holds is told from its content, never its name: a directory, a tar
    archive (plain, gzip, bzip2 or xz) or an hwloc XML export (plain or compressed, so
    ``.XML`` and ``.xml.gz`` read too).  A file is opened once, without blocking."""
    if not path:
        raise CaptureError("--input needs a path (a capture directory, tarball or .xml file)")
    st = None
    if path != "-":  # standard input: a tarball or an XML export piped in
        try:
            st = os.stat(path)
        except OSError as err:
            if err.errno == errno.ENOENT:
                raise CaptureError(f"{path}: no such file or directory") from None
            raise CaptureError(f"{path}: not readable ({err.strerror or err})") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        try:
            root = _find_root(DirRoot(path), path)
        except OSError as err:
            raise CaptureError(f"{path}: not readable ({err.strerror or err})") from None
    else:
        name = "standard input" if path == "-" else path
        try:
            data = read_file(path)
        except OSError as err:
            why = str(err) if isinstance(err, _sysfs.ReadError) else f"{name}: {err.strerror}"
            raise CaptureError(why) from None
        if is_tar(data):
            try:
                tar_root = TarRoot(data, name)
            except OSError as err:
                raise CaptureError(str(err)) from None
            root = _find_root(tar_root, name)
        elif looks_like_xml(data):
            from ._hwloc import HwlocSource

            return HwlocSource(data, name)
        else:
            raise CaptureError(
                f"{name}: neither a capture directory, a tar archive nor an hwloc XML export "
                "(by its content)"
            )
    try:
        environ = _read_env(root, path)
    except CaptureError:
        root.close()
        raise
    source = SysfsSource(root)
    source.environ = environ
    return source
