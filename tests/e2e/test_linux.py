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
                  then its power-off ends `kmig run` with status 0 (no
                  ACPI yet: Linux halts with interrupts off, which kmig
                  takes as the guest's end).  No early console: the
                  kernel's messages and the init's long line reach the
                  console through Linux's 8250 driver and tty layer,
                  which write on the UART's transmitter-empty interrupt
                  (without it the output stopped after the first bytes).
"""
import os
import shutil
import subprocess

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
    p = subprocess.run([os.path.join(kt.BUILD, "kmig"), "run", "--kernel", kernel,
                        "--initrd", rd, "--memory", "512M", "--console", "file:" + con,
                        "--cpus", str(cpus), "--cmdline", "console=ttyS0 panic=-1 " + apic],
                       capture_output=True, text=True, timeout=kt.slow(60))
    text = open(con, errors="replace").read()
    tail = " / ".join(text.splitlines()[-8:])
    print("# kmig status %d: %s" % (p.returncode, p.stderr[-800:]))
    print("# linux[%d cpus]: %s" % (cpus, " / ".join(
        l for l in text.splitlines() if any(k in l for k in (
            "MPTABLE", "MP-BIOS", "IOAPIC", "IO-APIC", "smpboot", "clocksource", "Brought up",
            "ttyS0", "WARNING", "kvm-clock")))[:3000]))
    check("linux_banner", "Linux version" in text, tail)
    check("initrd_unpacked", "Freeing initrd memory" in text or "Unpacking initramfs" in text
          or "Run /init" in text, tail)
    check("init_runs", "Run /init as init process" in text, tail)
    check("init_output", MARKER in text, tail[-600:])
    check("nproc", "KMIG-NPROC=%d" % cpus in text, tail[-600:])
    check("exit_0", p.returncode == 0, "status %d: %s" % (p.returncode, p.stderr[-400:]))
