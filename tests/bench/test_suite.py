"""bench/suite: the resumable benchmark runner's own logic, with small
commands standing in for benchmarks (no KVM; the benchmarks themselves
need a native /dev/kvm).  What it must never do: run a finished cell
again under the same key, count a failed, partial or interrupted cell as
done, mix builds, or publish a benchmark before all its rounds are in."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "suite"))
import suite  # noqa: E402

PY = sys.executable

# a stand-in benchmark: appends its name to RUNS (how often it ran), fails
# while the file FAIL names it, writes {"runs": [...], "binaries": ...}
BENCH = r"""
import json, os, sys, time
name, out, d = sys.argv[1], sys.argv[2], sys.argv[3]
with open(os.path.join(d, "RUNS"), "a") as f:
    f.write(name + "\n")
fail = os.path.join(d, "FAIL")
if os.path.exists(fail) and name in open(fail).read().split():
    sys.exit(3)
if os.path.exists(os.path.join(d, "SLOW")):
    time.sleep(60)
if os.path.exists(os.path.join(d, "NAP")):
    with open(os.path.join(d, "SPANS"), "a") as f:
        f.write("start %s\n" % name)
    time.sleep(float(open(os.path.join(d, "NAP")).read()))
    with open(os.path.join(d, "SPANS"), "a") as f:
        f.write("end %s\n" % name)
partial = os.path.exists(os.path.join(d, "PARTIAL"))
doc = {"partial": partial, "binaries": {"kmig_sha256": open(os.path.join(d, "BIN")).read()},
       "config": {"args": {"reps": 1}, "reps": 1}, "host": {"name": name},
       "runs": [{"config": name, "rep": 0, "v": 1}, {"config": name + "b", "rep": 0, "v": 2}]}
with open(out, "w") as f:
    json.dump(doc, f)
with open(out[:-5] + ".md", "w") as f:
    f.write("table of " + name + "\n")
