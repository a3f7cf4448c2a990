"""A rank with NUMABIND_TORCH=1, NUMABIND_WORKERS=spread and NUMABIND_OMP_PLACES=cores in
the VM: after ``import torch`` (libgomp pins the importing thread), a parallel region, a
thread and a forked child, then a DataLoader with 2 persistent fork workers checked by
``numabind check --all`` while they run.  Prints one line, ``LOADER {json}``."""

import json
import os
import subprocess
import sys
import threading
from typing import Any

import torch
from torch.utils.data import DataLoader


class Where:  # a map-style dataset: what DataLoader asks of one
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> object:
        info = torch.utils.data.get_worker_info()
        wid = info.id if info is not None else -1
        return torch.tensor([wid, os.getpid(), *sorted(os.sched_getaffinity(0))])


def main() -> None:
    out: dict[str, object] = {"after_import": sorted(os.sched_getaffinity(0))}
    torch.set_num_threads(2)
    x = torch.ones(1 << 20)
    for _ in range(5):
        (x * 2).sum()
    out["after_parallel"] = sorted(os.sched_getaffinity(0))
    out["others"] = [
        sorted(os.sched_getaffinity(int(t)))
        for t in os.listdir("/proc/self/task")
        if int(t) != os.getpid()
    ]
    seen: dict[str, object] = {}
    t = threading.Thread(target=lambda: seen.update(cpus=sorted(os.sched_getaffinity(0))))
    t.start()
    t.join()
    out["thread"] = seen["cpus"]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, json.dumps(sorted(os.sched_getaffinity(0))).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    out["fork_child"] = json.loads(os.read(r, 200))
    dataset: Any = Where()
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    workers: dict[str, dict[str, object]] = {}
    pids: list[int] = []
    for item in loader:
        wid, wpid, *cpus = item.tolist()
        workers[str(wid)] = {"pid": wpid, "cpus": cpus}
        pids.append(int(wpid))
    out["workers"] = workers
    numabind = os.path.join(os.path.dirname(sys.executable), "numabind")
    p = subprocess.run(
        [numabind, "check", "--all", "--json"], capture_output=True, text=True, timeout=600
    )
    out["check_rc"] = p.returncode
    found = {d["pid"]: d for d in json.loads(p.stdout)["processes"]}
    me = found.get(os.getpid(), {})
    out["check_me"] = {"ok": me.get("ok"), "problems": me.get("problems"), "roles": me.get("roles")}
    out["check_workers"] = {str(w): found.get(w, {}).get("ok") for w in sorted(set(pids))}
    print("LOADER " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
