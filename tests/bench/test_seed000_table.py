"""bench/report/seed000_table.py: seed 000's table from converge documents (no KVM)."""
import json
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "report"))
import seed000_table as table  # noqa: E402

CAP = 300.0


def run(config, mib, t=None, below=None, mbps=None, rep=0):
    """A converge run: completed in t seconds, or (t None) cancelled at the cap."""
    r = {"config": config, "stress_mib": mib, "wall_s": (t or CAP) + 0.2, "rep": rep,
         "guest": {"s_below_half_pace": below if below is not None else (t or CAP) * 0.9}}
    if t is None:
        r.update(status="did not converge", total_time_ms=None)
    else:
        r.update(status="completed", total_time_ms=int(t * 1000),
                 sent_bytes=int((mbps or 1000.0) * 1e6 * t))
    return r


def doc(runs, cpus=2, bw=125000000):
    return {"benchmark": "converge", "config": {"cpus": cpus, "memory": "4G",
                                                "max_bandwidth_bytes_per_s": bw, "cap_s": CAP},
            "host": {"git_head": "abcdef0123"}, "binaries": {"kmig_sha256": "k"}, "runs": runs}


def test_cell_mean_spread_and_interval():
    c = table.cell_stats([run("x", 1024, t) for t in (10, 12, 14)], CAP)
    assert c["n"] == 3 and c["completed"] == 3 and not c["lower_bound"]
    assert c["mean_s"] == pytest.approx(12) and c["sd_s"] == pytest.approx(2)
    assert c["ci95_s"] == pytest.approx(4.303 * 2 / math.sqrt(3))
    assert c["mean_s_below_half_pace"] == pytest.approx(10.8)


def test_capped_run_makes_a_lower_bound():
    c = table.cell_stats([run("x", 1024, 100), run("x", 1024, None)], CAP)
    assert c["lower_bound"] and c["completed"] == 1
    assert c["mean_s"] == pytest.approx((100 + 300.2) / 2)
    assert table.fmt_cell(c).startswith("≥200.1") and "1/2 ended" in table.fmt_cell(c)


def test_failed_runs_are_left_out_not_capped():
    """An error or a failed migration is no lower bound: it is left out
    and counted; a run without guest lines still counts its time."""
    runs = [run("x", 1024, 10), run("x", 1024, 10)]
    runs.append({"config": "x", "stress_mib": 1024, "status": "error", "wall_s": 3.0,
                 "guest": None, "error": "destination not listening"})
    runs.append({"config": "x", "stress_mib": 1024, "status": "failed", "wall_s": 5.0,
                 "total_time_ms": None, "guest": None})
    nolines = run("x", 1024, 13)
    nolines["guest"] = None
    c = table.cell_stats(runs + [nolines], CAP)
    assert c["n"] == 3 and c["failed"] == 2 and not c["lower_bound"]
    assert c["mean_s"] == pytest.approx(11) and c["mean_s_below_half_pace"] == pytest.approx(9)
    assert "2 failed" in table.fmt_cell(c)
    assert table.cell_stats(runs[2:], CAP) is None


def test_ratio_interval_and_bounds():
    a = table.cell_stats([run("a", 1, t) for t in (10, 11, 12, 13)], CAP)
    b = table.cell_stats([run("b", 1, t) for t in (40, 44, 48)], CAP)
    r = table.ratio(a, b)
    assert r["ratio"] == pytest.approx(11.5 / 44) and r["bound"] is None
    assert r["lo"] <= r["ratio"] <= r["hi"] and r["hi"] < 0.3
    assert table.ratio(a, b) == r, "the bootstrap is seeded"
    capped = table.cell_stats([run("q", 1, None)] * 3, CAP)
    assert table.ratio(a, capped)["bound"] == "<="
    assert table.ratio(capped, a)["bound"] == ">="
    assert table.ratio(capped, capped)["both_capped"]


