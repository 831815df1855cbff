"""The page format of the guest's `verify` workload (docs/guest.md, "verify
page format"), for checking a memory dump from outside the guest.

Word j (8 bytes, little-endian) of the 4 KiB page at guest-physical address
A written in generation g (1 .. 2^24-1) is

    (g << 40) | (mix64(A ^ (j << 3) ^ (g * 0x9e3779b97f4a7c15)) & (2^40 - 1))

where mix64 is the splitmix64 finalizer; generation 0 (never written) is an
all-zero word.  The guest writes a page's words in ascending j, so a page
caught mid-rewrite holds generation g+1 in words 0..k-1 and g in k..511.

    check_page(addr, data) -> (ok, why)
"""
import struct

M64 = (1 << 64) - 1
LOW40 = (1 << 40) - 1
GEN_MAX = 0xFFFFFF
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z):
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def word_value(addr, j, gen):
    """The 64-bit word j of the page at addr in generation gen."""
    if gen == 0:
        return 0
    return (gen << 40) | (mix64(addr ^ (j << 3) ^ ((gen * GOLDEN) & M64)) & LOW40)


def next_gen(gen):
    return 1 if gen >= GEN_MAX else gen + 1


def page_generations(data):
    return [w >> 40 for w in struct.unpack("<512Q", data)]


def check_page(addr, data):
    """Checks one 4096-byte page dumped from guest-physical address addr.

    ok when every word certifies itself and the page is either in one
    generation or torn between two consecutive generations: a rewrite's new
    generation as a prefix and the previous one as the rest (a stopped
    guest), or the reverse (a dump read while the guest rewrote the page
    behind the reader).  Returns (ok, why)."""
    if addr % 4096:
        return False, "address %#x is not page aligned" % addr
    if len(data) != 4096:
        return False, "page is %d bytes, not 4096" % len(data)
    words = struct.unpack("<512Q", data)
    for j, w in enumerate(words):
        g = w >> 40
        if w != word_value(addr, j, g):
            return False, "page %#x word %d = %#x is not a valid generation-%d word (want %#x)" % (
                addr, j, w, g, word_value(addr, j, g))
    first = words[0] >> 40
    k = 0
    while k < 512 and words[k] >> 40 == first:
        k += 1
    if k == 512:
        return True, "generation %d" % first
    rest = words[k] >> 40
    for j in range(k, 512):
        if words[j] >> 40 != rest:
            return False, "page %#x has more than two generations (word %d: %d, word %d: %d)" % (
                addr, k, rest, j, words[j] >> 40)
    if next_gen(rest) != first and next_gen(first) != rest:
        return False, "page %#x words 0..%d are generation %d but words %d..511 are %d (not consecutive)" % (
            addr, k - 1, first, k, rest)
    return True, "torn: words 0..%d generation %d, %d..511 generation %d" % (k - 1, first, k, rest)


def make_page(addr, gen, torn_at=512):
    """A page as the guest writes it (words >= torn_at still in gen - 1)."""
    old = gen - 1 if gen > 1 else (0 if gen == 1 else GEN_MAX)
    return struct.pack("<512Q", *[word_value(addr, j, gen if j < torn_at else old) for j in range(512)])
