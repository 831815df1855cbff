"""Stock Linux under load, migrated: Debian's own kernel (as in
test_linux.py) whose userspace runs memcheck in verify mode on every vCPU
(guest/linux/memcheck.c: each page holds its index and generation and is
checked before it is rewritten), migrated along a chain of kmig processes,
one hop per configuration, on a real x86 KVM (inside scripts/kvm-vm where
this machine's KVM cannot run Linux).

  chain[up|smp]  one Linux guest (1 vCPU on the PIC, no kvm-clock: Linux
                 times with the PIT and jiffies; 2 vCPUs with their local
                 APICs and the I/O APIC and kvm-clock on: Linux knows its
                 TSC's frequency and times with the TSC-deadline timer),
                 640 MiB, memcheck rewriting 256 MiB.  First, on its first host, a migration cancelled
                 in its bulk pass and one whose destination is killed in
                 the middle: each time the source goes on (running, its
                 dirty tracking off, memcheck still reporting with no bad
                 page).  Then the hops, each with x-verify (the destination
                 compares a checksum of all RAM, or of every page as it
                 came in post-copy) and, after it, on the destination:
                 memcheck goes on past the generation it had reached with
                 no page bad, its clock never went back, no watchdog,
                 lockup, stall, oops or warning on the console, and the
                 probe line (guest/linux/init kmig.probe) shows the RTC's,
                 the timer's and the UART's interrupts still arriving (the
                 first probe there may have heard its RTC interrupt late,
                 its wait begun on a throttled source, if the next one is
                 OK: lg.probe_verdict).  At
                 the end the balloon moves on the last destination (its
                 interrupt and queues still work).  Hops (source backend
                 -> destination backend: policy, transport):
                   ring -> bitmap   auto-converge computed
                   bitmap -> ring   auto-converge step, multifd 2 + zstd
                   ring -> ring     hybrid post-copy (x-postcopy-auto) at 16 MB/s
                   ring -> ring     dirty-limit, TLS (PSK)
                 so each backend is a source and each policy runs once.
                 `make test` runs the 1-vCPU chain whole and the first two
                 hops with 2 vCPUs; KMIG_TEST_FULL=1 (make test-full)
                 runs the 2-vCPU chain whole too.
  soak           the soak's Linux row: 24 hops, 12 under emulation (48 with
                 KMIG_TEST_FULL=1)
                 of one Linux guest, configurations and backends changing
                 every hop.
"""
import os
import subprocess
import time

import pytest

import kmigtest as kt
import linux_guest as lg

pytestmark = pytest.mark.linux

MIB = 1 << 20
MEMORY = 640
LOAD_MIB = 256
PROBE = lg.PROBE

HOPS = [
    dict(name="computed", dst="bitmap", caps={"auto-converge": True},
         params={"x-cpu-throttle-policy": "computed"}),
    dict(name="step_multifd_zstd", dst="ring",
         caps={"auto-converge": True, "multifd": True},
         params={"x-cpu-throttle-policy": "step", "multifd-channels": 2,
                 "x-compression": "zstd"}),
    # the hybrid at 16 MB/s: it may switch by itself during the bulk pass;
    # if it has not once 32 MiB went, migrate-start-postcopy switches (how
    # soon the hybrid decides depends on the machine's speed; that the
    # post-copy part works must not)
    dict(name="hybrid_postcopy", dst="ring", caps={"postcopy-ram": True, "x-postcopy-auto": True},
         params={"max-bandwidth": 16 << 20}, postcopy=True),
    # the dirty limit over TLS: emulated TLS is slow, and the limit holds
    # the guest to what the link carries
    dict(name="dirty_limit_tls", dst="ring", caps={"dirty-limit": True},
         params={"vcpu-dirty-limit": 4, "x-vcpu-dirty-limit-period": 1000}, tls=True),
]
ALL_CAPS = ("dirty-limit", "auto-converge", "multifd", "postcopy-ram", "x-postcopy-auto")


def backend_args(b):
    return ["--dirty-ring", "0"] if b == "bitmap" else ["--dirty-ring", "4096"]


