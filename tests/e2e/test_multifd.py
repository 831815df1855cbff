"""Live migration over parallel channels (capability multifd): pages on
extra TCP connections, synchronised per round; lossless with and without
compression, and failure-safe."""
import os
import re
import signal
import subprocess
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

VERIFY = "workload=verify mb=128 cpus=2 report_ms=300"
STRESS192 = "workload=stress mb=192 cpus=2 report_ms=300"
MIB = 1 << 20
STRESS_REPORT = re.compile(r"^stress cpu=(\d+) t_ms=(\d+) ms_per_gib=([\d.]+) ")


def stress_warm(vm, cpus=(0, 1), timeout=10):
    """Waits until each CPU's stress workload has written every page of its
    share (docs/guest.md): a report whose ms_per_gib is below half its t_ms
    comes only after the first GiB of page writes (more than one round)
    completed; until then a report gives the time the first GiB has taken
    so far, t_ms less the ~0.1 s before the workload started.  Under
    emulation that first round takes seconds: a migration started earlier
    has little to send and may end before the test can kill or cancel it."""
    deadline = time.time() + kt.slow(timeout)
    warm = set()
    while time.time() < deadline and vm.proc.poll() is None:
        vm.console.poll()
        for line in vm.console.lines:
            m = STRESS_REPORT.search(line)
            if m and float(m.group(3)) < int(m.group(2)) / 2:
                warm.add(int(m.group(1)))
        if warm >= set(cpus):
            return True
        time.sleep(0.1)
    return False


def midstream(q, timeout=30):
    """Waits until the migration is active with more than 4 MiB sent; returns
    the last query-migrate reply."""
    deadline = time.time() + kt.slow(timeout)
    while True:
        r = q.cmd("query-migrate")
        if r.get("status") in kt.MIG_FINAL or time.time() > deadline or (
                r.get("status") == "active" and r.get("ram", {}).get("transferred", 0) > 4 * MIB):
            return r
        time.sleep(0.05)


def pair(d, name, cmdline, extra=()):
    port = kt.free_port()
    src = kt.kmig_vm(d, name + "-src", cmdline, memory="512M", cpus=2, extra=list(extra))
    dst = kt.kmig_vm(d, name + "-dst", cmdline, memory="512M", cpus=2,
                     extra=list(extra) + ["--incoming", "tcp:127.0.0.1:%d" % port])
    return src, dst, "tcp:127.0.0.1:%d" % port


def dst_verifies(check, dst):
    """The migrated verify guest goes on checking its pages on both vCPUs
    of the destination, none bad."""
    dst.console.poll()
    n = len(dst.console.lines)
    ok = [dst.console.wait(r"verify ok round=\d+ cpu=%d" % c, timeout=kt.slow(20), start=n)
          for c in (0, 1)]
    check("both_vcpus_verify_on_destination", all(ok), dst.console.text()[-500:])
    check("no_verify_bad", dst.console.count("verify BAD") == 0)


@pytest.mark.parametrize("channels,compression,extra", [
    pytest.param(2, "none", ["--dirty-ring", "0"], id="2_plain"),
    pytest.param(4, "lz4", ["--dirty-ring", "4096"], id="4_lz4_ring"),
])
def test_verify(d, vms, check, channels, compression, extra):
    src, dst, uri = pair(d, "verify", VERIFY, extra)
    vms += [src, dst]
    check("boot", src.console.wait(r"kmig-guest ready cpus=2", timeout=kt.slow(20)) is not None)
    time.sleep(1)
    res = kt.migrate(src, dst, uri, caps={"multifd": True, "x-verify": True},
                     params={"multifd-channels": channels, "x-compression": compression,
                             "max-bandwidth": 0, "downtime-limit": 500}, timeout=kt.slow(60))
    check("completed", res.get("status") == "completed", "query-migrate %r" % res)
    dst_verifies(check, dst)
    check("destination_reports_channels", "%d multifd channels" % channels in dst.output(),
          dst.output())


