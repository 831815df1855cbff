"""virtio-blk across a live migration on shared storage, with the test
guest's disk workload (disk=1: each block of a 16 MiB region read and
checked against the generation the guest last wrote, then rewritten; the
expected generations live in guest RAM, so they migrate with it; docs/guest.md)
beside its RAM verify workload.  Source and destination open the same
raw image (one host here: shared storage as NFS would give it).

  shared_migration  a second kmig on the image is refused (locked); the
      destination waits holding the image inactive (no write lock, no
      I/O); a migration cancelled in its bulk pass leaves the source
      writing (lock kept, rounds go on, no error); the migration with
      x-verify completes, the destination holds the write lock and the
      source none (a `cont` there is refused: it would take the image
      back), and the guest's rounds go on there with no block
      wrong (every write the source acknowledged is in the image: the
      device drained and flushed before the final sync);
  shared_postcopy  the same, switched to post-copy part way (x-verify),
      with cache.direct=on on both sides (O_DIRECT: neither side's page
      cache holds a block; the image on an ext4 file system, since the
      emulated VM's tmpfs takes no O_DIRECT): the destination takes the
      write lock at the switch, its workers read and write guest pages
      it may still lack, and the guest's rounds go on there with no
      block wrong;
  device_marks_negative_control  the same migration from the test build
      with the device's writes into guest RAM unreported
      (KMIG_FAULT=no-device-marks): the blocks read into guest memory
      after the pass sent those pages never reach the destination, and
      x-verify fails.
"""

import pytest

import kmigtest as kt
import blkguest
from blkguest import CMDLINE, bad_lines, blk_args, goes_on, image

pytestmark = pytest.mark.kvm


def block(q):
    b = q.cmd("query-block")
    return b[0] if b else {}


def test_shared_migration(d, vms, check):
    img = image(d)
    src = blkguest.start(d, vms, check, "src", img)
    if not src:
        return
    q = src.qmp()
    b = block(q)
    check("src_lock", b.get("x-image-lock") == "write" and b.get("x-active") is True and
          b.get("inserted", {}).get("file") == img, repr(b))
    # a second VM on the image is refused at start
    other = kt.kmig_vm(d, "other", CMDLINE, memory="128M", extra=blk_args(img))
    vms.append(other)
    rc = other.wait_exit(kt.slow(30))
    check("second_refused", rc == 1 and "in use by another process" in other.output(),
          "rc %r: %s" % (rc, other.output()[-300:]))
    # the destination waits inactive
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    dst = kt.kmig_vm(d, "dst", CMDLINE, memory="256M", extra=blk_args(img) + ["--incoming", uri])
    vms.append(dst)
    kt.wait_incoming(dst)
    b = block(dst.qmp())
    check("dst_inactive", b.get("x-image-lock") != "write" and b.get("x-active") is False,
          repr(b))
    # cancelled in the bulk pass: the source keeps writing
    kt.set_caps(q, x_verify=True)
    kt.set_params(q, max_bandwidth=1 << 20)
    q.cmd("migrate", uri=uri)
    r = kt.cancel_in_bulk(q, kt.slow(30))
    check("cancelled", r.get("status") == "cancelled" and r["ram"]["transferred"] > 0,
          repr(r))
    b = block(q)
    check("lock_kept", b.get("x-image-lock") == "write" and b.get("x-active") is True, repr(b))
    check("disk_after_cancel", goes_on(src, kt.slow(30)), kt.dump(src))
    dst.wait_exit(kt.slow(20))
    # the migration
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    dst = kt.kmig_vm(d, "dst2", CMDLINE, memory="256M",
                     extra=blk_args(img) + ["--incoming", uri])
    vms.append(dst)
    # auto-converge: natively the guest rewrites its 32 MiB faster than
    # the downtime limit lets the last pass go at this bandwidth
    r = kt.migrate(src, dst, uri, caps={"auto-converge": True},
                   params={"max-bandwidth": 64 << 20}, timeout=kt.slow(120))
    if not check("completed", r.get("status") == "completed",
                 "%r; src %s; dst %s" % (r, kt.dump(src), kt.dump(dst))):
        return
    b, sb = block(dst.qmp()), block(q)
    check("dst_active", b.get("x-image-lock") == "write" and b.get("x-active") is True, repr(b))
    check("src_gave_up", sb.get("x-image-lock") != "write" and sb.get("x-active") is False,
          repr(sb))
    # cont on the source would take the image back: not while the
    # destination holds it
    try:
        q.cmd("cont")
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    check("cont_refused", "in use by another process" in refused and
          q.cmd("query-status").get("status") == "postmigrate", refused)
    check("disk_goes_on", goes_on(dst, kt.slow(60)), kt.dump(dst))
    bad = bad_lines(src) + bad_lines(dst)
    check("no_block_wrong", not bad, " / ".join(bad[:4]))


def test_shared_postcopy(d, vms, check, ext4):
    img = image(ext4(96), "disk.img")
    src = blkguest.start(d, vms, check, "src", img, direct=True)
    if not src:
        return
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    dst = kt.kmig_vm(d, "dst", CMDLINE, memory="256M",
                     extra=blk_args(img, direct=True) + ["--incoming", uri])
    vms.append(dst)
    q = src.qmp()
    kt.set_caps(dst.qmp(), postcopy_ram=True)
    kt.set_caps(q, postcopy_ram=True, x_verify=True)
    kt.set_params(q, max_bandwidth=16 << 20)
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    kt.wait_transferred(q, 32 << 20, kt.slow(60))
    q.cmd("migrate-start-postcopy")
    r, seen = kt.follow(q, kt.slow(120))
    if not check("completed", r.get("status") == "completed" and "postcopy-active" in seen,
                 "%r %r; src %s; dst %s" % (r, seen, kt.dump(src), kt.dump(dst))):
        return
    b, sb = block(dst.qmp()), block(q)
    check("dst_active", b.get("x-image-lock") == "write" and b.get("x-active") is True, repr(b))
    check("direct", b.get("inserted", {}).get("cache", {}).get("direct") is True, repr(b))
    check("src_gave_up", sb.get("x-image-lock") != "write", repr(sb))
    check("disk_goes_on", goes_on(dst, kt.slow(60)), kt.dump(dst))
    bad = bad_lines(src) + bad_lines(dst)
    check("no_block_wrong", not bad, " / ".join(bad[:4]))


def test_device_marks_negative_control(d, vms, check):
    img = image(d)
    src = blkguest.start(d, vms, check, "src", img, kmig=kt.KMIG_FAULTS,
                         env={"KMIG_FAULT": "no-device-marks"})
    if not src:
        return
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    dst = kt.kmig_vm(d, "dst", CMDLINE, memory="256M", extra=blk_args(img) + ["--incoming", uri],
                     kmig=kt.KMIG_FAULTS)
    vms.append(dst)
    r = kt.migrate(src, dst, uri, caps={"x-verify": True, "auto-converge": True},
                   params={"max-bandwidth": 64 << 20}, timeout=kt.slow(120))
    out = src.output() + dst.output()
    check("fault_injected", "fault injected: no-device-marks" in src.output(), src.output()[-300:])
    check("verify_failed", r.get("status") == "failed", repr(r))
    # the reason is read from query-migrate: the VMMs' own log lines may
    # still be on their way when the status reads failed
    check("checksum_reason", "guest RAM checksum mismatch" in (r.get("error-desc") or ""),
          "%r; output %s" % (r, out[-500:]))