class Chain:
    """The kmig processes of one guest's chain, all with the same settings."""

    def __init__(self, d, cpus, rd, keys, kvmclock, mib=LOAD_MIB, probe=True):
        self.d, self.cpus, self.rd, self.keys, self.n = d, cpus, rd, keys, 0
        self.kvmclock, self.mib, self.probe = kvmclock, mib, probe
        self.vms = []

    def vm(self, backend, extra=()):
        self.n += 1
        vm = lg.vm(self.d, "h%d" % self.n, self.rd,
                   lg.cmdline(self.mib, self.cpus, "kmig.probe=5" if self.probe else ""),
                   memory="%dM" % MEMORY, cpus=self.cpus,
                   extra=["--balloon", "--kvmclock", "on" if self.kvmclock else "off",
                          "--object", "tls-creds-psk,id=k0,dir=%s/psk" % self.keys] +
                   backend_args(backend) + list(extra))
        self.vms.append(vm)
        return vm

    def incoming(self, backend, extra=()):
        uri = "tcp:127.0.0.1:%d" % kt.free_port()
        return self.vm(backend, ["--incoming", uri] + list(extra)), uri

    def kill(self):
        for vm in self.vms:
            vm.kill()


reports = lg.reports
bad_lines = lg.bad_lines


def last_gen(vm):
    r = reports(vm)
    return r[-1][1] if r else -1


def goes_on(vm, after_gen, after_probe, timeout, start=0):
    """Waits until vm's memcheck reports a generation past after_gen and
    (unless after_probe is None) its probes numbered past after_probe
    decide (lg.probe_verdict); (ok, those probes)."""
    deadline = time.time() + timeout
    probes = []
    while time.time() < deadline and vm.proc.poll() is None:
        probes = [m for m in PROBE.finditer(vm.console.text())
                  if after_probe is None or int(m.group(1)) > after_probe]
        if last_gen(vm) > after_gen and (
                after_probe is None or lg.probe_verdict(probes)[0] is not None):
            return True, probes
        if bad_lines(vm, start):
            break
        time.sleep(1)
    return False, probes


def last_probe(vm):
    p = list(PROBE.finditer(vm.console.text()))
    return int(p[-1].group(1)) if p else 0


def check_guest(check, name, vm, gen, probe, start=0):
    """The guest on vm goes on: memcheck past gen with no bad page, its
    monotonic clock never back, interrupts arriving, its console clean
    from line start on."""
    ok, probes = goes_on(vm, gen, probe, kt.slow(60), start)
    verdict, line = lg.probe_verdict(probes)
    r = reports(vm)
    check(name + "_goes_on", ok, "gen %d -> %d, probe %r: %s" % (
        gen, last_gen(vm), line, kt.dump(vm)))
    check(name + "_no_bad_page", r and all(x[3] == 0 for x in r), kt.dump(vm))
    check(name + "_clock_never_back", r and all(x[6] == 0 for x in r),
          "back counts %r" % sorted({x[6] for x in r}))
    # rtcwait saw 2 RTC interrupts (the first probe may instead hear one
    # late, if the next hears 2); timer and UART counts go on
    check(name + "_interrupts", probe is None or verdict is True, "%s / %s" % (line, " / ".join(
        [l for l in vm.console.text().splitlines() if "KMIG-LINUX rtcdiag" in l][-2:])))
    bad = bad_lines(vm, start)
    check(name + "_console_clean", not bad, "%s; it began: %s" % (
        " / ".join(bad[:5]), lg.around_first_bad(vm, start)))
    return ok and not bad


def start(src, dst, uri, hop, tls=False):
    q = src.qmp()
    kt.set_caps(q, **{c.replace("-", "_"): False for c in ALL_CAPS})
    q.cmd("migrate-set-capabilities", capabilities=[
        {"capability": "x-verify", "state": True}] + [
        {"capability": k, "state": v} for k, v in hop.get("caps", {}).items()])
    q.cmd("migrate-set-parameters", **dict({"max-bandwidth": 1 << 30,
                                            "tls-creds": "k0" if tls else ""},
                                           **hop.get("params", {})))
    if hop.get("postcopy"):
        kt.set_caps(dst.qmp(), postcopy_ram=True)
    kt.wait_incoming(dst, kt.slow(30))
    q.cmd("migrate", uri=uri)
    return q


