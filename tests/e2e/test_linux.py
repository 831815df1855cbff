"""Stock Linux under kmig: Debian's own kernel package (the bzImage that
scripts/kvm-vm downloads and unpacks, never installs) booted through the
x86 boot protocol with an initramfs, on a real x86 KVM.

kvm_pvm cannot run a stock Linux kernel (docs/platform.md), so on such a
machine tests/run.sh runs this file inside scripts/kvm-vm, whose KVM is
kvm_amd under emulation.

  bzimage_initrd[up_pic|smp_apic]  the kernel boots to its initramfs:
                  "Run /init as init process" and the init's output on
                  the console (a long line, then `nproc`: every vCPU
                  online; two of them through the MP table's local
                  APICs, started by INIT/SIPI),
                  Linux's rtc_cmos finds kmig's CMOS clock and sets the
                  system time from it: the host's wall clock; an alarm
                  interrupts reach Linux's RTC core (rtcwait: 3 update
                  interrupts about a second apart, IRQ 8 through the PIC
                  or the I/O APIC), and without --kvmclock on Linux never
                  sees kvm-clock,
                  then its power-off ends `kmig run` with status 0 (no
                  ACPI yet: Linux halts with interrupts off, which kmig
                  takes as the guest's end).  No early console: the
                  kernel's messages and the init's long line reach the
                  console through Linux's 8250 driver and tty layer,
                  which write on the UART's transmitter-empty interrupt
                  (without it the output stopped after the first bytes).
                  A boot whose console stays silent for 75 s has hung
                  and fails with where it stopped.  One boot, which must
                  pass: with one emulated CPU the emulated KVM no longer
                  loses ticks or delivers interrupts twice
                  (docs/platform.md, "One emulated CPU").
  balloon_linux_driver  Linux's virtio_pci and virtio_balloon modules bind
                  kmig's balloon (INTA through the MP table's PCI route),
                  QMP balloon inflates 64 MiB of 512 (MemTotal and
                  query-balloon follow) and deflates it; Linux's free
                  page reporting then drops freed blocks.
  migrate_idle_linux  a mostly idle Linux guest with its balloon driver
                  bound migrates with x-verify, its ballooned and
                  hinted-free pages not sent: the destination goes on
                  ticking, its clock steps by no more than the real time,
                  its console stays clean, its balloon driver works.
"""
import os
import re
import shutil
import subprocess
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.linux

CACHE = os.environ.get("KMIG_VM_CACHE", "/var/cache/kmig/kvm-vm")
# longer than the 8250 driver's first write, and than the tty's buffer
MARKER = "KMIG-INIT-" + "".join("%04d" % i for i in range(300)) + "-END"
INIT = """#!/bin/busybox sh
/bin/busybox echo %s
/bin/busybox echo KMIG-NPROC=$(/bin/busybox nproc)
/bin/busybox mkdir -p /proc /dev
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev
/bin/rtcwait 3
/bin/busybox echo KMIG-RTC-IRQ $(/bin/busybox grep rtc0 /proc/interrupts)
/bin/busybox poweroff -f
""" % MARKER


def initramfs(d):
    """A busybox initramfs whose /init prints a marker and powers off."""
    root = os.path.join(d, "root")
    os.makedirs(os.path.join(root, "bin"))
    shutil.copy(shutil.which("busybox") or "/bin/busybox", os.path.join(root, "bin", "busybox"))
    shutil.copy(os.path.join(kt.BUILD, "linux", "rtcwait"), os.path.join(root, "bin", "rtcwait"))
    with open(os.path.join(root, "init"), "w") as f:
        f.write(INIT)
    os.chmod(os.path.join(root, "init"), 0o755)
    out = os.path.join(d, "initrd.gz")
    files = subprocess.run(["find", "."], cwd=root, capture_output=True, check=True).stdout
    cpio = subprocess.run(["cpio", "-o", "-H", "newc"], cwd=root, input=files,
                          capture_output=True, check=True).stdout
    with open(out, "wb") as f:
        f.write(subprocess.run(["gzip", "-1"], input=cpio, capture_output=True,
                               check=True).stdout)
    return out


# A boot whose console has been silent for QUIET seconds has hung: it is
# stopped and fails with where it stopped, rather than waiting for the
# test's time limit.
QUIET = 75


