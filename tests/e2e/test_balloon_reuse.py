"""Issue 7: a page hinted free at the start of a migration and reused by
the guest while the migration runs arrives with its new content.

The guest (fill-free of most of its 1 GiB, balloon=1, refill_ms) hints its
free memory when kmig starts the migration, gets it back when kmig says
DONE after the bulk pass, and from then on keeps reusing it: every
refill_ms it writes refill_mb MiB of freshly allocated memory (lowest
addresses first, i.e. memory it had just hinted) with a pattern of
(address, generation) and re-checks the previous generation.  A reused
hinted page that kmig did not resend would read back wrong (zero: the
destination keeps hinted pages zero) on the destination: "refill BAD".

Tests: the migration (completed, x-verify on, free pages skipped, the
guest reused hinted memory on the source and checks it on the
destination: increasing "refill ok" generations, hinted_mb > 0 among
them, never "refill BAD"); the control: corrupt_refill=2 makes the guest
skip one page's write in generation 2 and its own check must say
"refill BAD" for exactly that page (no migration).

Under emulation (scripts/kvm-vm) the guest writes a 32 MiB generation in
1.2-1.7 s instead of 200 ms (~20-27 MB/s, and then spends most of each
step re-reading the held generations), below the stream's rate, so at
100 MB/s the migration converged before the guest had written a
generation into reused memory.  There the bandwidth drops to
EMU_REUSE_BANDWIDTH (8 MB/s) as soon as the bulk pass is over (at 8 MB/s
the bulk pass itself would take half a minute), so the guest again
dirties faster than the stream carries it and every dirty round spans
several of its writes: the migration stays in its dirty rounds until the
test raises bandwidth and limit, as natively.
"""
import os
import re
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

MIB = 1 << 20
BALLOON = ["--balloon"]
REFILL_OK = re.compile(r"^refill ok gen=(\d+) mb=(\d+) hinted_mb=(\d+) checked_mb=(\d+)"
                       r" wrote_gen=(\d+) wrote_mb=(\d+)")
REFILL_BAD = re.compile(r"^refill (BAD|bad_pages)")
EMU_REUSE_BANDWIDTH = 8 * 1000 * 1000   # bytes/s; see the module docstring


