"""The machine generator the tests and benchmarks use: it lives in the package
(:mod:`numabind._examples`, which ``numabind show --example`` serves from memory) so that
both share it; this module keeps the tests' short name for it."""

from __future__ import annotations

from numabind._examples import (
    DGX_BDFS,
    Adapter,
    Gpu,
    Iface,
    Port,
    Spec,
    _uuid,
    build,
    container_2_of_8,
    cxl,
    dgx_a100,
    dgx_h100,
    files,
    gb200,
    gh200,
    mi300x,
    nics_one_socket,
    nps4,
    one_node,
    p4d,
    snc3,
    two_nodes,
    write,
    xeon_max,
)

__all__ = [
    "DGX_BDFS",
    "Adapter",
    "Gpu",
    "Iface",
    "Port",
    "Spec",
    "_uuid",
    "build",
    "container_2_of_8",
    "cxl",
    "dgx_a100",
    "dgx_h100",
    "files",
    "gb200",
    "gh200",
    "mi300x",
    "nics_one_socket",
    "nps4",
    "one_node",
    "p4d",
    "snc3",
    "two_nodes",
    "write",
    "xeon_max",
]
