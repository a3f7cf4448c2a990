"""The startup entry: whether numabind has anything to do in this interpreter, and for a
rank whose node's machine is cached, the start of the warm path (``_numabind_fast``).

``start()`` decides from the environment alone.  It is the one start path of all three
hook forms: the ``.pth`` line (which has already seen a trigger variable, with the
cheapest test Python offers: one dictionary intersection, compiled at every start of every
interpreter), PEP 829's ``_numabind_hook.start`` (Python 3.15+, which has not) and the
``sitecustomize`` form.  ``NUMABIND=0``/``off`` is checked here, before anything else.

Then :func:`fast`: the knobs, the local rank and its state key as numabind's own tables
say (a test keeps them in step); a process that inherited exactly this binding, or a rank
on a machine with one NUMA node (one ``node*`` directory: nothing to bind), is decided
here, without loading anything more.  A rank that has something to bind goes on to
``_numabind_fast``, which plans and binds it from the node's cached machine without
importing numabind; anything either cannot decide exactly as the full path would is handed
to the full path (``numabind._startup``), with the reason in :data:`handed_over`.

Also here, as the one copy numabind itself uses: the redirect rule for root
(:func:`root_owned_path`).  Only ``os`` and ``sys`` are imported; it never raises into the
interpreter (:func:`start`).
"""

import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping

    Env = MutableMapping[str, str]

# numabind._environ.TRIGGER_VARIABLES: the rank variables of numabind._model's table, then
# the framework switches; the .pth line spells the same list (a test keeps the three in step)
TRIGGERS = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
    "SLURM_LOCALID",
    "NUMABIND_TORCH",
    "NUMABIND_RAY",
    "NUMABIND_DEVICES",
)
# the modules numabind ships beside its package, which the warm start runs before the
# package is loaded (the wheel, the isolated collector and the tests' copies list them)
MODULES = ("_numabind_start", "_numabind_fast", "_numabind_roles")
# the one line a hook that cannot load says (the .pth and sitecustomize carry the same text
# for when this module itself cannot be imported; a test keeps them in step)
FAILED = "numabind: startup hook failed to load (%r); this process runs unbound\n"

# what the fast path did in this process, for numabind to adopt when it is imported later
# (numabind._apply makes a Binding of it, numabind._startup.last reads that): None when it
# bound nothing
applied: "dict[str, object] | None" = None
# why the fast path handed this process to the full path ("" when it did not): verbose
# mode says it, and so does the registry entry's ``machine`` field
handed_over = ""
# where the machine the fast path planned from came from ("cache", or "sysfs (cache: why
# not...)"; "" when it read none): doctor and the tests read it
machine_origin = ""
# what descriptor 2 was at start (numabind._output compares against it before it writes)
stderr_at_start: "tuple[int, int] | None" = None
_done: list[bool] = []


def failed(err: BaseException) -> None:
    """Say that the hook could not load, in one write(2) whose errors are ignored."""
    try:
        os.write(2, (FAILED % (err,)).encode("utf-8", "replace"))
    except Exception:
        pass


def start() -> None:
    try:
        env = os.environ
        if env.get("NUMABIND", "").strip().lower() in ("0", "off"):
            return
        for name in TRIGGERS:  # a loop, not any(): a generator is one more code object
            if name in env:
                break
        else:
            return
        if _done:
            return  # a venv processes each .pth twice (CPython #75723)
        _done.append(True)
        _note_stderr()
        global handed_over
        try:
            handed_over = fast(env)
        except Exception as err:  # the fast path undoes what it applied before it raises
            handed_over = f"the fast path failed ({type(err).__name__}: {err})"
        if not handed_over:
            return
        from numabind import _startup

        _startup.run()
    except Exception as err:
        failed(err)


def _note_stderr() -> None:
    global stderr_at_start
    if sys.__stderr__ is None:
        return
    try:
        st = os.fstat(2)
    except OSError:
        return
    stderr_at_start = (st.st_dev, st.st_ino)


# --- the fast path: what it decides, exactly as the full path does ----------------------------

