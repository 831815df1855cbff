#!/usr/bin/python3
"""Writes the seed corpora of the fuzz harnesses into tests/fuzz/corpus/
(committed; rerun after a protocol change): valid inputs the fuzzer
mutates from.  See docs/protocol.md for the records."""
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
PG = 4096


def rec(rtype, payload=b"", flags=0):
    return struct.pack("<IIQ", rtype, flags, len(payload)) + payload


def start(blocks=((0, 16 * PG), (1 << 32, 8 * PG)), shared=False, uuid=None):
    p = b"KMIGSTRM" + struct.pack("<III", 2, PG, len(blocks))
    for gpa, size in blocks:
        p += struct.pack("<QQ", gpa, size)
    if uuid is not None:
        p += uuid
    return rec(1, p, (32 if shared else 0) | (64 if uuid is not None else 0))


def pages(block, offsets, fill):
    p = struct.pack("<II", block, len(offsets)) + b"".join(struct.pack("<Q", o) for o in offsets)
    return rec(2, p + b"".join(bytes([fill + i]) * PG for i in range(len(offsets))))


def pages_zlib(block, offsets, fill):
    """A PAGES record compressed with zlib (flag COMPRESSED_ZLIB)."""
    raw = b"".join(bytes([fill + i]) * PG for i in range(len(offsets)))
    p = struct.pack("<II", block, len(offsets)) + b"".join(struct.pack("<Q", o) for o in offsets)
    return rec(2, p + struct.pack("<I", len(raw)) + zlib.compress(raw, 1), 1 << 3)


def zero(block, offsets):
    return rec(3, struct.pack("<II", block, len(offsets))
               + b"".join(struct.pack("<Q", o) for o in offsets))


def state(sid, inst, data):
    return rec(4, struct.pack("<III", sid, 1, inst) + data)


def sync(n):
    return rec(5, struct.pack("<Q", n))


def channel(index, count, session=b"0123456789abcdef"):
    return rec(8, struct.pack("<II", index, count) + session)


def discard(block, offsets):
    return rec(9, struct.pack("<II", block, len(offsets))
               + b"".join(struct.pack("<Q", o) for o in offsets))


def preempt(channels=0, session=b"0123456789abcdef"):
    return rec(13, session + struct.pack("<I", channels))


def xbzrle(block, entries):
    """XBZRLE: entries of (offset, bytes): b"" zero, 4096 bytes whole, else a delta."""
    p = struct.pack("<II", block, len(entries))
    for off, data in entries:
        p += struct.pack("<QH", off, len(data)) + data
    return rec(14, p)


def end(checksum=None, page_sum=False):
    """END; with a checksum flag HAS_CHECKSUM (4), and PAGE_SUM (16): a
    background snapshot's page sum."""
    return rec(6, checksum or b"", (4 if checksum else 0) | (16 if page_sum else 0))


def recv_seeds():
    body = pages(0, [0, PG, 5 * PG], 0x11) + zero(1, [0, 7 * PG]) + state(7, 0, b"lapic" * 10)
    return {
        "main_full": b"\0" + start() + body + sync(1) + pages(1, [PG], 0x42) + end(),
        "main_channels": b"\0" + start() + channel(0, 2) + body + sync(1) + end(),
        "main_checksum": b"\0" + start() + body + end(bytes(32)),
        "main_page_sum": b"\0" + start() + body + end(bytes(32), page_sum=True),
        "channel": b"\1" + pages(0, [2 * PG], 0x33) + zero(0, [3 * PG]) + sync(1) + sync(2),
        "main_zlib": b"\0" + start() + pages_zlib(0, [0, 3 * PG], 0x21) + sync(1) + end(),
        "error": b"\0" + start() + rec(7, struct.pack("<I", 125) + b"cancelled"),
        "postcopy": b"\2" + start() + body + discard(0, [0, PG]) + rec(10, b"")
                    + pages(0, [PG], 0x55) + zero(1, [7 * PG]) + end(),
        "main_preempt": b"\x0a" + start() + preempt(2) + channel(0, 2) + body
                        + discard(0, [0, PG]) + rec(10, b"") + pages(0, [PG], 0x56) + end(),
        "preempt_channel": b"\4" + pages(0, [PG, 9 * PG], 0x57) + zero(1, [2 * PG]) + end(),
        "main_shared": b"\x10" + start(shared=True) + state(7, 0, b"lapic" * 10)
                       + rec(15, struct.pack("<Q", 0x5eed)) + end(),
        "main_uuid": b"\x10" + start(uuid=bytes(range(0xa0, 0xb0))) + body + end(),
        "main_xbzrle": b"\0" + start() + body + sync(1)
                       + xbzrle(0, [(0, bytes([0, 1, 0x99, 5, 2, 1, 2])), (PG, b""),
                                    (5 * PG, bytes([0x61]) * PG),
                                    (2 * PG, bytes([0xf9, 0x1f, 1, 7]))])
                       + xbzrle(1, [(7 * PG, bytes([0x80, 0x01, 3, 1, 2, 3]))]) + end(),
    }


