"""The documented verify page rule (tests/guest/verify_page.py) accepts
exactly the pages a guest can leave, and bites on anything else.  No VM."""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import verify_page as vp  # noqa: E402
from kmigtest import Report  # noqa: E402

r = Report()
A = 0x2f9000
r.ok("verify_page_whole_generation_ok", vp.check_page(A, vp.make_page(A, 6))[0])
r.ok("verify_page_never_written_ok", vp.check_page(A, bytes(4096))[0])
r.ok("verify_page_torn_new_prefix_ok", vp.check_page(A, vp.make_page(A, 6, torn_at=100))[0])
rev = [vp.word_value(A, j, 5 if j < 128 else 6) for j in range(512)]
r.ok("verify_page_torn_old_prefix_ok", vp.check_page(A, struct.pack("<512Q", *rev))[0],
     "a dump read while the guest rewrote the page")
gap = [vp.word_value(A, j, 4 if j < 128 else 6) for j in range(512)]
r.ok("verify_page_generation_gap_bad", not vp.check_page(A, struct.pack("<512Q", *gap))[0])
three = [vp.word_value(A, j, 4 if j < 10 else 5 if j < 20 else 6) for j in range(512)]
r.ok("verify_page_three_generations_bad", not vp.check_page(A, struct.pack("<512Q", *three))[0])
bad = bytearray(vp.make_page(A, 6))
bad[8 * 77] ^= 1
r.ok("verify_page_flipped_bit_bad", not vp.check_page(A, bytes(bad))[0])
r.ok("verify_page_other_address_bad", not vp.check_page(A + 4096, vp.make_page(A, 6))[0])
r.done()