# The knobs the fast path knows, each with the values it decides itself (numabind._environ.
# KNOBS has the whole vocabulary; tests/test_fast.py keeps these in step with it).  A knob
# not listed, or a value not accepted here, hands the process to the full path.
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
_FAST_KNOBS: "dict[str, tuple[str, ...] | None]" = {
    "NUMABIND": ("", "auto", "force", "respect"),
    "NUMABIND_MODE": ("", "node", "socket", "exclusive"),
    "NUMABIND_MEMORY": ("", "preferred", "bind", "interleave", "local", "none"),
    "NUMABIND_SMT": ("", "all", "1"),
    "NUMABIND_PRIORITY": ("", "off", "rank", "main"),
    "NUMABIND_RESERVE": None,  # n, n/node, n/rank: _reserve
    "NUMABIND_DEVICES": ("",),
    "NUMABIND_STRICT": _TRUE + _FALSE,
    "NUMABIND_THREADS": _FALSE,
    "NUMABIND_OMP_PLACES": ("", "off"),
    "NUMABIND_WORKERS": ("", "share", "spread", "reserved"),
    "NUMABIND_VERBOSE": _FALSE,
    "NUMABIND_GUARD": _TRUE + _FALSE,
    "NUMABIND_TORCH": _FALSE,
    "NUMABIND_TORCH_SET_DEVICE": _TRUE + _FALSE,
    "NUMABIND_RAY": _FALSE,
    "NUMABIND_REPORT": _FALSE,
    "NUMABIND_REPORT_RANK": None,  # any text: read only when NUMABIND_REPORT is on
    "NUMABIND_REPORT_WAIT": None,
    "NUMABIND_SYSROOT": None,  # the redirect rule: _sysroot
    "NUMABIND_REGISTRY": None,  # likewise: _registry_base
    "NUMABIND_STATE": None,  # set by numabind
    "NUMABIND_MAIN_CPUS": None,  # set by numabind
    "NUMABIND_CACHE": ("", *_TRUE, "0", "off", "no", "false"),  # 0/off: the full path
}
# numabind._model.RANK_VARIABLES without SLURM_LOCALID (its size comes from Slurm's task
# lists: the full path reads those), in the same order
_RANKS = (
    ("LOCAL_RANK", ("LOCAL_WORLD_SIZE", "LOCAL_SIZE")),
    ("OMPI_COMM_WORLD_LOCAL_RANK", ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    ("MPI_LOCALRANKID", ("MPI_LOCALNRANKS",)),
    ("MV2_COMM_WORLD_LOCAL_RANK", ("MV2_COMM_WORLD_LOCAL_SIZE",)),
    ("PALS_LOCAL_RANKID", ("PALS_LOCAL_SIZE",)),
)
MAX_LOCAL = 1 << 20  # numabind._environ.MAX_LOCAL
# numabind._model.VISIBILITY_VARIABLES (the state key lists them in this order)
_VISIBILITY = (
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
)
# numabind._environ's launcher tables: a launcher is never a rank (the full path says so)
_LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "deepspeed.launcher.launch",
    "deepspeed.launcher.runner",
    "accelerate.commands.launch",
)
_LAUNCHER_SCRIPTS = ("torchrun", "deepspeed", "ds", "accelerate")


class Handover(Exception):
    """The fast path cannot decide this process: the full path does (the reason is said
    in verbose mode and recorded in the registry entry's ``machine`` field)."""


def _knob_names(env: "Env") -> "list[str]":
    """The NUMABIND* names in ``env``: for os.environ from its bytes keys (decoding all of
    a process's variables to find a few costs more than the rest of the decision)."""
    out = []
    data = getattr(env, "_data", None)
    if isinstance(data, dict):
        for k in data:
            if k[:8] == b"NUMABIND":
                out.append(os.fsdecode(k))
    else:
        for name in env:
            if name.startswith("NUMABIND"):
                out.append(name)
    return out


