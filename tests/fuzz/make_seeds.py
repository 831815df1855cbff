#!/usr/bin/python3
"""Writes the seed corpora of the fuzz harnesses into tests/fuzz/corpus/
(committed; rerun after a protocol change): valid inputs the fuzzer
mutates from.  See docs/protocol.md for the records."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
PG = 4096


def rec(rtype, payload=b"", flags=0):
    return struct.pack("<IIQ", rtype, flags, len(payload)) + payload


def start(blocks=((0, 16 * PG), (1 << 32, 8 * PG))):
    p = b"KMIGSTRM" + struct.pack("<III", 1, PG, len(blocks))
    for gpa, size in blocks:
        p += struct.pack("<QQ", gpa, size)
    return rec(1, p)


def pages(block, offsets, fill):
    p = struct.pack("<II", block, len(offsets)) + b"".join(struct.pack("<Q", o) for o in offsets)
    return rec(2, p + b"".join(bytes([fill + i]) * PG for i in range(len(offsets))))


def zero(block, offsets):
    return rec(3, struct.pack("<II", block, len(offsets))
               + b"".join(struct.pack("<Q", o) for o in offsets))


def state(sid, inst, data):
    return rec(4, struct.pack("<III", sid, 1, inst) + data)


def sync(n):
    return rec(5, struct.pack("<Q", n))


def channel(index, count):
    return rec(8, struct.pack("<II", index, count))


def end(checksum=None):
    return rec(6, checksum or b"", 1 if checksum else 0)


def recv_seeds():
    body = pages(0, [0, PG, 5 * PG], 0x11) + zero(1, [0, 7 * PG]) + state(7, 0, b"lapic" * 10)
    return {
        "main_full": b"\0" + start() + body + sync(1) + pages(1, [PG], 0x42) + end(),
        "main_channels": b"\0" + start() + channel(0, 2) + body + sync(1) + end(),
        "main_checksum": b"\0" + start() + body + end(bytes(32)),
        "channel": b"\1" + pages(0, [2 * PG], 0x33) + zero(0, [3 * PG]) + sync(1) + sync(2),
        "error": b"\0" + start() + rec(7, struct.pack("<I", 125) + b"cancelled"),
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
