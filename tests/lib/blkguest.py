"""The test guest's disk workload under kmig (disk=1, docs/guest.md): its
command line, images, the virtio-blk options and what its console says."""
import os
import re
import subprocess
import time

import kmigtest as kt

# RAM verify beside the disk workload on 16 MiB of the disk, as fast as it goes
CMDLINE = "workload=verify mb=32 report_ms=300 disk=1 disk_mb=16 disk_rate=0"


def image(d, name="disk.img", size=64 << 20):
    """A sparse raw image of size bytes in d."""
    path = os.path.join(d, name)
    subprocess.run(["truncate", "-s", str(size), path], check=True)
    return path


def blk_args(img, direct=False):
    """QEMU's older --drive form; with direct, --blockdev with
    cache.direct=on (O_DIRECT: the host's page cache left out)."""
    if direct:
        drive = ["--blockdev", "driver=file,filename=%s,node-name=d0,cache.direct=on" % img]
    else:
        drive = ["--drive", "file=%s,format=raw,if=none,id=d0" % img]
    return drive + ["--device", "virtio-blk-pci,drive=d0,serial=kmig-test"]


def rounds(vm):
    """(ok|bad, round, errors) of each disk report."""
    return [(m.group(1), int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"^disk (ok|bad) round=(\d+) .*? errors=(\d+)", vm.console.text(), re.M)]


def goes_on(vm, timeout):
    """Two more disk reports after now, all ok: the workload runs."""
    n = len(rounds(vm))
    deadline = time.time() + timeout
    while time.time() < deadline and vm.proc.poll() is None:
        r = rounds(vm)
        if len(r) >= n + 2:
            return all(x[0] == "ok" for x in r)
        time.sleep(0.2)
    return False


def bad_lines(vm):
    return [l for l in vm.console.text().splitlines()
            if "disk BAD" in l or "verify BAD" in l or "disk error" in l]


def start(d, vms, check, name, img, cmdline=CMDLINE, direct=False, **kw):
    """A kmig VM running the workload on img (kw: kmig_vm's); None, with
    the check failed, if its disk rounds do not start."""
    vm = kt.kmig_vm(d, name, cmdline, memory="256M", extra=blk_args(img, direct), **kw)
    vms.append(vm)
    ok = vm.console.wait(r"^disk ok round=", kt.slow(90), proc=vm.proc) is not None
    return vm if check("disk_runs", ok, kt.dump(vm)) else None
