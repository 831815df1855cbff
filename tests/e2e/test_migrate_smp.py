"""Live migration of a 2-vCPU guest (cpus=2): verify and stress workloads,
on the bitmap and the dirty-ring backend.  Both vCPUs must come up, the
migration must complete, and on the destination both vCPUs must go on with
their workload (verify: no lost page, rounds growing on each CPU).
"""
import re
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm


def dump(vm, n=12):
    return kt.dump(vm, n)


def rounds(text, cpu):
    return [int(x) for x in re.findall(r"^verify ok round=(\d+) cpu=%d " % cpu, text, re.M)]


@pytest.mark.parametrize("workload,backend", [
    ("verify", "bitmap"),
    ("verify", "ring"),
    ("stress", "bitmap"),
    ("stress", "ring"),
])
def test_smp(d, vms, check, workload, backend):
    extra = ["--dirty-ring", "4096" if backend == "ring" else "0"]
    cmd = "workload=%s mb=64 cpus=2 report_ms=300" % workload
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    src = kt.kmig_vm(d, "src", cmd, memory="256M", cpus=2, extra=extra)
    vms.append(src)
    dst = kt.kmig_vm(d, "dst", cmd, memory="256M", cpus=2,
                     extra=extra + ["--incoming", uri])
    vms.append(dst)
    line = r"^verify ok round=\d+ cpu=%d " if workload == "verify" else r"^stress cpu=%d "
    ready = src.console.wait(r"^kmig-guest ready cpus=(\d+)", kt.slow(60), proc=src.proc)
    if not check("two_cpus", ready is not None and ready.group(1) == "2", dump(src)):
        return
    up = all(src.console.wait(line % c, kt.slow(40), proc=src.proc) is not None for c in (0, 1))
    if not check("boot", up, dump(src)):
        return
    caps = {"auto-converge": True}
    if workload == "verify":
        caps["x-verify"] = True
    # default bandwidth (128 MiB/s) and downtime limit (300 ms): both vCPUs
    # dirty memory, so dirty rounds follow the bulk pass until auto-converge
    # throttles them enough
    r = kt.migrate(src, dst, uri, caps=caps, timeout=kt.slow(75))
    print("# smp_%s_%s: status %s, total-time %s ms, downtime %s ms, dirty-sync-count %s"
          % (workload, backend, r.get("status"), r.get("total-time"), r.get("downtime"),
             r.get("ram", {}).get("dirty-sync-count")))
    if not check("completed", r.get("status") == "completed",
                 "%r; src %s; dst %s" % (r, dump(src), dump(dst))):
        return
    check("states", src.qmp().cmd("query-status").get("status") == "postmigrate"
          and dst.qmp().cmd("query-status").get("status") == "running",
          "%s / %s" % (dump(src), dump(dst)))
    if workload == "verify":
        src_last = {c: max(rounds(src.console.text(), c) or [0]) for c in (0, 1)}
        deadline = time.time() + kt.slow(30)
        while time.time() < deadline:
            t = dst.console.text()
            if all(len(rounds(t, c)) >= 3 for c in (0, 1)) or "verify BAD" in t \
                    or dst.proc.poll() is not None:
                break
            time.sleep(0.2)
        t = dst.console.text()
        for c in (0, 1):
            rs = rounds(t, c)
            check("dst_cpu%d_verify_ok" % c,
                  len(rs) >= 3 and rs == sorted(rs) and len(set(rs)) == len(rs)
                  and rs[0] >= src_last[c],
                  "src last round %d, dst rounds %r; %s" % (src_last[c], rs, dump(dst)))
        bad = [l for l in (src.console.text() + "\n" + t).splitlines()
               if "verify BAD" in l or "bad_pages" in l]
        check("no_bad", not bad, " / ".join(bad[:5]))
    else:
        # each vCPU goes on reporting on the destination (two lines each)
        deadline = time.time() + kt.slow(20)
        while time.time() < deadline and dst.proc.poll() is None and \
                not all(dst.console.count(line % c) >= 2 for c in (0, 1)):
            time.sleep(0.1)
        for c in (0, 1):
            check("dst_cpu%d_stress" % c, dst.console.count(line % c) >= 2, dump(dst))
