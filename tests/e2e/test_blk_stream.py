"""The disk in the migration stream (x-block-migration): each side has an
image of its own, and the source sends its image beside RAM (the chunks
that may hold data, then each round the chunks the guest wrote), with the
test guest's disk workload (disk=1, as in test_blk.py) running all along.

  stream_migration  refused before a byte is written: a destination
      whose image has another size, and one given the source's own image
      (shared storage by mistake: its write lock is the source's); each
      time the source goes on.  Then the migration with x-verify (the
      disk's sector sums compared too): the destination's image held
      garbage, which is gone (the source's holes read as zero there, and
      were not sent), the incomplete-marker is gone once the guest is
      there, the guest's disk rounds go on with no block wrong.  Then the
      destination, stopped, is migrated on to a third image with `kmig
      migrate --disk` and the two images are compared byte for byte.
  incomplete_marker  a destination killed in the middle keeps its
      image's marker, and `kmig run` refuses that image.
  full_destination  the destination's image (cache.direct=on) lies on an
      ext4 file system of 8 MiB, too small for the guest's 16 MiB: the
      migration fails with the destination's ENOSPC as its reason, the
      destination exits with its image marked, the source goes on as it
      was.  The retry, to an image on a file system with room (also
      cache.direct=on), sends the disk whole again and completes with
      x-verify, the sums matching.
  stream_negative_control  from the test build, the bulk pass leaves out
      the first two chunks holding data (KMIG_FAULT=skip-disk-chunk@bulk)
      of a guest stopped first: with x-verify the sums differ and the
      migration fails (the source stays as it was); without it the
      migration completes, and after cont the guest finds a block wrong on
      the destination (two chunks: the guest's 16 requests in flight at
      the stop may cover the whole of one, read on the source).
"""
import filecmp
import json
import os
import subprocess
import time

import pytest

import blkguest
import kmigtest as kt
from blkguest import CMDLINE, bad_lines, blk_args, goes_on

pytestmark = pytest.mark.kvm

SIZE = 64 << 20
MARK = ".kmig-incomplete"
CHUNK = 64 << 10
# the negative control's guest: 2 MiB of disk, so it comes back to every
# block soon
SMALL = CMDLINE.replace("disk_mb=16", "disk_mb=2")
# the disk in the stream; auto-converge, as natively the guest rewrites
# its RAM faster than the downtime limit lets the last pass go at 64 MiB/s
STREAM = {"x-block-migration": True, "auto-converge": True}


def image(d, name, size=SIZE, garbage=False):
    path = blkguest.image(d, name, size)
    if garbage:     # outside the guest's 16 MiB: the source has holes there
        with open(path, "r+b") as f:
            for off in (20 << 20, 40 << 20, size - 4096):
                f.seek(off)
                f.write(os.urandom(4096))
    return path


def incoming(d, vms, name, img, cmdline=CMDLINE, direct=False, **kw):
    """A destination on img, listening: (vm, uri)."""
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    vm = kt.kmig_vm(d, name, cmdline, memory="256M",
                    extra=blk_args(img, direct) + ["--incoming", uri], **kw)
    vms.append(vm)
    return vm, uri


def zero_at(path, offs):
    with open(path, "rb") as f:
        for off in offs:
            f.seek(off)
            if f.read(4096) != bytes(4096):
                return False
    return True


def refused(d, vms, src, name, img, want, check):
    """A destination on img: the stream is refused with want in its
    reason, the source goes on."""
    dst, uri = incoming(d, vms, name, img)
    r = kt.migrate(src, dst, uri, caps={"x-block-migration": True}, timeout=kt.slow(60))
    dst.wait_exit(kt.slow(20))
    check(name + "_failed", r.get("status") == "failed" and want in r.get("error-desc", ""),
          "%r; dst: %s" % (r, dst.output()[-400:]))
    check(name + "_src_goes_on", src.qmp().cmd("query-status").get("status") == "running"
          and goes_on(src, kt.slow(30)), kt.dump(src))


