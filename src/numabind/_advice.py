"""What to change when a rank's allowed CPUs hold no CPU of its GPU's node, told for where
it runs.

numabind never binds outside the cgroup cpuset: a pod or a job step whose CPUs all lie on
the other socket leaves its rank unbound, and the plan says so.  The fix is not
numabind's but the scheduler's, and each has its own words: Kubernetes aligns a pod's
CPUs with its devices through the kubelet's CPU and topology managers (or, with Dynamic
Resource Allocation, a claim that aligns the devices it allocates); Slurm through the
job's GPU binding and CPUs per GPU.  ``check`` and ``doctor`` print the one that fits,
found from the process's environment and its cgroup's path (``kubepods`` / ``slurm``),
never from a guess about the machine.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._model import Allowed

KUBERNETES = (
    "in Kubernetes, give the pod exclusive CPUs on its GPU's NUMA node: the kubelet's static "
    "CPU manager (cpuManagerPolicy: static) for a Guaranteed pod (integer CPU requests equal "
    "to its limits, memory too) and the topology manager's single-numa-node policy "
    "(topologyManagerPolicy: single-numa-node); or, with DRA, allocate the GPU together with "
    "its CPUs in one claim whose constraints matchAttribute an attribute both drivers "
    "publish for the node (docs/launchers/kubernetes.rst)"
)
SLURM = (
    "under Slurm, allocate each task CPUs next to its GPU: srun --gpu-bind=closest with "
    "--cpus-per-gpu=N (the gres.conf Cores= of each GPU say which are close), and "
    "--cpu-bind=none to leave the binding to numabind (docs/launchers/slurm.rst)"
)
ELSEWHERE = (
    "give this process CPUs of that node (the container's or service's cpuset: docker "
    "--cpuset-cpus, systemd AllowedCPUs=, taskset on the launcher)"
)


def where_running(environ: Mapping[str, str], allowed: Allowed | None = None) -> str | None:
    """``kubernetes``, ``slurm`` or None, from the variables each sets in every process it
    starts and from the cgroup the cpuset was read from."""
    directory = (allowed.directory or "") if allowed is not None else ""
    if "KUBERNETES_SERVICE_HOST" in environ or "kubepods" in directory:
        return "kubernetes"
    if "SLURM_JOB_ID" in environ or "SLURM_JOBID" in environ or "/slurm" in directory:
        return "slurm"
    return None


def cpuset_fix(environ: Mapping[str, str], allowed: Allowed | None = None) -> str:
    """The fix for allowed CPUs off the GPU's node, in the words of where it runs."""
    where = where_running(environ, allowed)
    if where == "kubernetes":
        return KUBERNETES
    if where == "slurm":
        return SLURM
    return ELSEWHERE
