"""Captures crafted to cost, hang or crash: each refused with one line (exit 2), or read
within the work of the largest real machine, counted rather than timed.

Every run goes through ``numabind show --input`` in a child under ``prlimit``-style limits
(1 GiB of address space) and a subprocess timeout: a hang or a blow-up fails the test
as a timeout or a MemoryError; nothing here asserts a duration.  The parsers are also
run in-process where the work they did is asserted as counts (files, list items, mask
parses).
"""

from __future__ import annotations

import bz2
import gzip
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import synth
from numabind import _sysfs
from numabind._errors import CaptureError
from numabind._topology import Machine

SRC = Path(__file__).resolve().parent.parent / "src"
HWLOC = Path(__file__).resolve().parent / "data" / "hwloc"


def show(path: Path | str, *extra: str, limit: int = 1 << 30) -> subprocess.CompletedProcess[str]:
    code = (
        "import resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
        "sys.path.insert(0, sys.argv[1]); from numabind.cli import main; "
        "sys.exit(main(sys.argv[2:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(SRC), "show", "--input", str(path), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(p: subprocess.CompletedProcess[str], *words: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-2000:])
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    for w in words:
        assert w in p.stderr, p.stderr


# --- tar headers written by hand (tarfile refuses to write most of these) -----------------------


def header(name: bytes, size: bytes | int = 0, flag: bytes = b"0", link: bytes = b"") -> bytes:
    b = bytearray(512)
    b[0 : len(name[:100])] = name[:100]
    b[100:108] = b"0000644\0"
    b[108:116] = b"0000000\0"
    b[116:124] = b"0000000\0"
    field = size if isinstance(size, bytes) else b"%011o\0" % size
    b[124:136] = field[:12].ljust(12, b"\0")
    b[136:148] = b"00000000000\0"
    b[156:157] = flag
    b[157 : 157 + len(link[:100])] = link[:100]
    b[257:263] = b"ustar\0"
    b[263:265] = b"00"
    b[148:156] = b" " * 8
    b[148:156] = b"%06o\0 " % sum(b)
    return bytes(b)


def pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def pax(records: dict[str, str]) -> bytes:
    body = b""
    for k, v in records.items():
        rec = f" {k}={v}\n".encode()
        n = len(rec) + 1
        while len(str(n).encode() + rec) != n:
            n = len(str(n).encode() + rec)
        body += str(n).encode() + rec
    return header(b"././@PaxHeader", len(body), b"x") + pad(body)


def member(name: str, data: bytes) -> bytes:
    return header(name.encode(), len(data)) + pad(data)


def base() -> bytes:
    return (
        member("cap/sys/devices/system/cpu/online", b"0-1\n")
        + member("cap/sys/devices/system/node/node0/cpulist", b"0\n")
        + member("cap/sys/devices/system/node/node1/cpulist", b"1\n")
    )


def write(path: Path, raw: bytes, compress: bool = True) -> Path:
    path.write_bytes(gzip.compress(raw + b"\0" * 1024) if compress else raw + b"\0" * 1024)
    return path


def test_a_hand_written_archive_reads(tmp_path: Path) -> None:
    p = show(write(tmp_path / "ok.tgz", base()), "--json")
    assert p.returncode == 0, p.stderr
    assert [n["id"] for n in json.loads(p.stdout)["nodes"]] == [0, 1]


def test_a_member_of_30000_components_is_refused_in_linear_memory(tmp_path: Path) -> None:
    """227 bytes compressed: the 0.2.0 index keyed every prefix of the name (40 GB at
    100k components).  Refused by the per-member component cap, in a 1 GiB limit."""
    name = ("a/" * 30_000) + "x"
    raw = pax({"path": name}) + member("placeholder", b"x")
    cap = write(tmp_path / "deep.tgz", base() + raw)
    assert cap.stat().st_size < 2000
    one_line(show(cap), "longer than 4096")
    # within PATH_MAX, but 2,000 components: the per-member component cap
    raw = pax({"path": ("a/" * 2000) + "x"}) + member("placeholder", b"x")
    one_line(show(write(tmp_path / "deep2.tgz", base() + raw)), "2001 components")


def test_many_members_with_long_names_hit_the_name_budget(tmp_path: Path) -> None:
    name = "/".join(["d" * 200] * 20)  # 4,019 bytes, 20 components: within each cap
    raw = b"".join(pax({"path": f"{name}/{i}"}) + member("x", b"") for i in range(4200))
    one_line(show(write(tmp_path / "names.tgz", base() + raw)), "MiB")


def test_a_link_target_of_600000_dotdots_is_refused(tmp_path: Path) -> None:
    """1,950 bytes compressed: 0.2.0 resolved it with a quadratic list pop."""
    raw = pax({"linkpath": "../" * 600_000}) + header(b"cap/sys/x", 0, b"2")
    cap = write(tmp_path / "dots.tgz", base() + raw)
    assert cap.stat().st_size < 4000
    one_line(show(cap), "pax header of 1800018 bytes")
    gnu = b"../" * 2000
    raw = header(b"././@LongLink", len(gnu), b"K") + pad(gnu) + header(b"cap/sys/x", 0, b"2")
    one_line(show(write(tmp_path / "dots2.tgz", base() + raw)), "longer than 4096")


def test_a_link_of_1300_dotdots_within_path_max_resolves_inside(tmp_path: Path) -> None:
    raw = (
        base()
        + pax({"linkpath": "../" * 1300 + "etc/shadow"})
        + header(b"cap/sys/devices/system/node/node0/meminfo", 0, b"2")
    )
    p = show(write(tmp_path / "dots.tgz", raw), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["nodes"][0]["memory_bytes"] is None


def test_a_pax_header_of_400000_digits_never_reaches_a_regex(tmp_path: Path) -> None:
    """CVE-2024-6232: tarfile's pax regex backtracks on a long run of digits (572 bytes
    compressed hung 3.11.7).  numabind parses pax records itself, under its own bound."""
    body = b"0" * 400_000 + b" path=x\n"
    raw = header(b"././@PaxHeader", len(body), b"x") + pad(body) + member("x", b"")
    cap = write(tmp_path / "redos.tgz", base() + raw)
    one_line(show(cap), "pax header")
    small = b"9" * 60 + b" path=x\n"  # within the size cap, still not a record
    raw = header(b"././@PaxHeader", len(small), b"x") + pad(small) + member("x", b"")
    one_line(show(write(tmp_path / "redos2.tgz", base() + raw)), "pax")


@pytest.mark.parametrize(
    ("field", "words"),
    [
        (b"\xff" * 12, ("negative",)),  # base-256, negative
        (b"9" * 11 + b"\0", ("octal",)),
        (b"\x80" + b"\xff" * 11, ("beyond",)),  # base-256, 2^88
        (b"7" * 12, ("beyond",)),  # 12 octal digits: 68 GB
    ],
)
def test_absurd_member_sizes_are_one_line(tmp_path: Path, field: bytes, words: tuple[str]) -> None:
    raw = base() + header(b"cap/sys/big", field)
    one_line(show(write(tmp_path / "size.tgz", raw)), *words)


def test_a_bad_checksum_and_a_truncated_member_are_one_line(tmp_path: Path) -> None:
    bad = bytearray(member("cap/sys/x", b"abc"))
    bad[0] ^= 1
    one_line(show(write(tmp_path / "sum.tgz", base() + bytes(bad))), "checksum")
    cut = base() + header(b"cap/sys/y", 5000) + b"short"
    one_line(show(write(tmp_path / "cut.tar", cut, compress=False)), "truncated")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "capture.tar.gz"
    os.mkfifo(fifo)
    one_line(show(fifo), "not a regular file")


def test_a_tarball_swapped_for_a_fifo_after_the_type_check_is_never_opened_blocking(
    tmp_path: Path,
) -> None:
    """The capture is opened once, non-blocking, and decompressed from that descriptor:
    a name flipping between a tarball and a FIFO never blocks the reader."""
    good = write(tmp_path / "good.tgz", base())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "flip.tgz"
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for src in (good, fifo):
                tmp = tmp_path / "flip.tmp"
                try:
                    os.link(src, tmp)
                    os.replace(tmp, target)
                except OSError:
                    pass

    t = threading.Thread(target=flip)
    t.start()
    try:
        for _ in range(20):
            p = show(target)
            assert p.returncode in (0, 2) and "Traceback" not in p.stderr, p.stderr
    finally:
        stop.set()
        t.join()


def test_content_not_the_name_says_what_a_capture_is(tmp_path: Path) -> None:
    xml = (HWLOC / "nvidiaDGX2.xml").read_bytes()
    (tmp_path / "DGX2.XML").write_bytes(xml)
    (tmp_path / "dgx2.xml.gz").write_bytes(gzip.compress(xml))
    (tmp_path / "dgx2.xml.bz2").write_bytes(bz2.compress(xml))
    (tmp_path / "capture.xml").write_bytes(gzip.compress(base() + b"\0" * 1024))  # a tarball
    for name in ("DGX2.XML", "dgx2.xml.gz", "dgx2.xml.bz2"):
        p = show(tmp_path / name, "--json")
        assert p.returncode == 0, (name, p.stderr)
        assert len(json.loads(p.stdout)["devices"]) == 16
    p = show(tmp_path / "capture.xml", "--json")
    assert p.returncode == 0 and len(json.loads(p.stdout)["nodes"]) == 2, p.stderr
    (tmp_path / "junk.tar.gz").write_bytes(b"hello, not a capture\n" * 40)
    one_line(show(tmp_path / "junk.tar.gz"), "neither")


def test_a_deeply_nested_env_file_is_one_line(tmp_path: Path) -> None:
    raw = base() + member("cap/numabind-env.json", b"[" * 200_000 + b"]" * 200_000)
    one_line(show(write(tmp_path / "env.tgz", raw)), "numabind-env.json", "nested")


# --- hwloc XML ------------------------------------------------------------------------------------

BOMB = """<?xml version="1.0" encoding="{enc}"?>
<!DOCTYPE topology [<!ENTITY a "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa">
<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">
<!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;"><!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;">]>
<topology><object type="Machine" os_index="0" cpuset="0x1">&e;&e;&e;&e;</object></topology>
"""


@pytest.mark.parametrize(
    ("encoding", "bom"),
    [("UTF-16", b""), ("UTF-16-LE", b"\xff\xfe"), ("UTF-16-BE", b"\xfe\xff"), ("UTF-32", b"")],
)
def test_an_entity_bomb_in_utf16_or_utf32_is_refused(
    tmp_path: Path, encoding: str, bom: bytes
) -> None:
    doc = BOMB.format(enc=encoding.split("-", maxsplit=1)[0] if bom else encoding)
    path = tmp_path / "bomb.xml"
    path.write_bytes(bom + doc.encode(encoding))
    one_line(show(path, limit=512 << 20), "UTF-")


def test_an_entity_bomb_in_utf8_is_refused_by_the_parser(tmp_path: Path) -> None:
    path = tmp_path / "bomb.xml"
    path.write_text(BOMB.format(enc="UTF-8"))
    one_line(show(path), "internal DTD subset")
    # the same declarations without the byte pattern 0.2.0 matched ("<!ENTITY")
    path.write_text(BOMB.format(enc="UTF-8").replace("<!ENTITY", "<!ENTITY\n"))
    one_line(show(path), "DTD")


@pytest.mark.parametrize(
    "encoding", ["utf-7", "rot13", "idna", "punycode", "utf-32", "x-none", "latin-1", "UTF 8"]
)
def test_declared_encodings_other_than_utf8_are_one_line(tmp_path: Path, encoding: str) -> None:
    path = tmp_path / "enc.xml"
    path.write_bytes(
        f'<?xml version="1.0" encoding="{encoding}"?>\n'.encode()
        + b'<topology><object type="Machine" os_index="0" cpuset="0x1"/></topology>\n'
    )
    one_line(show(path), "encoding")


def test_hwloc_doctype_is_accepted_and_external_entities_are_not(tmp_path: Path) -> None:
    real = (HWLOC / "24em64t-2n6c2t-pci.xml").read_text()
    assert '<!DOCTYPE topology SYSTEM "hwloc2.dtd">' in real
    assert show(HWLOC / "24em64t-2n6c2t-pci.xml").returncode == 0
    ext = real.replace(
        '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
        '<!DOCTYPE topology SYSTEM "hwloc2.dtd" [<!ENTITY x SYSTEM "file:///etc/passwd">]>',
    ).replace('value="ProLiant SL390s G7"', 'value="&x;"')
    (tmp_path / "ext.xml").write_text(ext)
    one_line(show(tmp_path / "ext.xml"), "DTD")
    # a reference to an entity the document never declares (its DTD being external):
    # expat would skip it silently in text; numabind refuses it.  (In an attribute value
    # expat drops such a reference without a callback: nothing is expanded or fetched.)
    ref = real.replace('<topology version="3.0">', '<topology version="3.0">&x;')
    (tmp_path / "ref.xml").write_text(ref)
    one_line(show(tmp_path / "ref.xml"), "undeclared entity")


def _nested_cores(depth: int, pus: int, words: int) -> str:
    mask = ",".join(["0xffffffff"] * words)
    head = "".join(f'<object type="Core" os_index="{i}" cpuset="{mask}">' for i in range(depth))
    body = "".join(f'<object type="PU" os_index="{i}" cpuset="0x1"/>' for i in range(pus))
    tail = "</object>" * depth
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<topology><object type="Machine" os_index="0" '
        f'cpuset="{mask}"><object type="NUMANode" os_index="0" cpuset="{mask}"/>'
        f"{head}{body}{tail}</object></topology>\n"
    )


def test_nested_objects_cost_each_pu_one_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """63 nested Core elements with 512-word masks: 0.2.0 parsed the chain's masks again
    for every PU (~0.3 s each).  Each distinct mask text is parsed once now."""
    from numabind.capture import _hwloc

    calls: list[int] = []
    real = _sysfs.parse_cpumask

    def counting(text: str, *a: object, **k: object) -> frozenset[int]:
        calls.append(len(text))
        return real(text, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(_sysfs, "parse_cpumask", counting)
    doc = _nested_cores(depth=60, pus=2000, words=512).encode()
    assert len(doc) > 300_000
    src = _hwloc.HwlocSource(doc, "nested.xml")
    assert len(calls) <= 3, calls  # the one mask, the node's and a PU's: each text once
    assert src.cpu_info(1999).siblings >= {0, 1999}


def test_objects_nested_deeper_than_64_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.xml"
    path.write_text(_nested_cores(depth=80, pus=1, words=1))
    one_line(show(path), "deeper than 64")


def test_distances_split_over_several_elements_are_read(hwloc_dir: Path) -> None:
    """hwloc writes a matrix in elements of ten values: 0.2.0 read the first one and
    said "malformed" on every machine with >= 4 nodes."""
    m = Machine.from_capture(str(hwloc_dir / "irregulargroups-disallowed.xml"))
    assert not any("distance" in w for w in m.warnings), m.warnings
    assert [n.distance_to(0) for n in m.nodes] == [10, 50, 65, 65, 65, 65, 65, 65]
    # the last row, from the last two of its elements: "... 65 65 79 79" + "65 79 79 10"
    assert [m.nodes[7].distance_to(j) for j in range(8)] == [65, 65, 79, 79, 65, 79, 79, 10]


# --- sysfs trees that claim the caps everywhere ---------------------------------------------------


def _linked_cpus(root: Path, cpus: int, levels: int) -> None:
    """2N CPU directories linked to two templates whose ``levels`` cache indexes each list
    the other node's CPUs (the 0.2.0 attack: 16.6 s at 1,024 CPUs)."""
    half = cpus // 2
    other = [_sysfs.format_cpulist(range(half, cpus)), _sysfs.format_cpulist(range(half))]
    cpu_dir = root / "sys/devices/system/cpu"
    for t in range(2):
        tpl = root / f"tpl{t}"
        (tpl / "topology").mkdir(parents=True)
        (tpl / "topology/physical_package_id").write_text(f"{t}\n")
        (tpl / "topology/core_cpus_list").write_text(other[t] + "\n")
        for i in range(levels):
            idx = tpl / f"cache/index{i}"
            idx.mkdir(parents=True)
            (idx / "level").write_text(f"{i + 1}\n")
            (idx / "type").write_text("Unified\n")
            (idx / "shared_cpu_list").write_text(other[t] + "\n")
    for c in range(cpus):
        (cpu_dir / f"cpu{c}").symlink_to(f"../../../../tpl{c // half}")
    node_dir = root / "sys/devices/system/node"
    for n in range(2):
        (node_dir / f"node{n}").mkdir(parents=True, exist_ok=True)
        cpus_of = range(n * half, (n + 1) * half)
        (node_dir / f"node{n}/cpulist").write_text(_sysfs.format_cpulist(cpus_of) + "\n")
    (cpu_dir / "online").write_text(f"0-{cpus - 1}\n")


def test_linked_templates_with_64_cache_levels_cost_what_the_machine_costs(tmp_path: Path) -> None:
    root = tmp_path / "m"
    (root / "sys/devices/system/cpu").mkdir(parents=True)
    _linked_cpus(root, 1024, 64)
    (root / "numabind-env.json").write_text(
        json.dumps({"environ": {"NUMABIND_MODE": "core-complex", "LOCAL_WORLD_SIZE": "8"}})
    )
    m = Machine.from_capture(str(root))
    from numabind._plan import Request, plan

    for r in range(8):
        plan(m, Request(local_rank=r, local_world_size=8, mode="core-complex"))
    for c in m.online_cpus:
        m.cpu_info(c)
    b = m.source.budget
    # per CPU: package, siblings, the cache directory and 16 indexes' level/type/list
    assert b.files <= 1024 * (3 + 1 + 3 * _sysfs.MAX_CACHE_INDEXES) + 16, b.files
    # every list here is one of four texts: each parsed once, whatever links point to it
    assert b.items <= 4 * 1024 + 64, b.items
    p = show(root, "--json", "--mode", "core-complex", "--nproc", "8")
    assert p.returncode == 0, p.stderr


def test_many_gpus_linked_to_one_pci_directory_are_capped(tmp_path: Path) -> None:
    """512 fake GPUs linked to one directory whose local_cpulist spells 0-16383: 0.2.0's
    hook spent 6.9 s and 795 MiB.  Accelerators are capped at 64, the list parsed once."""
    root = tmp_path / "m"
    synth.write(synth.two_nodes(gpus=0), str(root))
    tpl = root / "gpu-template"
    tpl.mkdir()
    for name, value in (("vendor", "0x10de"), ("device", "0x2330"), ("class", "0x030200")):
        (tpl / name).write_text(value + "\n")
    (tpl / "numa_node").write_text("-1\n")
    (tpl / "local_cpulist").write_text(",".join(str(c) for c in range(16384)) + "\n")
    pci = root / "sys/bus/pci/devices"
    pci.mkdir(parents=True, exist_ok=True)
    for i in range(512):
        (pci / f"0000:{i // 32 + 1:02x}:{i % 32:02x}.0").symlink_to("/gpu-template")
    m = Machine.from_capture(str(root))
    assert len(m.all_accelerators) == _sysfs.MAX_ACCELERATORS
    assert any("more than 64 accelerators" in w for w in m.warnings)
    assert m.source.budget.items <= 16384 + 64 + 16, m.source.budget.items
    env = {"LOCAL_RANK": "0", "NUMABIND_SYSROOT": str(root), "PATH": os.environ["PATH"]}
    # VmHWM: this interpreter's peak (ru_maxrss would count the forking test process's)
    code = "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])"
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and int(r.stdout) < 100_000, (r.stdout, r.stderr)  # KiB


def test_a_tree_costing_more_than_the_largest_machine_is_refused(tmp_path: Path) -> None:
    """70 distinct spellings of 0-16383: 1.1 million CPU numbers, more than any machine
    numabind accepts needs to read."""
    root = tmp_path / "m"
    node_dir = root / "sys/devices/system/node"
    (root / "sys/devices/system/cpu").mkdir(parents=True)
    (root / "sys/devices/system/cpu/online").write_text("0-16383\n")
    for n in range(70):
        (node_dir / f"node{n}").mkdir(parents=True)
        text = f"0-{16383 - n - 1},{16383 - n}-16383"
        (node_dir / f"node{n}/cpulist").write_text(text + "\n")
    with pytest.raises(CaptureError, match="largest machine"):
        m = Machine.from_capture(str(root))
        m.cpu_nodes  # noqa: B018
    one_line(show(root), "largest machine")


def test_a_capture_read_without_proc_stays_inside(tmp_path: Path) -> None:
    """Without /proc (a private mount namespace) the reader cannot ask the kernel where a
    file it opened lies; it then walks from the capture's descriptor one component at a
    time, never following a link, instead of trusting the path (0.2.0 read the outside
    file)."""
    import shutil

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a mount namespace without /proc")
    secret = tmp_path / "secret"
    secret.write_text("TOPSECRET\n")
    root = tmp_path / "cap"
    synth.write(synth.two_nodes(), str(root))
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from numabind._roots import DirRoot; r = DirRoot(sys.argv[2]);"
        "import os; node = sys.argv[2] + '/sys/devices/system/node/node0';"
        "print(r.read('/sys/devices/system/node/node0/cpulist'));"
        "os.rename(node, node + '.moved'); os.symlink(sys.argv[3], node);"
        "print(r.opt('/sys/devices/system/node/node0/cpulist'))"
    )
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpulist").write_text("TOPSECRET\n")
    inner = (
        f"mount --make-rprivate / && umount -l /proc && "
        f'{sys.executable} -c "{code}" {SRC} {root} {outside}'
    )
    p = subprocess.run(
        ["unshare", "-m", "sh", "-c", inner], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "None"], p.stdout