def _config(env: "Env") -> "dict[str, str]":
    """The knobs as the fast path decides them; a knob it does not know, or a value it
    does not accept, hands the process over.  Only the knobs that are set are looked at
    (a rank sets a few of the table's two dozen)."""
    cfg: dict[str, str] = {}
    for name in _knob_names(env):
        if name not in _FAST_KNOBS:
            raise Handover(f"{name} is not a knob the fast path knows")
        raw = env[name]
        value = raw.strip().lower()
        accepted = _FAST_KNOBS[name]
        if accepted is not None and value not in accepted:
            raise Handover(f"{name}={raw[:40]!r}")
        cfg[name] = value
    if cfg.get("NUMABIND_CACHE") in ("0", "off", "no", "false"):
        raise Handover("NUMABIND_CACHE=0")
    reserve = _reserve(cfg.get("NUMABIND_RESERVE"))
    get = env.get
    return {
        "enable": cfg.get("NUMABIND") or "auto",
        "mode": cfg.get("NUMABIND_MODE") or "node",
        "memory": cfg.get("NUMABIND_MEMORY") or "preferred",
        "smt": cfg.get("NUMABIND_SMT") or "all",
        "priority": cfg.get("NUMABIND_PRIORITY") or "off",
        "reserve": reserve,
        "guard": "0" if cfg.get("NUMABIND_GUARD", "1") in _FALSE else "1",
        "state": get("NUMABIND_STATE", "") or "",
        "main_cpus": get("NUMABIND_MAIN_CPUS", "") or "",
    }


MAX_RESERVE = 4096  # numabind._environ.MAX_RESERVE


def _reserve(value: "str | None") -> str:
    """numabind._environ.parse_reserve, as its canonical text (``2/node``, ``1/rank``, or
    "" for none); a value it refuses is the full path's to say."""
    if value is None or value in ("", *_FALSE, "none"):
        return ""
    count, sep, scope = value.partition("/")
    scope = scope.strip() if sep else "node"
    count = count.strip()
    ok = count.isascii() and count.isdigit() and len(count) < 6 and int(count) <= MAX_RESERVE
    if scope not in ("node", "rank") or not ok:
        raise Handover(f"NUMABIND_RESERVE={value[:40]!r}")
    return f"{int(count)}/{scope}" if int(count) else ""


def _count(raw: str) -> "int | None":
    value = raw.strip()
    if not (value and value.isascii() and value.isdigit()) or len(value) > 7:
        return None
    n = int(value)
    return n if n < MAX_LOCAL else None


def _rank(env: "Env") -> "tuple[str, int, int | None, str | None]":
    """(rank variable, local rank, local world size or None, its variable)."""
    get = env.get
    for name, sizes in _RANKS:
        raw = get(name)
        if raw is None:
            continue
        rank = _count(raw)
        if rank is None:
            raise Handover(f"{name} is not a local rank")
        size = source = None
        for size_name in sizes:
            value = get(size_name)
            if value is None:
                continue
            parsed = _count(value)
            if parsed is not None and parsed > 0:
                size, source = parsed, size_name
                break
        if size is not None and rank >= size:
            size = source = None
        return name, rank, size, source
    raise Handover("no local rank the fast path reads")


def _launcher(argv: "list[str] | None") -> bool:
    """Whether the interpreter's command line starts a launcher (numabind._environ.
    launcher_of's walk, answering only yes or no)."""
    args = list(argv or ())[1:]
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-m" and i + 1 < len(args):
            return args[i + 1] in _LAUNCHER_MODULES
        if a.startswith("-m") and len(a) > 2:
            return a[2:] in _LAUNCHER_MODULES
        if a == "-c" or a.startswith("-c"):
            return False
        if a in ("-W", "-X"):
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        base = a.rsplit("/", 1)[-1]
        if base.endswith(".py"):
            base = base[:-3]
        if base in ("torchrun", "deepspeed", "ds"):
            return True
        return base == "accelerate" and "launch" in args[i + 1 :]
    return False


def state_key(source: str, rank: int, env: "Env", cfg: "dict[str, str]") -> str:
    """numabind._startup.state_key and roles_key, for what the fast path decides."""
    seen = []
    for v in _VISIBILITY:
        if v in env:
            seen.append(f"{v}={env[v][:200]}")
    visible = ",".join(seen).replace("#", "")
    reserve, smt = cfg["reserve"], cfg["smt"]
    roles = "" if not reserve and smt == "all" else f"|reserve={reserve}|smt={smt}"
    roles += f"|priority={cfg['priority']}" if cfg["priority"] != "off" else ""
    return f"{source}={rank}|{visible}|{cfg['mode']}|{cfg['memory']}{roles}"


