#!/usr/bin/env python3
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

Cases: the migration (completed, x-verify on, free pages skipped, the
guest reused hinted memory on the source and checks it on the
destination: increasing "refill ok" generations, hinted_mb > 0 among
them, never "refill BAD"); the control: corrupt_refill=2 makes the guest
skip one page's write in generation 2 and its own check must say
"refill BAD" for exactly that page (no migration).
"""
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kmigtest as kt  # noqa: E402

R = kt.Report()
MIB = 1 << 20
BALLOON = ["--balloon"]
REFILL_OK = re.compile(r"^refill ok gen=(\d+) mb=(\d+) hinted_mb=(\d+) checked_mb=(\d+)"
                       r" wrote_gen=(\d+) wrote_mb=(\d+)")
REFILL_BAD = re.compile(r"^refill (BAD|bad_pages)")


def dump(vm, n=12):
    return kt.dump(vm, n)


def run_case(name, fn, d):
    sub = os.path.join(d, name)
    os.mkdir(sub)
    kt.run_case(R, name, lambda vms: fn(sub, vms))


def refills(lines):
    """(gen, mb, hinted_mb, checked_mb, wrote_gen, wrote_mb) of each "refill ok" line."""
    return [tuple(int(x) for x in m.groups()) for m in map(REFILL_OK.match, lines) if m]


KEEP = 4


def case_reuse(d, vms):
    name = "balloon_reuse"
    cmd = ("workload=fill-free mb=768 report_ms=500 balloon=1 balloon_report=0"
           " refill_ms=200 refill_mb=32 refill_keep=%d" % KEEP)
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    src = kt.kmig_vm(d, "src", cmd, memory="1G", extra=BALLOON)
    dst = kt.kmig_vm(d, "dst", cmd, memory="1G", extra=BALLOON + ["--incoming", uri])
    vms += [src, dst]
    if not R.ok(name + "_bound", src.console.wait(r"^balloon bound ", 30, proc=src.proc) is not None,
                dump(src)):
        return
    if not R.ok(name + "_filled", src.console.wait(r"^fill-free done", 60, proc=src.proc) is not None,
                dump(src)):
        return
    if not R.ok(name + "_refills_before", src.console.wait(r"^refill ok gen=2 ", 10, proc=src.proc)
                is not None, dump(src)):
        return
    q = src.qmp()
    kt.set_caps(q, x_verify=True, events=True)
    # 100 MB/s; the guest writes 32 MiB every 200 ms (160 MiB/s), so every
    # dirty round (>= 0.33 s) ends with >= 32 MiB dirty and a 100 ms
    # downtime limit (10 MB) keeps the migration in its dirty rounds while
    # the guest reuses the memory it hinted; bandwidth and limit are raised
    # later
    kt.set_params(q, max_bandwidth=100 * 1000 * 1000, downtime_limit=100)
    kt.wait_incoming(dst)
    t0 = time.time()
    q.cmd("migrate", uri=uri)
    back = src.console.wait(r"^balloon hint returned blocks=", 20, proc=src.proc)
    if not R.ok(name + "_hints_returned", back is not None, dump(src, 30)):
        return
    i_back = next(i for i, l in enumerate(src.console.lines) if l.startswith("balloon hint returned"))
    # the first generation written wholly after the guest got its hinted
    # memory back (the return may come in the middle of a refill); once it
    # is retired, every generation the guest holds is in reused memory
    pre = refills(src.console.lines[:i_back])
    w0 = (pre[-1][4] if pre else 0) + 2
    deadline = time.time() + 15
    while time.time() < deadline and not any(x[0] >= w0 for x in refills(src.console.lines[i_back:])):
        time.sleep(0.05)
        src.console.poll()
    after = [x for x in refills(src.console.lines[i_back:]) if x[0] >= w0]
    st = q.cmd("query-migrate")
    R.ok(name + "_active_while_reusing", st.get("status") == "active" and after,
         "%r; %s" % (st, dump(src)))
    kt.set_params(q, max_bandwidth=4 * 1000 * 1000 * 1000, downtime_limit=1000)
    r = kt.wait_migration(q, 30)
    print("# %s: %.1f s; %r" % (name, time.time() - t0, dict({
        k: r.get(k) for k in ("status", "total-time", "downtime", "setup-time",
                              "x-free-pages-skipped", "x-iterations")},
        transferred_mib=round(r.get("ram", {}).get("transferred", 0) / MIB, 1))))
    if not R.ok(name + "_completed", r.get("status") == "completed",
                "%r; src %s; dst %s" % (r, dump(src), dump(dst))):
        return
    R.ok(name + "_free_pages_skipped", r.get("x-free-pages-skipped", 0) > 0, repr(r))

    # the destination (whose console starts at the switchover) keeps
    # checking: wait until every generation the source wrote is retired there
    deadline = time.time() + 10
    while time.time() < deadline and len(refills(dst.console.lines)) < KEEP + 3:
        if dst.proc.poll() is not None:
            break
        time.sleep(0.1)
        dst.console.poll()
    stext, dtext = src.console.text(), dst.console.text()
    sref, dref = refills(src.console.lines), refills(dst.console.lines)
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
    R.ok(name + "_no_refill_bad", not bad, " / ".join(bad[:6]))
    R.ok(name + "_hinted", re.search(r"^balloon hint done id=\d+ blocks=[1-9]", stext, re.M)
         is not None, dump(src, 30))
    # the guest reused hinted memory on the source during the migration
    R.ok(name + "_src_reused_hinted", any(x[2] > 0 for x in after), repr(after))
    gens = [x[0] for x in dref]
    R.ok(name + "_dst_checks", len(dref) >= KEEP + 3 and bool(sref) and gens[0] == sref[-1][0] + 1
         and all(b == a + 1 for a, b in zip(gens, gens[1:])),
         "dst %r; src last %r; %s" % (dref, sref[-1:], dump(dst)))
    # generations the source wrote into reused hinted memory after DONE,
    # checked intact on the destination
    R.ok(name + "_dst_checked_reused_hinted", len(crossed) >= KEEP - 1
         and all(x[1] > 0 for x in crossed) and sum(x[2] for x in crossed) > 0,
         "crossed %r; src last %r" % (crossed, sref[-1:]))


def case_control(d, vms):
    """The check bites: a page skipped on purpose is reported BAD."""
    name = "balloon_reuse_control"
    cmd = "workload=fill-free mb=256 report_ms=500 refill_ms=100 refill_mb=16 corrupt_refill=2"
    vm = kt.kmig_vm(d, "vm", cmd, memory="512M")
    vms.append(vm)
    line = vm.console.wait(r"^refill corrupt page=0x([0-9a-f]+) gen=2", 30, proc=vm.proc)
    if not R.ok(name + "_corrupted", line is not None, dump(vm)):
        return
    page = line.group(1)
    bad = vm.console.wait(r"^refill BAD page=0x[0-9a-f]+ gen=2 ", 10, proc=vm.proc)
    vm.console.wait(r"^refill ok gen=4 ", 10, proc=vm.proc)
    text = vm.console.text()
    bads = re.findall(r"^refill BAD page=0x([0-9a-f]+) gen=(\d+) word=(\d+)", text, re.M)
    R.ok(name + "_bad_reported", bad is not None and len(bads) == 1 
         and bads[0][0] == page and bads[0][1] == "2" and bads[0][2] == "0", dump(vm))
    R.ok(name + "_bad_summary", re.search(r"^refill bad_pages=1 gen=2 ", text, re.M) is not None,
         dump(vm))
    gens = [x[0] for x in refills(text.splitlines())]
    R.ok(name + "_others_ok", 1 in gens and 3 in gens and 2 not in gens, repr(gens))


def main():
    if not kt.have_kvm():
        R.skip("balloon_reuse", "no /dev/kvm")
        return
    d = kt.tmpdir()
    try:
        run_case("balloon_reuse_control", case_control, d)
        run_case("balloon_reuse", case_reuse, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
    R.done()