def boot(cmd, con, limit):
    """Runs kmig once, for at most limit seconds: (status or None if
    killed, stderr, console text, why it was killed or "")."""
    t0 = time.time()
    err = open(con + ".err", "w+")
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    size, since, why = -1, time.time(), ""
    while p.poll() is None:
        time.sleep(1)
        n = os.path.getsize(con) if os.path.exists(con) else 0
        if n != size:
            size, since = n, time.time()
        if time.time() - since > QUIET:
            why = "console silent for %d s" % QUIET
        elif time.time() - t0 > limit:
            why = "not done in %d s" % limit
        if why:
            p.kill()
            p.wait()
    err.seek(0)
    text = open(con, errors="replace").read() if os.path.exists(con) else ""
    return (None if why else p.returncode), err.read(), text, why


def wait_moving(vm, pattern, limit):
    """Waits up to limit seconds for a console line matching pattern while
    the console moves: (match or None, why it gave up or "").  A console
    silent for QUIET seconds has hung."""
    t0 = since = time.time()
    mark = (len(vm.console.lines), vm.console.partial())
    while time.time() - t0 < limit:
        m = vm.console.wait(pattern, 5, proc=vm.proc)
        if m:
            return m, ""
        if vm.proc.poll() is not None:
            return None, "kmig ended with status %s" % vm.proc.returncode
        now = (len(vm.console.lines), vm.console.partial())
        if now != mark:
            mark, since = now, time.time()
        elif time.time() - since > QUIET:
            return None, "console silent for %d s" % QUIET
    return None, "not there in %d s" % limit


PANIC = "Kernel panic"


# one vCPU on the 8259 PIC alone; two with the local APICs and the I/O
# APIC, which Linux finds in kmig's MP table (no ACPI)
@pytest.mark.parametrize("cpus,apic", [(1, "noapic nolapic"), (2, "")], ids=["up_pic", "smp_apic"])
def test_bzimage_initrd(d, check, cpus, apic):
    kernel = os.path.join(CACHE, "vmlinuz")
    if not check("kernel", os.path.isfile(kernel),
                 "%s missing: scripts/kvm-vm --prepare fetches it" % kernel):
        return
    rd = initramfs(d)
    con = os.path.join(d, "con.log")
    cmd = [os.path.join(kt.BUILD, "kmig"), "run", "--kernel", kernel, "--initrd", rd,
           "--memory", "512M", "--console", "file:" + con, "--cpus", str(cpus),
           "--cmdline", "console=ttyS0 panic=-1 " + apic]
    t0 = time.time()
    status, err, text, why = boot(cmd, con, kt.slow(60))
    t1 = time.time()
    tail = " / ".join(text.splitlines()[-8:])
    print("# boot: %s in %.0f s; %s" % (
        "status %s" % status if status is not None else "killed, " + why, t1 - t0,
        err[-800:].strip()))
    print("# linux[%d cpus]: %s" % (cpus, " / ".join(
        l for l in text.splitlines() if any(k in l for k in (
            "MPTABLE", "MP-BIOS", "IOAPIC", "IO-APIC", "smpboot", "clocksource", "Brought up",
            "ttyS0", "WARNING", "kvm-clock", "rtc_cmos")))[:3000]))
    check("linux_banner", "Linux version" in text, tail)
    check("initrd_unpacked", "Freeing initrd memory" in text or "Unpacking initramfs" in text
          or "Run /init" in text, tail)
    check("init_runs", "Run /init as init process" in text, tail)
    check("init_output", MARKER in text, tail[-600:])
    # the wall clock Linux took from kmig's CMOS RTC at boot: the host's
    m = re.search(r"rtc_cmos rtc_cmos: setting system clock to [^(]* \((\d+)\)", text)
    check("rtc_wall_clock", m is not None and t0 - 2 <= int(m.group(1)) <= t1 + 2,
          "want the host's time in %d..%d: %s" % (t0, t1, m.group(0) if m else tail[-600:]))
    check("nproc", "KMIG-NPROC=%d" % cpus in text, tail[-600:])
    # Linux's RTC core waits for 3 of the chip's interrupts (IRQ 8, its
    # alarm programmed for each next second): about 2 s from first to last
    m = re.search(r"rtcwait interrupts=(\d+) of=3 ms=(\d+)", text)
    irq = re.search(r"KMIG-RTC-IRQ\s+8:((?:\s+\d+)+)", text)
    # what rtcwait and /proc/interrupts said first: a report cut short
    # still shows them
    said = " / ".join(l for l in text.splitlines() if "rtcwait" in l or "KMIG-RTC-IRQ" in l)
    print("# rtc: %s" % said)
    check("rtc_irq", m is not None and m.group(1) == "3" and 1000 <= int(m.group(2)) <= 4000 and
          irq is not None and sum(int(x) for x in irq.group(1).split()) >= 3,
          (said or "no rtcwait line") + " // " + " / ".join(
              l for l in text.splitlines() if "rtc" in l.lower())[-600:])
    # without --kvmclock on, CPUID has no hypervisor bit: no kvm-clock
    clk = [l for l in text.splitlines() if "clocksource" in l or "kvm-clock" in l]
    check("no_kvmclock", "kvm-clock" not in text, " / ".join(clk)[-600:])
    check("no_panic", PANIC not in text, tail[-600:])
    check("exit_0", status == 0, "status %s: %s / console: %s" % (status, err[-400:], tail[-600:]))


