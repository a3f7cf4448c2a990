"""Which CPUs and memory nodes this process's cgroup cpuset allows.

The answer comes from the cpuset files of the process's own cgroup (v2
``cpuset.cpus.effective``, v1 ``cpuset.effective_cpus``), found through
``/proc/self/mounts`` and ``/proc/self/cgroup``.  ``Cpus_allowed_list`` is *not* this
answer: it is the current affinity, which a launcher or parent may have narrowed, and
planning inside it is the bug this library exists to fix (a rank pinned by its agent would
stay pinned).

Three outcomes, kept apart: a cpuset read (its CPUs bound the plan); no cpuset at all (no
controller mounted or enabled: every online CPU); and a cpuset that exists but cannot be
read (a permission, a planted FIFO, garbage).  The last is never silently treated like the
second: it plans on every online CPU *and says so* in ``Allowed.problem``, which the plan
and ``numabind show`` repeat.
"""

from __future__ import annotations

from . import _sysfs
from ._model import Allowed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._roots import Root

MOUNTS_CAP = 4 << 20  # container hosts can have thousands of mounts

# file names per layout: (effective cpus, cpus, effective mems, mems); "" = none
_V2 = ("cpuset.cpus.effective", "", "cpuset.mems.effective", "")
_V1 = ("cpuset.effective_cpus", "cpuset.cpus", "cpuset.effective_mems", "cpuset.mems")
_V1_NOPREFIX = ("effective_cpus", "cpus", "effective_mems", "mems")
CPUSET_FILES = tuple(dict.fromkeys(n for names in (_V2, _V1, _V1_NOPREFIX) for n in names if n))


def _unescape(field: str) -> str:
    r"""/proc/mounts writes space, tab, newline and backslash as \040 \011 \012 \134."""
    if "\\" not in field:
        return field
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


class _Found(Exception):
    def __init__(self, allowed: Allowed) -> None:
        self.allowed = allowed


def cpuset(root: Root, online: frozenset[int]) -> Allowed:
    """The process's cpuset as an :class:`~numabind._model.Allowed` (see module doc)."""
    mounts = root.opt("/proc/self/mounts", MOUNTS_CAP) or root.opt("/proc/mounts", MOUNTS_CAP)
    v1_mount = v2_mount = None
    v1_names = _V1
    for line in (mounts or "").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point, fstype, opts = _unescape(fields[1]), fields[2], fields[3].split(",")
        if fstype == "cgroup2" and v2_mount is None:
            v2_mount = point
        elif (fstype == "cgroup" and "cpuset" in opts) or fstype == "cpuset":
            v1_mount = point
            v1_names = _V1_NOPREFIX if ("noprefix" in opts or fstype == "cpuset") else _V1
    v1_path = v2_path = None
    cgroup = root.opt("/proc/self/cgroup")
    if cgroup:
        for line in cgroup.splitlines():
            hier, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            if hier == "0" and controllers == "":
                v2_path = path
            elif "cpuset" in controllers.split(","):
                v1_path = path
    else:
        # Old kernels (and some captures) only have /proc/self/cpuset.
        v1_path = v2_path = root.opt("/proc/self/cpuset")
    problems: list[str] = []
    try:
        if v1_mount is not None and v1_path is not None:
            _walk(root, online, v1_mount, v1_path, v1_names, "cgroup-v1", problems)
        if v2_mount is not None and v2_path is not None:
            _walk(root, online, v2_mount, v2_path, _V2, "cgroup-v2", problems)
    except _Found as found:
        return found.allowed
    return Allowed(
        cpus=online,
        mems=_mems_allowed(root),
        kind="online",
        problem="; ".join(problems) or None,
    )


def _mems_allowed(root: Root) -> frozenset[int] | None:
    # Mems_allowed_list is the cpuset's own memory nodes (no parent narrows it)
    for line in (root.opt("/proc/self/status") or "").splitlines():
        if line.startswith("Mems_allowed_list:"):
            try:
                return _sysfs.parse_nodelist(line.split(":", 1)[1])
            except ValueError:
                return None
    return None


def _walk(
    root: Root,
    online: frozenset[int],
    mount: str,
    path: str,
    names: tuple[str, str, str, str],
    kind: str,
    problems: list[str],
) -> None:
    """Walk up from the process's cgroup: in v2 a cgroup without the cpuset controller
    has no cpuset files and inherits its parent's; in a cgroup namespace the path from
    /proc/self/cgroup may not exist under the mount, whose root is then ours."""
    path = "/" + path.strip("/")
    before = len(problems)
    candidates: list[str] = []
    for _ in range(256):  # cgroup trees are shallow; a crafted path cannot loop us
        candidates.append(path)
        if path == "/":
            break
        path = path.rsplit("/", 1)[0] or "/"
    for cand in candidates:
        d = mount.rstrip("/") + (cand if cand != "/" else "")
        cpus_text = _read(root, d, names[0], names[1], problems)
        if cpus_text is None:
            if len(problems) > before:
                return  # it exists but cannot be read: say so rather than look above it
            continue
        if not cpus_text:
            continue
        mems_text = _read(root, d, names[2], names[3], problems)
        try:
            cpus = _sysfs.parse_cpulist(cpus_text)
            mems = _sysfs.parse_nodelist(mems_text) if mems_text else None
        except ValueError as err:
            problems.append(f"{kind.replace('-', ' ')} cpuset {d} is unreadable ({err})")
            return
        raise _Found(
            Allowed(
                cpus=cpus & online if online else cpus,
                mems=mems,
                kind=kind,  # type: ignore[arg-type]
                directory=d,
            )
        )


def _read(root: Root, d: str, first: str, second: str, problems: list[str]) -> str | None:
    for name in (first, second):
        if not name:
            continue
        try:
            return root.read(f"{d}/{name}")
        except FileNotFoundError:
            continue
        except OSError as err:
            why = str(err) if isinstance(err, _sysfs.ReadError) else (err.strerror or str(err))
            problems.append(f"cgroup cpuset file {d}/{name} exists but is unreadable ({why})")
            return None
    return None
