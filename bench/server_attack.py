"""Hostile clients against LMDeploy's api_server on the CPU path (issue 27): the upgraded server and
stock LMDeploy side by side, measured in the same run.

For each server: benign JSON-schema requests and ``/v1/models`` pings run while each hostile shape
is sent (fresh nonce each); then (upgraded only by default) the api_server's RSS growth after N
distinct refused ~1 MB specs. Prints one table: attack -> status, time, front-end stall (longest
ping while it was in flight), then ping and benign p50/p99 vs the no-attack baseline.

    OMP_NUM_THREADS=1 .venv/bin/python bench/server_attack.py [--servers upgraded,stock]
        [--refused 500] [--deadline 30] [--hostile-timeout 90] [--flood 8] [--json out.json]
    OMP_NUM_THREADS=1 .venv/bin/python bench/server_attack.py --bodies   # large request bodies only

Stock LMDeploy has no limits: a shape may hold its engine for minutes; each hostile request is cut
by the client at ``--hostile-timeout`` (reported as ``timeout``), and a stock server still stuck
at the end is killed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import server_attack as atk  # noqa: E402


def _fmt(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"


def measure(name: str, model, args) -> dict:
    limits = {"compile_timeout_s": args.deadline} if name == "upgraded" else None
    for attempt in range(3):  # stock's engine start can lose a race with its own mp.Manager under load
        log = Path(tempfile.mkdtemp(prefix=f"attack-{name}-")) / "server.log"
        proc, base = atk.start_server(model, log, stock=name == "stock", limits=limits)
        model_id = atk.wait_ready(proc, base, 300)
        if model_id is not None:
            break
        atk.stop_server(proc)
    else:
        raise SystemExit(f"{name} server did not start; log: {log}")
    try:
        shapes = {"compile": atk.compile_shapes(), "quick": atk.compile_shapes() + atk.hostile_shapes(quick=True),
                  "all": atk.compile_shapes() + atk.hostile_shapes()}[args.shapes]
        load_before = os.getloadavg()
        cpu_before = os.times()
        start = time.monotonic()
        timeout = args.hostile_timeout if name == "upgraded" else args.stock_hostile_timeout
        run = atk.run_attack(base, model_id, shapes, baseline_requests=args.baseline, min_attack_benign=args.baseline,
                             hostile_timeout=timeout, budget_s=args.budget, benign_timeout=timeout,
                             after_requests=args.baseline,
                             rss_of=lambda: (atk.tree_rss_mb(proc.pid, workers=False), atk.rss_mb(proc.pid)))
        out = {"server": name, "seconds": time.monotonic() - start, "baseline": run.baseline, "after": run.after,
               "under_attack": run.under_attack, "pings": [lat for _, lat in run.pings],
               "pings_quiet": run.ping_latencies(attack=False), "pings_in_flight": run.pings_in_flight(),
               "ping_failures": run.ping_failures, "benign_invalid": run.benign_invalid,
               "benign_errors": run.benign_errors[:5],
               "hostile": [vars(r) for r in run.hostile], "fresh_client": run.fresh_client,
               "load": (load_before, os.getloadavg()),
               "client_cpu_s": sum(os.times()[:2]) - sum(cpu_before[:2])}
        time.sleep(5)  # killed compile workers replaced, abandoned work ended
        rss_before, api_before = run.rss_at_start  # when the attack started, after the warm-up and baseline
        out["rss_mb"] = (rss_before, atk.tree_rss_mb(proc.pid, workers=False))
        out["api_rss_mb"] = (api_before, atk.rss_mb(proc.pid))  # the api_server alone; the rest: the engine
        out["workers_rss_mb"] = atk.tree_rss_mb(proc.pid, workers=True)
        if args.flood:
            out["flood"] = atk.flood_latency(base, model_id, args.flood)
        if args.refused and (name == "upgraded" or args.refused_stock):
            growth, refused = atk.refused_payload_growth(base, model_id, proc.pid, args.refused, mb=0.9)
            out["rss_growth_mb"], out["refused"] = growth, refused
        return out
    finally:
        atk.stop_server(proc)


def print_table(results: list[dict]) -> None:
    names = [r["server"] for r in results]
    rows = {}
    for r in results:
        sent: dict[str, int] = {}
        for h in r["hostile"]:
            sent[h["name"]] = sent.get(h["name"], 0) + 1
            label = h["name"] if sent[h["name"]] == 1 else f"{h['name']} #{sent[h['name']]}"
            status = "timeout" if h["status"] is None else str(h["status"])
            if h["valid"] is False:
                status += " INVALID"
            rows.setdefault(label, {})[r["server"]] = f"{status:>8} {h['seconds']:7.2f}s stall {h['stall_s']:6.2f}s"
    width = max(len(k) for k in rows) + 2
    print(f"{'attack':<{width}}" + "".join(f"{n + ': status, time, front-end stall':<44}" for n in names))
    for attack, cells in rows.items():
        print(f"{attack:<{width}}" + "".join(f"{cells.get(n, '-'):<44}" for n in names))
    print()
    for r in results:
        b50, b99 = atk.percentile(r["baseline"], 0.5), atk.percentile(r["baseline"], 0.99)
        a50, a99 = atk.percentile(r["under_attack"], 0.5), atk.percentile(r["under_attack"], 0.99)
        q99, p99 = atk.percentile(r["pings_quiet"], 0.99), atk.percentile(r["pings_in_flight"], 0.99)
        print(f"{r['server']:>9}: benign p50 {_fmt(b50)} -> {_fmt(a50)} s, p99 {_fmt(b99)} -> {_fmt(a99)} s "
              f"(x{_fmt(a99 / b99 if b99 == b99 and b99 else float('nan'))}); pings p99 {_fmt(q99)} -> {_fmt(p99)} s "
              f"(hostile in flight), max {_fmt(max(r['pings'], default=float('nan')))} s, "
              f"failed {r['ping_failures']}/{len(r['pings'])}; benign invalid {r['benign_invalid']}, "
              f"errors {len(r['benign_errors'])}; run {r['seconds']:.0f} s")
        if r.get("after"):
            f50, f99 = atk.percentile(r["after"], 0.5), atk.percentile(r["after"], 0.99)
            print(f"{'':>11}benign after the attack (no attack, load drift): p50 {_fmt(f50)}, p99 {_fmt(f99)} s; "
                  f"under-attack p99 / the larger no-attack p99: x{_fmt(a99 / max(b99, f99))}")
        fresh = r.get("fresh_client")
        if fresh:
            print(f"{'':>11}another client's fresh schema after the attack: {fresh[0]} in {fresh[1]:.2f} s")
        if "rss_mb" in r:
            print(f"{'':>11}server process tree RSS {r['rss_mb'][0]:.0f} -> {r['rss_mb'][1]:.0f} MB "
                  f"({r['rss_mb'][1] - r['rss_mb'][0]:+.0f} MB, 5 s after the attack; compile workers apart: "
                  f"{r.get('workers_rss_mb', 0):.0f} MB)")
        if "api_rss_mb" in r:
            api = r["api_rss_mb"][1] - r["api_rss_mb"][0]
            print(f"{'':>11}of which the api_server {api:+.0f} MB, the engine {r['rss_mb'][1] - r['rss_mb'][0] - api:+.0f} MB")
        if "load" in r:
            print(f"{'':>11}load average (1/5/15 min) {'/'.join(f'{x:.1f}' for x in r['load'][0])} at start, "
                  f"{'/'.join(f'{x:.1f}' for x in r['load'][1])} at end (2 cores)")
        if r.get("flood"):
            fl = r["flood"]
            times = [t for _, t in fl["flood"]]
            print(f"{'':>11}one client floods {len(times)} slow accepted specs: another client's fresh schema "
                  f"{fl['other'][0]} in {fl['other'][1]:.2f} s; the flood's answers "
                  f"{sorted(str(st) for st, _ in fl['flood'])}, slowest {max(times, default=0):.1f} s")
        if r.get("hostile"):
            worst = max(h["seconds"] for h in r["hostile"])
            print(f"{'':>11}slowest hostile answer {worst:.2f} s")
        if "rss_growth_mb" in r:
            print(f"{'':>11}RSS growth after {r['refused']} refused ~1 MB specs: {r['rss_growth_mb']:+.1f} MB")


def measure_bodies(name: str, model, args) -> dict:
    """The large-body shapes alone (``--bodies``): status, time, longest ping and log growth each."""
    log = Path(tempfile.mkdtemp(prefix=f"bodies-{name}-")) / "server.log"
    proc, base = atk.start_server(model, log, stock=name == "stock")
    try:
        model_id = atk.wait_ready(proc, base, 300)
        if model_id is None:
            raise SystemExit(f"{name} server did not start; log: {log}")
        results, quiet, during, failures = atk.run_bodies(base, model_id, log, timeout=args.stock_hostile_timeout
                                                          if name == "stock" else args.hostile_timeout)
        return {"server": name, "bodies": [vars(r) for r in results], "pings_quiet": quiet, "pings": during,
                "ping_failures": failures}
    finally:
        atk.stop_server(proc)


def print_bodies(results: list[dict]) -> None:
    print(f"{'server':9} {'body':28} {'status':>6} {'time s':>8} {'stall s':>8} {'log bytes':>10}")
    for res in results:
        for r in res["bodies"]:
            print(f"{res['server']:9} {r['name']:28} {str(r['status']):>6} {r['seconds']:8.2f} {r['stall_s']:8.2f} "
                  f"{r['log_bytes']:10d}")
        print(f"{res['server']:9} pings p99 {_fmt(atk.percentile(res['pings_quiet'], 0.99))} quiet -> "
              f"{_fmt(atk.percentile(res['pings'], 0.99))} during the bodies, max {_fmt(max(res['pings'] or [0]))}, "
              f"{len(res['ping_failures'])} failed")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", default="upgraded,stock")
    ap.add_argument("--refused", type=int, default=500, help="distinct refused ~1 MB specs for the RSS figure")
    ap.add_argument("--refused-stock", action="store_true", help="also send them to stock (it compiles them)")
    ap.add_argument("--deadline", type=float, default=30.0, help="upgraded server's compile_timeout_s")
    ap.add_argument("--hostile-timeout", type=float, default=90.0)
    ap.add_argument("--stock-hostile-timeout", type=float, default=30.0,
                    help="client timeout of each hostile and benign request sent to stock (it has no deadline)")
    ap.add_argument("--baseline", type=int, default=6)
    ap.add_argument("--budget", type=float, default=900.0, help="seconds per server for the attack run")
    ap.add_argument("--shapes", default="all", choices=("compile", "quick", "all"),
                    help="compile: issue 36's compile attacks only; quick: plus one of each earlier family")
    ap.add_argument("--flood", type=int, default=0,
                    help="after the attack: one client sends this many slow accepted specs at once, another a fresh schema")
    ap.add_argument("--json", default=None)
    ap.add_argument("--bodies", action="store_true", help="only the large request bodies (size/count limits)")
    args = ap.parse_args()
    from tokenrails.demo_model import resolve_model_dir

    model, _, _ = resolve_model_dir(quiet=True)
    if args.bodies:
        results = [measure_bodies(name, model, args) for name in args.servers.split(",")]
        print_bodies(results)
    else:
        results = []
        for name in args.servers.split(","):
            results.append(measure(name, model, args))
            if args.json:  # a later server failing to start must not lose this one's figures
                Path(args.json).write_text(json.dumps(results, indent=1))
        print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