MIB = 1 << 20
GUEST_MODS = os.path.join(CACHE, "guest-mods")
# Linux's own drivers: insmod virtio_pci and virtio_balloon (and what they
# need), say which device the driver bound, then follow MemTotal: once it
# has gone down (the host inflated) and come back (deflated), power off
BALLOON_INIT = """#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /sbin /usr/bin /usr/sbin
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys
for m in $(cat /mods/modules.list); do
	insmod /mods/$m.ko || echo KMIG-INSMOD-FAILED=$m
done
echo KMIG-BOUND=$(ls /sys/bus/virtio/drivers/virtio_balloon 2>/dev/null | grep virtio)
mem() { sed -n 's/^MemTotal: *\\([0-9]*\\) kB/\\1/p' /proc/meminfo; }
m0=$(mem) last=$m0 low=0 i=0
echo KMIG-MEMTOTAL=$m0
while [ $i -lt 1200 ]; do
	m=$(mem)
	[ $m != $last ] && echo KMIG-MEM=$m
	last=$m
	[ $m -lt $((m0 - 32768)) ] && low=1
	if [ $low = 1 ] && [ $m -ge $m0 ]; then
		echo KMIG-DEFLATED=$m; break
	fi
	sleep 0.25; i=$((i + 1))
	[ $((i % 20)) = 0 ] && echo KMIG-ALIVE $i
done
sleep 5   # free page reporting: the deflated pages, freed, are reported
echo KMIG-IRQ=$(grep -c virtio /proc/interrupts) $(grep virtio /proc/interrupts | tr -s ' ')
poweroff -f
"""


# 64 MiB into the balloon: enough to see it work
BALLOON_TARGET = 448 * MIB


def have_mods(check):
    return check("modules", os.path.isfile(os.path.join(GUEST_MODS, "modules.list")),
                 "%s missing: scripts/kvm-vm --prepare writes it" % GUEST_MODS)


def balloon_initramfs(d):
    """busybox, Linux's virtio modules from the kernel package, BALLOON_INIT."""
    root = os.path.join(d, "broot")
    os.makedirs(os.path.join(root, "bin"))
    shutil.copy(shutil.which("busybox") or "/bin/busybox", os.path.join(root, "bin", "busybox"))
    shutil.copytree(GUEST_MODS, os.path.join(root, "mods"))
    with open(os.path.join(root, "init"), "w") as f:
        f.write(BALLOON_INIT)
    os.chmod(os.path.join(root, "init"), 0o755)
    out = os.path.join(d, "binitrd.gz")
    files = subprocess.run(["find", "."], cwd=root, capture_output=True, check=True).stdout
    cpio = subprocess.run(["cpio", "-o", "-H", "newc", "-R", "0:0"], cwd=root, input=files,
                          capture_output=True, check=True).stdout
    with open(out, "wb") as f:
        f.write(subprocess.run(["gzip", "-1"], input=cpio, capture_output=True,
                               check=True).stdout)
    return out


