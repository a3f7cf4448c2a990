"""Captures of other machines: open one for ``numabind show --input``, write one with
``numabind gather``.

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
import io
import json
import os
import stat
import time

from . import _sysfs
from ._errors import CaptureError
from ._ranks import RANK_VARIABLE_NAMES, SIZE_VARIABLE_NAMES
from ._roots import DirRoot, Root
from ._sources import Source, SysfsSource, read_paths
from ._tarroot import TarRoot, is_tar, read_file
from ._vendors import VENDORS, VISIBILITY_VARIABLES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import IO

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
    try:
        st = os.stat(path)
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise CaptureError(f"{path}: no such file or directory") from None
        raise CaptureError(f"{path}: not readable ({err.strerror or err})") from None
    if stat.S_ISDIR(st.st_mode):
        try:
            root = _find_root(DirRoot(path), path)
        except OSError as err:
            raise CaptureError(f"{path}: not readable ({err.strerror or err})") from None
    else:
        try:
            data = read_file(path)
        except OSError as err:
            why = str(err) if isinstance(err, _sysfs.ReadError) else f"{path}: {err.strerror}"
            raise CaptureError(why) from None
        if is_tar(data):
            try:
                tar_root = TarRoot(data, path)
            except OSError as err:
                raise CaptureError(str(err)) from None
            root = _find_root(tar_root, path)
        elif looks_like_xml(data):
            from ._hwloc import HwlocSource

            return HwlocSource(data, path)
        else:
            raise CaptureError(
                f"{path}: neither a capture directory, a tar archive nor an hwloc XML export "
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


# --- gather -----------------------------------------------------------------------------


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
    }
    head, _, rest = pattern.partition("{")
    if not rest:
        yield pattern
        return
    key = "{" + rest.split("}", 1)[0] + "}"
    tail = rest.split("}", 1)[1]
    if key == "{index}":
        base = head.rstrip("/")
        for idx in root.listdir(base, 64):
            if idx.startswith("index"):
                yield from _expand(root, f"{base}/{idx}{tail}", cgroup)
        return
    base, prefix = fields[key]
    for name in root.listdir(base):
        if not prefix or (name.startswith(prefix) and name[len(prefix) :].isdigit()):
            yield from _expand(root, f"{base}/{name}{tail}", cgroup)


def gather_paths(root: Root) -> list[str]:
    """Every file the reader would open on this machine (``read_paths()``, expanded)."""
    cgroup = SysfsSource(root).allowed(frozenset()).directory
    out: list[str] = []
    for pattern in read_paths():
        out.extend(_expand(root, pattern, cgroup))
    return list(dict.fromkeys(out))


def _write_tar(out: IO[bytes], root: Root, environ: Mapping[str, str]) -> int:
    import tarfile  # writing what numabind made itself: no input is parsed here

    count = 0
    prefix = "numabind-capture"
    now = int(time.time())
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for path in gather_paths(root):
            text = root.opt(path)
            if text is None:
                continue
            data = (text + "\n").encode()
            info = tarfile.TarInfo(prefix + path)
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


def gather(out_path: str, environ: Mapping[str, str], root_path: str = "/") -> int:
    """Write a tarball of the files numabind reads, plus the rank/device environment, to
    ``out_path`` (``-``: standard output).  Returns how many files it holds.

    The file is written under a fresh name in the target's directory (``O_EXCL``, never
    through a link) and renamed over the target, so a symlink planted at the output path
    is replaced, not followed."""
    from ._roots import for_path

    root = for_path(root_path)
    if out_path == "-":
        import sys

        buf = io.BytesIO()
        n = _write_tar(buf, root, environ)
        sys.stdout.flush()
        sys.stdout.buffer.write(buf.getvalue())
        sys.stdout.buffer.flush()
        return n
    directory = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(2, "no such directory", directory)
    tmp = os.path.join(directory, f".{os.path.basename(out_path)}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            n = _write_tar(f, root, environ)
        os.replace(tmp, out_path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return n
