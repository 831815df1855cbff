"""A TCP proxy between a migration's source and destination that breaks the
stream once, at a chosen point, in a chosen way (tests/e2e/test_faults.py).

The source connects to proxy.port; the proxy connects to the destination.
The forward direction is relayed record by record (16-byte header: u32
type, u32 flags, u64 length; then the payload), so a fault lands at a
record boundary of a known phase; the return path is relayed as bytes.

Trigger (`at`):
  ("record", TYPE, N)  before forwarding the N-th record of TYPE (1-based)
  ("manual",)          before forwarding the first record after fire(); a
                       cut or a stall fire() does at once, wherever the
                       stream is (a manual trigger must not wait for the
                       source's next record: a post-copy push may have
                       nothing more to send, or the proxy may be blocked
                       writing to a destination that reads slowly)
  ("after-end",)       END was forwarded; a link fault hits the
                       destination's answer on the return path; with
                       action none, on_trigger runs right after END went
                       out, and an answer that came back before it ended
                       is dropped when drop_early (a destination killed
                       before the source heard from it)
Action:
  stall      forward nothing more, either way, sockets left open
  cut        close both connections (the record is not forwarded)
  truncate   forward half of the record (after END: half of the answer),
             then close both
  duplicate  forward the record (the answer) twice
  corrupt    forward the record (the answer) with its type's top byte
             flipped: a record type no peer knows
  none       only on_trigger runs (e.g. a signal to a process)
When one side closes or dies, the proxy passes that on (except on a
stalled link): the destination's close reaches the source as a FIN after
everything the destination sent, and what the source still sends is read
and dropped for DRAIN_S before both connections close.
on_trigger() runs in the proxy's thread when the trigger is reached,
before the action; `triggered` is set after both.
raw=True relays the forward direction as bytes too (a TLS stream, whose
records the proxy cannot read): only ("manual",) then, and the fault
lands on the next chunk the source sends after fire().
channels=True accepts further connections after the first (multifd's
channels, which connect to the same address) and relays each as bytes
both ways, to a connection of its own to the destination; `channels`
counts them.  A cut, truncate or close ends them with the first; a stall
stalls them too.
"""
import socket
import struct
import threading
import time

HDR = struct.Struct("<IIQ")
END = 6
DRAIN_S = 2.0


