#!/usr/bin/env python3
"""Recovery benchmark (seed 003): what a migration that does not complete
leaves behind.  A stressed guest runs, a migration starts with
auto-converge (or dirty-limit), and after --migrate-s seconds it is
cancelled (`cancel`) or its destination is killed (`dst-killed`).  Every
--sample-ms the source is asked for KVM's page-size statistics (kmig:
x-query-kvm-stats, QEMU 7.2: query-stats target=vm), for the throttle in
force and, on kmig, whether KVM still logs writes (x-query-dirty-tracking);
the guest's stress lines give its pace (ms per GiB of page writes).

Per run: the pace before (median), the worst pace while migrating, the time
from the end of the migration until the pace is back within 10 % of the
pace before (and stays there for the next 3 reports), pages_4k/2m/1g before,
at the end of the migration and at the end of the run, how long logging
and the throttle stayed on after the end, and when the 4 KiB mappings
logging left were gone (KVM's 4K count back near its count before).

Seed 003 on big guests: --touch has the guest write every free page first
(touch=1: a zero to each, so all its memory is mapped, with huge pages
where the host can, and the bulk pass still ends soon, zero pages going
as such; with a --memory of 8G and more), and --engaged starts the --migrate-s seconds
only once the policy acts (a throttle, or dirty limits set: the migration
must reach its rounds first), so what is measured is the recovery from a
policy that was in force; `engaged` in the table counts the runs where it
was.  Writes bench/results/recovery.json and prints a table of medians.
Never asserts.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import run as mig  # noqa: E402  (Proc, vm_args, host_info, snapshot_binaries, ...)

RESULTS = os.path.join(ROOT, "bench", "results")
# name: vmm, dirty ring entries (0 = bitmap), policy
CONFIGS = {
    "kmig-bitmap-step": ("kmig", 0, "step"),
    "kmig-bitmap-computed": ("kmig", 0, "computed"),
    "kmig-ring-step": ("kmig", 4096, "step"),
    "kmig-ring-computed": ("kmig", 4096, "computed"),
    "kmig-ring-dirty-limit": ("kmig", 4096, "dirty-limit"),
    "qemu-bitmap-step": ("qemu", 0, "step"),
    "qemu-ring-step": ("qemu", 4096, "step"),
}
OUTCOMES = ("cancel", "dst-killed")
REPORT_MS = 500     # pace report period: recovery_s wants four whole reports in a row


def sample(vmm, q, t0, policy):
    s = {"t": round(time.monotonic() - t0, 3), "pages": mig.kvm_pages(vmm, q)}
    r = q.cmd("query-migrate")
    s["status"] = r.get("status")
    if vmm == "kmig":
        t = q.cmd("x-query-dirty-tracking")
        s["logging"] = t.get("logging")
        s["throttle"] = t.get("throttle-percentage")
        if policy == "dirty-limit":     # limits set on the vCPUs
            s["limited"] = len(q.cmd("query-vcpu-dirty-limit") or [])
    else:
        s["throttle"] = r.get("cpu-throttle-percentage", 0)
    return s


def engaged(s):
    """The policy acts on the guest: a throttle, or dirty limits set."""
    return bool(s.get("throttle") or s.get("limited"))


def set_policy(vmm, q, policy, a):
    caps = {"auto-converge": policy != "dirty-limit"}
    if vmm == "kmig":       # QEMU 7.2 has no dirty-limit capability
        caps["dirty-limit"] = policy == "dirty-limit"
    q.cmd("migrate-set-capabilities",
          capabilities=[{"capability": k, "state": v} for k, v in caps.items()])
    params = {"max-bandwidth": a.bandwidth, "downtime-limit": 1}
    if vmm == "kmig" and policy != "dirty-limit":
        params["x-cpu-throttle-policy"] = policy
    q.cmd("migrate-set-parameters", **params)


def recovery_s(lines, t_end, base):
    """Seconds from t_end (host) until the first report after which this
    one and the next 3 are all within 10 % of base."""
    after = [l for l in lines if l["host"] > t_end and l["cpu"] == 0]
    for i in range(len(after)):
        win = after[i:i + 4]
        if len(win) == 4 and all(l["ms_per_gib"] <= 1.1 * base for l in win):
            return round(after[i]["host"] - t_end, 2)
    return None


def first_false(samples, key, t_end):
    """Seconds after t_end until samples[key] was first falsy (0/False)."""
    for s in samples:
        if s["t"] >= t_end and not s.get(key):
            return round(s["t"] - t_end, 3)
    return None


def split_gone_s(samples, t_end, before):
    """Seconds after t_end until the 4 KiB mappings logging left behind
    were gone: KVM's 4K count back within 10 % (plus 512) of its count
    before the migration.  (The 2 MiB count itself comes back only for
    the memory the guest touches again: KVM drops the split mappings when
    logging stops and maps huge again on the next fault.)"""
    if not before or "pages_4k" not in before:
        return None
    for s in samples:
        if s["t"] >= t_end and "pages_4k" in (s["pages"] or {}) and \
                s["pages"]["pages_4k"] <= 1.1 * before["pages_4k"] + 512:
            return round(s["t"] - t_end, 3)
    return None


def gib_of(size):
    """GiB (at least 1) of a size such as 8G or 1536M."""
    n, unit = float(size[:-1]), size[-1].upper()
    return max(1, int(n / 1024 if unit == "M" else n))


def wait_engaged(vmm, q, t0, policy, a, samples, src):
    """Samples until the policy acts (seconds since migrate) or
    --engage-cap passes (None)."""
    t = time.monotonic()
    while time.monotonic() < t + a.engage_cap:
        s = dict(sample(vmm, q, t0, policy), phase="migrating")
        samples.append(s)
        src.poll_lines()
        if engaged(s):
            return round(time.monotonic() - t, 2)
        if s["status"] not in ("setup", "active", "pre-switchover", "device"):
            return None
        time.sleep(a.sample_ms / 1000.0)
    return None


def one_run(env, cfg, outcome, rep, a):
    vmm, ring, policy = CONFIGS[cfg]
    d = tempfile.mkdtemp(prefix="rec-", dir=env["tmp"])
    uri = "tcp:127.0.0.1:%d" % mig.free_port()
    cl = "workload=stress mb=%d report_ms=%d tsc_khz=%d%s" % (
        a.stress_mb, REPORT_MS, env["tsc_khz"], " touch=1" if a.touch else "")
    res = {"config": cfg, "outcome": outcome, "rep": rep, "vmm": vmm, "ring": ring,
           "policy": policy, "loadavg": mig.loadavg()}
    src = mig.Proc(d, "src", mig.vm_args(env, vmm, ring, cl, a.memory, 1, d, "src"))
    dst = mig.Proc(d, "dst", mig.vm_args(env, vmm, ring, cl, a.memory, 1, d, "dst",
                                         incoming=uri))
    samples = []
    try:
        deadline = time.monotonic() + 90 + (a.memory_gib * 10 if a.touch else 0)
        while time.monotonic() < deadline and src.alive():
            src.poll_lines()
            if mig.warm_reports(src.seen, 1)[0] >= 4:     # its first writes done
                break
            time.sleep(0.05)
        if not mig.wait_dst_ready(dst, vmm):
            res["status"] = "setup-failed"
            return res
        q = src.qmp()
        set_policy(vmm, q, policy, a)
        t0 = time.monotonic()
        phases = [("before", a.before_s), ("migrating", a.migrate_s), ("after", a.after_s)]
        t_mig = t_end = None
        for name, secs in phases:
            if name == "migrating":
                t_mig = time.monotonic()
                q.cmd("migrate", uri=uri)
                if a.engaged:   # the phase's seconds count from the policy's first act
                    res["engaged_after_s"] = wait_engaged(vmm, q, t0, policy, a, samples, src)
            if name == "after":
                if outcome == "cancel":
                    q.cmd("migrate_cancel")
                else:
                    dst.kill()
                t_end = time.monotonic()
                res["status_at_end"] = q.cmd("query-migrate").get("status")
            stop = time.monotonic() + secs
            while time.monotonic() < stop:
                samples.append(dict(sample(vmm, q, t0, policy), phase=name))
                src.poll_lines()
                time.sleep(a.sample_ms / 1000.0)
        lines = mig.stress_lines(src.seen)
        pre = [l["ms_per_gib"] for l in lines
               if l["host"] < t_mig and l["cpu"] == 0 and l["warm"]]
        during = [l["ms_per_gib"] for l in lines if t_mig <= l["host"] < t_end]
        base = statistics.median(pre) if pre else None
        rel_end = t_end - t0

        def pages_at(phase, last=True):
            ps = [s["pages"] for s in samples if s["phase"] == phase and s["pages"]]
            return (ps[-1] if last else ps[0]) if ps else {}
        res.update(status=q.cmd("query-migrate").get("status"),
                   pace_before_ms_per_gib=base,
                   pace_worst_during=max(during) if during else None,
                   recovery_s=recovery_s(lines, t_end, base) if base else None,
                   pages_before=pages_at("before"), pages_end_of_migration=pages_at("migrating"),
                   pages_end=pages_at("after"),
                   logging_on_after_s=first_false(samples, "logging", rel_end)
                   if vmm == "kmig" else None,
                   throttle_on_after_s=first_false(samples, "throttle", rel_end),
                   max_throttle=max((s.get("throttle") or 0) for s in samples),
                   max_limited=max((s.get("limited") or 0) for s in samples),
                   split_gone_s=split_gone_s(samples, rel_end, pages_at("before")),
                   samples=samples,
                   reports=[[round(l["host"] - t0, 3), l["ms_per_gib"]] for l in lines
                            if l["cpu"] == 0])
        return res
    finally:
        src.kill()
        dst.kill()
        shutil.rmtree(d, ignore_errors=True)


def summarize(runs):
    out = {}
    for r in runs:
        out.setdefault((r["config"], r["outcome"]), []).append(r)
    summary = []
    for (cfg, outcome), rs in sorted(out.items()):
        ok = [r for r in rs if r.get("pace_before_ms_per_gib")]
        two_m = lambda r, k: (r.get(k) or {}).get("pages_2m")  # noqa: E731
        summary.append({
            "config": cfg, "outcome": outcome, "runs": len(rs), "measured": len(ok),
            "pace_before": mig.med([r["pace_before_ms_per_gib"] for r in ok]),
            "pace_worst_during": mig.med([r.get("pace_worst_during") for r in ok]),
            "recovery_s": mig.med([r.get("recovery_s") for r in ok]),
            "recovered_runs": sum(1 for r in ok if r.get("recovery_s") is not None),
            "pages_2m_before": mig.med([two_m(r, "pages_before") for r in ok]),
            "pages_2m_end_of_migration": mig.med([two_m(r, "pages_end_of_migration") for r in ok]),
            "pages_2m_end": mig.med([two_m(r, "pages_end") for r in ok]),
            "logging_on_after_s": mig.med([r.get("logging_on_after_s") for r in ok]),
            "engaged_runs": sum(1 for r in ok if r.get("max_throttle") or r.get("max_limited")),
            "split_gone_s": mig.med([r.get("split_gone_s") for r in ok]),
            "throttle_on_after_s": mig.med([r.get("throttle_on_after_s") for r in ok]),
        })
    return summary


def table(summary):
    f = lambda x, p="%d": "-" if x is None else p % x  # noqa: E731
    lines = ["%-22s %-10s %5s %7s %9s %9s %10s %9s %9s %9s %8s %8s %8s" % (
        "config", "outcome", "runs", "engaged", "pace", "worst", "recover s", "2M pre",
        "2M mig", "2M end", "4K gone", "log off", "thr off")]
    for s in summary:
        lines.append("%-22s %-10s %5s %7s %9s %9s %10s %9s %9s %9s %8s %8s %8s" % (
            s["config"], s["outcome"], "%d/%d" % (s["recovered_runs"], s["runs"]),
            "%d/%d" % (s.get("engaged_runs", 0), s["measured"]),
            f(s["pace_before"], "%.0f"), f(s["pace_worst_during"], "%.0f"),
            f(s["recovery_s"], "%.1f"), f(s["pages_2m_before"]),
            f(s["pages_2m_end_of_migration"]), f(s["pages_2m_end"]),
            f(s.get("split_gone_s"), "%.2f"),
            f(s["logging_on_after_s"], "%.2f"), f(s["throttle_on_after_s"], "%.2f")))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memory", default="1G")
    p.add_argument("--stress-mb", type=int, default=128)
    p.add_argument("--bandwidth", type=int, default=20000000, help="bytes/s")
    p.add_argument("--before-s", type=float, default=4)
    p.add_argument("--migrate-s", type=float, default=12)
    p.add_argument("--after-s", type=float, default=12)
    p.add_argument("--sample-ms", type=int, default=250)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--outcomes", default=",".join(OUTCOMES))
    p.add_argument("--tsc-khz", type=int, default=0)
    p.add_argument("--touch", action="store_true",
                   help="the guest writes every free page first (touch=1), so its memory is "
                        "mapped, with huge pages where the host can")
    p.add_argument("--engaged", action="store_true",
                   help="--migrate-s counts from the policy's first act (a throttle, or dirty "
                        "limits set), waited for up to --engage-cap seconds")
    p.add_argument("--engage-cap", type=float, default=120)
    p.add_argument("--out", default=os.path.join(RESULTS, "recovery.json"))
    a = p.parse_args()
    a.memory_gib = gib_of(a.memory)
    tmp = tempfile.mkdtemp(prefix="kmig-rec-")
    try:
        env, info, bins = mig.bench_env(tmp, a.tsc_khz)
        runs = []
        for rep in range(a.reps):
            for outcome in a.outcomes.split(","):
                for cfg in a.configs.split(","):
                    r = one_run(env, cfg, outcome, rep, a)
                    brief = {k: v for k, v in r.items() if k not in ("samples", "reports")}
                    print("# %s" % json.dumps(brief), flush=True)
                    runs.append(r)
        summary = summarize(runs)
        mig.save_results(a, "recovery", info, bins, runs, summary, table(summary))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
