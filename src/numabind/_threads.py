"""Thread pools sized to the binding: ``NUMABIND_THREADS=auto`` (or a count).

A bound rank's *thread budget* is ``max(1, (len(cpus) // smt) // n)`` (``Plan.threads``):
its physical cores, shared by the ``n`` local ranks planned onto exactly the same CPUs.
Among GPU launchers only DeepSpeed sizes ``OMP_NUM_THREADS`` to the cores it binds;
torchrun writes ``OMP_NUM_THREADS=1`` for every multi-process job where it is unset, and
Ray sets it to the task's ``num_cpus`` inside the worker.  So a value found in the
environment is the *user's* only if

* it is in this process's initial environment (``/proc/self/environ``): Ray sets its
  value in-process, after start; and
* it is not torchrun's: a worker of a torchrun agent (``TORCHELASTIC_RUN_ID``) that sees
  ``OMP_NUM_THREADS=1`` while the agent's own initial environment has none got it from
  torchrun (torch/distributed/run.py), not from the user.

The user's values are never touched.  The affinity variables (``OMP_PROC_BIND``,
``OMP_PLACES``, ``GOMP_CPU_AFFINITY``, ``KMP_AFFINITY``) are left as set, and numabind says
once when an explicit CPU list in them lies outside the binding.

``NUMABIND_OMP_PLACES=cores`` (or ``threads``) is the one opt-in exception
(:func:`apply_places`): where none of the affinity variables is set, numabind sets
``OMP_PLACES`` to it and ``OMP_PROC_BIND=close``, so that the OpenMP workers hold one place
each inside the rank's CPUs.  libgomp then also pins the thread that loads it to the
first place (measured with torch 2.13: ``import torch`` leaves the main thread on one
CPU), and every thread and process it starts afterwards (the DataLoader's pin thread,
NCCL's, forked workers) would inherit that one CPU; so numabind puts the importing thread
back on the rank's CPUs after the import (:func:`numabind._guard.arm_places`).  Later
parallel regions leave it there (measured); the workers keep their places.

At startup the variables are set before any runtime is imported (the runtimes read them
when they load).  On late binding the pools already loaded are resized at run time:
through threadpoolctl (``numabind[threads]``) for OpenMP/BLAS, and ``torch.set_num_threads``
when torch is imported.
"""

from __future__ import annotations

import os
import sys

from . import _kernel, _sysfs
from ._model import OMP_PROC_BIND, Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping

    from ._plan import Plan

AFFINITY_VARIABLES = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")
VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def _initial_environ(pid: int | str) -> dict[str, str] | None:
    try:
        return _kernel.read_environ(pid)
    except OSError:
        return None


def owner_of(name: str, environ: Mapping[str, str], initial: Mapping[str, str] | None) -> str:
    """Who set ``name``: ``unset``, ``user``, ``torchrun`` or ``in-process`` (Ray, or the
    program itself before numabind bound it late)."""
    value = environ.get(name)
    if value is None:
        return "unset"
    if initial is not None and initial.get(name) != value:
        return "in-process"
    if name == "OMP_NUM_THREADS" and value.strip() == "1" and "TORCHELASTIC_RUN_ID" in environ:
        import _numabind_base

        _numabind_base.unseen.append("the agent's environment")  # not an answer's input
        agent = _initial_environ(os.getppid())
        if agent is not None and "OMP_NUM_THREADS" not in agent:
            return "torchrun"
    return "user"


class Places(Record):
    """What :func:`apply_places` did: the variables it set, or those it found set (by the
    user or a launcher) and left alone."""

    set: tuple[tuple[str, str], ...] = ()
    kept: tuple[tuple[str, str], ...] = ()

    def note(self) -> str:
        if self.set:
            return "NUMABIND_OMP_PLACES: set " + ", ".join(f"{k}={v}" for k, v in self.set)
        return "NUMABIND_OMP_PLACES: left as set: " + ", ".join(
            f"{k}={_sysfs.short(v)}" for k, v in self.kept
        )


PLACES_MODULES = ("torch", "numpy", "scipy", "sklearn")  # each may load an OpenMP runtime


def apply_places(setting: str, environ: MutableMapping[str, str] | Mapping[str, str]) -> Places:
    """``NUMABIND_OMP_PLACES``: set OMP_PLACES and OMP_PROC_BIND where no affinity variable
    is set; a value anyone set is kept (the user's, or a launcher's)."""
    found = tuple((k, environ[k]) for k in AFFINITY_VARIABLES if environ.get(k))
    if found:
        return Places(kept=found)
    wanted = (("OMP_PLACES", setting), ("OMP_PROC_BIND", OMP_PROC_BIND))
    if hasattr(environ, "__setitem__"):
        for k, v in wanted:
            environ[k] = v
    return Places(set=wanted)