def balloon_run(d, attempt, rd, limit):
    """One boot with --balloon: waits for the driver, inflates to 448 MiB
    of 512, deflates; (what it saw, console text, why it was stopped)."""
    con = os.path.join(d, "bcon%d.log" % attempt)
    qmp = os.path.join(d, "b%d.qmp" % attempt)
    cmd = [os.path.join(kt.BUILD, "kmig"), "run", "--kernel", os.path.join(CACHE, "vmlinuz"),
           "--initrd", rd, "--memory", "512M", "--console", "file:" + con, "--cpus", "1",
           "--balloon", "--qmp", "unix:" + qmp, "--cmdline", "console=ttyS0 panic=-1"]
    vm = kt.VM(cmd, con)
    vm.qmp_path = qmp
    seen, t0 = {}, time.time()
    try:
        def wait(pattern, key, want=lambda v: True):
            """Waits for a line matching pattern whose group passes want,
            while the console moves; False on a hang or the end."""
            start = 0
            while time.time() - t0 < limit:
                n = len(vm.console.lines)
                m = vm.console.wait(pattern, 5, start=start, proc=vm.proc)
                if m and want(m.group(1)):
                    seen[key] = m.group(1)
                    return True
                if m:
                    start = next(i for i in range(start, len(vm.console.lines))
                                 if re.search(pattern, vm.console.lines[i])) + 1
                    continue
                if vm.proc.poll() is not None:
                    return False
                # progress: any line but the guest loop's heartbeat
                new = vm.console.lines[n:]
                alive = any("KMIG-ALIVE" in l for l in new)
                if all("KMIG-ALIVE" in l for l in new) and \
                        vm.console.partial() == seen.get("_part"):
                    seen["_quiet"] = seen.get("_quiet", 0) + 5
                    seen["_alive"] = seen.get("_alive", False) or alive
                    if seen["_quiet"] >= QUIET and seen["_alive"]:
                        seen["stalled"] = "no balloon progress for %d s, the guest running" % QUIET
                        return False
                    if seen["_quiet"] >= QUIET:
                        seen["why"] = "console silent for %d s" % QUIET
                        return False
                else:
                    seen["_quiet"], seen["_alive"] = 0, False
                seen["_part"] = vm.console.partial()
            seen["why"] = "not done in %d s" % limit
            return False
        if wait(r"KMIG-BOUND=(\S*)", "bound") and seen["bound"] and \
                wait(r"KMIG-MEMTOTAL=(\d+)", "memtotal"):
            m0 = int(seen["memtotal"])
            q = vm.qmp()
            q.cmd("balloon", value=BALLOON_TARGET)
            # inflated: MemTotal down by the whole 64 MiB
            if wait(r"KMIG-MEM=(\d+)", "inflated", lambda v: int(v) <= m0 - 64 * 1024 + 64):
                # the driver writes actual after its last page
                for _ in range(int(kt.slow(10) / 0.1)):
                    seen["actual_in"] = q.cmd("query-balloon").get("actual")
                    if seen["actual_in"] == BALLOON_TARGET:
                        break
                    time.sleep(0.1)
                q.cmd("balloon", value=512 * MIB)
                if wait(r"KMIG-DEFLATED=(\d+)", "deflated"):
                    for _ in range(int(kt.slow(10) / 0.1)):
                        seen["actual_out"] = q.cmd("query-balloon").get("actual")
                        if seen["actual_out"] == 512 * MIB:
                            break
                        time.sleep(0.1)
                    if wait(r"KMIG-IRQ=(.*)", "irq"):
                        b = q.cmd("query-balloon")
                        seen["reported"] = b.get("x-reported-pages")
                        seen["notify"] = (b.get("x-notify-ioeventfds"), b.get("x-notify-exits"))
                    seen["status"] = vm.wait_exit(kt.slow(30))
    except (OSError, EOFError, RuntimeError, ValueError) as e:
        seen["error"] = repr(e)
    finally:
        vm.kill()
    return seen, vm.console.text(), seen.get("why", "")