@pytest.fixture(autouse=True)
def _vm_tails(request, d, vms):
    """On an exception in the test, each VM's console and output tail (what
    the old harness's run_case printed), while the VMs still run and before
    d is removed.  Failed checks carry their own diagnostics."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "check(s) failed" not in str(rep.longrepr):
        for vm in vms:
            try:
                print("# %s (exit %r): %s" % (os.path.basename(vm.console.path),
                                              vm.proc.poll(), kt.dump(vm)))
            except OSError as e:
                print("# %s: %s" % (vm.console.path, e))


def dump(vm, n=12):
    return kt.dump(vm, n)


def refills(lines):
    """(gen, mb, hinted_mb, checked_mb, wrote_gen, wrote_mb) of each "refill ok" line."""
    return [tuple(int(x) for x in m.groups()) for m in map(REFILL_OK.match, lines) if m]


KEEP = 4


def test_reuse(d, vms, check):
    name = "balloon_reuse"
    cmd = ("workload=fill-free mb=768 report_ms=500 balloon=1 balloon_report=0"
           " refill_ms=200 refill_mb=32 refill_keep=%d" % KEEP)
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    src = kt.kmig_vm(d, "src", cmd, memory="1G", extra=BALLOON)
    vms.append(src)
    dst = kt.kmig_vm(d, "dst", cmd, memory="1G", extra=BALLOON + ["--incoming", uri])
    vms.append(dst)
    if not check("bound", src.console.wait(r"^balloon bound ", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    if not check("filled", src.console.wait(r"^fill-free done", kt.slow(60), proc=src.proc)
                 is not None, dump(src)):
        return
    if not check("refills_before", src.console.wait(r"^refill ok gen=2 ", kt.slow(10),
                                                    proc=src.proc) is not None, dump(src)):
        return
    q = src.qmp()
    kt.set_caps(q, x_verify=True, events=True)
    # 100 MB/s; the guest writes 32 MiB every 200 ms (160 MiB/s), so every
    # dirty round (>= 0.33 s) ends with >= 32 MiB dirty and a 100 ms
    # downtime limit (10 MB) keeps the migration in its dirty rounds while
    # the guest reuses the memory it hinted; bandwidth and limit are raised
    # later
    kt.set_params(q, max_bandwidth=100 * 1000 * 1000, downtime_limit=100)
    kt.wait_incoming(dst, kt.slow(30))
    t0 = time.time()
    q.cmd("migrate", uri=uri)
    if kt.emulated():
        # the bulk pass ends with the first dirty sync: from there on the
        # stream must be slower than the guest (see the module docstring)
        deadline = time.time() + kt.slow(20)
        while time.time() < deadline:
            st = q.cmd("query-migrate")
            if st.get("status") not in ("setup", "active") \
                    or st.get("ram", {}).get("dirty-sync-count", 0) >= 1:
                break
            time.sleep(0.02)
        kt.set_params(q, max_bandwidth=EMU_REUSE_BANDWIDTH)
    back = src.console.wait(r"^balloon hint returned blocks=", kt.slow(20), proc=src.proc)
    if not check("hints_returned", back is not None, dump(src, 30)):
        return
    i_back = next(i for i, l in enumerate(src.console.lines)
                  if l.startswith("balloon hint returned"))
    # the first generation written wholly after the guest got its hinted
    # memory back (the return may come in the middle of a refill); once it
    # is retired, every generation the guest holds is in reused memory
    pre = refills(src.console.lines[:i_back])
    w0 = (pre[-1][4] if pre else 0) + 2
    deadline = time.time() + kt.slow(15)
    while time.time() < deadline and not any(x[0] >= w0
                                             for x in refills(src.console.lines[i_back:])):
        time.sleep(0.05)
        src.console.poll()
    after = [x for x in refills(src.console.lines[i_back:]) if x[0] >= w0]
    st = q.cmd("query-migrate")
    check("active_while_reusing", st.get("status") == "active" and after,
          "%r; %s" % (st, dump(src)))
    kt.set_params(q, max_bandwidth=4 * 1000 * 1000 * 1000, downtime_limit=1000)
    r = kt.wait_migration(q, kt.slow(30))
    print("# %s: %.1f s; %r" % (name, time.time() - t0, dict({
        k: r.get(k) for k in ("status", "total-time", "downtime", "setup-time",
                              "x-free-pages-skipped", "x-iterations")},
        transferred_mib=round(r.get("ram", {}).get("transferred", 0) / MIB, 1))))
    if not check("completed", r.get("status") == "completed",
                 "%r; src %s; dst %s" % (r, dump(src), dump(dst))):
        return
    check("free_pages_skipped", r.get("x-free-pages-skipped", 0) > 0, repr(r))

    # the destination (whose console starts at the switchover) keeps
    # checking: wait until every generation the source wrote is retired there
    deadline = time.time() + kt.slow(10)
    while time.time() < deadline and len(refills(dst.console.lines)) < KEEP + 4:
        if dst.proc.poll() is not None:
            break
        time.sleep(0.1)
        dst.console.poll()
    stext, dtext = src.console.text(), dst.console.text()
    # a line the switchover cut: the guest wrote its start on the source
    # (no newline yet) and the rest on the destination, whose console
    # starts with that rest
    dlines = list(dst.console.lines)
    if src.console.partial() and dlines:
        dlines[0] = src.console.partial() + dlines[0]
    dtext = "\n".join(dlines)
    sref, dref = refills(src.console.lines), refills(dlines)
    after = [x for x in refills(src.console.lines[i_back:]) if x[0] >= w0]
    for line in (l for l in stext.splitlines() if l.startswith("balloon hint")):
        print("# src: " + line)
    last_wrote = sref[-1][4] if sref else 0
    crossed = [x for x in dref if x[0] <= last_wrote]
    print("# %s: src gens retired %d..%d (written after DONE: %s), last written %d; dst retired %s"
          % (name, sref[0][0] if sref else -1, sref[-1][0] if sref else -1,
             [(x[0], x[2]) for x in after], last_wrote, [(x[0], x[2]) for x in dref]))
    bad = [l for l in (stext + "\n" + dtext).splitlines()
           if REFILL_BAD.match(l) or "balloon error" in l or "kmig-guest fault" in l]
    check("no_refill_bad", not bad, " / ".join(bad[:6]))
    check("hinted", re.search(r"^balloon hint done id=\d+ blocks=[1-9]", stext, re.M)
          is not None, dump(src, 30))
    # the guest reused hinted memory on the source during the migration
    check("src_reused_hinted", any(x[2] > 0 for x in after), repr(after))
    gens = [x[0] for x in dref]
    check("dst_checks", len(dref) >= KEEP + 3 and bool(sref) and gens[0] == sref[-1][0] + 1
          and all(b == a + 1 for a, b in zip(gens, gens[1:])),
          "dst %r; src last %r; %s" % (dref, sref[-1:], dump(dst)))
    # generations the source wrote into reused hinted memory after DONE,
    # checked intact on the destination
    check("dst_checked_reused_hinted", len(crossed) >= KEEP - 1
          and all(x[1] > 0 for x in crossed) and sum(x[2] for x in crossed) > 0,
          "crossed %r; src last %r" % (crossed, sref[-1:]))


def test_control(d, vms, check):
    """The check bites: a page skipped on purpose is reported BAD."""
    cmd = "workload=fill-free mb=256 report_ms=500 refill_ms=100 refill_mb=16 corrupt_refill=2"
    vm = kt.kmig_vm(d, "vm", cmd, memory="512M")
    vms.append(vm)
    line = vm.console.wait(r"^refill corrupt page=0x([0-9a-f]+) gen=2", kt.slow(30), proc=vm.proc)
    if not check("corrupted", line is not None, dump(vm)):
        return
    page = line.group(1)
    bad = vm.console.wait(r"^refill BAD page=0x[0-9a-f]+ gen=2 ", kt.slow(10), proc=vm.proc)
    vm.console.wait(r"^refill ok gen=4 ", kt.slow(10), proc=vm.proc)
    text = vm.console.text()
    bads = re.findall(r"^refill BAD page=0x([0-9a-f]+) gen=(\d+) word=(\d+)", text, re.M)
    check("bad_reported", bad is not None and len(bads) == 1
          and bads[0][0] == page and bads[0][1] == "2" and bads[0][2] == "0", dump(vm))
    check("bad_summary", re.search(r"^refill bad_pages=1 gen=2 ", text, re.M) is not None,
          dump(vm))
    gens = [x[0] for x in refills(text.splitlines())]
    check("others_ok", 1 in gens and 3 in gens and 2 not in gens, repr(gens))