def test_zero_copy(d, vms, check):
    """zero-copy-send (QEMU's): the channels send the verify guest's pages
    with MSG_ZEROCOPY under a rate limit while it rewrites them; x-verify
    and the guest's own check on the destination pass.  Over loopback the
    kernel copies after all, which every SYNC counts
    (dirty-sync-missed-zero-copy, at most one per channel and pass), and
    kmig migrate --zero-copy, which drives it, says.  Refused as QEMU
    refuses it: without multifd, with compressed channels; and to a unix:
    URI (MSG_ZEROCOPY is TCP's); --zero-copy without --multifd."""
    src, dst, uri = pair(d, "zc", VERIFY)
    vms += [src, dst]
    check("boot", src.console.wait(r"kmig-guest ready cpus=2", timeout=kt.slow(20)) is not None)
    q = src.qmp()
    only = "Zero copy only available for non-compressed non-TLS multifd migration"
    r = q.cmd_full("migrate-set-capabilities",
                   capabilities=[{"capability": "zero-copy-send", "state": True}])
    check("refused_without_multifd", only in r.get("error", {}).get("desc", ""), repr(r))
    q.cmd("migrate-set-parameters", **{"x-compression": "zstd"})
    r = q.cmd_full("migrate-set-capabilities",
                   capabilities=[{"capability": "multifd", "state": True},
                                 {"capability": "zero-copy-send", "state": True}])
    check("refused_compressed", only in r.get("error", {}).get("desc", ""), repr(r))
    q.cmd("migrate-set-parameters", **{"x-compression": "none"})
    kt.set_caps(q, multifd=True, zero_copy_send=True)
    r = q.cmd_full("migrate", uri="unix:" + os.path.join(d, "zc.sock"))
    check("refused_unix", "tcp:" in r.get("error", {}).get("desc", ""), repr(r))
    cli = [kt.KMIG, "migrate", "--qmp", "unix:" + src.qmp_path, "--zero-copy"]
    p = subprocess.run(cli + [uri], capture_output=True, text=True, timeout=60)
    check("cli_needs_multifd", p.returncode != 0 and "--zero-copy needs --multifd" in p.stderr,
          "%d %s" % (p.returncode, p.stderr))
    # through kmig migrate, under a rate limit
    kt.wait_incoming(dst, kt.slow(30))
    p = subprocess.run(cli + ["--multifd", "2", "--verify", "--bandwidth", "50", "--downtime",
                              "2000", uri], capture_output=True, text=True, timeout=kt.slow(120))
    res = q.cmd("query-migrate")
    check("cli_says", p.returncode == 0 and "zero-copy: the kernel copied after all in" in
          p.stdout, "%d %s %s" % (p.returncode, p.stdout[-600:], p.stderr[-300:]))
    ram = res.get("ram", {})
    print("# zero_copy: %s, %s MiB, dirty-sync-count %s, dirty-sync-missed-zero-copy %s"
          % (res.get("status"), ram.get("transferred", 0) >> 20, ram.get("dirty-sync-count"),
             ram.get("dirty-sync-missed-zero-copy")))
    if not check("completed", res.get("status") == "completed", "query-migrate %r" % res):
        return
    missed = ram.get("dirty-sync-missed-zero-copy", -1)
    # one SYNC per channel a pass: the bulk pass, each round, the last
    check("missed_counted", 1 <= missed <= 2 * (ram.get("dirty-sync-count", 0) + 1), repr(ram))
    dst_verifies(check, dst)


def test_zero_copy_unpinnable(d, vms, check):
    """A source that may not pin the pages zero-copy sends (no
    CAP_IPC_LOCK, RLIMIT_MEMLOCK 64 KiB): the kernel refuses every send
    with ENOBUFS and no completion will ever come, so the migration fails
    within seconds, saying why, and the source runs on (before: the
    channel retried for ever and the migration never ended)."""
    wrap = os.path.join(d, "kmig-nolock")
    with open(wrap, "w") as f:
        f.write("#!/bin/sh\nulimit -l 64 || exit 1\n"
                "exec setpriv --bounding-set -ipc_lock --inh-caps -ipc_lock %s \"$@\"\n"
                % kt.KMIG)
    os.chmod(wrap, 0o755)
    port = kt.free_port()
    uri = "tcp:127.0.0.1:%d" % port
    src = kt.kmig_vm(d, "nolock-src", VERIFY, memory="512M", cpus=2, kmig=wrap)
    dst = kt.kmig_vm(d, "nolock-dst", VERIFY, memory="512M", cpus=2, extra=["--incoming", uri])
    vms += [src, dst]
    if not check("boot", src.console.wait(r"kmig-guest ready cpus=2", timeout=kt.slow(20))
                 is not None, kt.dump(src)):
        return
    res = kt.migrate(src, dst, uri, caps={"multifd": True, "zero-copy-send": True},
                     params={"multifd-channels": 2, "max-bandwidth": 0}, timeout=kt.slow(60))
    check("failed_saying_why", res.get("status") == "failed" and
          "RLIMIT_MEMLOCK" in res.get("error-desc", ""), repr(res))
    q = src.qmp()
    check("source_runs", q.cmd("query-status").get("status") == "running", kt.dump(src))
    src.console.poll()
    n = len(src.console.lines)
    check("guest_goes_on", src.console.wait(r"verify ok round=\d+ cpu=0", timeout=kt.slow(20),
                                            start=n) is not None, kt.dump(src))
    deadline = time.time() + kt.slow(10)
    while q.cmd("query-migrationthreads") and time.time() < deadline:
        time.sleep(0.05)
    check("no_threads_left", q.cmd("query-migrationthreads") == [],
          repr(q.cmd("query-migrationthreads")))


