"""Tool-call tokens/s over HTTP, upgraded vs stock LMDeploy, measured in the same run.

Two CPU api_servers (``tokenrails.engine_patch.lmdeploy.cpu.serve``, SmolLM2, LMDeploy's ``qwen``
tool-call parser), one with the upgrade, one ``--stock``. Each round sends the same chat request
(``tool_choice`` required by default, temperature 0, ``max_tokens``) to both, in alternating order
(ABBA), one request at a time; a warm-up request per server first (compiles, first-call set-ups).
Each side has ``--instances`` servers (default 2), started in ABBA order, round r on instance
r mod n: two engine processes of the same code differ by up to ~10% in CPU per token on this
machine (measured: upgraded +12% in one run, -3% in the next, same code), which a single
instance per side charges to the code.
Per request: wall time, completion tokens (the server's ``usage``), and the CPU time of the
server's whole process group (api_server + engine process, all threads) read from /proc before
and after. Prints per-server medians and the paired ratio upgraded/stock of tokens/s (wall) and
of tokens per CPU-second (goal >= 1.0); every call's arguments are checked with jsonschema.

    python bench/tool_calls_http.py [--rounds 8] [--instances 2] [--max-tokens 141] [--tool-choice required|auto|named]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather forecast for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        }, "required": ["city", "days"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time in a time zone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}},
]
PROMPT = "What is the weather in Paris for the next 3 days, and what time is it there? Use the tools."


def thread_cpu_seconds(pgid: int) -> dict[str, float]:
    """utime + stime per thread (``process/thread`` names) of every live process in the process
    group, in seconds: where a difference in CPU time is spent."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5 (pgrp) is index 2 after the command
                continue
            proc_name = (entry / "comm").read_text().strip()
            for task in (entry / "task").iterdir():
                stat = (task / "stat").read_text()
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                f = stat.rsplit(")", 1)[1].split()
                key = f"{proc_name}[{entry.name}]/{name}"
                out[key] = out.get(key, 0.0) + (int(f[11]) + int(f[12])) / tick
        except (OSError, ValueError):
            continue
    return out


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every live process in the process group (all threads), in seconds."""
    return sum(thread_cpu_seconds(pgid).values())


def request_body(model: str, choice: str, max_tokens: int) -> dict:
    tool_choice: object = choice
    if choice == "named":
        tool_choice = {"type": "function", "function": {"name": "get_weather"}}
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}], "tools": TOOLS,
            "tool_choice": tool_choice, "temperature": 0, "max_tokens": max_tokens}


def check_calls(message: dict) -> int:
    """The number of tool calls; raises when one's arguments do not validate."""
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    calls = message.get("tool_calls") or []
    for call in calls:
        fn = call["function"]
        jsonschema.validate(json.loads(fn["arguments"]), schemas[fn["name"]])
    return len(calls)


