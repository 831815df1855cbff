"""The verification matrix: a guest that keeps writing (workload verify)
migrated with x-verify in every configuration kmig advertises, and every
page checked twice: by the destination (x-verify's whole-RAM hash) and by
the guest itself, which checks each page before it rewrites it and after
each round, on the source before and on the destination after.

Dimensions: tracking backend (bitmap, ring of 256, 4096, 65536 entries),
convergence policy (none at unlimited bandwidth; auto-converge with the
step or the computed throttle; dirty-limit, which needs the ring),
parallel channels (off; multifd with 2 channels; multifd with zstd),
free page hints (off; the balloon driver bound, hints on), 1 and 2 vCPUs,
the disk (none; virtio-blk on one image both sides open, shared storage;
an image each, the disk in the stream with x-block-migration) with the
guest's disk workload checking every block it wrote.
MATRIX is a pairwise cut of them: every pair of values of two dimensions
appears in some case (dirty-limit pairs only with the ring).  CI runs the
cases marked ci (every value of every dimension at least once);
KMIG_TEST_FULL=1 (make test-full) runs all.  docs/testing.md has the table.

Each case also compares the downtime the source reports with what the
guest saw: the longest pause between its progress points around the
switchover (max_gap_ms of the destination's first report, docs/guest.md).
That report also spans the last moments on the source, where a throttled
vCPU may have slept up to about a second; test_migrate_clock measures the
switchover alone with an idle guest's heartbeat.
"""
import os
import re
import time

import pytest

import blkguest
import kmigtest as kt

pytestmark = pytest.mark.kvm

# name: backend, policy, multifd, hints, cpus, disk, ci
MATRIX = [
    ("bitmap",    "none",        "off",  False, 1, "stream", True),
    ("ring256",   "step",        "off",  True,  2, "shared", True),
    ("ring4096",  "computed",    "zstd", False, 2, "none",   True),
    ("ring65536", "dirty-limit", "on",   True,  1, "stream", True),
    ("bitmap",    "computed",    "on",   False, 2, "shared", True),
    ("ring4096",  "dirty-limit", "off",  True,  2, "none",   True),
    ("bitmap",    "step",        "zstd", True,  1, "none",   False),
    ("bitmap",    "none",        "zstd", False, 2, "shared", False),
    ("ring256",   "none",        "on",   False, 1, "none",   False),
    ("ring256",   "computed",    "off",  True,  1, "stream", False),
    ("ring256",   "dirty-limit", "zstd", False, 2, "shared", False),
    ("ring4096",  "none",        "zstd", True,  1, "stream", False),
    ("ring4096",  "step",        "on",   False, 1, "shared", False),
    ("ring65536", "none",        "off",  True,  2, "shared", False),
    ("ring65536", "step",        "zstd", False, 2, "stream", False),
    ("ring65536", "computed",    "on",   True,  1, "none",   False),
]
# the disk workload beside verify (docs/guest.md): 8 MiB of 4 KiB blocks,
# each read, checked and rewritten, 200 a second (a steady writer, not a
# flood the link could never keep up with)
DISK_CMD = " disk=1 disk_mb=8 disk_rate=200"

FULL = os.environ.get("KMIG_TEST_FULL") == "1"
if not kt.emulated():
    MEMORY, MB_PER_CPU, BANDWIDTH, DIRTY_LIMIT = "512M", 96, 125000000, 20
else:   # the emulated guest writes ~10-20 MB/s: a smaller share, a slower link
    MEMORY, MB_PER_CPU, BANDWIDTH, DIRTY_LIMIT = "128M", 16, 8000000, 2
DOWNTIME_LIMIT_MS = 300
THROTTLE_SLEEP_MS = 1000   # a 99 % throttle: 990 ms of sleep per 10 ms slice
OK_RX = r"^verify ok round=(\d+) cpu=%d pages=\d+ max_gap_ms=(\d+) tsc_back_us=(\d+)"


def case_id(c):
    return "%s-%s-mf_%s-%s-%dcpu-disk_%s" % (c[0], c[1], c[2], "hints" if c[3] else "nohints",
                                            c[4], c[5])


def cases():
    return [pytest.param(*c[:6], id=case_id(c)) for c in MATRIX if FULL or c[6]]


def vmm_args(backend, hints):
    args = ["--dirty-ring", backend[4:] if backend.startswith("ring") else "0"]
    return args + (["--balloon"] if hints else [])


def disk_args(d, disk, side):
    """virtio-blk for one side: shared, one image; stream, one each."""
    if disk == "none":
        return []
    return blkguest.blk_args(blkguest.image(d, "%s.img" % (side if disk == "stream" else "disk"),
                                            32 << 20))


def migration_settings(policy, multifd, disk="none"):
    # a fresh VM has every capability off: only those switched on are set
    on = {"x-verify": True, "auto-converge": policy in ("step", "computed"),
          "dirty-limit": policy == "dirty-limit", "multifd": multifd != "off",
          "x-block-migration": disk == "stream"}
    caps = {k: True for k, v in on.items() if v}
    params = {"downtime-limit": DOWNTIME_LIMIT_MS,
              "max-bandwidth": 0 if policy == "none" else BANDWIDTH}
    if policy in ("step", "computed"):
        params["x-cpu-throttle-policy"] = policy
    if policy == "dirty-limit":
        params.update({"vcpu-dirty-limit": DIRTY_LIMIT, "x-vcpu-dirty-limit-period": 1000})
    if multifd != "off":
        params.update({"multifd-channels": 2, "x-compression": "zstd" if multifd == "zstd"
                       else "none"})
    return caps, params


