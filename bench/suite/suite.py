"""The resumable benchmark suite's machinery (bench/suite/run.py is its
command line and its list of cells).

A suite is a list of cells, each one benchmark command that writes one JSON
document.  A cell is short enough for one session; the whole suite may not
be.  Its state lives in a directory named after the suite's key, the hash
of what is measured: the kmig binary, the guest, the Linux guest's kernel,
QEMU's version and the benchmark scripts themselves.  A run skips the
cells already done under the same key, so a suite interrupted (a session
ended, a machine rebooted, a cell failed) goes on where it stopped and
still measures one build; code that changed gets a new key, hence a new
state, and every cell runs again.

  state dir/state.json   the key and what went into it, and per cell:
                         status (done, failed), attempts (start, end,
                         wall seconds, exit status, git HEAD, host load
                         before and after, host facts), its JSON's path
  state dir/cells/       NAME.json (the cell's result), NAME.log (its output)

When every cell is done, `finish` writes the published results: cells of a
group (rounds of one benchmark, one repetition or size each) are merged
into one document whose runs are renumbered by round, then retabled by the
benchmark's own --retable; a lone cell's JSON (and .md) is copied.

Pure Python and the standard library; the tests (tests/bench/) drive it
with small commands, no KVM.
"""
import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import threading
import time

STATE = "state.json"


class Cell:
    """One benchmark command.

    argv     the command; "{out}" in it is replaced by the cell's JSON path
    group    None, or the published JSON this cell is one round of
    round    the round's number within its group (runs' "rep" becomes it)
    where    "native" (needs a native /dev/kvm) or "emulated" (runs
             through scripts/kvm-vm; its results are marked so)
    retable  for a group: the command that retables a merged document,
             "{json}" and "{out}" replaced
    est_min  the expected minutes, for the plan
    """

    def __init__(self, name, argv, group=None, round_=0, where="native", retable=None,
                 est_min=10, publish=None):
        self.name, self.argv, self.group, self.round = name, list(argv), group, round_
        self.where, self.retable, self.est_min = where, retable, est_min
        self.publish = publish     # a lone cell: the published JSON path

    def command(self, out):
        return [a.replace("{out}", out) for a in self.argv]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def suite_key(files, texts):
    """The key of what is measured: files (name -> path; a missing file
    counts as missing) and texts (name -> str, e.g. QEMU's version).
    Returns (key, parts), parts saying what each contributed."""
    parts = {}
    for name, path in sorted(files.items()):
        parts[name] = sha256_file(path) if path and os.path.isfile(path) else "missing"
    for name, text in sorted(texts.items()):
        parts[name] = "text:" + hashlib.sha256(text.encode()).hexdigest()
    h = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return h[:16], parts


def tree_digest(root, rels, skip_suffixes=()):
    """One digest over the files under root/rel for each rel (sorted, by
    content and relative name; __pycache__, .pyc and skip_suffixes left
    out: documentation does not change what is measured)."""
    h = hashlib.sha256()
    for rel in sorted(rels):
        base = os.path.join(root, rel)
        paths = [base] if os.path.isfile(base) else sorted(
            os.path.join(d, f) for d, ds, fs in os.walk(base) for f in fs
            if "__pycache__" not in d and not f.endswith((".pyc",) + tuple(skip_suffixes)))
        for p in sorted(paths):
            h.update(os.path.relpath(p, root).encode() + b"\0")
            h.update(sha256_file(p).encode())
    return h.hexdigest()


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def git_head(root):
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def host_facts():
    mods = sorted(m for m in os.listdir("/sys/module") if m.startswith("kvm")) \
        if os.path.isdir("/sys/module") else []
    return {"hostname": platform.node(), "kernel": platform.release(),
            "nproc": os.cpu_count(), "kvm_modules": mods,
            "dev_kvm": os.path.exists("/dev/kvm")}


class State:
    def __init__(self, d, key, parts):
        self.dir, self.path = d, os.path.join(d, STATE)
        self.doc = {"key": key, "parts": parts, "created": now(), "cells": {}}
        if os.path.exists(self.path):
            with open(self.path) as f:
                old = json.load(f)
            if old.get("key") != key:
                raise ValueError("%s holds suite %s, not %s" % (self.path, old.get("key"), key))
            self.doc = old
            for rec in self.doc["cells"].values():
                if rec.get("status") == "running":   # its runner was killed
                    rec["status"] = "interrupted"
                    if rec["attempts"]:
                        rec["attempts"][-1].setdefault("error", "interrupted")
        os.makedirs(os.path.join(d, "cells"), exist_ok=True)

    def cell(self, name):
        return self.doc["cells"].setdefault(name, {"status": "pending", "attempts": []})

    def done(self, name):
        return self.doc["cells"].get(name, {}).get("status") == "done"

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.path)


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def out_paths(state, cell):
    base = os.path.join(state.dir, "cells", cell.name)
    return base + ".json", base + ".log"


