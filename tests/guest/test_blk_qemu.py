"""The test guest's virtio-blk driver and disk workload (workload=disk)
against QEMU 7.2's virtio-blk-pci, QEMU under TCG (no KVM, no root):
binding and features, rounds of checked rewrites with errors=0, the image
itself readable with the documented block format (docs/guest.md, "disk
block format"), a block corrupted in the image while the guest is paused
reported as `disk BAD` (the negative control), a second boot on the same
image adopting the first boot's stamps without a single error, and a
read-only drive (only reads, every block checked).

The drive bypasses the host's page cache (cache.direct=on): QEMU reads what
the test wrote into the file, not a stale copy.  One QEMU at a time, each
run a few seconds.
"""
import os
import re
import shutil
import struct
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="qemu-system-x86_64 is not installed")

MIB = 1 << 20
IMAGE = 64 * MIB
BS = 4096
REGION_MB = 1
NBLOCKS = REGION_MB * MIB // BS

BOUND = (r"blk bound dev=00:([0-9a-f]{2})\.(\d) id=1af4:(1042|1001) features=0x([0-9a-f]+) "
         r"capacity=(\d+) blk_size=(\d+) offered=0x([0-9a-f]+) size_max=(\d+) seg_max=(\d+) "
         r"queue=(\d+) ro=([01])")
START = (r"disk start blocks=(?P<blocks>\d+) bs=(?P<bs>\d+) depth=(?P<depth>\d+) "
         r"segs=(?P<segs>\d+) rate=(?P<rate>\d+) flush=(?P<flush>\d+) zeroes=(?P<zeroes>[01]) "
         r"ro=(?P<ro>[01])")
SCAN = (r"disk scan blocks=(?P<blocks>\d+) adopted=(?P<adopted>\d+) zero=(?P<zero>\d+) "
        r"foreign=(?P<foreign>\d+) max_gen=(?P<max_gen>\d+) t_ms=(?P<t_ms>\d+)")
REPORT = (r"disk (?P<word>ok|bad) round=(?P<round>\d+) blocks=(?P<blocks>\d+) "
          r"writes=(?P<writes>\d+) flushes=(?P<flushes>\d+) max_lat_us=(?P<max_lat_us>\d+) "
          r"errors=(?P<errors>\d+) t_ms=(?P<t_ms>\d+) zeroes=(?P<zeroes>\d+) bad=(?P<bad>\d+) "
          r"ioerr=(?P<ioerr>\d+) proto=(?P<proto>\d+)")
BAD = (r"disk BAD block=(?P<block>\d+) want_gen=(?P<want>\d+) got_gen=(?P<got>\d+) "
       r"why=(?P<why>\w+) word=(?P<word>\d+) sector=(?P<sector>\d+) round=(?P<round>\d+)")

# feature bits (virtio 1.x, 5.2.3)
F_SIZE_MAX, F_SEG_MAX, F_RO, F_BLK_SIZE, F_FLUSH, F_DISCARD, F_WRITE_ZEROES = 1, 2, 5, 6, 9, 13, 14
F_VERSION_1 = 32

# ---------------------------------------------------------------- block format

M64 = (1 << 64) - 1
MAGIC = 0x316b6c6267696d6b          # "kmigblk1"
K_SEED = 0x9e3779b97f4a7c15
K_WORD = 0xd1b54a32d192ed03


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def checksum(words):
    return sum(mix64(w ^ ((j * K_SEED) & M64)) for j, w in enumerate(words) if j != 3) & M64