def budget_of(plan: Plan, setting: str) -> int | None:
    if not plan.bound:
        return None
    if setting == "auto":
        return plan.threads
    if setting.isdigit():
        return int(setting)
    return None


def _explicit_cpus(value: str) -> set[int]:
    """The CPU numbers an affinity variable names explicitly (GOMP_CPU_AFFINITY lists,
    OMP_PLACES numeric places, KMP_AFFINITY proclist); abstract forms name none."""
    if len(value) > 4096:
        return set()
    digits: set[int] = set()
    number = ""
    text = value
    if "proclist=" in value:
        text = value.split("proclist=", 1)[1]
    elif not any(ch.isdigit() for ch in value) or value.strip().lower() in (
        "true",
        "false",
        "close",
        "spread",
        "master",
        "primary",
    ):
        return set()
    prev: int | None = None
    dash = False
    for ch in text + " ":
        if ch.isdigit() and len(number) < 6:
            number += ch
            continue
        if number:
            n = int(number)
            if dash and prev is not None and n >= prev and n - prev < 16384:
                digits.update(range(prev, n + 1))
            else:
                digits.add(n)
            prev, number = n, ""
        dash = ch == "-"
        if ch == ":":
            break  # OMP_PLACES {0:4}:2:4: what follows are lengths and strides, not CPUs
    return digits


class ThreadSettings:
    """What ``apply_env`` did: the budget, the variables set, those left as the user set
    them, and a warning about affinity variables, if any."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.set: dict[str, tuple[str | None, str]] = {}  # name -> (replaced, who)
        self.kept: dict[str, str] = {}
        self.affinity_warning: str | None = None

    def registry_env(self) -> tuple[tuple[str, str], ...]:
        """The variables this rank was given, with their values, for its registry entry
        (the hook sets them after start: /proc/PID/environ cannot show them)."""
        given = {**self.kept, **{k: str(self.budget) for k in self.set}}
        return tuple(sorted(given.items()))

    def notes(self, verbose: bool) -> list[str]:
        out: list[str] = []
        if verbose:
            if self.set:
                how = ", ".join(
                    f"{k}={self.budget}" + (f" (replacing {old!r} set by {who})" if old else "")
                    for k, (old, who) in self.set.items()
                )
                out.append(f"NUMABIND_THREADS: set {how}")
            if self.kept:
                out.append(
                    "NUMABIND_THREADS: left as the user set them: "
                    + ", ".join(f"{k}={v}" for k, v in self.kept.items())
                )
        return out


def apply_env(
    plan: Plan, setting: str, environ: MutableMapping[str, str] | Mapping[str, str]
) -> ThreadSettings | None:
    """Set the thread variables of a bound rank to its budget, except the user's."""
    budget = budget_of(plan, setting)
    if budget is None:
        return None
    out = ThreadSettings(budget)
    # os.environ: what the process started with is in /proc/self/environ; a plain
    # mapping (tests, numabind run's child) is its own initial environment
    initial = _initial_environ("self") if environ is os.environ else dict(environ)
    for name in VARIABLES:
        who = owner_of(name, environ, initial)
        if who == "user":
            out.kept[name] = environ[name]
            continue
        old = environ.get(name)
        if hasattr(environ, "__setitem__"):
            environ[name] = str(budget)
        out.set[name] = (old, who)
    outside: list[str] = []
    for name in AFFINITY_VARIABLES:
        value = environ.get(name)
        if value:
            named = _explicit_cpus(value)
            if named and not named <= plan.cpus:
                outside.append(f"{name}={_sysfs.short(value)}")
    if outside:
        out.affinity_warning = (
            f"{', '.join(outside)} would place threads on CPUs outside the binding "
            f"{_sysfs.format_cpulist(plan.cpus)}; numabind leaves them as set"
        )
    return out


def apply_runtime(plan: Plan, setting: str) -> tuple[ThreadSettings | None, list[str]]:
    """Late binding: set the variables (for what starts later) and resize the thread pools
    already loaded; returns (what was set, notes)."""
    budget = budget_of(plan, setting)
    if budget is None:
        return None, []
    notes: list[str] = []
    settings = apply_env(plan, setting, os.environ)
    if settings is not None and "OMP_NUM_THREADS" in settings.kept:
        return settings, notes  # the user sized the pools: leave the runtimes as they are
    try:
        import threadpoolctl
    except ImportError:
        notes.append(
            "NUMABIND_THREADS: threadpoolctl is not installed (pip install numabind[threads]);"
            " OpenMP/BLAS pools already loaded keep their size"
        )
    else:
        threadpoolctl.threadpool_limits(limits=budget)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(budget)
    return settings, notes