def interrupted(check, chain, src, how):
    """A migration from src that is cancelled in its bulk pass (how ==
    "cancel") or whose destination is killed while it runs ("kill"): src
    goes on as it was."""
    dst, uri = chain.incoming("ring")
    gen, probe, mark = last_gen(src), last_probe(src), len(src.console.text().splitlines())
    q = start(src, dst, uri, {"caps": {"auto-converge": True},
                              "params": {"max-bandwidth": 16 << 20}})
    deadline = time.time() + kt.slow(60)
    r = {}
    while time.time() < deadline:
        r = q.cmd("query-migrate")
        if r.get("status") in kt.MIG_FINAL or r.get("ram", {}).get("transferred", 0) > 16 * MIB:
            break
        time.sleep(0.1)
    if how == "cancel":
        check("cancel_in_bulk", r.get("status") == "active" and
              r.get("ram", {}).get("dirty-sync-count", 0) == 0, repr(r))
        q.cmd("migrate_cancel")
    else:
        dst.kill()
    r = kt.wait_migration(q, kt.slow(30))
    want = "cancelled" if how == "cancel" else "failed"
    print("# linux load %s: %s after %s MiB" % (how, r.get("status"),
                                              r.get("ram", {}).get("transferred", 0) >> 20))
    check(how + "_status", r.get("status") == want, repr(r))
    check(how + "_src_running", q.cmd("query-status").get("status") == "running",
          repr(q.cmd("query-status")))
    check(how + "_src_recovered", *kt.recovered(q))
    if how == "cancel":
        check("cancel_dst_exits", dst.wait_exit(kt.slow(20)) == 1, kt.dump(dst))
    dst.kill()
    return check_guest(check, how + "_src", src, gen, probe, mark)


def hop_once(check, chain, src, hop):
    """Migrates src along one hop; returns the destination or None."""
    name = hop["name"]
    dst, uri = chain.incoming(hop["dst"], ["--tls-creds", "k0"] if hop.get("tls") else [])
    gen, probe = last_gen(src), last_probe(src) if chain.probe else None
    t0 = time.time()
    q = start(src, dst, uri, hop, tls=hop.get("tls", False))
    if hop.get("postcopy"):
        deadline = time.time() + kt.slow(60)
        # (its setup, dirty logging's start, may outlast the first query)
        while time.time() < deadline:
            r = q.cmd("query-migrate")
            if r.get("status") not in ("setup", "active") or \
                    r.get("ram", {}).get("transferred", 0) > 32 * MIB:
                break
            time.sleep(0.1)
        if r.get("status") in ("setup", "active"):
            # refused only if the hybrid switched (or it ended) meanwhile:
            # what follows checks that it went post-copy
            e = q.cmd_full("migrate-start-postcopy").get("error")
            if e:
                print("# linux load hop %s: migrate-start-postcopy: %r" % (name, e))
    r, seen = kt.follow(q, kt.slow(100), 0.2)
    sw = r.get("x-postcopy-switch")
    print("# linux load hop %s (%d vCPUs): %s in %.0f s, %s MiB, rounds %s, downtime %s ms, "
          "throttle %s%%, switch %r" % (name, chain.cpus, r.get("status"), time.time() - t0,
                                        r.get("ram", {}).get("transferred", 0) >> 20,
                                        r.get("ram", {}).get("dirty-sync-count"),
                                        r.get("downtime"), r.get("cpu-throttle-percentage"), sw))
    if r.get("status") not in kt.MIG_FINAL:
        q.cmd("migrate_cancel")
    if not check(name + "_completed", r.get("status") == "completed",
                 "%r %r / src %s / dst %s" % (r, seen, kt.dump(src), kt.dump(dst))):
        return None
    if hop.get("postcopy"):
        check(name + "_went_postcopy", sw is not None, "%r %r" % (seen, sw))
        check(name + "_verified", kt.wait_output(dst, r"x-verify: every page as it came matches",
                                                 kt.slow(10)) is not None, dst.output()[-400:])
    if hop.get("tls"):
        check(name + "_tls", "TLS" in src.output() and "TLS" in dst.output(),
              src.output()[-300:])
    check(name + "_src_postmigrate", src.qmp().cmd("query-status").get("status") == "postmigrate",
          repr(src.qmp().cmd("query-status")))
    check_guest(check, name, dst, gen, probe)
    return dst


