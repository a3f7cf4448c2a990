"""``numabind doctor``: why a rank would not be bound, answered before the job runs.

Three places can stop the startup hook, and each needs a different look:

* **the interpreter a launcher runs** (``--python PATH``, default this one): is the
  ``.pth`` file in one of its site directories, does it run (a probe interpreter is
  started with a trigger variable and reports whether numabind's start module loaded),
  which ``.pth`` files run code before it, whether torch or numpy were already imported
  when the interpreter came up (their import-time memory is then placed before the
  binding), and whether another ``sitecustomize`` shadows numabind's;
* **this environment**: which trigger variables are set, ``NUMABIND=0``, settings that do
  not parse;
* **this kernel and container**: can this process set its CPU mask, its memory policy and
  move pages (a seccomp profile refuses the last two with EPERM), is automatic NUMA
  balancing on, and which accelerators the machine has that numabind does not handle.

The probe's answer is read as untrusted input (an interpreter named by ``--python`` may be
anything): bounded, parsed as JSON, each field checked for its type, printed escaped.
"""

from __future__ import annotations

import errno
import json
import os
import sys

from .._model import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

STATUSES = ("ok", "info", "warn", "fail")
PROBE_TIMEOUT = 60.0
PROBE_CAP = 1 << 20  # bytes of the probe's answer read
HEAVY = ("torch", "numpy", "jax", "tensorflow", "cupy", "ray")
# .pth files that run code before numabind's and are known not to import anything heavy
HARMLESS_PTH = ("distutils-precedence.pth", "_virtualenv.pth", "__editable__")
PROBE_TRIGGER = "NUMABIND_RAY"  # present (=0): the hook loads and does nothing

# Runs in the target interpreter (3.8+, numabind possibly absent); prints one JSON object.
PROBE = r"""
import json, os, stat, sys
HEAVY = %(heavy)r
out = {
    "executable": sys.executable, "version": sys.version.split()[0], "prefix": sys.prefix,
    "no_site": bool(sys.flags.no_site), "isolated": bool(getattr(sys.flags, "isolated", 0)),
    "start_loaded": "_numabind_start" in sys.modules,
    "hook_ran": "numabind._startup" in sys.modules,
    "site_ran": "_numabind_sitecustomize" in sys.modules,
    "preloaded": [m for m in HEAVY if m in sys.modules],
    "path": [p for p in sys.path if isinstance(p, str)][:200],
}
try:
    import site
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
except Exception:
    dirs = []
out["site_dirs"] = [d for d in dirs if os.path.isdir(d)][:20]
pth = []
for d in out["site_dirs"]:
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".pth"))[:500]
    except OSError:
        continue
    for n in names:
        e = {"dir": d, "name": n, "runs_code": False, "hook": None}
        try:
            fd = os.open(os.path.join(d, n), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            try:
                text = os.read(fd, 65536) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
            finally:
                os.close(fd)
        except OSError:
            text = b""
        for line in text.decode("utf-8", "replace").splitlines():
            if line.startswith(("import ", "import\t")):
                e["runs_code"] = True
                if "_numabind_start" in line:
                    e["hook"] = line[:4096]
        pth.append(e)
out["pth"] = pth
for name in ("sitecustomize", "usercustomize"):
    out[name] = getattr(sys.modules.get(name), "__file__", None)
try:
    import _numabind_start
    out["start_file"] = _numabind_start.__file__
except Exception as err:
    out["start_error"] = repr(err)[:300]
try:
    import numabind
    out["numabind"] = [numabind.__version__, numabind.__file__]
except Exception as err:
    out["numabind_error"] = repr(err)[:300]
data = json.dumps(out).encode()
while data:
    data = data[os.write(1, data):]
"""


class Finding(Record):
    """One line of the doctor's answer."""

    check: str
    status: str  # one of STATUSES
    detail: str


class Probe(Record):
    """What the target interpreter said about itself (fields checked for their types)."""

    executable: str
    version: str
    no_site: bool
    start_loaded: bool
    hook_ran: bool
    site_ran: bool
    preloaded: tuple[str, ...]
    path: tuple[str, ...]
    site_dirs: tuple[str, ...]
    pth: tuple[dict[str, Any], ...]
    sitecustomize: str | None
    usercustomize: str | None
    start_file: str | None
    start_error: str | None
    numabind: tuple[str, str] | None
    numabind_error: str | None
    runner: str = ""  # whom it was started as, and why (probe_runner)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _text(value: Any, cap: int = 4096) -> str | None:
    return value[:cap] if isinstance(value, str) else None


def _texts(value: Any, limit: int = 500) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v[:4096] for v in value[:limit] if isinstance(v, str))


