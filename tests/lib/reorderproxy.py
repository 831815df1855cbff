"""A relay between a migration's source and destination that makes the
source's connections speak in another order than it opened them, as a
network that keeps no order between connections may (a lost segment sent
again, a relay of its own): tests/e2e/test_early_channels.py.

The source connects to relay.port, and every connection it makes there is
relayed as bytes, both ways, on a connection of its own to the
destination, opened at once: the destination's listener sees the
connections arrive in the source's order, and only their first bytes come
in `order`, a list of the connections' indexes (0 = the first the source
opened).  Connection order[i] sends nothing on until the connections
before it in the list have each sent their first bytes on and then
gate(i), if given, returned True (the test's way to wait until the
destination has dealt with them: a destination that finds several
connections with bytes takes the one that connected first, which would
undo the order); or until `wait_s` passed, or gate returned False: then
`reordered` is False, the test did not get what it asked for.  `first`
lists the connections in the order their first bytes went on.
"""
import socket
import threading
import time


class ReorderProxy:
    def __init__(self, dst_port, order, gate=None, wait_s=5.0):
        assert sorted(order) == list(range(len(order))), "order: each index once"
        self.dst_port, self.order, self.gate, self.wait_s = dst_port, list(order), gate, wait_s
        self.first = []
        self.reordered = True
        self.error = None
        self._cond = threading.Condition()
        self._socks = []
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(32)
        self.port = self.lsock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        k = 0
        try:
            while True:
                src, _ = self.lsock.accept()
                dst = socket.create_connection(("127.0.0.1", self.dst_port), timeout=30)
                dst.settimeout(None)
                with self._cond:
                    self._socks += [src, dst]
                threading.Thread(target=self._pump, args=(dst, src), daemon=True).start()
                threading.Thread(target=self._forward, args=(k, src, dst), daemon=True).start()
                k += 1
        except OSError as e:
            if self.lsock.fileno() >= 0:
                self.error = e

    def _turn(self, k):
        """Waits until every connection before k in `order` sent its first
        bytes on, then for the gate (k not in the list: at once)."""
        i = self.order.index(k) if k in self.order else 0
        deadline = time.time() + self.wait_s
        with self._cond:
            while not set(self.order[:i]) <= set(self.first):
                left = deadline - time.time()
                if left <= 0:
                    self.reordered = False
                    return
                self._cond.wait(left)
        if i and self.gate and not self.gate(i):
            self.reordered = False

    def _forward(self, k, src, dst):
        try:
            got = src.recv(65536)
            self._turn(k)
            if got:
                dst.sendall(got)
            with self._cond:
                self.first.append(k)
                self._cond.notify_all()
            if got:
                self._pump(src, dst)
                return
        except OSError:
            pass
        self._shut(src, dst)

    @staticmethod
    def _shut(a, b):
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _pump(self, a, b):
        """Bytes from a to b until either end closes; then both ends go."""
        try:
            while True:
                got = a.recv(65536)
                if not got:
                    break
                b.sendall(got)
        except OSError:
            pass
        self._shut(a, b)

    def close(self):
        try:
            self.lsock.close()
        except OSError:
            pass
        with self._cond:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass
