"""bench/dirty's guest pace: only warm stress reports of vCPU 0 inside the
measured console window count (no KVM: the console is made here)."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("bench_dirty",
                                               os.path.join(ROOT, "bench", "dirty", "run.py"))
dirty = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dirty)

AREA = 65536            # pages of a 256 MiB stress area


def console(cold, warm, per=16384):
    """A guest's console: its share line, then `cold` reports slow with
    first writes (3000 ms/GiB) and `warm` fast ones (3 ms/GiB), each
    `per` pages on; vCPU 1's reports between them."""
    lines = ["kmig-guest share cpu=0 base=0x1000000 pages=%d" % AREA, "heartbeat t_ms=1 gap_ms=1"]
    pages = 0
    for i in range(cold + warm):
        pages += per
        ms = 3000.0 if i < cold else 3.0
        lines.append("stress cpu=0 t_ms=%d ms_per_gib=%.2f max_ms_per_gib=%.2f pages=%d"
                     % (100 * (i + 1), ms, ms, pages))
        lines.append("stress cpu=1 t_ms=%d ms_per_gib=9.00 max_ms_per_gib=9.00 pages=%d"
                     % (100 * (i + 1), pages))
    return ("\n".join(lines) + "\n").encode()


def test_first_sweep_in_the_window_is_left_out():
    # the area and a GiB more (4 + 16 reports of 16384 pages) go before
    # the first warm report; the window opens at the first report
    text = console(cold=20, warm=10)
    lo = text.index(b"stress cpu=0")
    rep = dirty.stress_reports(text, lo, len(text))
    assert [ms for _, ms, _ in rep] == [3.0] * 10
    assert all(t > 2000 for t, _, _ in rep)


def test_window_bounds_hold():
    text = console(cold=0, warm=40)
    lo = text.index(b"t_ms=2500 ")
    hi = text.index(b"t_ms=3500 ")
    rep = dirty.stress_reports(text, text.rindex(b"\n", 0, lo) + 1, text.rindex(b"\n", 0, hi) + 1)
    assert [t for t, _, _ in rep] == list(range(2500, 3500, 100))


def test_line_being_written_at_hi_is_left_out():
    text = console(cold=0, warm=25) + b"stress cpu=0 t_ms=9900 ms_per_gib=3"
    rep = dirty.stress_reports(text, 0, len(text))
    assert rep[-1][0] == 2500