def test_balloon_linux_driver(d, check):
    """Linux's own virtio_pci and virtio_balloon drivers (modules from the
    kernel package) bind kmig's balloon, its INTA routed through the MP
    table to I/O APIC pin 10: the QMP balloon command inflates the guest by
    64 MiB (MemTotal falls by that, query-balloon's actual follows) and
    deflates it again, which needs the device's interrupt (the driver
    waits for each buffer back); the interrupt is the MP table's
    level-triggered route (seen failing without the route: Linux then
    takes the configuration space's line, edge-triggered); every queue
    notification reaches the device through an ioeventfd."""
    if not have_mods(check):
        return
    rd = balloon_initramfs(d)
    seen, text, why = balloon_run(d, 1, rd, kt.slow(120))
    print("# balloon boot: %r" % {k: v for k, v in seen.items() if not k.startswith("_")})
    tail = " / ".join(text.splitlines()[-10:])[-1500:]
    print("# linux balloon: %s" % " / ".join(
        l for l in text.splitlines() if any(k in l for k in (
            "virtio", "KMIG-", "PCI", "IRQ", "balloon")))[:3000])
    check("driver_bound", seen.get("bound", "").startswith("virtio"), tail)
    # INTA from the MP table's PCI route, level-triggered (without the
    # route Linux falls back to the configuration space's line, edge)
    check("mp_route", "PCI->APIC IRQ transform: INT A -> IRQ 10" in text and
          "buggy MP table" not in text and "fasteoi" in seen.get("irq", ""),
          "%r / %s" % (seen.get("irq"), " / ".join(l for l in text.splitlines()
                                                     if "virtio-pci" in l)))
    check("no_insmod_failure", "KMIG-INSMOD-FAILED" not in text, tail)
    if not check("inflated", "inflated" in seen, tail):
        return
    drop = int(seen["memtotal"]) - int(seen["inflated"])
    check("memtotal_fell_64m", 64 * 1024 - 64 <= drop <= 64 * 1024 + 64,
          "MemTotal fell by %d kB" % drop)
    check("actual_inflated", seen.get("actual_in") == BALLOON_TARGET, repr(seen))
    check("deflated", "deflated" in seen, tail)
    check("actual_deflated", seen.get("actual_out") == 512 * MIB, repr(seen))
    check("interrupts", re.match(r"[1-9]", seen.get("irq", "")) is not None, repr(seen))
    # Linux's free page reporting: at least one 4 MiB block dropped
    check("reported", (seen.get("reported") or 0) >= 1024, repr(seen))
    # Linux's notifications (16-bit writes) all come through ioeventfds
    fds, exits = seen.get("notify") or (0, -1)
    check("ioeventfds", fds > 0 and exits == 0, repr(seen))
    check("exit_0", seen.get("status") == 0, "%r / %s" % (seen, tail))


def guest_initramfs(d):
    """The project's Linux guest initramfs (guest/linux/mkinitrd.sh) with
    Linux's virtio modules, built here: `make linux-guest` has them only
    when the kernel cache existed before it ran."""
    out = os.path.join(d, "linux-initrd.gz")
    subprocess.run([os.path.join(kt.ROOT, "guest/linux/mkinitrd.sh"), out,
                    os.path.join(kt.BUILD, "linux", "memcheck"), GUEST_MODS], check=True)
    return out


# what must not appear on a Linux console once it runs on the destination
LINUX_BAD = ("watchdog", "stall", "soft lockup", "hard LOCKUP", "BUG:", "Oops", "Call Trace",
             "WARNING:", PANIC, "KMIG-LINUX insmod")
# The clocksource watchdog's note that its interval grew past its limit
# because the guest was stopped for the downtime, which its clocks count
# (with --kvmclock on, kvm-clock and the TSC both go on by the wall-clock
# time that passed): it skips that check, it compares nothing.  Any other
# watchdog line (a skew, a clocksource marked unstable) is bad.
LINUX_BENIGN = ("Long readout interval, skipping watchdog check",)
TICK = r"KMIG-LINUX tick (\d+) uptime ([0-9.]+)"


def linux_vm(d, attempt, rd, side, extra=()):
    """A Linux VM (1 vCPU, 512 MiB, --balloon): a source that boots and
    ticks, or with --incoming in extra a destination."""
    base = [os.path.join(kt.BUILD, "kmig"), "run", "--kernel", os.path.join(CACHE, "vmlinuz"),
            "--initrd", rd, "--memory", "512M", "--cpus", "1", "--balloon",
            "--cmdline", "console=ttyS0 panic=-1 kmig.mode=none kmig.then=ticks"]
    con = os.path.join(d, "m%d-%s.log" % (attempt, side))
    qmp = os.path.join(d, "m%d-%s.qmp" % (attempt, side))
    vm = kt.VM(base + ["--console", "file:" + con, "--qmp", "unix:" + qmp] + list(extra), con)
    vm.qmp_path = qmp
    return vm