def test_stress_zstd(d, vms, check):
    """A stress guest that takes a few rounds, with zstd on 3 channels."""
    src, dst, uri = pair(d, "stress", "workload=stress mb=96 cpus=2 report_ms=300")
    vms += [src, dst]
    check("boot", src.console.wait(r"kmig-guest ready", timeout=kt.slow(20)) is not None,
          kt.dump(src))
    q = src.qmp()
    q.cmd("migrate-set-capabilities", capabilities=[{"capability": "events", "state": True}])
    res = kt.migrate(src, dst, uri, caps={"multifd": True},
                     params={"multifd-channels": 3, "x-compression": "zstd", "max-bandwidth": 0,
                             "downtime-limit": 1000}, timeout=kt.slow(90))
    check("completed", res.get("status") == "completed", "%r" % res)
    dst.console.poll()
    n = len(dst.console.lines)
    check("destination_runs",
          dst.console.wait(r"^stress cpu=1", timeout=kt.slow(15), start=n) is not None)


def test_kill_destination_then_retry(d, vms, check):
    """The destination dies in the middle: the source fails, keeps running,
    and a retry to a new destination completes."""
    src, dst, uri = pair(d, "kill", STRESS192)
    vms += [src, dst]
    check("boot", src.console.wait(r"kmig-guest ready", timeout=kt.slow(20)) is not None,
          kt.dump(src))
    check("stress_warm", stress_warm(src), kt.dump(src))
    q = src.qmp()
    q.cmd("migrate-set-capabilities", capabilities=[{"capability": "multifd", "state": True}])
    q.cmd("migrate-set-parameters", **{"multifd-channels": 2, "max-bandwidth": 20000000,
                                       "downtime-limit": 300})
    kt.wait_incoming(dst, kt.slow(30))
    q.cmd("migrate", uri=uri)
    # the bulk pass of 192 MiB at 20 MB/s takes ~10 s: kill in it
    r = midstream(q)
    check("midstream", r.get("status") == "active", repr(r))
    os.killpg(dst.proc.pid, signal.SIGKILL)
    res = kt.wait_migration(q, timeout=kt.slow(30))
    print("# kill: error-desc %r" % res.get("error-desc"))
    check("source_failed", res.get("status") == "failed", "%r" % res)
    st = q.cmd("query-status")
    check("source_running", st["status"] == "running", "%r" % st)
    n = len(src.console.lines)
    check("source_prints", src.console.wait(r"^stress", timeout=kt.slow(10), start=n) is not None)
    port = kt.free_port()
    dst2 = kt.kmig_vm(d, "kill-dst2", STRESS192, memory="512M", cpus=2,
                      extra=["--incoming", "tcp:127.0.0.1:%d" % port])
    vms.append(dst2)
    res = kt.migrate(src, dst2, "tcp:127.0.0.1:%d" % port,
                     params={"max-bandwidth": 0, "downtime-limit": 1000}, timeout=kt.slow(90))
    check("retry_completed", res.get("status") == "completed", "%r" % res)


def check_threads(check, src, dst):
    """query-migrationthreads (QEMU 7.2's) mid-migration with 2 channels:
    the source lists its migration thread and both channels' workers, by
    QEMU's names, each a thread of the kmig process with kmig's own name
    for it; the destination lists none (QEMU lists the sending side's)."""
    got = src.qmp().cmd("query-migrationthreads")
    comm = {"live_migration": "migration", "multifdsend_0": "multifd1",
            "multifdsend_1": "multifd2"}
    check("threads_listed", sorted(t.get("name") for t in got) == sorted(comm), repr(got))
    for t in got:
        path = "/proc/%d/task/%s/comm" % (src.proc.pid, t.get("thread-id"))
        try:
            with open(path) as f:
                name = f.read().strip()
        except OSError as e:
            name = str(e)
        check("thread_" + str(t.get("name")), name == comm.get(t.get("name")),
              "%s: %r" % (path, name))
    check("dst_no_threads", dst.qmp().cmd("query-migrationthreads") == [], "")


