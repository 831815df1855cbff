"""A stock Linux guest writes to its disk across a live migration: Debian's
own kernel with Linux's own virtio_blk bound to kmig's virtio-blk-pci
(inside scripts/kvm-vm where this machine's KVM cannot run Linux),
memcheck verify rewriting 64 MiB, and on /dev/vda generation after
generation of 64 blocks written with O_DIRECT and fsync, then read back
and checked (guest/linux/init kmig.disk).

  disk_across_migration[shared]  source and destination open the same raw
      image (shared storage);
  disk_across_migration[stream]  (make test-full) each has an image of its
      own, the destination's empty, and the disk goes in the stream
      (x-block-migration);
      either way the migration with x-verify completes; on the
      destination the generations go on past the last one the source
      finished, every block as the guest wrote it (no "disk BAD"), the
      destination holds its image's write lock and the source none;
      memcheck and the console clean.
"""
import os
import re
import subprocess
import time

import pytest

import kmigtest as kt
import linux_guest as lg

pytestmark = pytest.mark.linux

GEN = re.compile(r"KMIG-LINUX disk ok gen=(\d+)")


def last_gen(vm):
    g = GEN.findall(vm.console.text())
    return int(g[-1]) if g else 0


def blk_args(d, name):
    img = os.path.join(d, name)
    subprocess.run(["truncate", "-s", "64M", img], check=True)
    return ["--drive", "file=%s,format=raw,if=none,id=d0" % img,
            "--device", "virtio-blk-pci,drive=d0"]


@pytest.mark.parametrize("stream", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["shared", "stream"])
def test_disk_across_migration(d, vms, check, stream):
    if not check("kernel", not lg.missing(), lg.missing()):
        return
    rd = lg.initramfs(d)
    blk = blk_args(d, "disk.img")
    cmd = lg.cmdline(64, 1, "kmig.disk=64")
    src = lg.vm(d, "src", rd, cmd, memory="384M", extra=blk)
    vms.append(src)
    if not check("disk_runs", src.console.wait(r"KMIG-LINUX disk ok gen=2", kt.slow(240),
                                               proc=src.proc) is not None, kt.dump(src, 30)):
        return
    start = lg.init_line(src)
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    dblk = blk_args(d, "dst.img") if stream else blk
    dst = lg.vm(d, "dst", rd, cmd, memory="384M", extra=dblk + ["--incoming", uri])
    vms.append(dst)
    r = kt.migrate(src, dst, uri, caps={"x-verify": True, "x-block-migration": stream},
                   params={"max-bandwidth": 64 << 20}, timeout=kt.slow(240))
    if not check("completed", r.get("status") == "completed",
                 "%r; src %s; dst %s" % (r, kt.dump(src), kt.dump(dst))):
        return
    g0 = last_gen(src)
    deadline = time.time() + kt.slow(120)
    while last_gen(dst) < g0 + 2 and time.time() < deadline and dst.proc.poll() is None:
        time.sleep(0.5)
    print("# linux disk: generation %d on the source, %d on the destination, downtime %s ms"
          % (g0, last_gen(dst), r.get("downtime")))
    check("disk_goes_on", last_gen(dst) >= g0 + 2, kt.dump(dst, 20))
    bad = [l for v in (src, dst) for l in v.console.text().splitlines()
           if "disk BAD" in l or "disk FAILED" in l]
    check("no_block_wrong", not bad, " / ".join(bad[:4]))
    b, sb = dst.qmp().cmd("query-block"), src.qmp().cmd("query-block")
    check("locks", b and b[0].get("x-image-lock") == "write" and sb and
          sb[0].get("x-image-lock") != "write", "%r / %r" % (b, sb))
    check("memcheck_ok", dst.console.wait(lg.REPORT_OK, kt.slow(60), proc=dst.proc) is not None,
          kt.dump(dst, 20))
    bad = lg.bad_lines(dst) + lg.bad_lines(src, start)
    check("console_clean", not bad, " / ".join(bad[:5]))