def one(client, base: str, body: dict, pgid: int) -> dict:
    c0, t0 = thread_cpu_seconds(pgid), time.perf_counter()
    resp = client.post(f"{base}/v1/chat/completions", json=body, timeout=600)
    wall = time.perf_counter() - t0
    c1 = thread_cpu_seconds(pgid)
    threads = {k: v - c0.get(k, 0.0) for k, v in c1.items() if v - c0.get(k, 0.0) > 0}
    cpu = sum(threads.values())
    resp.raise_for_status()
    data = resp.json()
    tokens = data["usage"]["completion_tokens"]
    return {"wall": wall, "cpu": cpu, "threads": threads, "tokens": tokens, "calls": check_calls(data["choices"][0]["message"]),
            "tok_s": tokens / wall, "tok_cpu_s": tokens / cpu if cpu > 0 else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--instances", type=int, default=2, help="servers per side (round r on instance r mod n)")
    ap.add_argument("--max-tokens", type=int, default=141)
    ap.add_argument("--tool-choice", default="required", choices=["required", "auto", "named"])
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--threads", action="store_true", help="print the busiest threads of each request")
    ap.add_argument("--meter", action="store_true",
                    help="the upgraded engine's guided CPU time by entry point (compile, fill, apply, accept; "
                         "guided_meter.py) at the end: a compile count above 1 is a recompile per request "
                         "(metering costs a little: not for the ratio)")
    args = ap.parse_args()

    import httpx

    from tokenrails.demo_model import resolve_model_dir
    from harness.server_attack import start_server, stop_server, wait_ready

    model, _, _ = resolve_model_dir(quiet=True)
    logdir = Path(tempfile.mkdtemp(prefix="tool_calls_http_"))
    if args.meter:
        from tokenrails.engine_patch.lmdeploy.step.guided_meter import ENV_METER

        os.environ[ENV_METER] = str(logdir / "meter")
    servers: dict[str, list] = {"upgraded": [], "stock": []}
    starts = [("upgraded", "stock") if i % 2 == 0 else ("stock", "upgraded") for i in range(args.instances)]
    try:
        for name in (n for pair in starts for n in pair):  # one at a time: engines starting at once crowd 2 cores
            log = logdir / f"{name}{len(servers[name])}.log"
            for attempt in range(3):  # LMDeploy's engine-start manager race (EOFError) is retried
                proc, base = start_server(model, log, stock=name == "stock")
                served = wait_ready(proc, base, args.ready_timeout)
                if served is not None:
                    break
                stop_server(proc)
            else:
                raise SystemExit(f"{name} server did not come up; log: {log}")
            servers[name].append((proc, base, served))
        results: dict[str, list[dict]] = {"upgraded": [], "stock": []}
        with httpx.Client() as client:
            for name, instances in servers.items():
                for proc, base, served in instances:
                    one(client, base, request_body(served, args.tool_choice, args.max_tokens), proc.pid)
            for r in range(args.rounds):
                order = ("upgraded", "stock") if r % 2 == 0 else ("stock", "upgraded")
                for name in order:
                    proc, base, served = servers[name][r % args.instances]
                    res = one(client, base, request_body(served, args.tool_choice, args.max_tokens), proc.pid)
                    results[name].append(res)
                    print(f"round {r} {name:8s}#{r % args.instances} {res['tokens']:4d} tokens {res['wall']:6.2f} s wall "
                          f"{res['cpu']:6.2f} s CPU  {res['calls']} call(s)", flush=True)
                    if args.threads:
                        for key, sec in sorted(res["threads"].items(), key=lambda kv: -kv[1])[:4]:
                            print(f"      {sec:6.2f} s  {key}")
    finally:
        for instances in servers.values():
            for proc, _, _ in instances:
                stop_server(proc)

    print(f"\ntool_choice={args.tool_choice!r}, max_tokens={args.max_tokens}, {args.rounds} rounds (ABBA), "
          "medians:")
    for name, rows in results.items():
        print(f"  {name:8s} tokens {statistics.median(r['tokens'] for r in rows):5.0f}  "
              f"wall {statistics.median(r['wall'] for r in rows):6.2f} s  "
              f"CPU {statistics.median(r['cpu'] for r in rows):6.2f} s  "
              f"tok/s {statistics.median(r['tok_s'] for r in rows):6.2f}  "
              f"tok/CPU-s {statistics.median(r['tok_cpu_s'] for r in rows):6.2f}")
    if args.meter:
        requests = args.rounds // args.instances + 1  # per upgraded instance (one meter file each)
        for path in sorted(logdir.glob("meter.*.json")):
            by = json.loads(path.read_text())["by"]
            if by:
                print(f"  guided CPU of {path.name} over {requests} upgraded requests (per request):")
                for name, v in sorted(by.items(), key=lambda kv: -kv[1]["seconds"]):
                    print(f"    {name:24s} {v['seconds'] / requests * 1000:8.1f} ms  {v['calls'] / requests:7.1f} calls")
    up, st = results["upgraded"], results["stock"]
    wall = statistics.median(a["tok_s"] / b["tok_s"] for a, b in zip(up, st))
    cpu = statistics.median(a["tok_cpu_s"] / b["tok_cpu_s"] for a, b in zip(up, st))
    print(f"  upgraded/stock tokens/s (paired, median): wall {wall:.3f}  CPU {cpu:.3f}  (goal >= 1.0)")


if __name__ == "__main__":
    main()