def test_cancel(d, vms, check):
    """Cancel while pages flow on the channels (query-migrationthreads
    lists them then, and nothing after)."""
    src, dst, uri = pair(d, "cancel", STRESS192)
    vms += [src, dst]
    check("boot", src.console.wait(r"kmig-guest ready", timeout=kt.slow(20)) is not None,
          kt.dump(src))
    check("stress_warm", stress_warm(src), kt.dump(src))
    q = src.qmp()
    q.cmd("migrate-set-capabilities", capabilities=[{"capability": "multifd", "state": True}])
    q.cmd("migrate-set-parameters", **{"multifd-channels": 2, "max-bandwidth": 20000000})
    kt.wait_incoming(dst, kt.slow(30))
    q.cmd("migrate", uri=uri)
    r = midstream(q)
    check("midstream", r.get("status") == "active", repr(r))
    check_threads(check, src, dst)
    q.cmd("migrate_cancel")
    res = kt.wait_migration(q, timeout=kt.slow(30))
    check("cancelled", res.get("status") == "cancelled", "%r" % res)
    deadline = time.time() + kt.slow(10)
    while q.cmd("query-migrationthreads") and time.time() < deadline:
        time.sleep(0.05)
    check("threads_gone", q.cmd("query-migrationthreads") == [],
          repr(q.cmd("query-migrationthreads")))
    check("source_running", q.cmd("query-status")["status"] == "running")
    check("destination_exits_nonzero", dst.wait_exit(kt.slow(15)) not in (None, 0),
          "exit %r" % dst.proc.poll())


def test_bad_parameters_refused(d, vms, check):
    src = kt.kmig_vm(d, "params", "workload=idle", memory="256M")
    vms.append(src)
    q = src.qmp()
    for v in (0, 17):
        rep = q.cmd_full("migrate-set-parameters", **{"multifd-channels": v})
        check("channels_%d_refused" % v, "error" in rep, "%r" % rep)
    rep = q.cmd_full("migrate-set-parameters", **{"x-compression": "gzip"})
    check("compression_gzip_refused", "error" in rep, "%r" % rep)
    # QEMU's names: multifd-compression has no lz4 (x-compression has)
    for name, value in (("multifd-compression", "lz4"), ("multifd-compression", "gzip"),
                        ("multifd-zstd-level", 21), ("multifd-zlib-level", 10),
                        ("multifd-zlib-level", -1)):
        rep = q.cmd_full("migrate-set-parameters", **{name: value})
        check("%s_%s_refused" % (name, value), "error" in rep, "%r" % rep)
    p = q.cmd("query-migrate-parameters")
    check("qemu_defaults", (p["multifd-compression"], p["multifd-zstd-level"],
                            p["multifd-zlib-level"]) == ("none", 1, 1), "%r" % p)
    want = {"multifd-compression": "zstd", "multifd-zstd-level": 20, "multifd-zlib-level": 0,
            "x-compression": "zlib"}
    q.cmd("migrate-set-parameters", **want)
    p = q.cmd("query-migrate-parameters")
    check("accepted_and_shown", all(p[k] == v for k, v in want.items()), "%r" % p)


def test_qemu_compression_names(d, vms, check):
    """QEMU's multifd-compression and multifd-zlib-level choose what the
    channels compress with: every page arrives whole (x-verify) and the
    links carry a fraction of the bytes the pages hold (the guest fills
    64 MiB with a pattern that compresses many times over, then idles)."""
    src, dst, uri = pair(d, "qnames", "workload=fill-free mb=64 report_ms=300")
    vms += [src, dst]
    check("filled", src.console.wait(r"^fill-free done", kt.slow(60), proc=src.proc) is not None,
          kt.dump(src))
    res = kt.migrate(src, dst, uri, caps={"multifd": True, "x-verify": True},
                     params={"multifd-channels": 2, "multifd-compression": "zlib",
                             "multifd-zlib-level": 6, "max-bandwidth": 0,
                             "downtime-limit": 1000}, timeout=kt.slow(90))
    check("completed", res.get("status") == "completed", "%r" % res)
    ram = res.get("ram", {})
    print("# zlib level 6 on 2 channels: %d bytes sent for %d bytes of pages"
          % (ram.get("transferred", 0), ram.get("normal-bytes", 0)))
    check("compressed", 0 < ram.get("transferred", 0) * 2 < ram.get("normal-bytes", 0), "%r" % ram)
    # the pages went on the channels: most of what was sent is theirs
    check("multifd_bytes", ram.get("transferred", 0) / 2 < ram.get("multifd-bytes", 0)
          <= ram.get("transferred", 0), "%r" % ram)
    check("destination_runs", dst.qmp().cmd("query-status").get("status") == "running")