def _one_node(sysroot: str) -> bool:
    """Whether the machine has at most one NUMA node: at most one ``node<N>`` directory
    under /sys/devices/system/node (numabind._sources lists the same directory, so a
    machine with one has at most one node with CPUs: nothing to bind in node and socket
    modes).  Live, a ``node1`` answers no at the cost of one stat (every multi-node rank
    asks), else the directory is listed directly (sysfs is the kernel's); a capture's is
    opened a part at a time without following a link (its tree is input: a link there
    could lead to an automount or a hung network file system)."""
    if not sysroot.rstrip("/"):
        try:
            os.stat("/sys/devices/system/node/node1")
            return False
        except OSError:
            pass
        try:
            return _count_nodes(os.listdir("/sys/devices/system/node"))
        except OSError:
            return False  # no node directory: the cached machine decides
    try:
        fd = os.open(sysroot or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        for part in ("sys", "devices", "system", "node"):
            nfd = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = nfd
        names = os.listdir(fd)
    except OSError:
        return False  # no node directory: the cached machine decides (a kernel without NUMA)
    finally:
        os.close(fd)
    return _count_nodes(names)


def _count_nodes(names: "list[str]") -> bool:
    if len(names) >= 4096:
        return False
    nodes = 0
    for n in names:
        if n.startswith("node") and n[4:].isascii() and n[4:].isdigit():
            nodes += 1
    return nodes <= 1


# --- where numabind reads and writes: the redirect rule ---------------------------------------

DEFAULT_BASE = "/dev/shm"  # the base of the per-user registry and cache directories


def root_owned_path(path: str) -> "str | None":
    """None when every directory on ``path`` (as written and as resolved) is owned by
    root and not writable by group or others (sticky directories excepted), else why."""
    if not path.startswith("/"):
        return "not an absolute path"
    real = os.path.realpath(path)
    for spelled in dict.fromkeys((os.path.abspath(path), real)):
        parts = [p for p in spelled.split("/") if p]
        prefix = ""
        for part in ["", *parts]:
            prefix = f"{prefix}/{part}" if part else "/"
            try:
                st = os.lstat(prefix)
            except OSError as err:
                return f"{prefix} cannot be examined ({err.strerror})"
            if st.st_uid != 0:
                return f"{prefix} is owned by uid {st.st_uid}"
            if stat.S_ISLNK(st.st_mode):
                continue  # its target is checked as the resolved spelling
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
                return f"{prefix} is writable by group or others"
    return None


def _sysroot(env: "Mapping[str, str]") -> str:
    """NUMABIND_SYSROOT as numabind._sysfs.redirect takes it for the process's own
    environment."""
    raw = env.get("NUMABIND_SYSROOT")
    if raw is None or raw.strip() == "" or sys.flags.ignore_environment:
        return "/"
    if os.geteuid() == 0 and root_owned_path(raw) is not None:
        return "/"
    return str(raw)


def _registry_base(env: "Mapping[str, str]") -> "str | None":
    """NUMABIND_REGISTRY likewise; None for root with one set (the rule then also asks
    which file system it is on: the full path decides)."""
    raw = env.get("NUMABIND_REGISTRY")
    if raw is None or raw.strip() == "" or sys.flags.ignore_environment:
        return DEFAULT_BASE
    if os.geteuid() == 0:
        return None
    return str(raw)


def fast(env: "Env") -> str:
    """Bind this process from the node's cached machine, or decide it needs nothing;
    returns '' when done, else why the full path must plan it (nothing applied is left
    behind)."""
    try:
        cfg = _config(env)
        source, rank, size, _ = _rank(env)
        if _launcher(getattr(sys, "orig_argv", None)):
            raise Handover("a launcher, not a rank")
        key = state_key(source, rank, env, cfg)
        recorded, _, status = cfg["state"].rpartition("#")
        if recorded == key:
            if cfg["priority"] == "main" and status == "bound" and cfg["main_cpus"]:
                from numabind._handback import inherited

                inherited(cfg["main_cpus"])
            return ""  # the parent planned exactly this
        sysroot = _sysroot(env)
        if _registry_base(env) is None:
            raise Handover("NUMABIND_REGISTRY is set for root (its rule asks which file system)")
        if cfg["mode"] in ("node", "socket") and cfg["priority"] == "off" and _one_node(sysroot):
            env["NUMABIND_STATE"] = f"{key}#skipped"
            env.pop("NUMABIND_MAIN_CPUS", None)
            return ""  # one NUMA node: nothing to bind (numabind._plan.nothing_to_bind)
    except Handover as h:
        return str(h)
    import _numabind_fast

    return _numabind_fast.bind_rank(env, cfg, source, rank, size, key, sysroot)
