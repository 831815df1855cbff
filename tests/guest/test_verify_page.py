"""The documented verify page rule (tests/guest/verify_page.py) accepts
exactly the pages a guest can leave, and bites on anything else.  No VM."""
import struct

import verify_page as vp

A = 0x2f9000


def gens(split):
    """A page whose word j has generation split(j)."""
    return struct.pack("<512Q", *[vp.word_value(A, j, split(j)) for j in range(512)])


def test_whole_generation_ok():
    assert vp.check_page(A, vp.make_page(A, 6))[0]


def test_never_written_ok():
    assert vp.check_page(A, bytes(4096))[0]


def test_torn_new_prefix_ok():
    assert vp.check_page(A, vp.make_page(A, 6, torn_at=100))[0]


def test_torn_old_prefix_ok():
    """A dump read while the guest rewrote the page."""
    assert vp.check_page(A, gens(lambda j: 5 if j < 128 else 6))[0]


def test_generation_gap_bad():
    assert not vp.check_page(A, gens(lambda j: 4 if j < 128 else 6))[0]


def test_three_generations_bad():
    assert not vp.check_page(A, gens(lambda j: 4 if j < 10 else 5 if j < 20 else 6))[0]


def test_flipped_bit_bad():
    bad = bytearray(vp.make_page(A, 6))
    bad[8 * 77] ^= 1
    assert not vp.check_page(A, bytes(bad))[0]


def test_other_address_bad():
    assert not vp.check_page(A + 4096, vp.make_page(A, 6))[0]