"""

# a stand-in --retable: the merged JSON as it is, marked
RETABLE = r"""
import json, sys
doc = json.load(open(sys.argv[1]))
doc["retabled"] = True
json.dump(doc, open(sys.argv[2], "w"))
"""


@pytest.fixture
def env(tmp_path):
    d = tmp_path
    (d / "bench.py").write_text(BENCH)
    (d / "retable.py").write_text(RETABLE)
    (d / "BIN").write_text("build-1")
    return d


def cells(d, n=3, group_rounds=2):
    out = [suite.Cell("lone%d" % i, [PY, str(d / "bench.py"), "lone%d" % i, "{out}", str(d)],
                      publish="lone%d.json" % i, est_min=1) for i in range(n)]
    for r in range(group_rounds):
        out.append(suite.Cell("grp-r%d" % r, [PY, str(d / "bench.py"), "grp-r%d" % r, "{out}",
                                              str(d)],
                              group="grp.json", round_=r, est_min=1,
                              retable=[PY, str(d / "retable.py"), "{json}", "{out}"]))
    return out


def state(d, key="k1"):
    return suite.State(str(d / "state" / key), key, {"kmig": key})


def runs_of(d):
    p = d / "RUNS"
    return p.read_text().split() if p.exists() else []


def quiet(_):
    pass


def test_resume_runs_only_what_is_not_done(env):
    d = env
    (d / "FAIL").write_text("lone1")
    cs = cells(d)
    left = suite.run(state(d), cs, str(d), log=quiet)
    assert left == ["lone1"]
    assert runs_of(d) == ["lone0", "lone1", "lone2", "grp-r0", "grp-r1"]
    st = state(d)    # as a new session would load it
    rec = st.doc["cells"]["lone1"]
    assert rec["status"] == "failed" and rec["attempts"][0]["error"] == "exit status 3"
    assert st.done("lone0") and st.done("grp-r1")
    (d / "FAIL").write_text("")
    assert suite.run(st, cs, str(d), log=quiet) == []
    assert runs_of(d)[5:] == ["lone1"], "a finished cell ran again"
    assert len(state(d).doc["cells"]["lone1"]["attempts"]) == 2


def test_attempt_records_host_commit_load(env):
    d = env
    st = state(d)
    suite.run(st, cells(d, 1, 0), str(d), log=quiet)
    a = st.doc["cells"]["lone0"]["attempts"][0]
    for k in ("start", "end", "wall_s", "rc", "load_before", "load_after", "host", "argv",
              "git_head", "where"):
        assert k in a, k
    assert a["rc"] == 0 and a["host"]["nproc"] >= 1
    assert os.path.exists(os.path.join(st.dir, "cells", "lone0.log"))


def test_partial_result_is_not_done(env):
    d = env
    (d / "PARTIAL").write_text("")
    st = state(d)
    assert suite.run(st, cells(d, 1, 0), str(d), log=quiet) == ["lone0"]
    assert st.doc["cells"]["lone0"]["attempts"][0]["error"] == "its JSON is marked partial"


def test_gives_up_after_max_failures(env):
    d = env
    (d / "FAIL").write_text("lone0")
    st = state(d)
    for _ in range(3):
        suite.run(st, cells(d, 1, 0), str(d), max_failures=2, log=quiet)
    assert runs_of(d) == ["lone0", "lone0"]


def test_deadline_starts_no_cell_that_would_overrun(env):
    d = env
    cs = cells(d, 2, 0)
    cs[1].est_min = 600
    left = suite.run(state(d), cs, str(d), deadline=time.time() + 300, log=quiet)
    assert left == ["lone1"] and runs_of(d) == ["lone0"]


def spans_at_once(d):
    """The most cells that were running at once, from SPANS."""
    most = cur = 0
    for line in (d / "SPANS").read_text().split("\n"):
        cur += {"start": 1, "end": -1}.get(line.split(" ")[0], 0)
        most = max(most, cur)
    return most


@pytest.mark.parametrize("jobs", [1, 2])
def test_jobs_run_side_by_side_and_state_stays_whole(env, jobs):
    d = env
    (d / "NAP").write_text("0.5")
    (d / "FAIL").write_text("lone2")
    committed = []
    st = state(d)
    left = suite.run(st, cells(d, 4, 2), str(d), log=quiet, jobs=jobs,
                     on_done=lambda c: committed.append(c.name))
    assert left == ["lone2"]
    assert spans_at_once(d) == jobs
    assert sorted(runs_of(d)) == sorted(["lone0", "lone1", "lone2", "lone3", "grp-r0", "grp-r1"])
    assert sorted(committed) == sorted(["lone0", "lone1", "lone3", "grp-r0", "grp-r1"])
    again = state(d)    # as saved, every attempt whole
    for name, rec in again.doc["cells"].items():
        assert len(rec["attempts"]) == 1, name
        a = rec["attempts"][0]
        assert a["jobs"] == jobs and "end" in a and a["rc"] == (3 if name == "lone2" else 0)
        assert rec["status"] == ("failed" if name == "lone2" else "done")


def test_jobs_deadline_starts_nothing_after_the_first_cell_left(env):
    d = env
    cs = cells(d, 4, 0)
    cs[1].est_min = 600
    left = suite.run(state(d), cs, str(d), deadline=time.time() + 300, log=quiet, jobs=2)
    assert left == ["lone1", "lone2", "lone3"] and runs_of(d) == ["lone0"]


def test_jobs_error_ends_the_run_and_starts_nothing_more(env):
    """A commit that fails beside another cell: run() raises it, as a lone
    runner would, and no cell starts after it."""
    d = env

    def commit(c):
        raise RuntimeError("git commit failed on " + c.name)
    with pytest.raises(RuntimeError, match="git commit failed"):
        suite.run(state(d), cells(d, 6, 0), str(d), log=quiet, jobs=2, on_done=commit)
    assert len(runs_of(d)) <= 3, "cells started after the error"


def test_key_follows_the_binaries(env, tmp_path):
    d = env
    a = tmp_path / "kmig"
    a.write_bytes(b"one")
    k1, parts = suite.suite_key({"kmig": str(a)}, {"qemu": "QEMU 7.2"})
    assert suite.suite_key({"kmig": str(a)}, {"qemu": "QEMU 7.2"})[0] == k1
    a.write_bytes(b"two")
    k2, _ = suite.suite_key({"kmig": str(a)}, {"qemu": "QEMU 7.2"})
    k3, _ = suite.suite_key({"kmig": str(a)}, {"qemu": "QEMU 8.0"})
    assert len({k1, k2, k3}) == 3
    assert parts["kmig"] != "missing"
    # a state directory belongs to one key
    state(d, "kA").save()
    with pytest.raises(ValueError):
        suite.State(str(d / "state" / "kA"), "kB", {})


def test_tree_digest_ignores_docs_not_code(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "run.py").write_text("x = 1\n")
    (tmp_path / "b" / "README.md").write_text("one\n")
    h1 = suite.tree_digest(str(tmp_path), ["b"], skip_suffixes=(".md",))
    (tmp_path / "b" / "README.md").write_text("two\n")
    assert suite.tree_digest(str(tmp_path), ["b"], skip_suffixes=(".md",)) == h1
    (tmp_path / "b" / "run.py").write_text("x = 2\n")
    assert suite.tree_digest(str(tmp_path), ["b"], skip_suffixes=(".md",)) != h1


def test_killed_runner_leaves_the_cell_interrupted(env):
    """A session that ends mid-cell: the runner is killed; the next run
    finds the cell interrupted (not done) and runs it again."""
    d = env
    (d / "SLOW").write_text("")
    code = ("import sys; sys.path.insert(0, %r); import suite; "
            "st = suite.State(%r, 'k1', {'kmig': 'k1'}); "
            "suite.run(st, [suite.Cell('lone0', [%r, %r, 'lone0', '{out}', %r])], %r)"
            % (os.path.join(ROOT, "bench", "suite"), str(d / "state" / "k1"), PY,
               str(d / "bench.py"), str(d), str(d)))
    p = subprocess.Popen([PY, "-c", code], start_new_session=True, stdout=subprocess.DEVNULL)
    deadline = time.time() + 30
    while "lone0" not in runs_of(d) and time.time() < deadline:
        time.sleep(0.05)
    assert "lone0" in runs_of(d)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    st = state(d)
    assert st.doc["cells"]["lone0"]["status"] == "interrupted"
    (d / "SLOW").unlink()
    assert suite.run(st, cells(d, 1, 0), str(d), log=quiet) == []
    assert runs_of(d) == ["lone0", "lone0"]


def test_merge_renumbers_rounds_and_refuses_other_builds():
    doc = {"binaries": {"kmig_sha256": "a"}, "config": {"reps": 1, "args": {"reps": 1}},
           "runs": [{"rep": 0, "x": 1}], "partial": True}
    m = suite.merge_group([(0, doc), (1, doc), (2, doc)])
    assert [r["rep"] for r in m["runs"]] == [0, 1, 2]
    assert m["config"]["reps"] == 3 and m["config"]["args"]["reps"] == 3
    assert m["partial"] is False and len(m["rounds"]) == 3
    # two sizes in one round count once
    assert suite.merge_group([(0, doc), (0, doc)])["config"]["reps"] == 1
    other = dict(doc, binaries={"kmig_sha256": "b"})
    with pytest.raises(ValueError):
        suite.merge_group([(0, doc), (1, other)])


def test_finish_publishes_only_complete_benchmarks(env, tmp_path):
    d = env
    res = tmp_path / "results"
    (d / "FAIL").write_text("grp-r1")
    cs = cells(d, 1, 2)
    st = state(d)
    suite.run(st, cs, str(d), log=quiet)
    written = suite.finish(st, cs, str(d), str(res), log=quiet)
    assert [os.path.basename(p) for p in written] == ["lone0.json"]
    assert (res / "lone0.md").read_text() == "table of lone0\n"
    assert not (res / "grp.json").exists(), "a group was published with a round missing"
    (d / "FAIL").write_text("")
    suite.run(st, cs, str(d), log=quiet)
    suite.finish(st, cs, str(d), str(res), log=quiet)
    g = json.loads((res / "grp.json").read_text())
    assert g["retabled"] and [r["rep"] for r in g["runs"]] == [0, 0, 1, 1]
    assert g["suite"]["cells"] == ["grp-r0", "grp-r1"]


def test_more_rounds_later_run_only_the_new_ones(env, tmp_path):
    """Two rounds published, then the same benchmark asked for three (the
    seed's REPS=5, then 10): only the third runs, and all three publish."""
    d = env
    res = tmp_path / "results"
    st = state(d)
    suite.run(st, cells(d, 0, 2), str(d), log=quiet)
    suite.finish(st, cells(d, 0, 2), str(d), str(res), log=quiet)
    assert json.loads((res / "grp.json").read_text())["suite"]["cells"] == ["grp-r0", "grp-r1"]
    assert suite.run(st, cells(d, 0, 3), str(d), log=quiet) == []
    assert runs_of(d) == ["grp-r0", "grp-r1", "grp-r2"]
    suite.finish(st, cells(d, 0, 3), str(d), str(res), log=quiet)
    g = json.loads((res / "grp.json").read_text())
    assert [r["rep"] for r in g["runs"]] == [0, 0, 1, 1, 2, 2] and len(g["rounds"]) == 3


def test_finish_refuses_rounds_of_two_builds(env, tmp_path):
    """Rounds run before and after a rebuild that kept the key (it cannot,
    unless someone edits the state): the merge refuses them."""
    d = env
    cs = cells(d, 0, 2)
    st = state(d)
    suite.run(st, cs[:1], str(d), log=quiet)
    (d / "BIN").write_text("build-2")
    suite.run(st, cs, str(d), log=quiet)
    with pytest.raises(ValueError):
        suite.finish(st, cs, str(d), str(tmp_path / "r"), log=quiet)


def test_catalogue_and_plan():
    """The real catalogue: unique names, every group's rounds retabled the
    same way, every cell writes to {out}; --plan runs without KVM."""
    spec = __import__("importlib.util").util.spec_from_file_location(
        "suite_run", os.path.join(ROOT, "bench", "suite", "run.py"))
    mod = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cs = mod.catalogue(3, 10)
    names = [c.name for c in cs]
    assert len(names) == len(set(names))
    for c in cs:
        assert "{out}" in c.argv, c.name
        assert bool(c.group) != bool(c.publish), c.name
        assert os.path.exists(os.path.join(ROOT, [a for a in c.argv if a.endswith(".py")][0]))
    groups = {}
    for c in cs:
        if c.group:
            groups.setdefault(c.group, set()).add(tuple(c.retable or ()))
    assert all(len(v) == 1 for v in groups.values())
    for want in ("boot.json", "converge.json", "converge-1536.json", "migrate.json",
                 "postcopy.json", "recovery.json", "logstart.json", "free-pages.json",
                 "tls.json", "dirty.json", "linux-free-pages.json", "seed000-cpus2-125MBs.json",
                 "snapshot.json", "local-update.json"):
        assert want in {c.group or c.publish for c in cs}, want
    assert {c.where for c in cs if c.name.startswith("linux-")} == {"emulated"}
    p = subprocess.run([PY, os.path.join(ROOT, "bench", "suite", "run.py"), "--plan"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "cells, about" in p.stdout, p.stderr


def real_results(benchmark):
    """The committed results of one benchmark with 2 or more rounds."""
    out = []
    for f in sorted(os.listdir(os.path.join(ROOT, "bench", "results"))):
        if not f.endswith(".json"):
            continue
        with open(os.path.join(ROOT, "bench", "results", f)) as fh:
            doc = json.load(fh)
        if doc.get("benchmark") == benchmark and not doc.get("partial") and \
                len({r.get("rep") for r in doc.get("runs", [])}) >= 2:
            out.append((f, doc))
    return out


@pytest.mark.parametrize("benchmark,script", [("converge", "bench/converge/run.py"),
                                              ("migrate", "bench/migrate/run.py")])
def test_rounds_retabled_as_one_run(benchmark, script, tmp_path):
    """A real result split into its rounds, as the suite would have run it,
    then merged and retabled by the benchmark itself: the same summary as
    the run that measured all rounds at once."""
    found = real_results(benchmark)
    assert found, "no committed %s result of 2+ rounds to check the merge with" % benchmark
    name, doc = found[0]
    reps = sorted({r["rep"] for r in doc["runs"]})
    st = suite.State(str(tmp_path / "state"), "k", {})
    retable = [PY, os.path.join(ROOT, script), "--retable", "{json}", "--out", "{out}"]
    cs = []
    for rep in reps:
        c = suite.Cell("%s-r%d" % (benchmark, rep), ["true", "{out}"], group=name, round_=rep,
                       retable=retable)
        part = json.loads(json.dumps(doc))
        part["runs"] = [dict(r, rep=0) for r in doc["runs"] if r["rep"] == rep]
        for k in ("reps", "reps_cheap", "reps_expensive"):
            if k in part["config"]:
                part["config"][k] = 1
        if "args" in part["config"]:
            part["config"]["args"]["reps"] = 1
        with open(suite.out_paths(st, c)[0], "w") as f:
            json.dump(part, f)
        st.cell(c.name)["status"] = "done"
        cs.append(c)
    suite.finish(st, cs, ROOT, str(tmp_path / "res"), log=quiet)
    with open(tmp_path / "res" / name) as f:
        merged = json.load(f)
    # the whole run retabled by the same code (the committed summary may
    # predate a field the benchmark has since added)
    whole_in, whole_out = tmp_path / "whole-in.json", tmp_path / "whole.json"
    with open(whole_in, "w") as f:
        json.dump(doc, f)
    subprocess.run([PY, os.path.join(ROOT, script), "--retable", str(whole_in), "--out",
                    str(whole_out)], check=True, stdout=subprocess.DEVNULL)
    with open(whole_out) as f:
        whole = json.load(f)
    assert len(merged["runs"]) == len(doc["runs"])
    assert merged["summary"] == whole["summary"]
    # and in the fields the committed run has, its own summary
    assert len(merged["summary"]) == len(doc["summary"])
    for m, d in zip(merged["summary"], doc["summary"]):
        assert {k: v for k, v in m.items() if k in d} == d