def qmp_seeds():
    cmds = [
        b'{"execute": "qmp_capabilities"}\n{"execute": "query-version", "id": 1}\n',
        b'{"execute": "query-commands"}\n',
        b'{"execute": "qmp_capabilities", "arguments": {"enable": ["oob"]}}\n',
        b'{"execute": "no-such-command", "id": "x\\u00e9"}\n',
        b'{"execute": "query-version", "arguments": {"extra": 1}}\n',
        b'[1, 2, {"a": null}]\n{"execute": 5}\n',
    ]
    return {"cmd%d" % i: c for i, c in enumerate(cmds)}


def balloon_seeds():
    # the harness takes "P" + (u32 offset, u8 byte)... as patches of a
    # valid state it builds itself; anything else is loaded as it is
    return {
        "valid": b"P",
        "patch_ranges": b"P" + struct.pack("<IB", 1000, 0xff),
        "raw_header": b"BLN1" + struct.pack("<I", 0),
    }


def pvh_elf(entry=0x100000, paddr=0x100000, memsz=0x2000):
    """A minimal x86-64 PVH kernel: one PT_LOAD, one PT_NOTE with the entry."""
    note = struct.pack("<III", 4, 4, 18) + b"Xen\0" + struct.pack("<I", entry)
    ehdr_len, phdr_len = 64, 56
    note_off = ehdr_len + 2 * phdr_len
    code_off = 0x200
    code = b"\xf4" * 16
    eh = (b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
          + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, entry, ehdr_len, 0, 0, ehdr_len,
                        phdr_len, 2, 64, 0, 0))
    load = struct.pack("<IIQQQQQQ", 1, 5, code_off, paddr, paddr, len(code), memsz, 0x1000)
    pnote = struct.pack("<IIQQQQQQ", 4, 4, note_off, 0, 0, len(note), len(note), 4)
    img = eh + load + pnote + note
    return img + bytes(code_off - len(img)) + code