def test_goal_half_of_qemu_decides_both_ways():
    """The goal check can fail: 0.6x QEMU is no, 0.4x is yes; with QEMU
    capped only a ratio already at most half decides."""
    def row_goal(kmig_t, qemu_t):
        runs = [run("kmig-ring4096+default", 1024, kmig_t) for _ in range(3)]
        runs += [run("qemu-ring4096+ac", 1024, qemu_t) for _ in range(3)]
        rows = table.main_rows(table.cells_of(doc(runs)), [1024])
        assert len(rows) == 1 and rows[0]["tracking"] == "ring 4096"
        return rows[0]["goal_half_qemu"]
    assert row_goal(40, 100) is True
    assert row_goal(60, 100) is False
    assert row_goal(100, None) is True       # <= 100/300.2
    assert row_goal(200, None) is None       # <= 0.67: the cap hides the answer
    assert row_goal(None, 100) is False      # >= 3
    assert row_goal(None, None) is None

    # one run a side has no interval: it decides nothing
    one = [run("kmig-bitmap+default", 1024, 10), run("qemu-bitmap+ac", 1024, 100)]
    assert table.main_rows(table.cells_of(doc(one)), [1024])[0]["goal_half_qemu"] is None

    # a mean of 0.38 whose interval reaches past 0.5 decides nothing
    runs = [run("kmig-bitmap+default", 1024, t) for t in (20, 28, 36, 44, 64)]
    runs += [run("qemu-bitmap+ac", 1024, 100) for _ in range(5)]
    row = table.main_rows(table.cells_of(doc(runs)), [1024])[0]
    assert row["default_over_qemu"]["ratio"] == pytest.approx(0.384)
    assert row["default_over_qemu"]["hi"] > 0.5 and row["goal_half_qemu"] is None


def test_main_rows_carry_the_seeds_ratios():
    runs = []
    for cfg, t in (("kmig-ring4096+seed-all", 20), ("kmig-ring4096+seed-none", 60),
                   ("qemu-ring4096+ac", 80), ("kmig-bitmap+seed-none", 50)):
        runs += [run(cfg, 3072, t + i) for i in range(3)]
    rows = table.main_rows(table.cells_of(doc(runs)), [3072])
    ring = [r for r in rows if r["ring"] == 4096][0]
    assert ring["seed_on_over_off"] == pytest.approx(13320 / 44234)
    assert ring["seed_off_ring_over_bitmap"] == pytest.approx(44234 / 45254)
    assert ring["on_over_off"]["ratio"] == pytest.approx(21 / 61)
    assert ring["off_ring_over_bitmap"]["ratio"] == pytest.approx(61 / 51)
    assert ring["default"] is None and ring["goal_half_qemu"] is True   # 21/81 on the ideas-on row
    bitmap = [r for r in rows if r["ring"] == 0][0]
    assert bitmap["off_ring_over_bitmap"] is None and bitmap["seed_on_over_off"] is None


def test_each_idea_off_alone():
    runs = [run("kmig-ring4096+seed-all", 1024, 30 + i) for i in range(3)]
    runs += [run("kmig-ring4096+seed-no5", 1024, 60 + i) for i in range(3)]
    runs += [run("kmig-ring4096+seed-no2", 1024, 30 + i) for i in range(3)]
    cells = table.cells_of(doc(runs))
    assert table.main_rows(cells, [1024]) == [], "the each-off part has no main row"
    each = table.each_rows(cells, [1024])
    assert [r["idea"] for r in each] == [2, 5]
    assert each[0]["off_over_on"]["ratio"] == pytest.approx(1.0)
    assert each[1]["off_over_on"]["ratio"] == pytest.approx(61 / 31)
    assert each[1]["what"] == "computed throttle"


def test_command_writes_markdown_and_json(tmp_path):
    runs = []
    for cfg in ("kmig-bitmap+seed-all", "qemu-bitmap+ac", "kmig-bitmap+seed-none"):
        runs += [run(cfg, 1024, 20 + i, rep=i) for i in range(3)]
    p = tmp_path / "seed000-cpus2-unlimited.json"
    p.write_text(json.dumps(doc(runs, bw=0)))
    md, js = tmp_path / "t.md", tmp_path / "t.json"
    assert table.main([str(p), "--out", str(md), "--json", str(js)]) == 0
    text = md.read_text()
    assert "seed000-cpus2-unlimited: 2 vCPU(s), unlimited" in text and "| bitmap | 1024 MiB |" in text
    assert "commit abcdef0, 3 rounds" in text
    assert "The throughput loopback gave" in text and "| kmig-bitmap+seed-all | 1000 |" in text
    summ = json.loads(js.read_text())
    assert summ[0]["rows"][0]["seed_all"]["mean_s"] == pytest.approx(21)


def test_no_results_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(table, "ROOT", str(tmp_path))
    assert table.main([]) == 2
    assert "no results" in capsys.readouterr().err
