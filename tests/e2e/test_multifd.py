"""Live migration over parallel channels (capability multifd): pages on
extra TCP connections, synchronised per round; lossless with and without
compression, and failure-safe."""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from kmigtest import (Report, free_port, have_kvm, kmig_vm, migrate, tmpdir,  # noqa: E402
                      wait_incoming, wait_migration)

r = Report()
if not have_kvm():
    r.skip("multifd", "no /dev/kvm")
    r.done()

d = tmpdir()
VERIFY = "workload=verify mb=128 cpus=2 report_ms=300"


def pair(name, cmdline, extra=()):
    port = free_port()
    src = kmig_vm(d, name + "-src", cmdline, memory="512M", cpus=2, extra=extra)
    dst = kmig_vm(d, name + "-dst", cmdline, memory="512M", cpus=2,
                  extra=list(extra) + ["--incoming", "tcp:127.0.0.1:%d" % port])
    return src, dst, "tcp:127.0.0.1:%d" % port


def verify_case(name, channels, compression, extra=()):
    src, dst, uri = pair(name, VERIFY, extra)
    try:
        r.ok(name + "_boot", src.console.wait(r"kmig-guest ready cpus=2", timeout=20) is not None)
        time.sleep(1)
        res = migrate(src, dst, uri, caps={"multifd": True, "x-verify": True},
                      params={"multifd-channels": channels, "x-compression": compression,
                              "max-bandwidth": 0, "downtime-limit": 500}, timeout=60)
        r.ok(name + "_completed", res.get("status") == "completed", "query-migrate %r" % res)
        dst.console.poll()
        n = len(dst.console.lines)
        ok = [dst.console.wait(r"verify ok round=\d+ cpu=%d" % c, timeout=20, start=n) for c in (0, 1)]
        r.ok(name + "_both_vcpus_verify_on_destination", all(ok), dst.console.text()[-500:])
        r.ok(name + "_no_verify_bad", dst.console.count("verify BAD") == 0)
        r.ok(name + "_destination_reports_channels", "%d multifd channels" % channels in dst.output(),
             dst.output())
    finally:
        src.kill()
        dst.kill()


verify_case("multifd2_plain", 2, "none")
verify_case("multifd4_lz4_ring", 4, "lz4", extra=["--dirty-ring", "4096"])

# A stress guest that takes a few rounds, with zstd on 3 channels.
src, dst, uri = pair("multifd_stress", "workload=stress mb=96 cpus=2 report_ms=300")
try:
    src.console.wait(r"kmig-guest ready", timeout=20)
    q = src.qmp()
    q.cmd("migrate-set-capabilities", capabilities=[{"capability": "events", "state": True}])
    res = migrate(src, dst, uri, caps={"multifd": True},
                  params={"multifd-channels": 3, "x-compression": "zstd", "max-bandwidth": 0,
                          "downtime-limit": 1000}, timeout=90)
    r.ok("multifd_stress_completed", res.get("status") == "completed", "%r" % res)
    dst.console.poll()
    n = len(dst.console.lines)
    r.ok("multifd_stress_destination_runs",
         dst.console.wait(r"^stress cpu=1", timeout=15, start=n) is not None)
finally:
    src.kill()
    dst.kill()

# The destination dies in the middle: the source fails, keeps running, and a
# retry to a new destination completes.
src, dst, uri = pair("multifd_kill", "workload=stress mb=192 cpus=2 report_ms=300")
try:
    src.console.wait(r"kmig-guest ready", timeout=20)
    q = src.qmp()
    q.cmd("migrate-set-capabilities", capabilities=[{"capability": "multifd", "state": True}])
    q.cmd("migrate-set-parameters", **{"multifd-channels": 2, "max-bandwidth": 20000000,
                                       "downtime-limit": 300})
    wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    time.sleep(2)
    os.killpg(dst.proc.pid, signal.SIGKILL)
    res = wait_migration(q, timeout=30)
    r.ok("multifd_kill_source_failed", res.get("status") == "failed", "%r" % res)
    st = q.cmd("query-status")
    r.ok("multifd_kill_source_running", st["status"] == "running", "%r" % st)
    n = len(src.console.lines)
    r.ok("multifd_kill_source_prints",
         src.console.wait(r"^stress", timeout=10, start=n) is not None)
    port = free_port()
    dst2 = kmig_vm(d, "multifd_kill-dst2", "workload=stress mb=192 cpus=2 report_ms=300",
                   memory="512M", cpus=2, extra=["--incoming", "tcp:127.0.0.1:%d" % port])
    try:
        res = migrate(src, dst2, "tcp:127.0.0.1:%d" % port,
                      params={"max-bandwidth": 0, "downtime-limit": 1000}, timeout=90)
        r.ok("multifd_kill_retry_completed", res.get("status") == "completed", "%r" % res)
    finally:
        dst2.kill()
finally:
    src.kill()
    dst.kill()

# Cancel while pages flow on the channels.
src, dst, uri = pair("multifd_cancel", "workload=stress mb=192 cpus=2 report_ms=300")
try:
    src.console.wait(r"kmig-guest ready", timeout=20)
    q = src.qmp()
    q.cmd("migrate-set-capabilities", capabilities=[{"capability": "multifd", "state": True}])
    q.cmd("migrate-set-parameters", **{"multifd-channels": 2, "max-bandwidth": 20000000})
    wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    time.sleep(1.5)
    q.cmd("migrate_cancel")
    res = wait_migration(q, timeout=30)
    r.ok("multifd_cancel_cancelled", res.get("status") == "cancelled", "%r" % res)
    r.ok("multifd_cancel_source_running", q.cmd("query-status")["status"] == "running")
    r.ok("multifd_cancel_destination_exits_nonzero", dst.wait_exit(15) not in (None, 0),
         "exit %r" % dst.proc.poll())
finally:
    src.kill()
    dst.kill()

# Bad parameter values are refused.
src = kmig_vm(d, "multifd_params", "workload=idle", memory="256M")
try:
    q = src.qmp()
    for v in (0, 17):
        rep = q.cmd_full("migrate-set-parameters", **{"multifd-channels": v})
        r.ok("multifd_channels_%d_refused" % v, "error" in rep, "%r" % rep)
    rep = q.cmd_full("migrate-set-parameters", **{"x-compression": "gzip"})
    r.ok("compression_gzip_refused", "error" in rep, "%r" % rep)
finally:
    src.kill()
r.done()
