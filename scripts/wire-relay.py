#!/usr/bin/python3
"""wire-relay: forward every Ethernet frame between two interfaces, each one
after a fixed delay; scripts/two-hosts --rtt-ms runs it (this kernel has no
netem).

    wire-relay.py IF1 IF2 DELAY_MS

Frames are read and written with AF_PACKET sockets carrying a virtio-net
header (PACKET_VNET_HDR), so GSO frames and checksum offload pass through
as they are.  Frames wait in one FIFO per direction; once more than
MAX_QUEUED bytes wait in a direction, new ones are dropped (a full link
buffer).  Prints "ready" once both sockets are bound; runs until killed
or until an interface goes away.
"""
import collections
import errno
import select
import socket
import sys
import time

ETH_P_ALL = 3
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
MAX_FRAME = 256 * 1024
MAX_QUEUED = 32 << 20
BATCH = 256


def open_if(name):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    try:
        s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    except OSError:
        pass    # older kernels: outgoing frames are told apart by pkttype below
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        s.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
    s.bind((name, ETH_P_ALL))
    s.setblocking(False)
    return s


class Direction:
    """Frames read on src, written to dst DELAY seconds later."""

    def __init__(self, src, dst, delay):
        self.src, self.dst, self.delay = src, dst, delay
        self.queue = collections.deque()
        self.queued = 0
        self.dropped = 0

    def read(self, now):
        for _ in range(BATCH):
            try:
                data, _, flags, addr = self.src.recvmsg(MAX_FRAME)
            except BlockingIOError:
                return
            if addr[2] == PACKET_OUTGOING or flags & socket.MSG_TRUNC:
                continue
            if self.queued + len(data) > MAX_QUEUED:
                self.dropped += 1
                continue
            self.queue.append((now + self.delay, data))
            self.queued += len(data)

    def write(self, now):
        """Sends what is due; returns when the next frame is due (or None)."""
        while self.queue:
            due, data = self.queue[0]
            if due > now:
                return due
            try:
                self.dst.send(data)
            except BlockingIOError:
                return now + 0.001      # the socket's buffer is full: soon again
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                self.dropped += 1       # the device's queue is full: a loss
            self.queue.popleft()
            self.queued -= len(data)
        return None


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    a, b = open_if(sys.argv[1]), open_if(sys.argv[2])
    delay = float(sys.argv[3]) / 1000.0
    dirs = {a: Direction(a, b, delay), b: Direction(b, a, delay)}
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        due = [t for t in (d.write(now) for d in dirs.values()) if t is not None]
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        readable, _, _ = select.select(list(dirs), [], [], timeout)
        now = time.monotonic()
        for s in readable:
            dirs[s].read(now)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