@pytest.mark.parametrize("cpus", [1, 2], ids=["up", "smp"])
def test_chain(d, check, cpus):
    if not check("kernel", not lg.missing(), lg.missing()):
        return
    keys = os.path.join(d, "keys")
    subprocess.run([os.path.join(kt.ROOT, "tests/lib/make-certs.sh"), keys], check=True)
    # the SMP chain with kvm-clock: Linux then knows its TSC's frequency
    # and times with the local APIC's TSC deadline (whose armed deadline
    # must survive each hop); the UP one without (the PIT and jiffies)
    chain = Chain(d, cpus, lg.initramfs(d), keys, kvmclock=cpus == 2)
    hops = HOPS if cpus == 1 or os.environ.get("KMIG_TEST_FULL") == "1" else HOPS[:2]
    try:
        src = chain.vm("ring")
        # the boot's own messages come before the init's first line (and
        # under emulation hold the platform's XSAVE warning, docs/platform.md):
        # from that line on the console must stay clean
        up = src.console.wait(r"KMIG-LINUX up", kt.slow(120), proc=src.proc)
        start = lg.init_line(src)
        ok, _ = goes_on(src, 1, 0, kt.slow(120), start) if up else (False, None)
        if not check("boot", ok and all(x[3] == 0 for x in reports(src)) and
                     not bad_lines(src, start), kt.dump(src)):
            return
        print("# linux load: %s" % " / ".join(
            l for l in src.console.text().splitlines() if "KMIG-LINUX up" in l or
            "Switched to clocksource" in l or "TSC deadline" in l or "memcheck running" in l))
        for how in ("cancel", "kill"):
            if not interrupted(check, chain, src, how):
                return
        for hop in hops:
            dst = hop_once(check, chain, src, hop)
            if dst is None:
                return
            src.kill()
            src = dst
        # the balloon's queues and interrupt on the last destination
        q = src.qmp()
        q.cmd("balloon", value=(MEMORY - 32) * MIB)
        got = kt.wait_balloon(q, (MEMORY - 32) * MIB, kt.slow(30))
        check("balloon_moves", got == (MEMORY - 32) * MIB, "actual %r / %s" % (got, kt.dump(src)))
        r = reports(src)
        print("# linux load: last report %r, max_step_ms %d over the chain"
              % (r[-1] if r else None, max((x[5] for x in r), default=-1)))
    finally:
        chain.kill()


# The soak's hops: the destination's backend alternates, so each backend is
# a source every other hop
SOAK = [
    dict(name="plain", dst="bitmap"),
    dict(name="multifd_zstd", dst="ring", caps={"multifd": True},
         params={"multifd-channels": 2, "x-compression": "zstd"}),
    dict(name="lz4", dst="bitmap", params={"x-compression": "lz4"}),
    dict(name="computed", dst="ring", caps={"auto-converge": True},
         params={"x-cpu-throttle-policy": "computed"}),
]
SOAK_N = int(os.environ.get("KMIG_LINUX_SOAK_N",
                            "48" if os.environ.get("KMIG_TEST_FULL") == "1"
                            else "12" if kt.emulated() else "24"))


def test_soak(d, check):
    """The soak's Linux row: one Linux guest (1 vCPU, memcheck verify over
    64 MiB) migrated SOAK_N times (24; under emulation 12, each
    configuration three times; 48 with KMIG_TEST_FULL=1), the
    configuration changing every hop (SOAK), each hop with x-verify and
    memcheck going on with no page bad, its clock never back, its console
    clean."""
    if not check("kernel", not lg.missing(), lg.missing()):
        return
    keys = os.path.join(d, "keys")
    subprocess.run([os.path.join(kt.ROOT, "tests/lib/make-certs.sh"), keys], check=True)
    chain = Chain(d, 1, lg.initramfs(d), keys, kvmclock=False, mib=64, probe=False)
    done = 0
    try:
        src = chain.vm("ring")
        up = src.console.wait(r"KMIG-LINUX up", kt.slow(120), proc=src.proc)
        ok, _ = goes_on(src, 1, None, kt.slow(120), lg.init_line(src)) if up else (False, None)
        if not check("boot", ok, kt.dump(src)):
            return
        for i in range(SOAK_N):
            hop = dict(SOAK[i % len(SOAK)])
            hop["name"] = "hop%d_%s" % (i + 1, hop["name"])
            dst = hop_once(check, chain, src, hop)
            src.kill()
            if dst is None:
                break
            src, done = dst, done + 1
    finally:
        print("# linux soak: %d of %d hops" % (done, SOAK_N))
        chain.kill()
    check("all_hops", done == SOAK_N, "%d of %d" % (done, SOAK_N))