def make_block(b, g, bs=BS):
    """Block b of generation g as the guest writes it (docs/guest.md)."""
    seed = mix64((b << 32 | g) & M64)
    w = [MAGIC, b, g | bs << 32, 0] + [mix64((seed + j * K_WORD) & M64)
                                        for j in range(4, bs // 8)]
    w[3] = checksum(w)
    return struct.pack("<%dQ" % len(w), *w)


def classify(raw, b, bs=BS):
    """("stamp", g), ("zero", 0) or ("foreign", 0): the scan's rule."""
    if raw.count(0) == len(raw):
        return "zero", 0
    w = struct.unpack("<%dQ" % (bs // 8), raw)
    g = w[2] & 0xffffffff
    if w[0] == MAGIC and w[1] == b and w[2] >> 32 == bs and 0 < g < 1 << 31 \
            and raw == make_block(b, g, bs):
        return "stamp", g
    return "foreign", 0


def read_region(img):
    with open(img, "rb") as f:
        data = f.read(NBLOCKS * BS)
    return [data[i * BS:(i + 1) * BS] for i in range(NBLOCKS)]


def write_block(img, b, raw):
    fd = os.open(img, os.O_WRONLY)
    try:
        os.pwrite(fd, raw, b * BS)
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- helpers

@pytest.fixture(autouse=True)
def _guest_built():
    assert os.path.exists(kt.GUEST), "%s missing (make guest)" % kt.GUEST


def new_image(d, name="disk.img"):
    img = os.path.join(d, name)
    with open(img, "wb") as f:
        f.truncate(IMAGE)
    return img


def boot(d, vms, name, img, cmdline, readonly=False):
    drive = "file=%s,format=raw,if=none,id=d0,cache.direct=on" % img
    if readonly:
        drive += ",readonly=on"
    extra = ["-drive", drive, "-device", "virtio-blk-pci,drive=d0"]
    vm = kt.qemu_vm(d, name, cmdline, memory="128M", extra=extra, accel="tcg")
    vms.append(vm)
    return vm


def tail(vm, n=800):
    return vm.console.text()[-n:] + " | " + vm.output()[-300:]


def reports(vm):
    return [ints(m) for m in re.finditer(REPORT, vm.console.text())]


def wait_reports(vm, n, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline and vm.proc.poll() is None:
        r = reports(vm)
        if len(r) >= n:
            return r
        time.sleep(0.1)
    return reports(vm)


def ints(m):
    return {k: int(v) if v.isdigit() else v for k, v in m.groupdict().items()}


# ---------------------------------------------------------------- tests

def test_rounds_and_corruption(d, vms, check):
    """Binds, runs rounds with errors=0; a block the test corrupts in the
    image while the guest is paused is reported as disk BAD."""
    img = new_image(d)
    vm = boot(d, vms, "blk", img, "workload=disk disk_mb=%d report_ms=500" % REGION_MB)
    m = vm.console.wait(BOUND, timeout=30, proc=vm.proc)
    assert m, "not bound: " + tail(vm)
    f = int(m.group(4), 16)
    for bit, name in ((F_VERSION_1, "VERSION_1"), (F_FLUSH, "FLUSH"), (F_BLK_SIZE, "BLK_SIZE"),
                      (F_SEG_MAX, "SEG_MAX"), (F_WRITE_ZEROES, "WRITE_ZEROES")):
        check("feature " + name, f & (1 << bit), "features=%#x" % f)
    check("no RO", not f & (1 << F_RO), "features=%#x" % f)
    check("no DISCARD", not f & (1 << F_DISCARD), "features=%#x" % f)
    check("features offered", f & ~int(m.group(7), 16) == 0, m.group(0))
    check("capacity", int(m.group(5)) == IMAGE // 512, m.group(0))
    check("blk_size", int(m.group(6)) == 512, m.group(0))
    check("ro=0", m.group(11) == "0", m.group(0))
    s = vm.console.wait(START, timeout=5, proc=vm.proc)
    check("start line", s and int(s.group("blocks")) == NBLOCKS and int(s.group("bs")) == BS
          and int(s.group("depth")) == 16 and int(s.group("flush")) == 16
          and s.group("zeroes") == "1", s and s.group(0))
    sc = vm.console.wait(SCAN, timeout=20, proc=vm.proc)
    check("scan of a fresh image", sc and ints(sc)["zero"] == NBLOCKS, sc and sc.group(0))

    r = wait_reports(vm, 3, timeout=30)
    assert len(r) >= 3, "fewer than 3 disk reports: " + tail(vm)
    check("rounds ok", all(x["word"] == "ok" and x["errors"] == 0 for x in r), r)
    check("rounds advance", r[-1]["round"] > r[0]["round"] >= 1, r)
    check("blocks checked and written", all(x["blocks"] > 0 and x["writes"] > 0 for x in r), r)
    check("flushes", sum(x["flushes"] for x in r) > 0, r)
    check("write-zeroes used", sum(x["zeroes"] for x in r) > 0, r)

    # paused (QEMU drains the requests in flight): the image holds the
    # documented format, every block stamped or zeroed by the guest
    q = vm.qmp()
    q.cmd("stop")
    kinds = [classify(raw, b) for b, raw in enumerate(read_region(img))]
    foreign = [b for b, (k, _) in enumerate(kinds) if k == "foreign"]
    check("image: no foreign block", not foreign, "foreign blocks %s" % foreign[:10])
    check("image: stamps", sum(k == "stamp" for k, _ in kinds) > NBLOCKS // 2,
          "%d stamped" % sum(k == "stamp" for k, _ in kinds))

    # the negative control: garbage in two blocks half the region apart
    # (at most one of them can be among the 16 in flight around the pause)
    victims = (NBLOCKS // 4, NBLOCKS // 4 + NBLOCKS // 2)
    for b in victims:
        write_block(img, b, bytes((i * 7 + 0x5a) & 0xff for i in range(BS)))
    vm.console.poll()
    n0 = len(vm.console.lines)
    q.cmd("cont")
    bad = vm.console.wait(BAD, timeout=20, start=n0, proc=vm.proc)
    assert bad, "corruption not reported: " + tail(vm)
    time.sleep(1.5)
    bads = [ints(x) for x in re.finditer(BAD, vm.console.text())]
    check("only the corrupted blocks are bad", bads and all(x["block"] in victims for x in bads),
          bads)
    check("why: no stamp at word 0", all(x["why"] in ("magic", "notzero") and x["got"] == 0
                                         and x["word"] == 0 for x in bads), bads)
    check("sector", all(x["sector"] == x["block"] * BS // 512 for x in bads), bads)
    after = [x for x in reports(vm) if x["errors"]]
    check("report says bad", after and after[-1]["word"] == "bad"
          and after[-1]["bad"] == len(bads), "%s vs %d BAD lines" % (after[-1:], len(bads)))
    q.cmd("quit")
    vm.wait_exit(10)


def test_second_boot_adopts(d, vms, check):
    """A second boot on the first boot's image adopts every valid stamp
    (no error, though it never wrote them), treats foreign blocks (garbage,
    a stamp of another block) as unknown, and checks the adopted blocks."""
    img = new_image(d)
    vm = boot(d, vms, "first", img, "workload=disk disk_mb=%d report_ms=500 exit_ms=3000"
              % REGION_MB)
    vm.wait_exit(30)
    r1 = reports(vm)
    assert r1 and all(x["errors"] == 0 for x in r1), "first boot: " + tail(vm)

    blocks = read_region(img)
    write_block(img, 7, os.urandom(BS))            # foreign: garbage
    write_block(img, 9, blocks[3] if classify(blocks[3], 3)[0] == "stamp"
                else make_block(3, 1))              # foreign: block 3's stamp
    kinds = [classify(raw, b) for b, raw in enumerate(read_region(img))]
    want = {k: sum(1 for x, _ in kinds if x == k) for k in ("stamp", "zero", "foreign")}
    check("host: first boot stamped blocks", want["stamp"] > NBLOCKS // 2, want)
    check("host: the two foreign blocks", want["foreign"] >= 2 and kinds[7][0] == "foreign"
          and kinds[9][0] == "foreign", want)

    vm2 = boot(d, vms, "second", img, "workload=disk disk_mb=%d report_ms=500 exit_ms=4000"
               % REGION_MB)
    sc = vm2.console.wait(SCAN, timeout=30, proc=vm2.proc)
    assert sc, "no scan line: " + tail(vm2)
    sc = ints(sc)
    check("scan adopted = host stamps", sc["adopted"] == want["stamp"], (sc, want))
    check("scan zero = host zero", sc["zero"] == want["zero"], (sc, want))
    check("scan foreign = host foreign", sc["foreign"] == want["foreign"], (sc, want))
    check("scan max_gen", sc["max_gen"] == max(g for _, g in kinds), sc)
    vm2.wait_exit(30)
    r2 = reports(vm2)
    check("second boot rounds", len(r2) >= 2 and r2[-1]["round"] >= 2, tail(vm2))
    check("second boot errors=0", r2 and all(x["word"] == "ok" and x["errors"] == 0 for x in r2),
          r2)
    check("no BAD line", "disk BAD" not in vm2.console.text(), tail(vm2))
    # the generations went on from the adopted ones
    g2 = [classify(raw, b)[1] for b, raw in enumerate(read_region(img))]
    check("generations continued", max(g2) > sc["max_gen"], "%d vs %d" % (max(g2), sc["max_gen"]))


def test_read_only(d, vms, check):
    """On a read-only drive (RO offered) the guest never writes: it adopts
    the stamps the test wrote in the documented format and keeps checking
    them, every block, with errors=0."""
    img = new_image(d)
    gens = {b: 5 + b % 3 for b in range(NBLOCKS) if b % 4}   # every 4th block left zero
    with open(img, "r+b") as f:
        for b, g in gens.items():
            f.seek(b * BS)
            f.write(make_block(b, g))
    vm = boot(d, vms, "ro", img, "workload=disk disk_mb=%d report_ms=500 exit_ms=4000"
              % REGION_MB, readonly=True)
    m = vm.console.wait(BOUND, timeout=30, proc=vm.proc)
    assert m, "not bound: " + tail(vm)
    check("RO negotiated", int(m.group(4), 16) & (1 << F_RO) and m.group(11) == "1", m.group(0))
    s = vm.console.wait(START, timeout=5, proc=vm.proc)
    check("no flushes, no zeroes", s and s.group("flush") == "0" and s.group("zeroes") == "0"
          and s.group("ro") == "1", s and s.group(0))
    sc = vm.console.wait(SCAN, timeout=30, proc=vm.proc)
    check("scan adopts the test's stamps", sc and ints(sc)["adopted"] == len(gens)
          and ints(sc)["zero"] == NBLOCKS - len(gens) and ints(sc)["max_gen"] == 7,
          sc and sc.group(0))
    vm.wait_exit(30)
    r = reports(vm)
    check("rounds", len(r) >= 2 and r[-1]["round"] >= 2, tail(vm))
    check("reads only", r and all(x["writes"] == 0 and x["flushes"] == 0 and x["blocks"] > 0
                                  and x["errors"] == 0 for x in r), r)
    check("image unchanged", all(classify(raw, b) == (("stamp", gens[b]) if b in gens
                                                      else ("zero", 0))
                                 for b, raw in enumerate(read_region(img))), "changed")
