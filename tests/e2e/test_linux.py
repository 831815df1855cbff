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
                  system time from it: the host's wall clock,
                  then its power-off ends `kmig run` with status 0 (no
                  ACPI yet: Linux halts with interrupts off, which kmig
                  takes as the guest's end).  No early console: the
                  kernel's messages and the init's long line reach the
                  console through Linux's 8250 driver and tty layer,
                  which write on the UART's transmitter-empty interrupt
                  (without it the output stopped after the first bytes).
                  Under emulation a boot whose console stays silent for
                  75 s has hung (the platform loses timer ticks, under
                  QEMU too: docs/platform.md); such a boot, or one whose
                  kernel panicked (the platform's twice-delivered
                  interrupt), is printed with where it stopped and tried
                  again, 8 boots and 20 minutes at most; any other
                  failure is not.  On a real KVM the one boot must pass.
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
/bin/busybox poweroff -f
""" % MARKER


def initramfs(d):
    """A busybox initramfs whose /init prints a marker and powers off."""
    root = os.path.join(d, "root")
    os.makedirs(os.path.join(root, "bin"))
    shutil.copy(shutil.which("busybox") or "/bin/busybox", os.path.join(root, "bin", "busybox"))
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


# Under emulation the platform itself loses Linux's timer ticks now and
# then (docs/platform.md: QEMU 7.2 hangs there too): a boot whose console
# has been silent for QUIET seconds has hung.  There a hung or crashed boot
# is printed and the boot tried again, up to EMULATED_TRIES in all; on a
# real KVM one boot must do.
QUIET = 75
EMULATED_TRIES = 8
BUDGET = 1200       # all tries together, under run.sh's per-test timeout


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


def booted(status, text):
    return status == 0 and MARKER in text and PANIC not in text


# the platform's own failures, the only ones tried again: a hang, or the
# kernel's panic (the interrupt delivered twice, docs/platform.md), after
# which Linux's reboot (panic=-1) ends the VM
PANIC = "Kernel panic"


def platform_failure(why, text):
    return bool(why) or PANIC in text


# one vCPU on the 8259 PIC alone; two with the local APICs and the I/O
# APIC, which Linux finds in kmig's MP table (no ACPI)
@pytest.mark.parametrize("cpus,apic", [(1, "noapic nolapic"), (2, "")], ids=["up_pic", "smp_apic"])
def test_bzimage_initrd(d, check, cpus, apic):
    kernel = os.path.join(CACHE, "vmlinuz")
    if not check("kernel", os.path.isfile(kernel),
                 "%s missing: scripts/kvm-vm --prepare fetches it" % kernel):
        return
    rd = initramfs(d)
    tries = EMULATED_TRIES if kt.emulated() else 1
    deadline = time.time() + BUDGET
    for attempt in range(1, tries + 1):
        con = os.path.join(d, "con%d.log" % attempt)
        cmd = [os.path.join(kt.BUILD, "kmig"), "run", "--kernel", kernel, "--initrd", rd,
               "--memory", "512M", "--console", "file:" + con, "--cpus", str(cpus),
               "--cmdline", "console=ttyS0 panic=-1 " + apic]
        t0 = time.time()
        status, err, text, why = boot(cmd, con, min(kt.slow(60), deadline - t0))
        t1 = time.time()
        tail = " / ".join(text.splitlines()[-8:])
        print("# boot %d of at most %d: %s in %.0f s; %s" % (
            attempt, tries, "status %s" % status if status is not None else "killed, " + why,
            t1 - t0, err[-800:].strip()))
        if booted(status, text):
            break
        print("# boot %d failed, the console ended: %s" % (attempt, tail[-1200:]))
        if not platform_failure(why, text) or deadline - time.time() < QUIET:
            break       # kmig's own failure: no second chance
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
    check("no_panic", PANIC not in text, tail[-600:])
    check("exit_0", status == 0, "status %s: %s / console: %s" % (status, err[-400:], tail[-600:]))