def reports(vm, cpu):
    return [(int(r), int(g), int(b))
            for r, g, b in re.findall(OK_RX % cpu, vm.console.text(), re.M)]


def dst_reports(dst, cpus, n=2, timeout=30):
    """Waits for n reports of each CPU on the destination (or a BAD line)."""
    deadline = time.time() + kt.slow(timeout)
    while time.time() < deadline and dst.proc.poll() is None:
        if "verify BAD" in dst.console.text():
            break
        if all(len(reports(dst, c)) >= n for c in range(cpus)):
            break
        time.sleep(0.2)
    return [reports(dst, c) for c in range(cpus)]


@pytest.mark.parametrize("backend,policy,multifd,hints,cpus,disk", cases())
def test_matrix(d, vms, check, backend, policy, multifd, hints, cpus, disk):
    cmd = "workload=verify mb=%d cpus=%d report_ms=300%s%s" % (
        MB_PER_CPU, cpus, " balloon=1 balloon_hint=1" if hints else "",
        DISK_CMD if disk != "none" else "")
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    extra = vmm_args(backend, hints)
    src = kt.kmig_vm(d, "src", cmd, memory=MEMORY, cpus=cpus,
                     extra=extra + disk_args(d, disk, "src"))
    dst = kt.kmig_vm(d, "dst", cmd, memory=MEMORY, cpus=cpus,
                     extra=extra + disk_args(d, disk, "dst") + ["--incoming", uri])
    vms += [src, dst]
    ready = all(src.console.wait(OK_RX % c, kt.slow(40), proc=src.proc) for c in range(cpus))
    if not check("boot", ready, kt.dump(src)):
        return
    if disk != "none" and not check("disk_runs", src.console.wait(
            r"^disk ok round=", kt.slow(40), proc=src.proc), kt.dump(src)):
        return
    if hints and not check("balloon_bound", src.console.wait(r"^balloon bound", kt.slow(20),
                                                             proc=src.proc), kt.dump(src)):
        return
    caps, params = migration_settings(policy, multifd, disk)
    r = kt.migrate(src, dst, uri, caps=caps, params=params, timeout=kt.slow(90))
    if not check("completed", r.get("status") == "completed",
                 "query-migrate %r; src %s; dst %s" % (r, kt.dump(src), kt.dump(dst))):
        return
    src_last = [max([x[0] for x in reports(src, c)] or [0]) for c in range(cpus)]
    after = dst_reports(dst, cpus)
    check("dst_verifies", all(len(a) >= 2 and a[0][0] >= s for a, s in zip(after, src_last)),
          "source's last rounds %r, destination's reports %r; %s"
          % (src_last, after, kt.dump(dst)))
    if disk != "none":
        check("disk_goes_on", blkguest.goes_on(dst, kt.slow(30)), kt.dump(dst))
    bad = [ln for ln in (src.console.text() + dst.console.text()).splitlines()
           if "verify BAD" in ln or "bad_pages" in ln] + blkguest.bad_lines(src) + \
        blkguest.bad_lines(dst)
    check("no_bad", not bad, " / ".join(bad[:4]))
    back = [x[2] for c in range(cpus) for x in reports(dst, c) + reports(src, c)]
    check("clock_never_back", not any(back), "a vCPU's TSC went back (us): %r" % back)
    if hints:
        check("hints_skipped_pages", r.get("x-free-pages-skipped", 0) > 0, repr(r))
    # the guest's view of the switchover: its longest pause in the first
    # report on the destination
    gap = max([a[0][1] for a in after if a] or [-1])
    down = r.get("downtime", -1)
    print("# matrix %s: total %s ms, downtime %s ms (guest saw %d ms), rounds %s, "
          "throttle %s%%, transferred %.1f MiB, hinted-skipped %s, disk %s"
          % (case_id((backend, policy, multifd, hints, cpus, disk)), r.get("total-time"), down, gap,
             r.get("ram", {}).get("dirty-sync-count"), r.get("cpu-throttle-percentage"),
             r.get("ram", {}).get("transferred", 0) / 2 ** 20, r.get("x-free-pages-skipped"),
             r.get("disk")))
    # The guest cannot see much less than the pause (its clock runs on
    # across it), nor, beyond its progress granularity and scheduling,
    # more.  A throttled vCPU also sleeps up to THROTTLE_SLEEP_MS in one
    # 10 ms slice before the switchover, inside the same report.
    slack = kt.slow(250) + (THROTTLE_SLEEP_MS if policy != "none" else 0)
    check("guest_gap_vs_downtime", gap >= 0 and down >= 0
          and down / 2 - 50 <= gap <= down + slack,
          "guest saw %d ms, the source reported %d ms (slack %d ms)" % (gap, down, slack))
