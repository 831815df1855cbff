"""Stock Linux under kmig: Debian's own kernel package (the bzImage that
scripts/kvm-vm downloads and unpacks, never installs) booted through the
x86 boot protocol with an initramfs, on a real x86 KVM.

kvm_pvm cannot run a stock Linux kernel (docs/platform.md), so on such a
machine tests/run.sh runs this file inside scripts/kvm-vm, whose KVM is
kvm_amd under emulation.

  bzimage_initrd  the kernel boots to its initramfs: "Run /init as init
                  process" and the init's first output on the console,
                  then its power-off ends `kmig run` with status 0 (no
                  ACPI yet: Linux halts with interrupts off, which kmig
                  takes as the guest's end).  The 8250's interrupt is not
                  wired yet, so userspace output through the tty stops
                  after its first bytes: the init prints a marker that
                  fits.  The command line keeps the early console
                  (earlyprintk=serial): without it the kernel's messages
                  stopped for minutes after the 8250 driver took the port
                  over (the same missing interrupt).
"""
import os
import shutil
import subprocess

import pytest

import kmigtest as kt

pytestmark = pytest.mark.linux

CACHE = os.environ.get("KMIG_VM_CACHE", "/var/cache/kmig/kvm-vm")
INIT = """#!/bin/busybox sh
/bin/busybox echo KMIG-INIT
/bin/busybox poweroff -f
"""


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


def test_bzimage_initrd(d, check):
    kernel = os.path.join(CACHE, "vmlinuz")
    if not check("kernel", os.path.isfile(kernel),
                 "%s missing: scripts/kvm-vm --prepare fetches it" % kernel):
        return
    rd = initramfs(d)
    con = os.path.join(d, "con.log")
    p = subprocess.run([os.path.join(kt.BUILD, "kmig"), "run", "--kernel", kernel,
                        "--initrd", rd, "--memory", "512M", "--console", "file:" + con,
                        "--cmdline", "console=ttyS0 earlyprintk=serial,ttyS0 panic=-1 noapic nolapic"],
                       capture_output=True, text=True, timeout=kt.slow(240))
    text = open(con, errors="replace").read()
    tail = " / ".join(text.splitlines()[-8:])
    check("linux_banner", "Linux version" in text, tail)
    check("initrd_unpacked", "Freeing initrd memory" in text or "Unpacking initramfs" in text
          or "Run /init" in text, tail)
    check("init_runs", "Run /init as init process" in text, tail)
    check("init_output", "KMIG-" in text, tail)
    check("exit_0", p.returncode == 0, "status %d: %s" % (p.returncode, p.stderr[-400:]))
