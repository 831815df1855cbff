"""The soak: one verify guest migrated from kmig process to kmig process N
times with x-verify, the configuration changing at every hop.

A kmig that has migrated its guest away stays in `postmigrate` and takes
no incoming migration (as QEMU), so "back and forth" is between two slots:
each hop starts a fresh destination in the other slot (its own QMP socket,
console and port), migrates, checks, and ends the old source.

Each hop must complete, pass x-verify (the destination hashes all RAM),
and the guest must go on verifying on the destination (a "verify ok"
report from every vCPU with a later round, never "verify BAD").  The
summary counts hops, failures, the RAM pages x-verify covered and the
pages the guest checked itself, and gives the spread (min, median, max)
of total time, downtime and the guest's largest pause per hop.
"""
import json
import os
import re
import statistics
import time

import kmigtest as kt

# (name, capabilities, parameters); every hop also sets x-verify
CONFIGS = [
    ("plain", {}, {}),
    ("multifd", {"multifd": True}, {"multifd-channels": 2, "x-compression": "none"}),
    ("multifd-zstd", {"multifd": True}, {"multifd-channels": 2, "x-compression": "zstd"}),
    ("lz4", {}, {"x-compression": "lz4"}),
    ("computed", {"auto-converge": True}, {"x-cpu-throttle-policy": "computed"}),
]
OK_RX = re.compile(r"^verify ok round=(\d+) cpu=(\d+) pages=(\d+) max_gap_ms=(\d+) "
                   r"tsc_back_us=(\d+)", re.M)


def spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


class Soak:
    def __init__(self, d, cpus=2, mb=8, memory="128M", log=print):
        self.d, self.cpus, self.log = d, cpus, log
        self.cmd = "workload=verify mb=%d cpus=%d report_ms=200" % (mb, cpus)
        self.memory = memory
        self.vms = []
        self.hops = []
        self.failures = []
        self.guest_pages = 0

    def start(self, slot, hop, incoming=None):
        # the ring on even slots, the bitmap on odd ones: hops alternate
        extra = ["--dirty-ring", "4096"] if slot == 0 else []
        if incoming:
            extra += ["--incoming", incoming]
        vm = kt.kmig_vm(self.d, "s%d_h%d" % (slot, hop), self.cmd, memory=self.memory,
                        cpus=self.cpus, extra=extra)
        self.vms.append(vm)
        return vm

    def reports(self, vm):
        return [tuple(map(int, m)) for m in OK_RX.findall(vm.console.text())]

    def goes_on(self, dst, after_round, timeout):
        """Every vCPU reports a round after after_round on dst; no BAD line
        and no TSC step back."""
        deadline = time.time() + timeout
        while time.time() < deadline and dst.proc.poll() is None:
            text = dst.console.text()
            reps = self.reports(dst)
            if "verify BAD" in text or any(b for _, _, _, _, b in reps):
                return False, None
            cpus = {c for r, c, _, _, _ in reps if r > after_round}
            if len(cpus) >= self.cpus:
                gaps = [g for _, _, _, g, _ in reps[:self.cpus * 2]]
                return True, max(gaps) if gaps else None
            time.sleep(0.1)
        return False, None

    def hop(self, i, src):
        name, caps, params = CONFIGS[i % len(CONFIGS)]
        slot = (i + 1) % 2
        uri = "tcp:127.0.0.1:%d" % kt.free_port()
        dst = self.start(slot, i + 1, uri)
        caps = dict(caps, **{"x-verify": True})
        # each process is fresh: only this hop's capabilities are on
        last_round = max([r for r, _, _, _, _ in self.reports(src)] or [0])
        r = kt.migrate(src, dst, uri, caps=caps, params=dict(params), timeout=kt.slow(120))
        ok = r.get("status") == "completed"
        alive, gap = self.goes_on(dst, last_round, kt.slow(30)) if ok else (False, None)
        rec = {"hop": i + 1, "config": name, "to": "ring4096" if slot == 0 else "bitmap",
               "status": r.get("status"), "error": r.get("error-desc"),
               "total_ms": r.get("total-time"), "downtime_ms": r.get("downtime"),
               "guest_gap_ms": gap, "dirty_sync_count": r.get("ram", {}).get("dirty-sync-count"),
               "ram_pages": r.get("ram", {}).get("total", 0) // 4096, "guest_ok": alive}
        self.hops.append(rec)
        if not ok or not alive:
            self.failures.append(rec)
            self.log("# soak hop %d (%s): FAILED %r; src %s; dst %s"
                     % (i + 1, name, rec, kt.dump(src), kt.dump(dst)))
        self.guest_pages += sum(p for _, _, p, _, _ in self.reports(src))
        src.kill()
        return dst if ok else None

    def run(self, n):
        src = self.start(0, 0)
        if not src.console.wait(OK_RX.pattern, kt.slow(40), proc=src.proc):
            self.failures.append({"hop": 0, "error": "the guest did not start: %s" % kt.dump(src)})
            return self.summary(n)
        for i in range(n):
            nxt = self.hop(i, src)
            if nxt is None:
                break
            src = nxt
            if (i + 1) % 10 == 0:
                self.log("# soak: %d of %d hops, %d failures" % (i + 1, n, len(self.failures)))
        else:
            self.guest_pages += sum(p for _, _, p, _, _ in self.reports(src))
        return self.summary(n)

    def summary(self, n):
        done = [h for h in self.hops if h["status"] == "completed" and h["guest_ok"]]
        return {
            "hops_planned": n, "hops_done": len(done), "failures": len(self.failures),
            "xverify_pages": sum(h["ram_pages"] for h in done),
            "guest_checked_pages": self.guest_pages,
            "total_ms": spread([h["total_ms"] for h in done]),
            "downtime_ms": spread([h["downtime_ms"] for h in done]),
            "guest_gap_ms": spread([h["guest_gap_ms"] for h in done]),
            "configs": [c[0] for c in CONFIGS], "cpus": self.cpus,
            "first_failure": self.failures[0] if self.failures else None,
        }

    def close(self):
        for vm in self.vms:
            vm.kill()


def write(summary, hops, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({"summary": summary, "hops": hops}, f, indent=1)
