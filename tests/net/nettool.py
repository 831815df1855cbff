#!/usr/bin/python3
"""Small network probes for tests/net, run inside a namespace with
`ip netns exec NS /usr/bin/python3 tests/net/nettool.py ...` (no ping or
iperf on these machines).

    nettool.py ping ADDR COUNT TIMEOUT   ICMP echo; prints each reply's RTT in ms
                                         (or "lost"); exits 0 if any came back
    nettool.py sink ADDR PORT            accepts one TCP connection, reads to EOF,
                                         prints "BYTES SECONDS" (first byte to EOF)
    nettool.py send ADDR PORT BYTES      connects and sends BYTES bytes
"""
import os
import select
import socket
import struct
import sys
import time


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    s = (s >> 16) + (s & 0xffff)
    s += s >> 16
    return ~s & 0xffff


def ping(addr, count, timeout):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    ident = os.getpid() & 0xffff
    got = 0
    for seq in range(count):
        body = struct.pack("!HH", ident, seq) + b"kmig-two-hosts"
        hdr = struct.pack("!BBH", 8, 0, checksum(struct.pack("!BBH", 8, 0, 0) + body))
        t0 = time.monotonic()
        s.sendto(hdr + body, (addr, 0))
        rtt = None
        while rtt is None:
            left = t0 + timeout - time.monotonic()
            if left <= 0 or not select.select([s], [], [], left)[0]:
                break
            pkt, src = s.recvfrom(65536)
            icmp = pkt[(pkt[0] & 0x0f) * 4:]
            if src[0] == addr and icmp[0] == 0 and icmp[4:8] == body[:4]:
                rtt = (time.monotonic() - t0) * 1000.0
        print("%.3f" % rtt if rtt is not None else "lost", flush=True)
        got += rtt is not None
    return 0 if got else 1


def sink(addr, port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(1)
    print("listening", flush=True)
    c, _ = ls.accept()
    n, t0 = 0, None
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        if t0 is None:
            t0 = time.monotonic()
        n += len(b)
    print("%d %.6f" % (n, time.monotonic() - (t0 or time.monotonic())), flush=True)
    return 0


def send(addr, port, nbytes):
    c = socket.create_connection((addr, port), timeout=60)
    chunk = b"\x5a" * (1 << 16)
    left = nbytes
    while left > 0:
        left -= c.send(chunk[:min(left, len(chunk))])
    c.shutdown(socket.SHUT_WR)
    c.recv(1)       # the sink's close: every byte was read
    return 0


def main(argv):
    if len(argv) == 5 and argv[1] == "ping":
        return ping(argv[2], int(argv[3]), float(argv[4]))
    if len(argv) == 4 and argv[1] == "sink":
        return sink(argv[2], int(argv[3]))
    if len(argv) == 5 and argv[1] == "send":
        return send(argv[2], int(argv[3]), int(argv[4]))
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