def parse_probe(raw: bytes) -> Probe:
    """The probe's answer, or ValueError naming what was wrong with it (nesting too deep
    for the decoder too: the answer is another user's interpreter's word)."""
    try:
        data = json.loads(raw.decode("utf-8", "replace"))
    except RecursionError:
        raise ValueError("the probe's answer is nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError("the probe's answer is not a JSON object")
    pth: list[dict[str, Any]] = []
    for e in data.get("pth", [])[:2000] if isinstance(data.get("pth"), list) else []:
        if isinstance(e, dict) and isinstance(e.get("name"), str):
            pth.append(
                {
                    "dir": _text(e.get("dir")) or "",
                    "name": e["name"][:255],
                    "runs_code": e.get("runs_code") is True,
                    "hook": _text(e.get("hook")),
                }
            )
    nb = data.get("numabind")
    return Probe(
        executable=_text(data.get("executable")) or "?",
        version=_text(data.get("version"), 40) or "?",
        no_site=data.get("no_site") is True,
        start_loaded=data.get("start_loaded") is True,
        hook_ran=data.get("hook_ran") is True,
        site_ran=data.get("site_ran") is True,
        preloaded=_texts(data.get("preloaded"), 20),
        path=_texts(data.get("path")),
        site_dirs=_texts(data.get("site_dirs"), 20),
        pth=tuple(pth),
        sitecustomize=_text(data.get("sitecustomize")),
        usercustomize=_text(data.get("usercustomize")),
        start_file=_text(data.get("start_file")),
        start_error=_text(data.get("start_error"), 300),
        numabind=(nb[0][:40], nb[1][:4096])
        if isinstance(nb, list) and len(nb) == 2 and all(isinstance(x, str) for x in nb)
        else None,
        numabind_error=_text(data.get("numabind_error"), 300),
    )


def probe_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The probe's environment: the caller's, without anything that would bind it or
    turn the hook off, and with one trigger that makes the hook load and do nothing."""
    from .._environ import TRIGGER_VARIABLES

    env = {k: v for k, v in environ.items() if k not in TRIGGER_VARIABLES and k != "NUMABIND"}
    env[PROBE_TRIGGER] = "0"
    return env


def resolve_python(python: str | None) -> str:
    """The interpreter ``--python`` names: a path relative to the caller's directory (the
    probe runs from ``/``), a bare name looked up on PATH; default this one."""
    import shutil

    if python is None:
        return sys.executable
    if "/" not in python:
        found = shutil.which(python)
        if found is None:
            raise ValueError(f"{python}: no such interpreter on PATH")
        return found
    return os.path.abspath(python)


def site_paths(python: str, environ: Mapping[str, str], home: str | None) -> list[str]:
    """What an interpreter runs or imports at start besides itself, told from its layout
    alone (nothing is run): the site directories of its venv and of its base (``lib/
    python3*/site-packages`` and Debian's ``dist-packages``), the user site under
    ``home``, each ``.pth`` file and top-level entry there, the directories ``.pth``
    path lines add, and the ``PYTHONPATH`` entries (where a ``sitecustomize`` is found)."""
    import glob

    prefixes = [
        os.path.dirname(os.path.dirname(os.path.abspath(python))),
        os.path.dirname(os.path.dirname(os.path.realpath(python))),
    ]
    patterns = ["lib/python3*/site-packages", "lib/python3*/dist-packages"]
    patterns += ["lib/python3/dist-packages", "local/lib/python3*/dist-packages"]
    sites = [d for pre in dict.fromkeys(prefixes) for pat in patterns
             for d in sorted(glob.glob(os.path.join(pre, pat)))[:8]]  # fmt: skip
    if home:
        sites += sorted(glob.glob(os.path.join(home, ".local/lib/python3*/site-packages")))[:8]
    sites += [p for p in environ.get("PYTHONPATH", "").split(os.pathsep)[:64] if p]
    out: list[str] = []
    for site in dict.fromkeys(sites):
        if not os.path.isdir(site):
            continue
        out.append(site)
        try:
            names = sorted(os.listdir(site))[:20000]
        except OSError:
            continue
        for name in names:
            path = os.path.join(site, name)
            out.append(path)
            if name.endswith(".pth"):
                out += _pth_dirs(site, path)
    return list(dict.fromkeys(out))


def _pth_dirs(site: str, pth: str) -> list[str]:
    """The directories a ``.pth`` file's path lines add (read as text, never run)."""
    try:
        fd = os.open(pth, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        text = os.read(fd, 65536).decode("utf-8", "replace")
    finally:
        os.close(fd)
    out = []
    for line in text.splitlines()[:1000]:
        line = line.strip()
        if line and not line.startswith(("#", "import ", "import\t")):
            where = os.path.join(site, line)
            if os.path.isdir(where):
                out.append(where)
    return out


class Runner(Record):
    """Whom the probe runs as: ``uid`` (None: this process's own) and why."""

    uid: int | None
    gid: int | None
    home: str | None
    said: str


def probe_runner(python: str, environ: Mapping[str, str]) -> Runner:
    """Starting an interpreter runs its site directories' ``.pth`` files and
    ``sitecustomize``: code of whoever may write them.  The probe runs with no more
    privilege than they have (numabind.check._isolated): as this user when only root or this
    user can change any of it; as root's one other writer, dropped to that uid, when
    there is exactly one; refused (ValueError) when a file is writable by group or
    others, or several users could change it, or this user is not root."""
    import pwd

    from ..check._isolated import interpreter_paths, writers

    me = os.geteuid()
    uid: int | None = None
    home = environ.get("HOME")
    for _ in range(3):  # the interpreter first, then what it would run as that uid
        allowed = {0, me if uid is None else uid}
        paths = interpreter_paths(python) + site_paths(python, environ, home)
        owners, why = writers(paths, allowed)
        if not owners:
            break
        if -1 in owners or len(owners) > 1 or me != 0 or uid is not None:
            loosest = [w for w in why if "owned by" not in w] if -1 in owners else why
            reason = (loosest or why or ["it could be changed by another user"])[0]
            raise ValueError(
                f"{python}: not started: {reason} (its .pth files and sitecustomize would run "
                f"as uid {me}; run doctor as the user who owns it)"
            )
        uid = next(iter(owners))
        try:
            entry = pwd.getpwuid(uid)
            home, gid = entry.pw_dir, entry.pw_gid
        except KeyError:
            home, gid = None, uid
    if uid is None:
        who = "root" if me == 0 else f"uid {me}"
        return Runner(uid=None, gid=None, home=None, said=f"started as you ({who})")
    return Runner(uid=uid, gid=gid, home=home, said=f"started as uid {uid}, its owner, not as root")


def run_probe(python: str, environ: Mapping[str, str]) -> Probe:
    """Start ``python`` on the probe and read its answer; ValueError with one line when it
    could not.  It runs as :func:`probe_runner` says, contained as everything numabind
    starts for someone else (numabind.check._isolated.run_contained: its own session with
    no terminal, stdin /dev/null, from ``/``, the session killed once it answered); as
    another user with nothing of this environment but the probe's trigger
    (``contained_env``), as this user with this environment less the bindings."""
    from ..check._isolated import contained_env, run_contained

    code = PROBE % {"heavy": HEAVY}
    if not os.path.exists(python):
        raise ValueError(f"{python}: no such interpreter")
    runner = probe_runner(python, environ)
    if runner.uid is not None:
        env = contained_env(runner.home, {PROBE_TRIGGER: "0"})
    else:
        env = probe_environ(environ)
    try:
        proc = run_contained(
            [python, "-c", code],
            env=env,
            timeout=PROBE_TIMEOUT,
            cap=PROBE_CAP,
            uid=runner.uid,
            gid=runner.gid,
        )
    except FileNotFoundError:
        raise ValueError(f"{python}: no such interpreter") from None
    except PermissionError:
        raise ValueError(f"{python}: not executable") from None
    except OSError as err:
        raise ValueError(f"{python}: cannot run it ({err.strerror or err})") from None
    if proc.returncode is None:
        raise ValueError(f"{python}: did not answer in {PROBE_TIMEOUT:.0f} s")
    if proc.returncode == 0 and not proc.stdout.strip():
        raise ValueError(f"{python}: gave no answer; is it a Python interpreter?")
    if proc.returncode != 0:
        last = (proc.stderr or b"").decode("utf-8", "replace").strip().splitlines()[-1:]
        why = last[0][:300] if last else f"exit status {proc.returncode}"
        raise ValueError(f"{python}: the probe failed ({why}); is it a Python interpreter?")
    try:
        return parse_probe(proc.stdout).replace(runner=runner.said)
    except (ValueError, UnicodeError) as err:
        raise ValueError(f"{python}: the probe's answer could not be read ({err})") from None


# --- the checks --------------------------------------------------------------------------------


def _our_hook_line() -> str | None:
    """This numabind's own ``.pth`` line (next to its start modules), the reference the
    target's is compared with; None where it cannot be found."""
    import _numabind_base

    here = os.path.dirname(os.path.abspath(_numabind_base.__file__ or ""))
    try:
        with open(os.path.join(here, "_numabind_hook.pth"), "rb") as f:
            return f.read(65536).decode("utf-8", "replace").strip()
    except OSError:
        return None


def interpreter_findings(p: Probe, environ: Mapping[str, str]) -> list[Finding]:
    """What stops or weakens the hook in the interpreter the probe ran in."""
    from .. import __version__
    from .._environ import TRIGGER_VARIABLES
    from .._startup import sitecustomize_dir

    ran = f"; {p.runner}: its .pth files and sitecustomize ran" if p.runner else ""
    out = [
        Finding(check="python", status="info", detail=f"{p.executable} (Python {p.version}){ran}")
    ]
    if p.numabind is None:
        out.append(
            Finding(
                check="numabind",
                status="fail",
                detail=f"not importable here ({p.numabind_error or 'unknown reason'}); install "
                f"numabind for this Python ({p.executable} -m pip install PATH-TO-NUMABIND)",
            )
        )
    else:
        version, where = p.numabind
        differs = version != __version__
        out.append(
            Finding(
                check="numabind",
                status="warn" if differs else "ok",
                detail=f"{version} at {os.path.dirname(where)}"
                + (f" (this command is {__version__})" if differs else ""),
            )
        )
    hooks = [e for e in p.pth if e["hook"]]
    site_form = sitecustomize_dir() in p.path or any(
        os.path.basename(os.path.dirname(x)) == "_site" and "numabind" in x for x in p.path
    )
    if not hooks:
        out.append(
            Finding(
                check="hook file",
                status="warn" if site_form else "fail",
                detail="no _numabind_hook.pth in "
                + (", ".join(p.site_dirs) or "any site directory")
                + ": ranks started by this Python are bound only through numabind run, "
                "apply() or the sitecustomize form; reinstall numabind with pip for it",
            )
        )
    else:
        first = hooks[0]
        detail = f"{first['name']} in {first['dir']}"
        if len(hooks) > 1:
            detail += f" (and {len(hooks) - 1} more: each runs, the later ones do nothing)"
        missing = [t for t in TRIGGER_VARIABLES if t not in first["hook"]]
        ours = _our_hook_line()
        if missing:
            out.append(
                Finding(
                    check="hook file",
                    status="warn",
                    detail=f"{detail}: an older hook line that does not react to "
                    f"{', '.join(missing)}; reinstall numabind",
                )
            )
        else:
            same = ours is None or first["hook"].strip() == ours
            out.append(
                Finding(
                    check="hook file",
                    status="ok",
                    detail=detail + ("" if same else " (a different numabind's line)"),
                )
            )
    out.append(_runs(p, bool(hooks), site_form))
    out += _order(p, hooks)
    out += _sitecustomize(p, site_form)
    return out


def _runs(p: Probe, has_pth: bool, site_form: bool) -> Finding:
    if p.hook_ran:
        return Finding(
            check="hook runs",
            status="ok",
            detail="a fresh interpreter given a trigger variable loaded numabind's start "
            "module before any user code",
        )
    if p.no_site:
        why = "site processing is off (-S or a frozen interpreter): no .pth file runs"
    elif p.start_loaded:
        why = "the start module loaded but numabind did not (NUMABIND=0, or it failed)"
    elif has_pth or site_form:
        why = (
            "the hook is installed but did not run"
            + (f" ({p.start_error})" if p.start_error else "")
            + "; run this Python with a trigger variable to see its line on stderr"
        )
    else:
        why = "nothing installed for this Python runs it"
    return Finding(check="hook runs", status="fail", detail=why)


def _order(p: Probe, hooks: list[dict[str, Any]]) -> list[Finding]:
    """``.pth`` files run in name order within a directory: the code of the ones before
    numabind's runs unbound, and what torch or numpy allocate at import stays where it
    was first placed."""
    out: list[Finding] = []
    if hooks:
        first = hooks[0]
        before = [
            e["name"]
            for e in p.pth
            if e["dir"] == first["dir"]
            and e["runs_code"]
            and e["name"] < first["name"]
            and not e["name"].startswith(HARMLESS_PTH)
        ]
        if before:
            out.append(
                Finding(
                    check="hook order",
                    status="warn",
                    detail=f"{', '.join(before)} run code before numabind's hook; whatever "
                    "they import is placed before the binding",
                )
            )
        else:
            out.append(
                Finding(
                    check="hook order",
                    status="ok",
                    detail="no other .pth file runs code before numabind's",
                )
            )
    if p.preloaded:
        out.append(
            Finding(
                check="imported at start",
                status="warn",
                detail=f"{', '.join(p.preloaded)} already imported when the interpreter came "
                "up (a .pth file or sitecustomize imports it): its import-time memory is "
                "placed before any binding; apply() migrates it later",
            )
        )
    return out


def _sitecustomize(p: Probe, site_form: bool) -> list[Finding]:
    loaded = p.sitecustomize
    if site_form:
        mine = p.site_ran
        if not mine:
            return [
                Finding(
                    check="sitecustomize",
                    status="fail",
                    detail=f"numabind's directory is on PYTHONPATH but {loaded or 'another'}"
                    " was loaded as sitecustomize instead: the sitecustomize form of the hook "
                    "never runs (put numabind's directory first on PYTHONPATH)",
                )
            ]
        return [
            Finding(
                check="sitecustomize",
                status="ok",
                detail="numabind's (it then runs the next one on sys.path, if any)",
            )
        ]
    if loaded:
        return [
            Finding(
                check="sitecustomize",
                status="info",
                detail=f"{loaded} (not numabind's; the .pth form does not need one)",
            )
        ]
    return []


def environment_findings(environ: Mapping[str, str]) -> list[Finding]:
    """Trigger variables, ``NUMABIND=0`` and settings that do not parse, here."""
    from .._environ import TRIGGER_VARIABLES, detect

    out: list[Finding] = []
    switch = environ.get("NUMABIND", "").strip().lower()
    if switch in ("0", "off"):
        out.append(
            Finding(
                check="enabled",
                status="warn",
                detail=f"NUMABIND={environ['NUMABIND'][:20]!r}: the hook does nothing here",
            )
        )
    set_here = [t for t in TRIGGER_VARIABLES if t in environ]
    if set_here:
        info = detect(environ)
        rank = (
            f"local rank {info.local_rank} from {info.rank_source}"
            if info.local_rank is not None
            else "no local rank"
        )
        shown = ", ".join(f"{t}={environ[t][:40]}" for t in set_here)
        out.append(Finding(check="trigger variables", status="info", detail=f"{shown} ({rank})"))
    else:
        out.append(
            Finding(
                check="trigger variables",
                status="info",
                detail="none set here: the hook stays idle in this shell (a launcher sets "
                "LOCAL_RANK, SLURM_LOCALID, ... in each rank)",
            )
        )
    out += setting_findings(environ)
    return out


def setting_findings(environ: Mapping[str, str]) -> list[Finding]:
    """Every knob whose value does not parse, one finding each (the startup hook stops at
    the first: each is read alone here, so one typo does not hide the next)."""
    from .._environ import KNOBS, Config, path_setting

    out: list[Finding] = []
    for knob in KNOBS:
        if knob.name not in environ:
            continue
        if knob.kind == "path":  # set and not used: under the rules of this process's own
            _, unused = path_setting(knob, environ[knob.name], environ is os.environ)
            out += [Finding(check="settings", status="warn", detail=w) for w in unused]
            continue
        try:
            cfg = Config.from_env({knob.name: environ[knob.name]})
        except ValueError as err:
            out.append(Finding(check="settings", status="fail", detail=str(err)))
            continue
        out += [Finding(check="settings", status="warn", detail=w) for w in cfg.warnings]
    return out


def kernel_findings() -> list[Finding]:
    """Ask the kernel, changing nothing: pin this thread to the CPU mask and the memory
    policy it already has (put back after), and move no pages."""
    from .. import _kernel
    from .._model import POLICIES
    from .._pin import ThreadPin
    from .._plan import Placement

    out: list[Finding] = []
    failed: OSError | None = None
    try:
        policy, nodes = _kernel.get_mempolicy()
    except OSError as err:
        policy, nodes, failed = "none", frozenset(), err
    with ThreadPin(Placement(cpus=frozenset(os.sched_getaffinity(0)))) as pin:
        pass
    if pin.cpu_error is None:
        out.append(Finding(check="cpu affinity", status="ok", detail="this process may set it"))
    else:
        out.append(
            Finding(
                check="cpu affinity",
                status="fail",
                detail=f"sched_setaffinity refused ({pin.cpu_error.strerror}): numabind "
                "cannot bind here",
            )
        )
    memory = Placement(memory_policy=policy if policy in POLICIES else "none", memory_nodes=nodes)
    with ThreadPin(memory) as pin:
        pass
    failed = failed or (pin.errors[0] if pin.errors else None)
    if failed is not None:
        out.append(
            Finding(
                check="memory policy",
                status="fail" if failed.errno == errno.EPERM else "warn",
                detail=f"{failed}; numabind binds CPUs only here: memory lands where it is "
                "first touched",
            )
        )
    else:
        out.append(Finding(check="memory policy", status="ok", detail="this process may set it"))
    found = interleave_finding(policy, nodes)
    if found is not None:
        out.append(found)
    out.append(_migration())
    return out


def interleave_finding(policy: str, nodes: frozenset[int]) -> Finding | None:
    """This process (and what it starts: a launcher's ranks) runs under a policy that
    interleaves over several nodes, ``numactl --interleave=all`` and the like."""
    from .._sysfs import format_cpulist

    if policy != "interleave" or len(nodes) < 2:
        return None
    return Finding(
        check="interleave",
        status="warn",
        detail=f"this process's memory policy interleaves over nodes {format_cpulist(nodes)} "
        "and every rank started from here inherits it: numabind replaces it with the "
        "rank's plan, but keeps it where the rank's CPU mask is deliberate and inside its "
        "GPU's node or NUMABIND=respect; a GPU rank that keeps it spreads its pinned "
        "staging buffers over every node (torch pin_memory, cudaHostAlloc: one report "
        "measured the host-to-device path 10x slower); numabind.host_buffer and "
        "numabind.torch.pinned_empty take a policy of their own",
    )


def _migration() -> Finding:
    """apply() moves placed pages with mbind(MPOL_MF_MOVE) and retries leftovers with
    move_pages: try both on one scratch page of our own (mapped for this, unmapped after)."""
    import ctypes
    import mmap

    from .. import _kernel

    page = mmap.PAGESIZE
    scratch = mmap.mmap(-1, page)
    try:
        scratch[0:1] = b"x"
        cell = ctypes.c_char.from_buffer(scratch)
        addr = ctypes.addressof(cell)
        del cell
        try:
            _kernel.mbind(addr, page, "default", (), 0)
        except OSError as err:
            return Finding(
                check="page migration",
                status="warn",
                detail=f"{err}; apply() and @numa_bound cannot move pages already placed "
                "(the startup hook binds before there are any, so it is unaffected)",
            )
        try:
            _kernel.move_pages([addr])
        except OSError as err:
            return Finding(
                check="page migration",
                status="info",
                detail=f"{err}; apply() moves pages with mbind, but cannot retry the ones "
                "mbind leaves behind",
            )
    finally:
        scratch.close()
    return Finding(check="page migration", status="ok", detail="this process may move its pages")


def machine_findings(machine: Any, environ: Mapping[str, str] | None = None) -> list[Finding]:
    """Nodes, accelerators, accelerators not handled, NUMA balancing."""
    from .._sysfs import format_cpulist

    out: list[Finding] = []
    with_cpus = machine.cpu_nodes
    accs = machine.accelerators
    kinds: dict[str, int] = {}
    for a in accs:
        kinds[a.vendor] = kinds.get(a.vendor, 0) + 1
    seen = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no accelerators"
    status = "info"
    detail = (
        f"{_plural(len(machine.node_ids), 'NUMA node')}, {len(with_cpus)} with CPUs; {seen}; this "
        f"process may use CPUs {format_cpulist(machine.allowed.cpus) or '-'}"
    )
    if len(with_cpus) <= 1 and machine.memory_only_ids:
        only = format_cpulist(machine.memory_only_ids)
        detail += (
            f": one node with CPUs and memory-only node(s) {only}: ranks are planned on "
            "that node's CPUs, with a memory policy that keeps their memory off those nodes "
            "(NUMABIND_SPILL)"
        )
    elif len(with_cpus) <= 1:
        detail += ": one node with CPUs, nothing to bind on this machine"
    out.append(Finding(check="machine", status=status, detail=detail))
    # what the reading found wrong (a DRA file that does not parse...), each said once, and
    # the fall-back to every GPU in sysfs that a pod's unusable DRA files mean
    out += [Finding(check="machine problem", status="warn", detail=w) for w in machine.warnings]
    from .._devices import DRA_FALLBACK, resolve

    env = os.environ if environ is None else environ
    out += [
        Finding(check="visible devices", status="warn", detail=n)
        for n in resolve(machine, env).notes
        if n.startswith(DRA_FALLBACK)
    ]
    others = machine.others()
    if others:
        groups: dict[str, list[str]] = {}
        for d in others:
            groups.setdefault(d.label(), []).append(d.pci)
        for label, where in groups.items():
            out.append(
                Finding(
                    check="not handled",
                    status="warn",
                    detail=f"{len(where)} x {label} at {', '.join(where[:8])}"
                    + (" ..." if len(where) > 8 else "")
                    + ": numabind does not know this vendor's devices; a rank using one is "
                    "planned as having no GPU (bind it with numabind run --node N)",
                )
            )
    out += cpuset_findings(machine, environ)
    out += nic_findings(machine)
    out += binder_findings(machine, environ)
    balancing = machine.numa_balancing
    if balancing is not None:
        out.append(
            Finding(
                check="numa balancing",
                status="info",
                detail="on: the kernel also moves pages toward the CPUs that touch them "
                "(it agrees with a bound rank; it costs page faults)"
                if balancing
                else "off: pages stay where the memory policy put them",
            )
        )
    return out


def binder_findings(machine: Any, environ: Mapping[str, str] | None = None) -> list[Finding]:
    """The other binders this environment and machine show (numabind._binders): each
    variable that makes a library re-pin a rank started from here, and an active sched_ext
    scheduler, with what it will do to numabind's binding and the fix."""
    from .._binders import env_lines, sched_ext_line

    env = os.environ if environ is None else environ
    lines = env_lines(env)
    scheduler = machine.sched_ext
    if scheduler is not None:
        lines.append(sched_ext_line(scheduler))
    return [Finding(check="binders", status="warn", detail=line) for line in lines]


def subnuma_findings(machine: Any, environ: Mapping[str, str]) -> list[Finding]:
    """Where a package is split into several NUMA nodes (Intel SNC, AMD NPS) and a GPU's
    node is smaller than its ranks need: node mode gives each rank of a GPU node that
    node's cores and memory, shared by its GPUs' ranks, and a split that leaves GPUs
    unevenly over the package's nodes (some with none: a B200 host in SNC3 has GPUs on
    four of six nodes) gives them less than the package would.  "Needs" is that even
    share: the package's cores and memory over its GPUs (one rank per visible device)."""
    from .._devices import resolve
    from .._plan import device_node, split_of
    from .._sysfs import format_cpulist

    visible = resolve(machine, environ).devices
    gpus: dict[int, int] = {}
    for dev in visible:
        node = device_node(machine, dev).node
        if node is not None:
            gpus[node] = gpus.get(node, 0) + 1
    out: list[Finding] = []
    smt = max(machine.smt, 1)
    sizes = {n.id: (len(n.cpus) // smt, n.memory_bytes or 0) for n in machine.nodes if n.cpus}
    seen: set[tuple[int, ...]] = set()
    for node in sorted(gpus):
        split = split_of(machine, node)
        if split is None or split.nodes in seen:
            continue
        seen.add(split.nodes)
        ranks = sum(gpus.get(n, 0) for n in split.nodes)
        cores = sum(sizes.get(n, (0, 0))[0] for n in split.nodes)
        memory = sum(sizes.get(n, (0, 0))[1] for n in split.nodes)
        short = []
        for n in split.nodes:
            if not gpus.get(n):
                continue
            c, m = sizes.get(n, (0, 0))
            if c * ranks < cores * gpus[n] or m * ranks < memory * gpus[n]:
                short.append(
                    f"node {n}: {c // gpus[n]} cores and {m / gpus[n] / 2**30:.0f} GiB a rank"
                )
        if not short:
            continue
        idle = [n for n in split.nodes if not gpus.get(n)]
        row = split.row
        setting = f" ({split.setting})" if split.setting else ""
        what = f"package {split.package} is split into {len(split.nodes)} {row.node}s{setting}"
        out.append(
            Finding(
                check="sub-NUMA",
                status="warn",
                detail=f"{what}: {'; '.join(short)}, where package {split.package} would give "
                f"each of its {ranks} GPU ranks {cores // ranks} cores and "
                f"{memory / ranks / 2**30:.0f} GiB"
                + (
                    f" (node{'s' if len(idle) > 1 else ''} {format_cpulist(idle)} "
                    f"{'have' if len(idle) > 1 else 'has'} no GPU)"
                    if idle
                    else ""
                )
                + "; NUMABIND_MODE=socket gives the package's ranks all of it, or change "
                + row.bios,
            )
        )
    return out


def cpuset_findings(machine: Any, environ: Mapping[str, str] | None = None) -> list[Finding]:
    """Visible GPUs whose node has no CPU this process may use (a pod's or a job step's
    cpuset on the other socket): their ranks would not be bound; the fix, in the words of
    where this runs (numabind._advice)."""
    from .._advice import cpuset_fix
    from .._devices import resolve
    from .._plan import describe_device, device_node
    from .._sysfs import format_cpulist

    env = os.environ if environ is None else environ
    if len(machine.cpu_nodes) <= 1:
        return []
    allowed = machine.allowed
    off: dict[int, list[str]] = {}  # node -> the visible GPUs on it, none of its CPUs allowed
    for i, dev in enumerate(resolve(machine, env).devices):
        node = device_node(machine, dev).node
        found = machine.node(node) if node is not None else None
        if node is not None and found is not None and found.cpus and not found.cpus & allowed.cpus:
            off.setdefault(node, []).append(describe_device(dev, i))
    if not off:
        return []
    gpus = sum(len(v) for v in off.values())
    where = "; ".join(
        f"{', '.join(devs)} {'is' if len(devs) == 1 else 'are'} on node {n} (CPUs "
        f"{format_cpulist(machine.node(n).cpus)})"
        for n, devs in off.items()
    )
    return [
        Finding(
            check="cpuset",
            status="fail",
            detail=f"{where}, and none of the CPUs this process may use is there (CPUs "
            f"{format_cpulist(allowed.cpus) or 'none'}, from {allowed.source}): "
            f"{'its rank is' if gpus == 1 else 'their ranks are'} not bound. "
            f"Fix: {cpuset_fix(env, allowed)}",
        )
    ]


def nic_findings(machine: Any) -> list[Finding]:
    """The RDMA adapters: what may be offered, what is listed and never chosen and why,
    and each GPU with no adapter nearer than SYS (its ranks' RDMA traffic crosses the
    socket interconnect whatever they are told)."""
    from .._nics import assign, offered, same_vendor
    from .._plan import describe_device, device_node

    gpus = machine.accelerators
    units, refused = offered(machine)
    if not units and not refused:
        if gpus:
            out = [Finding(check="rdma adapters", status="info", detail="none found")]
            return out
        return []
    shown = ", ".join(
        f"{u.nic.name}:{u.port.number}" + (f" ({u.rate:g} Gb/s)" if u.rate else "")
        for u in units[:16]
    )
    detail = f"{len(units)} port(s) may be offered: {shown or 'none'}"
    if refused:
        detail += "; never chosen: " + "; ".join(
            f"{r.nic.name or r.nic.pci}: {r.why}" for r in refused[:8]
        )
    out = [Finding(check="rdma adapters", status="info" if units else "warn", detail=detail)]
    if units and gpus:
        found = assign(
            machine, same_vendor(machine, gpus[0]), lambda d: device_node(machine, d).node
        )
        for i, g in enumerate(gpus):
            mine = found.per_device.get(g.pci, ())
            if mine and mine[0].relation.rstrip("*") == "SYS":
                out.append(
                    Finding(
                        check="nic distance",
                        status="warn",
                        detail=f"{describe_device(g, i)}: no RDMA adapter nearer than SYS "
                        f"(its nearest, {mine[0].label}, is across the socket interconnect)",
                    )
                )
    return out


def doctor(python: str | None, environ: Mapping[str, str], machine: Any) -> list[Finding]:
    """Every finding, interpreter first."""
    try:
        target = resolve_python(python)
        probe = run_probe(target, environ)
        found = interpreter_findings(probe, environ)
    except ValueError as err:
        found = [Finding(check="python", status="fail", detail=str(err))]
    found += environment_findings(environ)
    found += kernel_findings()
    if machine is not None:
        found += machine_findings(machine, environ)
        found += cores_findings(machine, environ)
        found += subnuma_findings(machine, environ)
    return found


def cores_findings(machine: Any, environ: Mapping[str, str]) -> list[Finding]:
    """Which cores (their kinds: what NUMABIND_PRIORITY uses), read now, and whether the
    node's cache the ranks plan from still holds for this process (numabind._cache: a
    witness that says otherwise names what changed)."""
    from .. import _cache

    kinds = machine.core_kinds
    if kinds.distinct:
        detail = "; ".join(
            f"node {n.id}: {machine.describe_kinds(n.cpus)}" for n in machine.cpu_nodes
        )
    else:
        detail = machine.describe_kinds(machine.online_cpus)
    out = [Finding(check="cores", status="info", detail=detail)]
    raw = environ.get("NUMABIND_SYSROOT")
    from .._sysfs import redirect

    sysroot = redirect("NUMABIND_SYSROOT", raw, "/", own=environ is os.environ, registry=False,
                       notes=[])  # fmt: skip
    out.append(
        Finding(
            check="machine cache",
            status="info",
            detail="doctor read the machine as it is now; the ranks' cache: "
            + _cache.status(environ, sysroot),
        )
    )
    return out


def lines(found: list[Finding]) -> list[str]:
    width = max((len(f.check) for f in found), default=0)
    out = [f"{f.status.upper():5} {f.check:{width}}  {f.detail}" for f in found]
    fails = sum(f.status == "fail" for f in found)
    warns = sum(f.status == "warn" for f in found)
    out += ["", f"{_plural(fails, 'problem')}, {_plural(warns, 'warning')}"]
    return out