class FaultProxy:
    def __init__(self, dst_port, at, action, on_trigger=None, drop_early=False, raw=False,
                 channels=False):
        assert not raw or at == ("manual",), "a raw proxy only fires by hand"
        self.dst_port, self.at, self.action, self.raw = dst_port, at, action, raw
        self.on_trigger, self.drop_early = on_trigger, drop_early
        self.more, self.channels = channels, 0
        self._more_started = False
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8 if channels else 1)
        self.port = self.lsock.getsockname()[1]
        self.socks = [self.lsock]
        self.counts = {}
        self.forwarded = 0
        self.triggered = threading.Event()
        self.end_forwarded = threading.Event()
        self._fire = threading.Event()
        self._stall = threading.Event()
        self._dst_gone = threading.Event()
        self._acted = threading.Event()    # fire() did the action itself
        self._lock = threading.Lock()
        self.error = None
        self._doing = ("accepting the source", time.time())  # the relay's step, since
        threading.Thread(target=self._run, daemon=True).start()

    def _step(self, what):
        self._doing = (what, time.time())

    def state(self):
        """For a failure's message: records seen, bytes forwarded, the
        error, and what the forward relay has been doing for how long
        (reading from the source, or writing to a destination that does
        not read)."""
        what, since = self._doing
        return "counts %r, forwarded %d bytes, error %r, relay %s for %.1f s" % (
            self.counts, self.forwarded, self.error, what, time.time() - since)

    def fire(self):
        self._fire.set()
        if self.at == ("manual",) and self.action in ("cut", "stall"):
            self._acted.set()
            self._act(None, b"")

    @staticmethod
    def _read(sock, n):
        buf = bytearray()
        while len(buf) < n:
            got = sock.recv(min(n - len(buf), 1 << 20))
            if not got:
                raise EOFError
            buf += got
        return bytes(buf)

    def _close(self):
        with self._lock:
            for s in self.socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def _half_close(self, src):
        """The destination is gone: pass its FIN on to the source and let
        the forward direction drain what the source still sends for a
        while, as a closing peer's kernel would, so that the source can
        read the destination's last words before its writes fail."""
        try:
            src.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._dst_gone.set()
        threading.Timer(DRAIN_S, self._close).start()

    def _trigger(self):
        if self.on_trigger:
            self.on_trigger()

    @staticmethod
    def _corrupt(data):
        b = bytearray(data)
        b[3] ^= 0x40      # the type's top byte
        return bytes(b)

    def _act(self, out, data):
        """Applies the action to data about to be sent on out; returns
        False when relaying must stop."""
        self._trigger()
        a = self.action
        try:
            if a == "stall":
                self._stall.set()
                return False
            if a == "cut":
                self._close()
                return False
            if a == "truncate":
                out.sendall(data[:max(1, len(data) // 2)])
                self._close()
                return False
            if a == "duplicate":
                out.sendall(data + data)
            elif a == "corrupt":
                out.sendall(self._corrupt(data))
            else:
                out.sendall(data)
            return True
        finally:
            self.triggered.set()

    def _is_trigger(self, rtype):
        kind = self.at[0]
        if kind == "record":
            return rtype == self.at[1] and self.counts[rtype] == self.at[2]
        return kind == "manual" and self._fire.is_set()

    def _back(self, src, dst):
        """The return path: bytes, or the answer broken after END.  When
        either side closes (or dies) the other connection is closed too,
        as a direct connection would be, unless the link is stalled."""
        try:
            self._relay_back(src, dst)
        finally:
            if not self._stall.is_set():
                self._half_close(src)

    def _relay_back(self, src, dst):
        try:
            while True:
                got = dst.recv(65536)
                if not got or self._stall.is_set():
                    return
                if self.at[0] == "after-end" and self.action == "none":
                    if not self.triggered.is_set():
                        if self.drop_early:
                            continue
                        self.triggered.wait()
                elif (self.at[0] == "after-end" and self.end_forwarded.is_set()
                        and not self.triggered.is_set()):
                    if not self._act(src, got):
                        return
                    continue
                src.sendall(got)
        except OSError:
            pass

    def _next(self, src):
        """The next record (its type and bytes), or in raw mode the next
        chunk (type None)."""
        if self.raw:
            got = src.recv(65536)
            if not got:
                raise EOFError
            return None, got
        head = self._read(src, HDR.size)
        rtype, _, length = HDR.unpack(head)
        return rtype, head + self._read(src, length)

    def _pump(self, a, b):
        """Bytes from a to b until either end closes or the link stalls."""
        try:
            while not self._stall.is_set():
                got = a.recv(65536)
                if not got or self._stall.is_set():
                    break
                b.sendall(got)
        except OSError:
            pass
        if not self._stall.is_set():
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _accept_more(self):
        """channels=True: every connection after the first, as bytes."""
        try:
            while True:
                src, _ = self.lsock.accept()
                dst = socket.create_connection(("127.0.0.1", self.dst_port), timeout=30)
                dst.settimeout(None)
                with self._lock:
                    self.socks += [src, dst]
                    self.channels += 1
                for a, b in ((src, dst), (dst, src)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()
        except OSError:
            pass

    def _run(self):
        try:
            src, _ = self.lsock.accept()
            dst = socket.create_connection(("127.0.0.1", self.dst_port), timeout=30)
            dst.settimeout(None)
            with self._lock:
                self.socks += [src, dst]
            threading.Thread(target=self._back, args=(src, dst), daemon=True).start()
            fired = False
            while not self._stall.is_set():
                if self.more and self.forwarded and not self._more_started:
                    # the channels only once the main stream's first
                    # record is through: relayed raw, their first bytes
                    # would otherwise overtake it (this relay reads the
                    # main stream record by record).  The destination
                    # would hold them for their turn (test_early_channels
                    # tests that); here the faults keep to the order the
                    # source sent in
                    self._more_started = True
                    threading.Thread(target=self._accept_more, daemon=True).start()
                self._step("reading from the source")
                rtype, rec = self._next(src)
                self._step("relaying a record of type %s, %d bytes" % (rtype, len(rec)))
                self.counts[rtype] = self.counts.get(rtype, 0) + 1
                if self._stall.is_set():
                    break
                if self._dst_gone.is_set():
                    continue            # draining
                if self._acted.is_set():
                    fired = True
                if not fired and self.at[0] != "after-end" and self._is_trigger(rtype):
                    fired = True
                    if not self._act(dst, rec):
                        return
                else:
                    try:
                        dst.sendall(rec)
                    except OSError:
                        self._half_close(src)   # the destination died: drain
                self.forwarded += len(rec)
                if rtype == END:
                    self.end_forwarded.set()
                    if self.at[0] == "after-end" and self.action == "none" and not fired:
                        fired = True
                        self._act(dst, b"")
        except (OSError, EOFError, struct.error) as e:
            self.error = e
        self._step("ended")
        if not self._stall.is_set():
            self._close()

    def close(self):
        self._close()