def bzimage(setup_sects=2, pm=8192, init_size=0x10000, initrd=4096, cmdline=16):
    """A bzImage setup header (boot protocol 2.15) and a protected-mode part;
    the last 8 bytes give fuzz_boot the initrd size and command line length."""
    img = bytearray((setup_sects + 1) * 512 + pm)
    img[0x1f1] = setup_sects
    struct.pack_into("<H", img, 0x1fe, 0xaa55)
    img[0x200:0x202] = b"\xeb\x6a"
    img[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", img, 0x206, 0x020f)
    img[0x211] = 1
    struct.pack_into("<I", img, 0x214, 0x100000)
    struct.pack_into("<I", img, 0x22c, 0x7fffffff)
    struct.pack_into("<I", img, 0x238, 2047)
    struct.pack_into("<I", img, 0x260, init_size)
    struct.pack_into("<IHH", img, len(img) - 8, initrd, cmdline, 0)
    return bytes(img)


def boot_seeds():
    return {"pvh": pvh_elf(), "pvh_high": pvh_elf(entry=0x200000, paddr=0x200000, memsz=0x10000),
            "not_elf": b"MZ" + bytes(62), "bzimage": bzimage(),
            "bzimage_big_initrd": bzimage(initrd=100 << 20, init_size=16 << 20)}


def section(sid, inst, data):
    return struct.pack("<IBH", sid, inst, len(data)) + data


def state_seeds():
    tsc = struct.pack("<QQII", 1 << 40, 1700000000 * 10**9, 2000000, 0)
    msrs = b"".join(struct.pack("<IIQ", idx, 0, 0) for idx in (0x10, 0x174, 0xc0000080))
    return {
        "runstate": section(23, 0, b"\x01"),
        "tsc_msrs": section(24, 0, tsc) + section(6, 1, msrs),
        "vcpu": section(2, 0, bytes(144)) + section(1, 1, bytes(312)) + section(7, 0, bytes(1024)),
        "vm": section(30, 0, bytes(10)) + section(21, 0, bytes(112)) + section(22, 0, bytes(48)),
        "balloon": section(31, 0, b"BLN1" + bytes(60)),
        "bad_version": struct.pack("<IBH", 0x82000002, 0, 4) + bytes(4),
    }


def virtio_seeds():
    feats = 1 << 32 | 1 << 1 | 1 << 3 | 1 << 5
    start = b"\x04" + struct.pack("<Q", feats)
    pfns = b"\x00" + struct.pack("<HB", 0x10000 - 0x100, 16) + b"".join(
        struct.pack("<I", 0x2000 + i) for i in range(4))
    win = 0x100000 + 0x10000 - 0x100     # QBASE + that window offset
    inflate = b"\x05" + struct.pack("<BIIHH", 0, win, 16, 0, 0)
    deflate = b"\x05" + struct.pack("<BIIHH", 1, win, 16, 0, 0)
    stats = b"\x05" + struct.pack("<BIIHH", 2, win, 60, 0, 0)
    hint = b"\x06" + struct.pack("<BI", 1, 0) + b"\x05" + struct.pack("<BIIHH", 3, 0x300000, 4096, 2, 0)
    report = b"\x05" + struct.pack("<BIIHH", 4, 0x400000, 0x200000, 2, 0)
    save = b"\x06" + struct.pack("<BI", 4, 0)
    return {
        "inflate_deflate": start + pfns + inflate + deflate + save,
        "stats_hint_report": start + stats + hint + report + save,
        "target": start + b"\x06" + struct.pack("<BI", 0, 1000) + b"\x02" + struct.pack("<HB", 0x2004, 2),
        "raw_mmio": b"\x01" + struct.pack("<HBQ", 0x14, 0, 0xff) + b"\x03" + struct.pack("<BBI", 4, 1, 6),
        # a device without hinting: reporting is queue 3
        "no_hint_report": b"\x07\x01" + b"\x04" + struct.pack("<Q", 1 << 32 | 1 << 1 | 1 << 5) +
        b"\x05" + struct.pack("<BIIHH", 3, 0x400000, 0x200000, 2, 0) + save,
    }


def net_seeds():
    """fuzz_net: START, receive buffers, frames from the network,
    a transmitted frame, control commands, link and save."""
    feats = 1 << 32 | 1 << 5 | 1 << 15 | 1 << 16 | 1 << 17 | 1 << 18 | 1 << 21 | 1 << 23
    start = b"\x03" + struct.pack("<Q", feats)
    hdr = bytes(12)
    frame = hdr + bytes.fromhex("525400123456" "020000000009" "0800") + bytes(50)
    rx = b"".join(b"\x04" + struct.pack("<BIIHH", 0, 0x200000 + i * 0x1000, 1526, 2, 0)
                  for i in range(4))
    got = b"\x05" + struct.pack("<H", len(frame)) + frame
    win = 0x100000 + 0x10000 - 0x100
    tx = (b"\x00" + struct.pack("<HB", 0x10000 - 0x100, len(frame)) + frame +
          b"\x04" + struct.pack("<BIIHH", 1, win, len(frame), 0, 0))
    promisc_off = (b"\x00" + struct.pack("<HB", 0x10000 - 0x100, 3) + b"\x00\x00\x00" +
                   b"\x04" + struct.pack("<BIIHH", 2, win, 3, 1, 1) +
                   b"\x04" + struct.pack("<BIIHH", 2, 0x300000, 1, 2, 0))
    save = b"\x06" + struct.pack("<BI", 3, 0)
    return {
        "rx_tx": start + rx + got + got + tx + save,
        "ctrl": start + promisc_off + rx + got + save,
        "link": start + rx + b"\x06" + struct.pack("<BI", 0, 0) + got + b"\x06" +
        struct.pack("<BI", 1, 0) + got + b"\x06" + struct.pack("<BI", 2, 0),
    }


def blk_seeds():
    """fuzz_blk: START, requests written into RAM near the queue (a
    header, data, a status byte) and made available: a write, a read, a
    flush, GET_ID, a discard, garbage; drains and a save."""
    feats = 1 << 32 | 1 << 1 | 1 << 2 | 1 << 6 | 1 << 9 | 1 << 13 | 1 << 14
    start = b"\x03" + struct.pack("<Q", feats)
    base = 0x100000

    def mem(off, data):
        return b"\x00" + struct.pack("<HB", off, len(data)) + data

    def desc(gpa, ln, flags):
        return b"\x04" + struct.pack("<IIHH", gpa, ln, flags, 0)

    def request(slot, typ, sector, data_len, data_w, payload=b""):
        hdr_off, st_off, data_off = 0x4000 + 16 * slot, 0x5000 + slot, 0x8000 + 0x1000 * slot
        out = mem(hdr_off, struct.pack("<IIQ", typ, 0, sector))
        if payload:
            out += mem(data_off, payload)
        # the chain's descriptors go in one after the other (NEXT = 1, WRITE = 2)
        parts = [(base + hdr_off, 16, 1)]
        if data_len:
            parts.append((base + data_off, data_len, 1 | (2 if data_w else 0)))
        parts.append((base + st_off, 1, 2))
        return out, parts
    seeds = {}
    w, wp = request(0, 1, 8, 512, False, bytes(range(200)))
    r, rp = request(1, 0, 8, 512, True)
    fl, fp = request(2, 4, 0, 0, False)
    gi, gp = request(3, 8, 0, 20, True)
    dc, dp = request(4, 11, 0, 16, False, struct.pack("<QII", 16, 8, 0))
    bad, bp = request(5, 77, 1 << 40, 512, True)

    def chain(parts, first):
        # descriptors land at consecutive indices starting at `first`
        out = b""
        for i, (gpa, ln, flags) in enumerate(parts):
            nxt = first + i + 1 if flags & 1 and i + 1 < len(parts) else 0
            fl = flags if i + 1 < len(parts) else flags & ~1
            out += b"\x04" + struct.pack("<IIHH", gpa, ln, fl, nxt)
        return out
    seeds["write_read"] = start + w + chain(wp, 0) + b"\x05" + r + chain(rp, 3) + b"\x05"
    seeds["flush_id"] = start + fl + chain(fp, 0) + gi + chain(gp, 2) + b"\x05"
    seeds["discard_bad_save"] = start + dc + chain(dp, 0) + bad + chain(bp, 3) + b"\x06"
    return seeds


def rp_seeds():
    req = lambda block, off: rec(0x104, struct.pack("<IIQ", block, 0, off))
    fail = rec(0x102, struct.pack("<I", 22) + b"no room")
    ack = lambda pos: rec(0x107, struct.pack("<Q", pos))

    def bitmap(first, nbits, words):
        return rec(0x106, struct.pack("<QQ", first, nbits) + b"".join(
            struct.pack("<Q", w) for w in words))
    return {
        "requests": b"\0" + req(0, 0) + rec(0x105) + req(1, 511 * PG) + req(0, 3 * PG) + rec(0x101),
        "fail": b"\0" + req(1, 0) + fail,
        "outside": b"\0" + req(0, 512 * PG) + req(1, 512 * PG),
        "acks": b"\0" + ack(64) + rec(0x105) + ack(65600) + req(0, PG) + ack(65600) + rec(0x101),
        "ack_back": b"\0" + ack(70000) + ack(69999),
        "bitmap": b"\1" + bitmap(0, 1000, [0xff] * 8) + bitmap(8, 1000, [(1 << 64) - 1] * 8),
        "bitmap_bad": b"\1" + bitmap(15, 1000, [1, 2]) + bitmap(0, 999, [1]),
    }


def write(name, seeds):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    for k, v in seeds.items():
        with open(os.path.join(d, k), "wb") as f:
            f.write(v)


if __name__ == "__main__":
    write("recv", recv_seeds())
    write("qmp", qmp_seeds())
    write("balloon_state", balloon_seeds())
    write("boot", boot_seeds())
    write("state", state_seeds())
    write("virtio", virtio_seeds())
    write("rp", rp_seeds())
    write("net", net_seeds())
    write("blk", blk_seeds())