def cell_ok(out):
    """Why the cell's JSON is not a finished result, or None."""
    if not os.path.exists(out):
        return "it wrote no JSON"
    try:
        with open(out) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return "its JSON does not load: %s" % e
    if not isinstance(doc, dict):
        return "its JSON is not an object"
    if doc.get("partial"):
        return "its JSON is marked partial"
    return None


def run_cell(state, cell, root, env=None, log=print, lock=None, jobs=1):
    """Runs one cell to its end; records the attempt; True when done.
    lock (when cells run side by side) guards the state; jobs is how many
    cells ran at once, recorded with the attempt."""
    lock = lock or contextlib.nullcontext()
    out, logp = out_paths(state, cell)
    for p in (out, os.path.splitext(out)[0] + ".md"):
        if os.path.exists(p):
            os.unlink(p)
    att = {"start": now(), "git_head": git_head(root), "load_before": loadavg(),
           "host": host_facts(), "where": cell.where, "argv": cell.command(out), "jobs": jobs}
    with lock:
        rec = state.cell(cell.name)
        rec["attempts"].append(att)
        rec["status"] = "running"
        state.save()
    t0 = time.monotonic()
    with open(logp, "w") as lf:
        try:
            rc = subprocess.run(cell.command(out), cwd=root, stdout=lf, stderr=subprocess.STDOUT,
                                env=env).returncode
        except OSError as e:
            lf.write("cannot run: %s\n" % e)
            rc = 127
    ended = dict(end=now(), wall_s=round(time.monotonic() - t0, 1), rc=rc,
                 load_after=loadavg())
    why = ("exit status %d" % rc) if rc else cell_ok(out)
    with lock:
        att.update(ended)
        if why:
            att["error"] = why
            rec["status"] = "failed"
        else:
            rec.update(status="done", out=os.path.relpath(out, state.dir))
        state.save()
        log("  %-40s %s (%.0f s)" % (cell.name, "done" if not why else "FAILED: " + why,
                                     att["wall_s"]))
    return not why


def run(state, cells, root, deadline=None, max_failures=3, on_done=None, log=print, env=None,
        jobs=1):
    """Runs every cell not done yet, in order, jobs of them at a time (more
    than one only for cells that do not measure time: the emulated ones).
    A cell that failed max_failures times is left for a person to look at.
    Starts no cell whose estimate would pass deadline (time.time() seconds),
    nor any after it.  Returns the names still not done."""
    lock, todo, stop = threading.Lock(), iter(cells), []

    def next_cell():
        with lock:
            for c in todo:
                if stop:
                    return None
                if state.done(c.name):
                    continue
                tried = len(state.cell(c.name)["attempts"])
                if tried >= max_failures:
                    log("  %-40s skipped: failed %d times (see its log)" % (c.name, tried))
                    continue
                if deadline is not None and time.time() + c.est_min * 60 > deadline:
                    log("  %-40s left for the next run (estimated %d min, the time left is "
                        "shorter)" % (c.name, c.est_min))
                    stop.append(c)
                    return None
                return c
            return None

    def worker(errors=None):
        try:
            while True:
                c = next_cell()
                if c is None:
                    return
                ok = run_cell(state, c, root, env=env, log=log, lock=lock, jobs=jobs)
                with lock:
                    if ok and on_done:
                        on_done(c)
                    elif not ok and "interrupted" in stop:   # as a lone runner's cell
                        rec = state.cell(c.name)
                        rec["status"] = "interrupted"
                        rec["attempts"][-1]["error"] = "interrupted"
                        state.save()
        except BaseException as e:    # side by side: the others start nothing more
            if errors is None:
                raise
            stop.append(None)
            errors.append(e)

    if jobs <= 1:
        worker()
        return [c.name for c in cells if not state.done(c.name)]
    errors = []
    workers = [threading.Thread(target=worker, args=(errors,)) for _ in range(jobs)]
    try:
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    except BaseException:   # Ctrl-C: the cells running end with it, no other starts
        stop.append("interrupted")
        raise
    if errors:
        raise errors[0]
    return [c.name for c in cells if not state.done(c.name)]


