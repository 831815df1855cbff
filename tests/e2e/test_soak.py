"""A short soak (make soak runs the long one): one verify guest migrated
SOAK_N times (default 20) between two kmig slots with x-verify, the
configuration changing at every hop (tests/lib/soak.py).  Every hop must
complete and the guest must go on verifying."""
import os

import pytest

import kmigtest as kt
import soak

pytestmark = pytest.mark.kvm

SOAK_N = int(os.environ.get("KMIG_SOAK_N", "20"))


def test_soak(d, vms, check):
    s = soak.Soak(d)
    try:
        summary = s.run(SOAK_N)
    finally:
        vms += s.vms
    print("# soak: %d of %d hops, %d failures, x-verify %d pages, guest checked %d pages; "
          "total ms %r, downtime ms %r, guest gap ms %r"
          % (summary["hops_done"], SOAK_N, summary["failures"], summary["xverify_pages"],
             summary["guest_checked_pages"], summary["total_ms"], summary["downtime_ms"],
             summary["guest_gap_ms"]))
    check("all_hops", summary["hops_done"] == SOAK_N and summary["failures"] == 0,
          "first failure %r" % (summary["first_failure"],))
    check("guest_checked", summary["guest_checked_pages"] > 0, repr(summary))