def linux_pair(d, attempt, rd, uri):
    """A Linux source ticking, and its destination listening on uri."""
    return linux_vm(d, attempt, rd, "src"), linux_vm(d, attempt, rd, "dst", ["--incoming", uri])


def test_migrate_idle_linux(d, check):
    """A mostly idle Linux guest (its /init prints a tick a second), with
    Linux's virtio_balloon bound, migrates between two kmig processes with
    x-verify: the destination's guest goes on ticking, its clock steps by
    no more than the real time that passed (from the migration's start to
    its first tick on the destination, seen on the host, plus 1.5 s for
    the tick before the start), no
    watchdog, stall, lockup, oops or warning reaches its console, and
    Linux's balloon driver still works there (inflated by 64 MiB on the
    source, whose pages are not sent, and by 64 MiB more on the
    destination).  Before it, a migration to another destination is
    cancelled in its bulk pass, while Linux's driver hints its free
    pages: the source goes on running and ticking with dirty logging
    off, that destination exits, and the migration after it is the one
    checked above.  (Under load: test_linux_load.py.)"""
    if not have_mods(check):
        return
    rd = guest_initramfs(d)
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    src, dst = linux_pair(d, 1, rd, uri)
    uri0 = "tcp:127.0.0.1:%d" % kt.free_port()
    dst0 = linux_vm(d, 1, rd, "dst0", ["--incoming", uri0])
    try:
        up, why = wait_moving(src, r"KMIG-LINUX tick (3) ", kt.slow(90))
        text = src.console.text()
        if not check("boot", up, why + ": " + " / ".join(text.splitlines()[-10:])[-1200:]):
            return
        if cancel_linux(check, src, dst0, uri0):
            migrate_linux(check, src, dst)
    finally:
        src.kill()
        dst.kill()
        dst0.kill()


def balloon_wait(vm, target, timeout):
    """QMP balloon to target bytes; query-balloon's last actual."""
    q = vm.qmp()
    q.cmd("balloon", value=target)
    return kt.wait_balloon(q, target, timeout)


def balloon_to(check, name, vm, target):
    """QMP balloon to target bytes; True once query-balloon says so."""
    actual = balloon_wait(vm, target, kt.slow(30))
    return check(name, actual == target, "actual %r, want %d / %s" % (actual, target, dump_vm(vm)))


def cancel_linux(check, src, dst0, uri0):
    """A migration to dst0, cancelled in its bulk pass (8 MB/s: the hinted
    pages are skipped, the rest takes seconds); True when the source runs
    on as it did."""
    kt.wait_incoming(dst0, kt.slow(30))
    q = src.qmp()
    q.cmd("migrate-set-parameters", **{"max-bandwidth": 8 << 20, "x-free-page-hint-wait": 2000})
    q.cmd("migrate", uri=uri0)
    deadline = time.time() + kt.slow(60)
    r = {}
    while time.time() < deadline:
        r = q.cmd("query-migrate")
        if r.get("status") in kt.MIG_FINAL or (r.get("status") == "active" and
                                                 r.get("ram", {}).get("transferred", 0) > 4 * MIB):
            break
        time.sleep(0.1)
    in_bulk = r.get("status") == "active" and r.get("ram", {}).get("dirty-sync-count", 0) == 0
    q.cmd("migrate_cancel")
    r = kt.wait_migration(q, kt.slow(20))
    n = len(src.console.lines)
    print("# linux cancel: in the bulk pass %s, then %s after %s MiB" % (
        in_bulk, r.get("status"), r.get("ram", {}).get("transferred", 0) >> 20))
    ticking = src.console.wait(TICK, kt.slow(15), start=n, proc=src.proc) is not None
    ok = [check("cancel_in_bulk", in_bulk, repr(r)),
          check("cancelled", r.get("status") == "cancelled", repr(r)),
          check("cancel_src_running", q.cmd("query-status").get("status") == "running",
                repr(q.cmd("query-status"))),
          check("cancel_src_recovered", *kt.recovered(q)),
          check("cancel_src_ticks", ticking, dump_vm(src)),
          check("cancel_dst_exits", dst0.wait_exit(kt.slow(20)) == 1, dump_vm(dst0))]
    return all(ok)