def merge_group(docs):
    """One document from a group's rounds (in round order): the first's
    fields, every round's runs with "rep" set to the round, the hosts of all
    rounds under "rounds", and the config's reps counts set to the number of
    rounds.  Refuses rounds of different binaries."""
    if not docs:
        raise ValueError("no rounds to merge")
    first = docs[0][1]
    bins = first.get("binaries")
    merged = json.loads(json.dumps(first))
    merged["runs"], merged["rounds"] = [], []
    for rnd, doc in docs:
        if doc.get("binaries", {}).get("kmig_sha256") != (bins or {}).get("kmig_sha256"):
            raise ValueError("round %d measured another kmig binary" % rnd)
        for r in doc.get("runs", []):
            r = dict(r)
            r["rep"] = rnd
            merged["runs"].append(r)
        merged["rounds"].append({"round": rnd, "host": doc.get("host") or doc.get("info"),
                                 "runs": len(doc.get("runs", []))})
    merged["partial"] = False
    cfg = merged.get("config")
    if isinstance(cfg, dict):
        n = len(set(rnd for rnd, _ in docs))
        for k in ("reps", "reps_cheap", "reps_expensive"):
            if k in cfg:
                cfg[k] = n
        if isinstance(cfg.get("args"), dict) and "reps" in cfg["args"]:
            cfg["args"]["reps"] = n
    return merged


def finish(state, cells, root, results, log=print):
    """Writes the published results of every benchmark whose cells are all
    done (a lone cell's JSON and .md copied, a group's rounds merged and
    retabled); returns the paths written."""
    written, groups = [], {}
    for c in cells:
        if c.group:
            groups.setdefault(c.group, []).append(c)
        elif c.publish and state.done(c.name):
            out, _ = out_paths(state, c)
            dst = os.path.join(results, c.publish)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(out, dst)
            md = os.path.splitext(out)[0] + ".md"
            if os.path.exists(md):
                shutil.copyfile(md, os.path.splitext(dst)[0] + ".md")
            written.append(dst)
    for group, members in groups.items():
        if not all(state.done(c.name) for c in members):
            continue
        docs = []
        for c in sorted(members, key=lambda c: c.round):
            with open(out_paths(state, c)[0]) as f:
                docs.append((c.round, json.load(f)))
        merged = merge_group(docs)
        merged["suite"] = {"key": state.doc["key"], "cells": [c.name for c in members]}
        tmp = os.path.join(state.dir, "cells", "merged-" + os.path.basename(group))
        with open(tmp, "w") as f:
            json.dump(merged, f, indent=1)
        dst = os.path.join(results, group)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        re_cmd = members[0].retable
        if re_cmd:
            argv = [a.replace("{json}", tmp).replace("{out}", dst) for a in re_cmd]
            rc = subprocess.run(argv, cwd=root, stdout=subprocess.DEVNULL).returncode
            if rc:
                raise RuntimeError("retable of %s: exit status %d" % (group, rc))
        else:
            shutil.copyfile(tmp, dst)
        os.unlink(tmp)
        written.append(dst)
    log("wrote %d result(s)" % len(written))
    return written


def summary(state, cells):
    """The suite's record: its key, per cell the wall time, the commits and
    hosts seen, and the total time the cells took."""
    rows, total, heads, hosts = [], 0.0, set(), set()
    for c in cells:
        rec = state.doc["cells"].get(c.name, {"status": "pending", "attempts": []})
        last = rec["attempts"][-1] if rec["attempts"] else {}
        wall = sum(a.get("wall_s", 0) for a in rec["attempts"])
        total += wall
        if last.get("git_head"):
            heads.add(last["git_head"])
        if last.get("host"):
            hosts.add(last["host"].get("hostname") or "?")
        rows.append({"cell": c.name, "status": rec["status"], "where": c.where,
                     "attempts": len(rec["attempts"]), "wall_s": round(wall, 1),
                     "load_before": last.get("load_before"), "load_after": last.get("load_after")})
    return {"key": state.doc["key"], "parts": state.doc["parts"], "created": state.doc["created"],
            "cells_done": sum(1 for r in rows if r["status"] == "done"), "cells": len(rows),
            "wall_s_total": round(total, 1), "git_heads": sorted(heads),
            "hosts": sorted(hosts), "rows": rows}
