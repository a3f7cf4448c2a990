"""Mutation testing as a habit: does the unit stage catch a wrong rule?

    python scripts/mutants.py                 every mutant (about 25 minutes on 2 CPUs)
    python scripts/mutants.py --sample 10     a fixed sample (CI)
    python scripts/mutants.py --only M07      one mutant
    python scripts/mutants.py --check         only check that every mutant applies

Each mutant is one small source edit of a rule a user depends on (a wrong constant, an
inverted test, a dropped flag).  The script copies the checkout once into a work folder
with its own venv (numabind installed editable from the copy, so that the tests' child
interpreters import the mutated code too, hook files included), then for each mutant puts
the pristine source back, applies the edit and runs the unit stage, the tests named for
the mutant first (quick kills) and then the whole stage.  A mutant is *killed* when a test
fails.  It prints the kill ratio and each survivor; the exit status is 1 when a mutant
survives that is not written down as equivalent (with the reason) in ``EQUIVALENT``.

The mutants live here, in one list, so that a new rule adds its mutant beside its test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRISTINE = [ROOT]  # where the mutants are made from (prepare() sets a snapshot)
UNIT = ["-m", "not vm and not launchers and not torch and not ray"]


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str  # relative to the repository
    old: str  # must occur exactly once
    new: str
    rule: str  # the user-facing rule the edit breaks
    tests: tuple[str, ...] = ()  # the tests expected to kill it (run first)


M = Mutant
MUTANTS: tuple[Mutant, ...] = (
    # --- who am I ---------------------------------------------------------------------------
    M(
        "M01",
        "src/_numabind_start.py",
        'in ("0", "off")',
        'in ("0",)',
        "NUMABIND=off disables the hook",
        ("tests/test_startup.py",),
    ),
    M(
        "M02",
        "src/_numabind_hook.pth",
        " SLURM_LOCALID",
        "",
        "an srun task (SLURM_LOCALID) triggers the .pth hook",
        ("tests/test_startup.py",),
    ),
    M(
        "M03",
        "src/numabind/_environ.py",
        "if size is not None and rank >= size:",
        "if size is not None and rank > size:",
        "LOCAL_RANK == LOCAL_WORLD_SIZE is not trusted",
        ("tests/test_ranks.py",),
    ),
    M(
        "M04",
        "src/numabind/_environ.py",
        "if var.requires is not None and var.requires not in environ:",
        "if False:",
        "SLURM_LOCALID names a rank only inside a job step",
        ("tests/test_ranks.py",),
    ),
    M(
        "M05",
        "src/numabind/_environ.py",
        "    if value in FALSE:\n        return False",
        "    if value in FALSE:\n        return True",
        "0/false/no/off mean false for every switch",
        ("tests/test_ranks.py", "tests/test_runtime.py"),
    ),
    # --- devices ----------------------------------------------------------------------------
    M(
        "M06",
        "src/numabind/_model.py",
        "return [item for uuid, item in uuids if uuid and uuid.lower().startswith(want)]",
        "return [item for uuid, item in uuids if uuid and uuid.lower().startswith(want)][:1]",
        "an ambiguous UUID prefix is refused, not the first match taken",
        ("tests/test_devices.py",),
    ),
    # --- the plan ---------------------------------------------------------------------------
    M(
        "M07",
        "src/numabind/_plan.py",
        "        if n is not None and n.cpus:\n            return NodeChoice(node=n.id",
        "        if n is not None:\n            return NodeChoice(node=n.id",
        "a device whose numa_node is a memory-only node is placed by its local CPUs",
        ("tests/test_plan.py",),
    ),
    M(
        "M08",
        "src/numabind/_plan.py",
        "        if len(inside) == 1:",
        "        if len(inside) >= 1:",
        "local CPUs inside one node identify that node, not the first of several",
        ("tests/test_plan.py",),
    ),
    M(
        "M09",
        "src/numabind/_plan.py",
        'if len(machine.cpu_nodes) > 1 or mode not in ("node", "socket"):',
        'if len(machine.cpu_nodes) > 2 or mode not in ("node", "socket"):',
        "the one-node shortcut applies to one node only",
        ("tests/test_plan.py",),
    ),
    M(
        "M10",
        "src/numabind/_plan.py",
        '        if policy == "preferred" and len(mem) > 1:',
        '        if policy == "preferred" and len(mem) > 2:',
        "preferred over several nodes becomes preferred-many",
        ("tests/test_plan.py",),
    ),
    M(
        "M11",
        "src/numabind/_plan.py",
        '        frozenset({first}),\n        f"kernel before 5.15',
        '        nodes,\n        f"kernel before 5.15',
        "before 5.15, preferred names one node",
        ("tests/test_plan.py",),
    ),
    M(
        "M12",
        "src/numabind/_plan.py",
        "    start = m.position * each + min(m.position, extra)",
        "    start = m.position * each",
        "exclusive mode gives ranks disjoint cores",
        ("tests/test_plan.py",),
    ),
    M(
        "M13",
        "src/numabind/_plan.py",
        "    slot = m.position % len(ordered)",
        "    slot = 0",
        "core-complex gives ranks different L3 domains",
        ("tests/test_plan.py",),
    ),
    M(
        "M14",
        "src/numabind/_plan.py",
        "cores = len(cpus) // max(self.m.smt, 1)",
        "cores = len(cpus)",
        "the thread budget counts cores, not SMT threads",
        ("tests/test_runtime.py", "tests/test_plan.py"),
    ),
    M(
        "M15",
        "src/numabind/_plan.py",
        "    if chosen != wanted:\n        planner.notes.append(",
        "    if False:\n        planner.notes.append(",
        "run --cpus says which CPUs the cgroup left out",
        ("tests/test_first_hour.py",),
    ),
    # --- bind -------------------------------------------------------------------------------
    M(
        "M16",
        "src/numabind/_apply.py",
        "    if existing.deliberate and inside:",
        "    if existing.deliberate:",
        "a deliberate mask outside the GPU's node is replaced",
        ("tests/test_existing.py",),
    ),
    M(
        "M17",
        "src/numabind/_apply.py",
        '"respect":\n        return Decision(action="keep", memory_only_if_default=True)',
        '"respect":\n        return Decision(action="keep")',
        "NUMABIND=respect keeps a policy already set (numactl --membind)",
        ("tests/test_existing.py",),
    ),
    M(
        "M18",
        "src/numabind/_apply.py",
        "    if not existing.narrower or existing.current == plan_cpus:",
        "    if existing.current == plan_cpus:",
        "a mask that is not narrower than allowed is simply replaced by the plan",
        ("tests/test_existing.py",),
    ),
    M(
        "M19",
        "src/numabind/_model.py",
        '        code=2,\n        numa_maps="bind",',
        '        code=3,\n        numa_maps="bind",',
        "bind is MPOL_BIND (2)",
        ("tests/test_bind.py",),
    ),
    M(
        "M20",
        "src/numabind/_model.py",
        '        code=1,\n        numa_maps="prefer",',
        '        code=4,\n        numa_maps="prefer",',
        "preferred is MPOL_PREFERRED (1)",
        ("tests/test_bind.py",),
    ),
    # --- the registry -----------------------------------------------------------------------
    M(
        "M21",
        "src/_numabind_base.py",
        "        efd = os.open(name, _READ | os.O_NOFOLLOW, dir_fd=fd)",
        "        efd = os.open(name, _READ, dir_fd=fd)",
        "registry entries are never read through a link",
        ("tests/test_check.py",),
    ),
    M(
        "M22",
        "src/_numabind_base.py",
        "    if st.st_uid not in (0, uid):",
        "    if False:",
        "no registry is made in a base another ordinary user owns",
        ("tests/test_shared_machine.py",),
    ),
    M(
        "M23",
        "src/_numabind_base.py",
        "            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK",
        "            os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK",
        "an entry is written to a fresh file, never an existing one",
        ("tests/test_security.py",),
    ),
    # --- check ------------------------------------------------------------------------------
    M(
        "M24",
        "src/numabind/check/_inspect.py",
        "escaped = {t: c for t, c in threads.items() if not c <= expected.allowed_for(t, main)}",
        "escaped: dict[int, frozenset[int]] = {}",
        "check: a thread off the plan's CPUs is off plan",
        ("tests/test_check.py",),
    ),
    M(
        "M25",
        "src/numabind/check/_inspect.py",
        '        if got_name != want or (want != "local" and got_nodes != mem_nodes):',
        "        if got_name != want and got_nodes != mem_nodes:",
        "check: a wrong memory policy is off plan",
        ("tests/test_check.py",),
    ),
    M(
        "M26",
        "src/numabind/check/_inspect.py",
        "MIN_LOCALITY = 0.9",
        "MIN_LOCALITY = 0.0",
        "check: pages left remote are off plan",
        ("tests/test_check.py",),
    ),
    M(
        "M27",
        "src/numabind/cli/_common.py",
        'code=1,\n        name="off-plan"',
        'code=0,\n        name="off-plan"',
        "check exits 1 for a process off its plan",
        ("tests/test_check.py",),
    ),
    M(
        "M28",
        "src/numabind/check/_inspect.py",
        '        problems.append(f"no plan to check against: {source}")',
        "        pass",
        "check of a process with no plan is not OK",
        ("tests/test_first_hour.py", "tests/test_check.py"),
    ),
    # --- bench ------------------------------------------------------------------------------
    M(
        "M29",
        "src/numabind/cli/_bench.py",
        "NO_DIFFERENCE = 1.20",
        "NO_DIFFERENCE = 1.0",
        "bench: under 1.2x remote/local is no measurable difference",
        ("tests/test_bench.py",),
    ),
    M(
        "M30",
        "src/numabind/cli/_bench.py",
        "                    this = min(size, int(free * share) // PAGE * PAGE)",
        "                    this = size",
        "bench uses at most --share of each node's free memory",
        ("tests/test_bench.py",),
    ),
    # --- reading the machine ----------------------------------------------------------------
    M(
        "M31",
        "src/_numabind_base.py",
        "OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK",
        "OPEN_FLAGS = os.O_RDONLY",
        "no read blocks on a FIFO planted where a file was expected",
        ("tests/test_security.py", "tests/test_sysfs.py"),
    ),
    M(
        "M32",
        "src/numabind/capture/_hwloc.py",
        "self._distances = self._read_distances(root)",
        "self._distances = {}",
        "hwloc exports' distance matrices are read",
        ("tests/test_captures.py", "tests/test_first_hour.py"),
    ),
    M(
        "M33",
        "src/numabind/_nics.py",
        '    return "PIX" if len(a) - common <= 1 and len(b) - common <= 1 else "PXB"',
        '    return "PXB"',
        "matrix and NIC choice: GPUs on one switch are PIX",
        ("tests/test_first_hour.py", "tests/test_nics.py"),
    ),
    M(
        "M34",
        "src/numabind/_nics.py",
        '    if common == 1:\n        return "PHB"',
        '    if common == 1:\n        return "NODE"',
        "matrix and NIC choice: devices under one host bridge are PHB",
        ("tests/test_first_hour.py", "tests/test_nics.py"),
    ),
    M(
        "M35",
        "src/numabind/_sources.py",
        "        if not hosts or parts[-1] != bdf:",
        "        if not hosts:",
        "a PCI path is the device's own (not a neighbour's)",
        ("tests/test_first_hour.py",),
    ),
    # --- output and entry points ------------------------------------------------------------
    M(
        "M36",
        "src/numabind/cli/_common.py",
        '    out.write("".join(escape(line, 20000) + "\\n" for line in lines))',
        '    out.write("".join(line + "\\n" for line in lines))',
        "every text line is escaped (another user's fields cannot drive root's terminal)",
        ("tests/test_shared_machine.py",),
    ),
    M(
        "M37",
        "src/numabind/cli/_common.py",
        "os.O_EXCL | os.O_NOFOLLOW",
        "os.O_NOFOLLOW",
        "outputs are written to a fresh file, never through a planted one",
        ("tests/test_shared_machine.py",),
    ),
    M(
        "M38",
        "src/numabind/_startup.py",
        "    global _done\n",
        "    global _done\n    _done = False\n",
        "the hook runs once per interpreter (a venv runs each .pth twice)",
        ("tests/test_startup.py",),
    ),
    M(
        "M39",
        "src/numabind/_threads.py",
        '        if who == "user":\n            out.kept[name]',
        "        if False:\n            out.kept[name]",
        "NUMABIND_THREADS never overrides a value the user set",
        ("tests/test_runtime.py",),
    ),
    M(
        "M40",
        "src/numabind/cli/_doctor.py",
        '                status="fail" if failed.errno == errno.EPERM else "warn",',
        '                status="warn",',
        "doctor fails when the container refuses memory policies",
        ("tests/test_first_hour.py",),
    ),
    M(
        "M41",
        "src/numabind/_errors.py",
        "        found = bool(loaded) or",
        "        found = True or",
        "torch/ray install() without the framework says so",
        ("tests/test_first_hour.py",),
    ),
    M(
        "M42",
        "src/numabind/cli/__init__.py",
        "if not p.bound:  # asked for by name: refuse, as numactl does, not run unbound",
        "if False:",
        "run --node/--cpus refuse what cannot be honoured",
        ("tests/test_first_hour.py",),
    ),
    M(
        "M43",
        "src/numabind/_children.py",
        '            if err.errno == errno.EPERM or getattr(_ENTERING, "on", False):\n'
        "                continue",
        "            if True:\n                continue",
        "child_binding says once when the memory policy is refused",
        ("tests/test_first_hour.py",),
    ),
    M(
        "M44",
        "src/numabind/capture/_tarroot.py",
        "TAR_MEMBERS = 50_000",
        "TAR_MEMBERS = 500_000",
        "a capture tarball's member count is capped",
        ("tests/test_security.py",),
    ),
    # --- core roles ----------------------------------------------------------------------
    M(
        "M45",
        "src/numabind/_plan.py",
        "taken = usable[len(usable) - need :]",
        "taken = usable[:need]",
        "reserved cores are taken from the end of the node's core list",
        ("tests/test_roles.py",),
    ),
    M(
        "M46",
        "src/numabind/_plan.py",
        "need = want - (len(cores) - len(usable))",
        "need = want",
        "cores the cgroup leaves out count towards the reservation",
        ("tests/test_roles.py",),
    ),
    M(
        "M47",
        "src/numabind/_plan.py",
        "cpus = one_per_core(self.m, cpus)",
        "cpus = frozenset(cpus)",
        "NUMABIND_SMT=1 keeps one hardware thread per core",
        ("tests/test_roles.py",),
    ),
    M(
        "M48",
        "src/numabind/check/_inspect.py",
        "return self.cpus if tid == main else self.cpus | self.helpers",
        "return self.cpus | self.helpers",
        "check: the main thread belongs on the compute CPUs, not the helper cores",
        ("tests/test_roles.py",),
    ),
    M(
        "M49",
        "src/numabind/_threads.py",
        "found = tuple((k, environ[k]) for k in AFFINITY_VARIABLES if environ.get(k))",
        "found = ()",
        "NUMABIND_OMP_PLACES never replaces an affinity variable someone set",
        ("tests/test_roles.py",),
    ),
    M(
        "M50",
        "src/numabind/_guard.py",
        "if not want or now is None or not now < want:",
        "if True:",
        "NUMABIND_OMP_PLACES puts the thread libgomp narrowed back on the rank's CPUs",
        ("tests/test_roles.py",),
    ),
    # --- registration with the GPU driver -----------------------------------------------------
    M(
        "M51",
        "src/numabind/_model.py",
        "portable=0x01,  # CU_MEMHOSTREGISTER_PORTABLE",
        "portable=0x00,  # CU_MEMHOSTREGISTER_PORTABLE",
        "host buffers are registered PORTABLE: every context sees them",
        ("tests/test_register.py",),
    ),
    M(
        "M52",
        "src/numabind/memory/_memory.py",
        "            if dontfork:\n",
        "            if False:\n",
        "a registered buffer is not mapped by a fork child (MADV_DONTFORK)",
        ("tests/test_register.py",),
    ),
    M(
        "M53",
        "src/numabind/memory/_memory.py",
        "    if reg is not None:\n        reg.unregister()\n    try:\n        held.mapping.close()",
        "    try:\n        held.mapping.close()\n"
        "        if reg is not None:\n            reg.unregister()",
        "close() unregisters before it unmaps",
        ("tests/test_register.py",),
    ),
    # --- the job report ---------------------------------------------------------------------
    M(
        "M54",
        "src/numabind/check/_job.py",
        "    if expect_host is not None and host != expect_host:",
        "    if False:",
        "a node record cannot speak for another host",
        ("tests/test_job.py",),
    ),
    M(
        "M55",
        "src/numabind/check/_job.py",
        "    if s.off_plan:\n        return 1",
        "    if s.off_plan and not s.unreachable_nodes:\n        return 1",
        "check --job exits 1 when a rank is off plan, whatever else is unreachable",
        ("tests/test_job.py",),
    ),
    M(
        "M56",
        "src/numabind/check/_inspect.py",
        '        return host is None or env.get(v["host"]) == host',
        "        return True",
        "the collector counts only its own node's ranks (a shared PID namespace)",
        ("tests/test_job.py",),
    ),
    # --- bench: pinned copies through the driver --------------------------------------------
    M(
        "M57",
        "src/numabind/cli/_bench.py",
        "    return len(lanes) * AT_ONCE_COPIES * nbytes / wall / 1e9",
        "    return AT_ONCE_COPIES * nbytes / wall / 1e9",
        "'all GPUs at once' is every GPU's bytes over the wall time",
        ("tests/test_bench_gpu.py",),
    ),
    M(
        "M58",
        "src/numabind/cli/_bench.py",
        "    width = max((len(c.devices) for c in trusted), default=0)",
        "    width = min((len(c.devices) for c in trusted), default=0)",
        "the pinned-copy verdict rests on every GPU at once where there are several",
        ("tests/test_bench_gpu.py",),
    ),
    M(
        "M59",
        "src/numabind/memory/_driver.py",
        "        restore = self.driver.push(self.device, self.token)\n        try:\n            t0",
        "        restore = None\n        try:\n            t0",
        "each timed copy runs with its own GPU's context current",
        ("tests/test_bench_gpu.py",),
    ),
    M(
        "M60",
        "src/numabind/check/_store.py",
        "        if length > self.limit:",
        "        if False:",
        "check --job --store refuses a value longer than a record before reading it",
        ("tests/test_report.py",),
    ),
    # --- the appliers' rules (issue 33: each one a unit test now kills) -------------------
    M(
        "M61",
        "src/numabind/_apply.py",
        '        rebind_inside=True,\n        message=f"replaced CPU mask',
        '        rebind_inside=False,\n        message=f"replaced CPU mask',
        "a launcher's pin inside the plan is widened to the whole plan",
        ("tests/test_appliers.py",),
    ),
    M(
        "M62",
        "src/numabind/_apply.py",
        'return Decision(action="apply", memory_only_if_default=enable == "respect")',
        'return Decision(action="apply")',
        "NUMABIND=respect keeps a memory policy already set",
        ("tests/test_appliers.py",),
    ),
    M(
        "M63",
        "src/numabind/_range.py",
        "flags = _kernel.MPOL_MF_MOVE if move else 0",
        "flags = 0",
        "late migration asks the kernel to move the pages (MPOL_MF_MOVE)",
        ("tests/test_appliers.py",),
    ),
    M(
        "M64",
        "src/numabind/_apply.py",
        "dest = min(target, key=lambda n: (n != plan.numa_node, n))",
        "dest = min(target)",
        "leftover pages go to the GPU's node when the plan has several memory nodes",
        ("tests/test_appliers.py",),
    ),
    M(
        "M65",
        "src/numabind/memory/_memory.py",
        '    if policy == "preferred" and len(nodes) > 1:\n        from .._plan import',
        "    if False:\n        from .._plan import preferred_over",
        "a preferred buffer over two nodes is MPOL_PREFERRED_MANY",
        ("tests/test_appliers.py",),
    ),
    M(
        "M66",
        "src/numabind/memory/_memory.py",
        "    if node is not None:\n        nodes = (node,) if isinstance(node, int)",
        "    if node is not None and device is None:\n"
        "        nodes = (node,) if isinstance(node, int)",
        "host_buffer(node=N, device=D) puts the memory on node N",
        ("tests/test_appliers.py",),
    ),
    M(
        "M67",
        "src/numabind/memory/_memory.py",
        "            seen |= machine.siblings_of(c) | {c}",
        "            seen |= {c}",
        "populating uses one thread per physical core, not per hardware thread",
        ("tests/test_appliers.py",),
    ),
    M(
        "M68",
        "src/numabind/memory/_memory.py",
        "        pin_cpus(cpus)  # this thread only",
        "        pass  # this thread only",
        "the populate workers run on the target node's CPUs",
        ("tests/test_appliers.py",),
    ),
    M(
        "M69",
        "src/numabind/memory/_memory.py",
        "        hugetlb = (\n            huge and",
        "        hugetlb = False and (\n            huge and",
        "huge=True is backed by huge pages where the node has them free",
        ("tests/test_appliers.py",),
    ),
    M(
        "M70",
        "src/numabind/_range.py",
        "    return max(off_before - off_after, 0), off_after",
        "    return off_before, off_after",
        "bind_range never counts a page that could not move as moved",
        ("tests/test_appliers.py",),
    ),
    M(
        "M71",
        "src/numabind/check/_inspect.py",
        '        flag = "" if self.on_plan is not False else " OFF PLAN"',
        '        flag = ""',
        "the roles line says OFF PLAN for a group off its plan",
        ("tests/test_appliers.py",),
    ),
    M(
        "M72",
        "src/numabind/cli/_bench.py",
        "NO_DIFFERENCE = 1.20",
        "NO_DIFFERENCE = 1.5",
        "the bench calls 1.2x and more a difference",
        ("tests/test_appliers.py",),
    ),
    M(
        "M73",
        "src/numabind/_pin.py",
        "        if self._previous_policy is not None:\n            try:\n",
        "        if False:\n            try:\n",
        "a thread pin puts back the memory policy it found",
        ("tests/test_appliers.py",),
    ),
    M(
        "M74",
        "src/numabind/_plan.py",
        "                    local_world_size=len(visible) if index is not None else None,",
        "                    local_world_size=None,",
        "each device of a multi-device process gets its own rank's share (exclusive splits)",
        ("tests/test_several_gpus.py",),
    ),
    M(
        "M75",
        "src/numabind/_apply.py",
        "        if previous is not None and not changed and previous.policy_holds():",
        "        if previous is not None:",
        "apply() after a second binder moved threads binds again",
        ("tests/test_several_gpus.py",),
    ),
    M(
        "M76",
        "src/numabind/check/_inspect.py",
        "        own = self.thread_plans.get(tid)\n        if own is not None:",
        "        own = self.thread_plans.get(tid)\n        if False:",
        "check judges a thread bound to one device against that device's plan",
        ("tests/test_several_gpus.py",),
    ),
    M(
        "M77",
        "src/numabind/_sources.py",
        "        if numa_node is None:  # a pod's DRA metadata may say (said in the warnings)",
        "        if True:  # a pod's DRA metadata may say (said in the warnings)",
        "sysfs wins over a pod's DRA metadata where it names a node",
        ("tests/test_kubernetes.py",),
    ),
    M(
        "M78",
        "src/numabind/cli/__init__.py",
        "    missing = cpus - online",
        "    missing = frozenset()",
        "run --cpus refuses CPUs the machine does not have",
        ("tests/test_first_hour.py",),
    ),
    M(
        "M79",
        "src/numabind/_apply.py",
        "            or bool(self.plan.unmet)  # something asked for was not done: always said",
        "            or False",
        "what was asked and not done is said without NUMABIND_VERBOSE",
        ("tests/test_first_hour.py",),
    ),
    M(
        "M80",
        "src/numabind/_range.py",
        "    leave = frozenset(n for r in before for n in r.pages if mask and n not in mask)",
        "    leave: frozenset[int] = frozenset()",
        "late migration leaves pages on a node outside the spill mask (a GPU's own memory)",
        ("tests/test_appliers.py",),
    ),
    M(
        "M81",
        "src/numabind/_apply.py",
        "        if block is not None:\n            # bind_thread's own",
        "        if block is not None and False:\n            # bind_thread's own",
        "a later apply() leaves a thread inside a bind_thread block on its device's CPUs",
        ("tests/test_several_gpus.py",),
    ),
    M(
        "M82",
        "src/numabind/cli/_job.py",
        '        if row.host in rows and rows[row.host].state == "answered":',
        "        if False:",
        "check --job: a host's answered record wins over a second one for it",
        ("tests/test_job.py",),
    ),
    M(
        "M83",
        "src/numabind/check/_store.py",
        "        raw = (KEY_PREFIX + key).encode()",
        "        raw = key.encode()",
        "every store key on the wire carries TCPStore's '/' prefix",
        ("tests/test_report.py",),
    ),
    M(
        "M84",
        "src/numabind/cli/_job.py",
        "            if left <= 0:\n                if stopped:",
        "            if left <= 0 and False:\n                if stopped:",
        "check --job stops a hung srun at its deadline",
        ("tests/test_job.py",),
    ),
    M(
        "M85",
        "src/numabind/_replay.py",
        "        return bool(current) and current <= home",
        "        return True",
        "a rank that may have run off its node looks for early pages there (numa_maps)",
        ("tests/test_warm.py",),
    ),
    M(
        "M87",
        "src/_numabind_base.py",
        "        return int(mode.value), frozenset(nodes)",
        "        return int(mode.value) & 0xFF, frozenset(nodes)",
        "an inherited policy is put back with its mode flags (relative, static nodes)",
        ("tests/test_warm.py",),
    ),
    # --- the NIC next to the GPU (N: numbered apart, so that other branches' M ids stay) ---
    M(
        "N01",
        "src/numabind/_nics.py",
        "    while _shift_once(order, cand, chosen, load):",
        "    while False:",
        "GPUs that tie on adapters share them evenly, where the greedy pass does not",
        ("tests/test_nics.py",),
    ),
    M(
        "N02",
        "src/numabind/_nics.py",
        "            if not p.active:",
        "            if False:",
        "a port that is down is never chosen",
        ("tests/test_nics.py",),
    ),
    M(
        "N03",
        "src/numabind/_nics.py",
        "        if nic.member_of is not None:",
        "        if False:",
        "a bond's member is never offered alone",
        ("tests/test_nics.py",),
    ),
    M(
        "N04",
        "src/numabind/_nics.py",
        "        if floor is not None and u.rate is not None and u.rate < floor:",
        "        if False:",
        "a port slower than the minimum rate is never chosen",
        ("tests/test_nics.py",),
    ),
    M(
        "N05",
        "src/numabind/_nics.py",
        '    if mode == "exclusive":\n        _spread(order, chosen, cost, len(units))',
        '    if mode == "exclusive":\n        pass',
        "exclusive mode never leaves an adapter idle while another serves two GPUs",
        ("tests/test_nics.py",),
    ),
    M(
        "N06",
        "src/numabind/_transports.py",
        '    return "=" + labels if var.syntax == "nccl" else labels',
        "    return labels",
        "NCCL_IB_HCA is written with '=': exact names, not prefixes (mlx5_1 is not mlx5_10)",
        ("tests/test_transports.py",),
    ),
    M(
        "N07",
        "src/numabind/_transports.py",
        "        inherited = have is not None and ours.get(name) == have",
        "        inherited = False",
        "a child rank gets its own adapter, not the one numabind set for its parent",
        ("tests/test_transports.py",),
    ),
    M(
        "N08",
        "src/numabind/_transports.py",
        '        return var.value if nics else ""',
        '        return ""',
        "NVSHMEM_HCA_LIST comes with NVSHMEM_ENABLE_NIC_PE_MAPPING=1, without which it is ignored",
        ("tests/test_transports.py",),
    ),
    M(
        "N09",
        "src/numabind/_plan.py",
        '        nic_mode=cfg.nic_mode if (bool(cfg.nic) if nic is None else nic) else "",',
        "        nic_mode=cfg.nic_mode,",
        "a rank that does not ask for NICs reads no adapter",
        ("tests/test_transports.py",),
    ),
    M(
        "N10",
        "src/numabind/_transports.py",
        "    if judged[0] <= best_here:",
        "    if True:",
        "check warns on a transport variable that names an adapter farther than the nearest",
        ("tests/test_transports.py",),
    ),
    # --- which memory (issue 36; T: numbered apart, as the NIC mutants are) ---------------------
    M(
        "T01",
        "src/numabind/_plan.py",
        "    if not mask or usable <= mask:",
        "    if not mask:",
        "where every node has CPUs, preferred is left as it was (no mask)",
        ("tests/test_tiers.py",),
    ),
    M(
        "T02",
        "src/numabind/_plan.py",
        '            return "bind", self.memory_mask',
        "            return self.memory_policy, self.memory_nodes",
        "the kernel gets MPOL_BIND over the spill mask, not preferred",
        ("tests/test_tiers.py",),
    ),
    M(
        "T03",
        "src/numabind/_topology.py",
        "and n.tier > tiers[-1]:",
        "and n.tier >= tiers[-1]:",
        "a node in the CPU nodes' memory tier is not far memory",
        ("tests/test_tiers.py",),
    ),
    M(
        "T04",
        "src/numabind/check/_inspect.py",
        "        if node not in memory_only or node in asked or count <= 0:",
        "        if node not in memory_only or count <= 0:",
        "check does not warn of memory a rank asked for on a GPU's or far node",
        ("tests/test_tiers.py",),
    ),
    M(
        "T05",
        "src/numabind/_topology.py",
        "            for k, n in enumerate(parts)",
        "            for k, n in enumerate(reversed(parts))",
        "compute partitions are numbered in the KFD topology's order (ROCr's)",
        ("tests/test_partitions.py",),
    ),
    # --- round three: what root runs, and what a report may cost (issue 32; S: apart) ------
    M(
        "S01",
        "src/numabind/check/_isolated.py",
        'return [python, "-I", "-S", "-B", "-c", BOOT, mode, root, *args]',
        'return [python, "-B", "-c", BOOT, mode, root, *args]',
        "the collector starts isolated: no cwd, no PYTHON* variable, no .pth file",
        ("tests/test_shared_cluster.py",),
    ),
    M(
        "S02",
        "src/numabind/check/_inspect.py",
        "                if uids is not None and uids == {owner}:",
        "                if uids is not None:",
        "without Slurm tracking or a job cgroup, only the job owner's processes are its ranks",
        ("tests/test_shared_cluster.py",),
    ),
    M(
        "S03",
        "src/numabind/check/_job.py",
        "    if len(raw) > max_ranks and max_ranks == 1:",
        "    if False:",
        "a store record listing a second rank is refused before any rank is parsed",
        ("tests/test_shared_cluster.py",),
    ),
    M(
        "S04",
        "src/numabind/_kernel.py",
        "            if start < end:\n                got = self.found[i] or {}",
        "            if start < end and False:\n                got = self.found[i] or {}",
        "a listed host buffer is measured from the one pass over numa_maps",
        ("tests/test_shared_cluster.py", "tests/test_host_memory.py"),
    ),
    M(
        "S05",
        "src/numabind/cli/_doctor.py",
        "            uid=runner.uid,\n",
        "            uid=None,\n",
        "doctor starts another user's interpreter as that user, never as root",
        ("tests/test_shared_cluster.py",),
    ),
    M(
        "S06",
        "src/numabind/cli/_ray.py",
        "            if node not in holders or names.get(node, node[:12]) in rows:",
        "            if names.get(node, node[:12]) in rows:",
        "check --ray takes a record only for a node the dashboard says holds a GPU",
        ("tests/test_shared_cluster.py",),
    ),
    # --- issue 42 (round four): what root starts for another user is contained ---------------
    M(
        "U01",
        "src/numabind/check/_isolated.py",
        "        start_new_session=True,\n        **drop,",
        "        start_new_session=False,\n        **drop,",
        "a probe root starts for another user has no controlling terminal (its own session)",
        ("tests/test_probe_session.py",),
    ),
    M(
        "U02",
        "src/numabind/cli/_doctor.py",
        '        env = contained_env(runner.home, {PROBE_TRIGGER: "0"})',
        "        env = probe_environ(environ)",
        "another user's probe gets the allow-listed environment, nothing else of root's",
        ("tests/test_probe_session.py",),
    ),
    M(
        "U03",
        "src/numabind/check/_isolated.py",
        "    for _ in range(SESSION_ROUNDS):\n        members = session_members(sid)",
        "    for _ in range(0):\n        members = session_members(sid)",
        "a probe's session is killed once it answered or timed out",
        ("tests/test_probe_session.py",),
    ),
    M(
        "U04",
        "src/numabind/check/_isolated.py",
        "        members = session_members(sid)\n",
        "        members: list[int] = []\n",
        "a probe's leftovers in another process group of its session are killed too",
        ("tests/test_probe_session.py",),
    ),
    M(
        "U05",
        "src/numabind/check/_isolated.py",
        '        scheme = [n for n in ("venv", "posix_prefix") if n in names][:1]',
        "        scheme = []",
        "the isolated collector finds a system-Python venv's packages in the venv's own scheme",
        ("tests/test_probe_session.py",),
    ),
    M(
        "U06",
        "src/numabind/check/_isolated.py",
        "                buf += chunk[: max(cap - len(buf), 0)]\n    while ended is None:",
        "                buf += chunk\n    while ended is None:",
        "a contained child's output is kept only up to its cap",
        ("tests/test_probe_session.py",),
    ),
    # --- the warm start's answers and the truth of the cache (issues 43, 44) ---
    M(
        "M88",
        "src/numabind/_cache.py",
        '    if opened.origin != "cache" or not isinstance(source, Cached) or not source.misses:',
        "    if True:",
        "a rank whose machine file lacked a fact says it read sysfs for it",
        ("tests/test_cache.py",),
    ),
    M(
        "M89",
        "src/numabind/_replay.py",
        "        while not lock.take():",
        "        while False:",
        "an answer is written only under the answers file's lock",
        ("tests/test_warm.py",),
    ),
    M(
        "M90",
        "src/numabind/_cache.py",
        "    _for_every_device(machine)\n",
        "",
        "the rank that writes the machine file asks every device what it asked of its own",
        ("tests/test_cache.py",),
    ),
    M(
        "M91",
        "src/numabind/_guard.py",
        "    if not off and not strays:\n        return []\n",
        "    from . import _kernel\n",
        "a warm rank's first watched import loads the guards and not the binder",
        ("tests/test_warm.py",),
    ),
    M(
        "M92",
        "src/numabind/_cache.py",
        '    if memo.get("cpu_siblings"):  # the cores',
        "    if False:  # the cores",
        "the rank that writes the machine file asks every allowed CPU's cores",
        ("tests/test_cache.py",),
    ),
    M(
        "M93",
        "src/numabind/_cache.py",
        '    for listed in memo.get("accelerators", {}).values():  # a scan the plan made itself',
        "    for listed in ():  # a scan the plan made itself",
        "the writer asks every GPU of a bus scan (no driver's list) what it asked of its own",
        ("tests/test_cache.py",),
    ),
    # --- issue 45: the binding exporter (check --format openmetrics) ----------------------
    M(
        "E01",
        "src/numabind/check/_metrics.py",
        'e.add("numabind_rank_on_plan", labels, r.ok)',
        'e.add("numabind_rank_on_plan", labels, r.status == "bound")',
        "a rank's on_plan series is check's verdict (a bound rank moved off plan says 0)",
        ("tests/test_metrics.py",),
    ),
    M(
        "E02",
        "src/numabind/check/_metrics.py",
        r""".replace('"', '\\"').replace("\n", "\\n")""",
        r""".replace("\n", "\\n")""",
        "a double quote in a label value is escaped",
        ("tests/test_metrics.py",),
    ),
    M(
        "E03",
        "src/numabind/check/_metrics.py",
        r""".replace('"', '\\"').replace("\n", "\\n")""",
        r""".replace('"', '\\"')""",
        "a newline in a label value is escaped",
        ("tests/test_metrics.py",),
    ),
    M(
        "E04",
        "src/numabind/check/_metrics.py",
        r"""return value.replace("\\", "\\\\").replace('"', '\\"')""",
        r"""return value.replace('"', '\\"').replace("\\", "\\\\")""",
        "a backslash in a label value is escaped before the escapes are added",
        ("tests/test_metrics.py",),
    ),
    M(
        "E05",
        "src/numabind/check/_inspect.py",
        "        off.extend(sorted(escaped))",
        "        off.extend(sorted(threads))",
        "threads_off_plan counts only the threads the CPU rule judged off the plan",
        ("tests/test_metrics.py",),
    ),
    M(
        "E06",
        "src/numabind/check/_metrics.py",
        'return f"{domain.upper():0>8}:{rest.upper()}"',
        'return f"{domain:0>8}:{rest}"',
        "pci_bus_id is NVML's spelling (upper case), so that it joins dcgm-exporter's",
        ("tests/test_metrics.py",),
    ),
    M(
        "E07",
        "src/numabind/check/_metrics.py",
        'e.add("numabind_rank_main_thread_priority_core", labels, r.main_on_priority)',
        'e.add("numabind_rank_main_thread_priority_core", labels, True)',
        "the priority-core series says whether the main thread is on a priority core",
        ("tests/test_metrics.py",),
    ),
    M(
        "E08",
        "src/numabind/check/_metrics.py",
        'return "unreadable" if r.plan_source.startswith("cannot read") else "no_plan"',
        'return "no_plan"',
        "another user's rank, which this user cannot read, is up 0 with reason unreadable",
        ("tests/test_metrics.py",),
    ),
    # --- issue 42 (safety4b): membership, bounded decoding, who answers, DRA bounds ----------
    M(
        "R01",
        "src/numabind/check/_inspect.py",
        "            found = slurm_path(path)\n            if found is None:\n",
        "            found = slurm_path(path)\n"
        "            if found is None and _claims(path, job):\n"
        "                found = (job, path, None)\n"
        "            if found is None:\n",
        "a job_N cgroup off Slurm's own path (under user@UID.service) is not the job's",
        ("tests/test_round4.py",),
    ),
    M(
        "R02",
        "src/numabind/check/_inspect.py",
        'seen[path] = None if st.st_uid == 0 else f"is owned by uid {st.st_uid}"',
        'seen[path] = None if st.st_uid >= 0 else f"is owned by uid {st.st_uid}"',
        "a job cgroup counts only when root owns it and every folder above it",
        ("tests/test_round4.py",),
    ),
    M(
        "R03",
        "src/numabind/check/_inspect.py",
        "            if owner is not None and (uids != {owner} or found[2] not in (None, owner)):",
        "            if owner is not None and found[2] not in (None, owner):",
        "a process of another uid in the job's cgroup is not one of its ranks",
        ("tests/test_round4.py",),
    ),
    M(
        "R04",
        "src/numabind/cli/_ray.py",
        "        out += view[eol + 2 : eol + 2 + n]\n",
        "        out += bytes(view[eol + 2 :])[:n]\n",
        "a chunked answer is decoded in time linear in its bytes (no copy of the rest per chunk)",
        ("tests/test_round4.py",),
    ),
    M(
        "R05",
        "src/numabind/cli/_ray.py",
        "        if not count & 0x3FF and time.monotonic() > deadline:  # every 1,024 chunks",
        "        if False:",
        "decoding a chunked answer stops at the deadline",
        ("tests/test_round4.py",),
    ),
    M(
        "R06",
        "src/numabind/_dra.py",
        "        if used >= TOTAL_FILES or spent >= TOTAL_BYTES:\n            break\n"
        "        left = TOTAL_BYTES - spent\n",
        "        left = FILE_CAP << 10\n",
        "DRA metadata: the work is bounded (files and bytes in all), not the answer",
        ("tests/test_kubernetes.py",),
    ),
    M(
        "R07",
        "src/numabind/_dra.py",
        "    if used < len(listed):",
        "    if False:",
        "DRA metadata files left unread are said",
        ("tests/test_kubernetes.py",),
    ),
    M(
        "R08",
        "src/numabind/check/_peer.py",
        '        if os.geteuid() == 0:\n            return f"{why}; root asks it nothing',
        '        if False:\n            return f"{why}; root asks it nothing',
        "root asks nothing of a local dashboard or store another user serves",
        ("tests/test_round4.py",),
    ),
    M(
        "R09",
        "src/numabind/check/_peer.py",
        '    if sys.byteorder == "little":  # each 32-bit word is written in host order',
        "    if False:",
        "the listener is found in /proc/net/tcp (addresses in host order)",
        ("tests/test_round4.py",),
    ),
    M(
        "R10",
        "src/numabind/check/_store.py",
        "            refused = self._vet(self.listener) if self.listener and self._vet else None",
        "            refused = None",
        "check --store asks who serves a local store before a byte is sent",
        ("tests/test_round4.py",),
    ),
    M(
        "R11",
        "src/numabind/cli/_doctor.py",
        "    except RecursionError:\n        raise ValueError(\"the probe's answer is nested",
        "    except MemoryError:\n        raise ValueError(\"the probe's answer is nested",
        "doctor's probe answer nested too deep is a finding, not a traceback",
        ("tests/test_round4.py",),
    ),
    # --- issue 46: every setting that is set is used or said (helper firsthour-a) ----------
    M(
        "F01",
        "src/numabind/cli/_show.py",
        '    "NUMABIND_SPILL",\n    "NUMABIND_RESERVE",',
        '    "NUMABIND_RESERVE",',
        "show --example plans with this shell's NUMABIND_SPILL (every planning knob)",
        ("tests/test_first_hour.py::test_46_show_example_applies_every_planning_knob",),
    ),
    M(
        "F02",
        "src/numabind/_apply.py",
        "    main = kept if kept and kept <= plan.main_cpus else plan.main_cpus",
        "    main = plan.main_cpus",
        "NUMABIND_PRIORITY=main hands back against the core the kernel kept, not the one asked",
        ("tests/test_first_hour.py::test_46_priority_main_hands_back_what_the_kernel_narrowed",),
    ),
    M(
        "F03",
        "src/numabind/_environ.py",
        '    return value, [f"{n}; using {knob.default}" for n in why]',
        "    return value, []",
        "a NUMABIND_SYSROOT set and not used is said in one line by show, doctor and the hook",
        ("tests/test_first_hour.py::test_46_a_sysroot_set_and_not_used_is_said_in_one_line",),
    ),
    # --- issue 44, helper regress: the regressions (GH200's CPUs, AMD preferred-core
    # rankings) and the isolated collector's group bit ---
    M(
        "G01",
        "src/numabind/_plan.py",
        "            cpus=frozenset(cpus),\n            memory_nodes=mem_nodes,",
        "            cpus=frozenset() if one_node else frozenset(cpus),\n"
        "            memory_nodes=mem_nodes,",
        "a GH200's rank (its node holds every allowed CPU) reports those CPUs and its budget",
        ("tests/test_plan_regressions.py",),
    ),
    M(
        "G02",
        "src/numabind/_model.py",
        "        if self.source not in RANKED_FILES or len(found) <= 2:",
        "        if True:",
        "an AMD preferred-core ranking is split at its gap: a node's top group is its priority",
        ("tests/test_plan_regressions.py",),
    ),
    M(
        "G03",
        "src/numabind/_model.py",
        "        if any(RANKING_GAP * s > widest for i, s in enumerate(steps) if i != cut - 1):",
        "        if False:",
        "a ranking is split only where one step stands out (else its best core alone leads)",
        ("tests/test_plan_regressions.py",),
    ),
    M(
        "G04",
        "src/numabind/check/_isolated.py",
        "    if st.st_mode & (_stat.S_IWGRP | _stat.S_IWOTH):",
        "    if st.st_mode & _stat.S_IWOTH:",
        "the collector refuses a group-writable interpreter or package tree (a shared env)",
        ("tests/test_group_writable.py",),
    ),
    M(
        "G05",
        "src/numabind/check/_isolated.py",
        "    if [ $(( 0$4 & 022 )) -ne 0 ]; then",
        "    if [ $(( 0$4 & 002 )) -ne 0 ]; then",
        "the node's sh check refuses a group-writable interpreter path",
        ("tests/test_group_writable.py",),
    ),
    # --- issue 45: every binder named, vLLM wired in, ready for PEP 829 (helper binders) ---
    M(
        "B01",
        "src/numabind/_binders.py",
        "        have = environ.get(b.key)\n        if have is None:",
        "        have = environ.get(b.key)\n        if True:",
        "NUMABIND_BINDERS=keep never overwrites a value the user set",
        ("tests/test_binders.py",),
    ),
    M(
        "B02",
        "src/numabind/_binders.py",
        '        values=TRUE,\n        keep="0",',
        '        values=TRUE,\n        keep="",',
        "NUMABIND_BINDERS=keep sets AMD_CPU_AFFINITY=0 where unset",
        ("tests/test_binders.py",),
    ),
    M(
        "B03",
        "src/numabind/_binders.py",
        'b.vendor in ("", vendor)',
        "True",
        "NCCL's thread names are RCCL's only in a rank of an AMD GPU",
        ("tests/test_binders.py",),
    ),
    M(
        "B04",
        "src/numabind/check/_inspect.py",
        "    if entry is not None and entry.start_mask and entry.start_action:",
        "    if False:",
        "check names the mask an exec wrapper (numactl) left and what the rule did with it",
        ("tests/test_binders.py",),
    ),
    M(
        "B05",
        "src/numabind/_apply.py",
        '            b.start_mask, b.start_action = existing.current, "replaced"',
        '            b.start_mask, b.start_action = existing.current, "kept"',
        "the entry records whether the keep/replace rule kept or replaced the start mask",
        ("tests/test_binders.py",),
    ),
    M(
        "B06",
        "src/numabind/_sources.py",
        '        return ops if plain else "an unnamed scheduler"',
        "        return ops",
        "a sched_ext scheduler name that is not a plain word is never shown as it is",
        ("tests/test_binders.py",),
    ),
    M(
        "B07",
        "src/numabind/_binders.py",
        '    return [say(b, f"{b.key}={value}") for b, value in env_binders(environ)]',
        '    return [say(b, f"{b.key}={value}") for b, value in env_binders(environ)][:1]',
        "doctor and check name every re-pinning switch a rank carries",
        ("tests/test_binders.py",),
    ),
    M(
        "B08",
        "src/numabind/_transports.py",
        "            if var.name not in handed:",
        "            if True:",
        "with vllm named, the variables vLLM sets per worker are left to it",
        ("tests/test_vllm.py",),
    ),
    M(
        "B09",
        "src/numabind/_transports.py",
        'mapping = ",".join(f"{gpu}={nic.pci}" for gpu, nic in pairs)',
        'mapping = ",".join(f"{nic.pci}={gpu}" for gpu, nic in pairs)',
        "VLLM_GPU_NIC_PCIE_MAPPING is GPU_BDF=NIC_BDF pairs, as vLLM parses it",
        ("tests/test_vllm.py",),
    ),
    M(
        "B10",
        "src/numabind/vllm.py",
        "    if bound_plan(process=True) is not None:",
        "    if bound_plan(process=True) is None:",
        "the vLLM plugin does nothing where the hook already bound the process",
        ("tests/test_vllm.py",),
    ),
    M(
        "B11",
        "src/numabind/vllm.py",
        "    except Exception as err:  # a plugin that raises",
        "    except ImportError as err:  # a plugin that raises",
        "the vLLM plugin never raises into vLLM (it would stop the process)",
        ("tests/test_vllm.py",),
    ),
    M(
        "B12",
        "src/_numabind_hook.start",
        "_numabind_start:start",
        "_numabind_start.start",
        "the .start file names a PEP 829 entry point in the module:function form",
        ("tests/test_pep829.py",),
    ),
    M(
        "B13",
        "src/numabind/_transports.py",
        '    if var.syntax == "vllm-map":',
        "    if False:",
        "a vLLM map set before numabind is judged for the rank's GPU (farther, missing)",
        ("tests/test_vllm.py",),
    ),
    # --- the cache's witnesses and answers (what a warm rank trusts) ----------------------
    M(
        "C01",
        "src/_numabind_base.py",
        '    return "=" + got.decode("utf-8", "replace").strip()',
        '    return got.decode("utf-8", "replace").strip()',
        "a witnessed file that reads '-' is not taken for an absent one",
        ("tests/test_truth.py",),
    ),
    M(
        "C02",
        "src/_numabind_base.py",
        '        if said == "+" or witness(kind, prefix + path) != said:',
        "        if witness(kind, prefix + path) != said:",
        "a witness too large to be whole never holds",
        ("tests/test_truth.py",),
    ),
    M(
        "C03",
        "src/numabind/_replay.py",
        "        merged = {(kind, path): said for kind, path, said in held if kept}",
        "        merged = {}",
        "an answers file witnesses every answer it keeps, not only its writer's",
        ("tests/test_truth.py",),
    ),
    M(
        "C04",
        "src/numabind/_replay.py",
        "            if (now.get((kind, path)) or base.witness(kind, prefix + path)) != said:",
        "            if False:",
        "an answer made while its witnesses changed is not kept",
        ("tests/test_truth.py",),
    ),
    M(
        "C05",
        "src/_numabind_base.py",
        '    return value.encode("utf-8", "surrogatepass").decode("latin-1")',
        '    return value.encode("utf-8").decode("latin-1")',
        "a command line that is not UTF-8 is an input like any other (kept, replayed)",
        ("tests/test_truth.py",),
    ),
    M(
        "C06",
        "src/_numabind_base.py",
        '    where = f"{escape(sysroot)}|{st.st_dev}',
        '    where = f"{sysroot}|{st.st_dev}',
        "a sysroot whose path is not UTF-8 is cached and replayed",
        ("tests/test_truth.py",),
    ),
    M(
        "C07",
        "src/_numabind_base.py",
        "    return raw is not None and raw.strip().lower() in FLAG_FALSE",
        "    return raw is not None and raw.strip().lower() not in FLAG_TRUE",
        "NUMABIND_CACHE that is no boolean keeps the cache on, for the ranks and doctor alike",
        ("tests/test_cache.py",),
    ),
    M(
        "C08",
        "src/_numabind_start.py",
        '                said = None if value == "-" else base.unescape(value[1:])',
        '                said = None if value == "-" else value[1:]',
        "an answer whose variables do not unescape applies nothing",
        ("tests/test_truth.py",),
    ),
    M(
        "C09",
        "src/_numabind_start.py",
        "        if kind not in base.ANSWER_OUTPUTS:",
        "        if False:",
        "an output of a kind the start module does not know is handed over, not skipped",
        ("tests/test_warm.py",),
    ),
    M(
        "C10",
        "src/numabind/_replay.py",
        'out.append(f"pages {base.cpulist(plan.memory_nodes)}',
        'out.append(f"page {base.cpulist(plan.memory_nodes)}',
        "the writer's line kinds are the answer table's, a line no test's rank writes included",
        ("tests/test_warm.py",),
    ),
    M(
        "M94",
        "src/numabind/_apply.py",
        "        tids = _kernel.thread_ids()\n",
        "        break\n",
        "apply lists the threads again: one started during its pass is bound too",
        ("tests/test_bind.py",),
    ),
)

# What CI runs (--sample 10): one rule from each part (hook, rank variables, plan, the
# keep/replace rule, registry, check, the matrix, the run-once guard, run), none of them a
# mutant that can only be caught by a time-out
SAMPLE = ("M01", "M04", "M10", "M16", "M21", "M25", "M28", "M33", "M38", "M42")

# Survivors that are not bugs of the tests, with the reason (an equivalent mutant, or a
# rule only a multi-node kernel can show: those are killed by tests/test_vm.py).
EQUIVALENT: dict[str, str] = {
    "M08": "equivalent: NUMA nodes' CPU sets are disjoint, so a non-empty locality lies "
    "inside at most one node; '>= 1' and '== 1' cannot differ",
    "M23": "equivalent here: the temporary name has 64 random bits and the directory is the "
    "user's own, mode 0700, so no one else can have created it; O_EXCL is defence in depth "
    "that no test can observe",
    "M37": "equivalent in practice: the temporary name has 48 random bits, so a file at it "
    "cannot have been planted; O_EXCL is defence in depth (a planted link at the output "
    "itself is tested, and replaced by the rename)",
}


def _files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-co", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return [f for f in out if f and (root / f).is_file()]


def prepare(work: Path) -> tuple[Path, Path]:
    """The copy of the checkout (and a pristine one the mutants are made from, so that
    editing the checkout meanwhile changes nothing) and its venv."""
    tree, venv = work / "tree", work / "venv"
    for folder in (tree, PRISTINE[0]):
        if folder.exists():
            shutil.rmtree(folder)
        for f in _files(ROOT):
            (folder / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, folder / f)
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-e", f"{tree}[test]"],
        check=True,
        env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    return tree, python


def _site(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def apply(m: Mutant, tree: Path, site: Path) -> None:
    """Put the pristine file back, then edit it; the hook files are installed copies."""
    target = tree / m.path
    shutil.copy2(PRISTINE[0] / m.path, target)
    text = target.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"{m.id}: {m.path}: the text to mutate occurs {text.count(m.old)} times")
    target.write_text(text.replace(m.old, m.new))
    if target.parent.name == "src" and target.name.startswith("_numabind_"):
        shutil.copy2(target, site / target.name)


def restore(m: Mutant, tree: Path, site: Path) -> None:
    shutil.copy2(PRISTINE[0] / m.path, tree / m.path)
    if (tree / m.path).parent.name == "src" and Path(m.path).name.startswith("_numabind_"):
        shutil.copy2(PRISTINE[0] / m.path, site / Path(m.path).name)


def _pytest(python: Path, tree: Path, args: list[str], timeout: float) -> bool:
    """True when the tests failed (the mutant is killed)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # a skip is not a kill
    try:
        r = subprocess.run(
            [
                str(python),
                "-m",
                "pytest",
                "-x",
                "-q",
                "-p",
                "no:randomly",
                "-p",
                "no:cacheprovider",
                *UNIT,
                *args,
            ],
            cwd=tree,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return True  # a rule broken into a hang is caught too (the stage would time out)
    return r.returncode != 0


def run(m: Mutant, tree: Path, python: Path, site: Path) -> tuple[bool, str, float]:
    t0 = time.monotonic()
    apply(m, tree, site)
    try:
        # named tests normally finish in a minute: past 3 the mutant made something hang,
        # which the stage would time out on too (a kill)
        if m.tests and _pytest(python, tree, list(m.tests), 180):
            return True, "named tests", time.monotonic() - t0
        if _pytest(python, tree, [], 900):
            return True, "unit stage", time.monotonic() - t0
        return False, "survived", time.monotonic() - t0
    finally:
        restore(m, tree, site)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=int, help="a fixed, evenly spread sample of N mutants")
    ap.add_argument("--only", action="append", help="run this mutant (repeatable)")
    ap.add_argument("--check", action="store_true", help="only check that every mutant applies")
    ap.add_argument(
        "--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "numabind-mutants")
    )
    args = ap.parse_args()
    chosen = list(MUTANTS)
    if args.only:
        chosen = [m for m in MUTANTS if m.id in args.only]
    elif args.sample:
        chosen = [m for m in MUTANTS if m.id in SAMPLE][: args.sample]
    if args.check:
        bad = []
        for m in MUTANTS:
            n = (ROOT / m.path).read_text().count(m.old)
            if n != 1:
                bad.append(f"{m.id} {m.path}: occurs {n} times")
        print("\n".join(bad) or f"all {len(MUTANTS)} mutants apply")
        return 1 if bad else 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    PRISTINE[0] = work / "pristine"
    tree, python = prepare(work)
    site = _site(python)
    results = []
    for m in chosen:
        killed, how, took = run(m, tree, python, site)
        results.append((m, killed, how))
        print(
            f"{m.id} {'killed  ' if killed else 'SURVIVED'} {took:6.0f} s  {how:12} {m.rule}",
            flush=True,
        )
    killed = sum(1 for _, k, _ in results if k)
    print(f"\n{killed}/{len(results)} mutants killed ({killed / len(results):.0%})")
    bad = [m for m, k, _ in results if not k and m.id not in EQUIVALENT]
    for m, k, _ in results:
        if not k:
            why = EQUIVALENT.get(m.id, "NOT EXPLAINED: a rule no unit test guards")
            print(f"  survivor {m.id} ({m.path}): {m.rule} -- {why}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