def migrate_linux(check, src, dst):
    """Migrates src to dst and checks the guest there."""
    # Linux's driver inflates 64 MiB before the migration: those pages
    # are not sent
    try:
        actual = balloon_wait(src, 448 * MIB, kt.slow(30))
    except OSError as e:
        rc = src.wait_exit(kt.slow(10))
        check("src_alive", False, "%r, exit %r: %s" % (e, rc, dump_vm(src)))
        return
    if not check("src_balloon", actual == 448 * MIB, "actual %r / %s" % (actual, dump_vm(src))):
        return
    kt.wait_incoming(dst, kt.slow(30))
    q = src.qmp()
    q.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-verify", "state": True}])
    # the bulk pass waits for Linux's free page hints (up to 2 s)
    q.cmd("migrate-set-parameters", **{"max-bandwidth": 1 << 30, "x-free-page-hint-wait": 2000})
    t_mig = time.time()
    q.cmd("migrate", uri=next(a for a in dst.proc.args if a.startswith("tcp:")))
    r = kt.wait_migration(q, kt.slow(120))
    print("# linux migration: %s, %s ms, downtime %s ms, %s MiB, %s ballooned and %s hinted "
          "pages skipped" % (r.get("status"), r.get("total-time"), r.get("downtime"),
                             r.get("ram", {}).get("transferred", 0) >> 20,
                             r.get("x-balloon-pages-skipped"), r.get("x-free-pages-skipped")))
    if not check("completed", r.get("status") == "completed",
                 "%r / src %s / dst %s" % (r, dump_vm(src), dump_vm(dst))):
        return
    check("ballooned_not_sent", r.get("x-balloon-pages-skipped", 0) >= 64 * 256, repr(r))
    check("hinted_not_sent", r.get("x-free-pages-skipped", 0) > 0, repr(r))
    last = [re.search(TICK, l) for l in src.console.text().splitlines()]
    last = [m for m in last if m][-1]
    seen = dst.console.wait(TICK, kt.slow(15), proc=dst.proc)
    t_seen = time.time()
    later = dst.console.wait(r"KMIG-LINUX tick (%d) " % (int(last.group(1)) + 3), kt.slow(30),
                             proc=dst.proc)
    if later is None:
        alive, state = guest_answers(dst)
        check("dst_ticks", False, "balloon driver %s: %s / %s" % (
            "answers" if alive else "silent", state, dump_vm(dst)))
        return
    first = next(m for m in (re.search(TICK, l) for l in dst.console.text().splitlines()) if m)
    step = float(first.group(2)) - float(last.group(2))
    gap = int(first.group(1)) - int(last.group(1))
    # the guest's clock must not run ahead of real time: from its last
    # tick on the source (at most 1.5 s before the migration began) to its
    # first on the destination (seen here at t_seen) no more time passed
    limit = (t_seen - t_mig) + 1.5 if seen else 0
    print("# linux clock: tick %s at %s s on the source, tick %s at %s s on the destination"
          % (last.group(1), last.group(2), first.group(1), first.group(2)))
    check("clock_step", 0 < step <= limit, "uptime stepped %.2f s over %d ticks (at most %.2f: "
          "the host saw %.2f s from the migration's start to that tick)"
          % (step, gap, limit, t_seen - t_mig))
    bad = [l for l in dst.console.text().splitlines() if any(b in l for b in LINUX_BAD)
           and not any(b in l for b in LINUX_BENIGN)]
    check("dst_console_clean", not bad, " / ".join(bad[:5]))

    # the destination's balloon goes on with the same driver
    balloon_to(check, "dst_balloon", dst, 384 * MIB)


def guest_answers(vm):
    """Whether the guest still runs though its console is silent: its
    balloon driver, asked for 16 MiB, moves.  (alive, what was seen)."""
    try:
        q = vm.qmp()
        b0 = q.cmd("query-balloon").get("actual", 0)
        b1 = balloon_wait(vm, b0 - 16 * MIB, kt.slow(10))
        return b1 != b0, "%r; balloon actual %r, asked for %d MiB less: %r" % (
            q.cmd("query-status"), b0, 16, b1)
    except (OSError, EOFError, RuntimeError, ValueError) as e:
        return False, repr(e)


def dump_vm(vm):
    return " / ".join(vm.console.text().splitlines()[-8:])[-1000:] + " | " + vm.output()[-600:]