def test_stream_migration(d, vms, check):
    a = image(d, "a.img")
    src = blkguest.start(d, vms, check, "src", a)
    if not src:
        return
    refused(d, vms, src, "small", image(d, "small.img", SIZE // 2), "must be equal", check)
    refused(d, vms, src, "same", a, "in use by another process", check)
    check("same_untouched", not os.path.exists(a + MARK), "marker on the source's image")
    b = image(d, "b.img", garbage=True)
    dst, uri = incoming(d, vms, "dst", b)
    r = kt.migrate(src, dst, uri, caps={**STREAM, "x-verify": True},
                   params={"max-bandwidth": 64 << 20}, timeout=kt.slow(180))
    if not check("completed", r.get("status") == "completed",
                 "%r; src %s; dst %s" % (r, kt.dump(src), kt.dump(dst))):
        return
    disk = r.get("disk", {})
    # the destination counts what came as the source counts what it sent
    dd = dst.qmp().cmd("query-migrate").get("disk", {})
    check("dst_disk_stats", dd.get("total") == SIZE and dd.get("transferred") ==
          disk.get("transferred") and dd.get("x-data-chunks") == disk.get("x-data-chunks") and
          dd.get("x-data-bytes") == disk.get("x-data-bytes") and
          dd.get("x-zero-chunks") == disk.get("x-zero-chunks"), "%r / %r" % (dd, disk))
    sent = disk.get("x-data-chunks", 0) + disk.get("x-zero-chunks", 0)
    # every byte counted: INFO, each record's (header, fields, its data for
    # DATA: a run of 4 KiB blocks inside one 64 KiB chunk), SUM; blocks the
    # guest rewrote go again, so the bytes may pass the image's size
    rec = 16 + 24
    want = rec + (rec + 8) + disk.get("x-data-chunks", 0) * rec + disk.get("x-data-bytes", 0) + \
        disk.get("x-zero-chunks", 0) * rec
    check("runs", disk.get("x-chunk-size") == CHUNK and disk.get("x-block-size") == 4096 and
          disk.get("x-data-bytes", 0) <= disk.get("x-data-chunks", 0) * CHUNK, repr(disk))
    check("disk_stats", disk.get("total") == SIZE and disk.get("remaining") == 0 and
          disk.get("transferred") == want, "%r, want transferred %d" % (disk, want))
    # the guest's 16 MiB is 256 chunks: the holes beyond were never sent
    # (each block the guest dirtied may add one record)
    check("holes_not_sent", 0 < sent <= 256 + disk.get("x-dirtied-blocks", 0), repr(disk))
    check("garbage_cleared", zero_at(b, (20 << 20, 40 << 20, SIZE - 4096)), b)
    check("marker_gone", not os.path.exists(b + MARK), b + MARK)
    check("disk_goes_on", goes_on(dst, kt.slow(60)), kt.dump(dst))
    # stopped, on to a third image: the two are the same, byte for byte
    qd = dst.qmp()
    qd.cmd("stop")
    c = image(d, "c.img", garbage=True)
    dst2, uri = incoming(d, vms, "dst2", c)
    # through kmig migrate --disk (the CLI sets x-block-migration)
    kt.wait_incoming(dst2)
    cli = subprocess.run([kt.KMIG, "migrate", "--qmp", "unix:" + dst.qmp_path, "--disk",
                          "--json", uri], capture_output=True, text=True, timeout=kt.slow(180))
    r = json.loads(cli.stdout) if cli.returncode == 0 and cli.stdout.strip() else {}
    check("completed_stopped", r.get("status") == "completed" and
          r.get("disk", {}).get("total") == SIZE, "%s %r %r" % (cli.returncode, cli.stdout,
                                                                cli.stderr[-500:]))
    check("images_equal", filecmp.cmp(b, c, shallow=False), "b.img and c.img differ")
    bad = bad_lines(src) + bad_lines(dst)
    check("no_block_wrong", not bad, " / ".join(bad[:4]))


def test_incomplete_marker(d, vms, check):
    """A destination killed in the middle keeps its image's marker; kmig
    run refuses that image until it is received again (--incoming) or the
    marker is removed."""
    src = blkguest.start(d, vms, check, "src", image(d, "a.img"))
    if not src:
        return
    b = image(d, "b.img")
    dst, uri = incoming(d, vms, "dst", b)
    q = src.qmp()
    kt.set_caps(q, x_block_migration=True)
    kt.set_params(q, max_bandwidth=1 << 20)
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    deadline = time.time() + kt.slow(30)
    while time.time() < deadline and not os.path.exists(b + MARK):
        time.sleep(0.1)
    check("marked", os.path.exists(b + MARK), b + MARK)
    dst.kill()
    r = kt.wait_migration(q, kt.slow(30))
    check("failed", r.get("status") == "failed", repr(r))
    check("src_goes_on", goes_on(src, kt.slow(30)), kt.dump(src))
    other = kt.kmig_vm(d, "other", CMDLINE, memory="128M", extra=blk_args(b))
    vms.append(other)
    rc = other.wait_exit(kt.slow(30))
    check("refused", rc == 1 and "did not complete" in other.output(),
          "rc %r: %s" % (rc, other.output()[-300:]))


def test_full_destination(d, vms, check, ext4):
    a = image(d, "a.img")
    src = blkguest.start(d, vms, check, "src", a)
    if not src:
        return
    full = image(ext4(8, "small"), "b.img")
    dst, uri = incoming(d, vms, "dst", full, direct=True)
    r = kt.migrate(src, dst, uri, caps={**STREAM, "x-verify": True},
                   params={"max-bandwidth": 64 << 20}, timeout=kt.slow(180))
    rc = dst.wait_exit(kt.slow(20))
    check("failed", r.get("status") == "failed" and
          "No space left on device" in r.get("error-desc", ""), repr(r))
    check("dst_exits", rc == 1 and "No space left on device" in dst.output(),
          "rc %r: %s" % (rc, dst.output()[-400:]))
    check("dst_marked", os.path.exists(full + MARK), full + MARK)
    check("src_unmarked", not os.path.exists(a + MARK), a + MARK)
    check("src_goes_on", src.qmp().cmd("query-status").get("status") == "running" and
          goes_on(src, kt.slow(30)), kt.dump(src))
    # the retry, with room: the disk whole again, through O_DIRECT
    b = image(ext4(96, "big"), "b.img")
    dst, uri = incoming(d, vms, "dst2", b, direct=True)
    r = kt.migrate(src, dst, uri, caps={**STREAM, "x-verify": True},
                   params={"max-bandwidth": 64 << 20}, timeout=kt.slow(180))
    if not check("retry_completed", r.get("status") == "completed",
                 "%r; src %s; dst %s" % (r, kt.dump(src), kt.dump(dst))):
        return
    check("marker_gone", not os.path.exists(b + MARK), b + MARK)
    check("disk_goes_on", goes_on(dst, kt.slow(60)), kt.dump(dst))
    bad = bad_lines(src) + bad_lines(dst)
    check("no_block_wrong", not bad, " / ".join(bad[:4]))


def test_stream_negative_control(d, vms, check):
    """The guest stopped first, so the bulk pass sends every chunk that
    holds data once and nothing is sent again: the chunk the fault leaves
    out is certainly missing at the destination.  (With the guest running,
    the chunk left out of the final pass may be one whose last write landed
    while the previous pass read it, so the destination held it already.)"""
    src = blkguest.start(d, vms, check, "src", image(d, "a.img"), kmig=kt.KMIG_FAULTS,
                         env={"KMIG_FAULT": "skip-disk-chunk@bulk"}, cmdline=SMALL)
    if not src:
        return
    q = src.qmp()
    q.cmd("stop")
    # x-verify: the sums differ, the migration fails, the source is as it was
    dst, uri = incoming(d, vms, "dst", image(d, "b.img"), kmig=kt.KMIG_FAULTS, cmdline=SMALL)
    r = kt.migrate(src, dst, uri, caps={**STREAM, "x-verify": True},
                   params={"max-bandwidth": 64 << 20}, timeout=kt.slow(180))
    check("verify_failed", r.get("status") == "failed" and
          "checksum differs" in r.get("error-desc", ""), repr(r))
    check("fault_injected", src.output().count("fault injected: skip-disk-chunk") == 1,
          src.output()[-300:])
    check("src_stays_stopped", q.cmd("query-status").get("status") == "paused",
          repr(q.cmd("query-status")))
    dst.wait_exit(kt.slow(20))
    # without it: the migration completes; cont, and the guest finds the block
    dst, uri = incoming(d, vms, "dst2", image(d, "c.img"), kmig=kt.KMIG_FAULTS, cmdline=SMALL)
    r = kt.migrate(src, dst, uri, caps={**STREAM, "x-verify": False},
                   params={"max-bandwidth": 64 << 20}, timeout=kt.slow(180))
    check("completed", r.get("status") == "completed", repr(r))
    check("fault_injected_again", src.output().count("fault injected: skip-disk-chunk") == 2,
          src.output()[-300:])
    dst.qmp().cmd("cont")
    # the guest visits every block once a round: within two more rounds
    found = bad_within_rounds(dst, 2, kt.slow(60))
    check("guest_finds_it", found is not None, "%r; %s" % (blkguest.rounds(dst)[-3:],
                                                           kt.dump(dst)))


def bad_within_rounds(vm, n, timeout):
    """A "disk BAD" line before the disk workload has begun n more rounds
    (or timeout passed), else None."""
    r0 = (blkguest.rounds(vm) or [("ok", 0, 0)])[-1][1]
    deadline = time.time() + timeout
    while time.time() < deadline and vm.proc.poll() is None:
        m = vm.console.wait(r"disk BAD block=", 0.5)
        if m:
            return m
        r = blkguest.rounds(vm)
        if r and r[-1][1] > r0 + n:
            return None
    return None
