"""Verifying live ranks and whole jobs: ``numabind check`` (one process, ``--all``, a
Slurm job, a torch store, a Ray cluster), the node record and the job report, and how
root starts a collector without running anyone else's code.  A rank never loads it.

A wing: no module of numabind's core imports it at module level (tests/test_layout.py)."""
