"""Tensor parallel on LMDeploy 0.18's real engine (CPU path): tokens/s and guided CPU time per rank,
TP = 1 and TP = 3, stock vs upgraded, in the same run.

Each configuration is one engine in its own process (tests/engine_patch/lmdeploy/tp_child.py):
SmolLM2-135M in float32, greedy, one batch of six rows (json_schema, regex, choice, grammar, a tool
call as a structural tag, unguided; stock refuses choice and grammar, so its batch decodes fewer
tokens). The batch runs ``--repeat`` times; the last is timed (grammars compiled, caches warm):
tokens/s = generated tokens / wall seconds of that batch. Guided CPU per rank is the thread CPU time
of the upgrade's guided entry points in each rank's process over the whole run (vocabulary build,
compiles, fills, applies, accepts: engine_patch/lmdeploy/step/guided_meter.py); stock has no such meter.

    python bench/lmdeploy_tp.py [--repeat 2] [--configs stock:1,stock:3,upgraded:1,upgraded:3]

The machine's cores are shared: at TP = 3 three ranks contend for them, so TP = 3 is not expected to
be faster here; the figure is for the ratio between stock and upgraded at the same TP.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(mode: str, tp: int, repeat: int, meter_dir: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("TOKENRAILS_LMDEPLOY", None)
    meter = env["TOKENRAILS_GUIDED_CPU_METER"] = os.path.join(meter_dir, f"{mode}-{tp}")  # step/guided_meter.py
    cmd = [sys.executable, "-m", "tests.engine_patch.lmdeploy.tp_child", "--tp", str(tp),
           "--mode", "stock" if mode == "stock" else "tokenrails", "--repeat", str(repeat)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("TP_RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{mode} TP={tp} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("TP_RESULT "):])
    reports = [json.loads(Path(f).read_text()) for f in glob.glob(meter + ".*.json")]
    ranks = {r["rank"]: r["seconds"] for r in reports if r.get("rank") is not None}
    if not ranks:  # TP = 1: the engine runs in the parent process, which never learns a rank
        ranks = {0: sum(r["seconds"] for r in reports)}
    return {"timing": result.pop("_timing"), "outputs": result, "guided_cpu": ranks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--configs", default="stock:1,upgraded:1,stock:3,upgraded:3")
    args = ap.parse_args()
    configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as meter_dir:
        for mode, tp in configs:
            results[(mode, tp)] = run(mode, tp, args.repeat, meter_dir)
            r = results[(mode, tp)]
            t = r["timing"]
            cpu = " ".join(f"r{k}={v:.3f}s" for k, v in sorted(r["guided_cpu"].items())) if mode != "stock" else "-"
            print(f"{mode:>9} TP={tp}: {t['tokens']:4d} tokens in {t['seconds']:6.2f} s = "
                  f"{t['tokens'] / t['seconds']:6.2f} tok/s; guided CPU per rank: {cpu}", flush=True)
    for tp in sorted({tp for _, tp in configs}):
        s, u = results.get(("stock", tp)), results.get(("upgraded", tp))
        if s and u:
            rs = s["timing"]["tokens"] / s["timing"]["seconds"]
            ru = u["timing"]["tokens"] / u["timing"]["seconds"]
            print(f"TP={tp}: upgraded/stock tokens/s = {ru / rs:.2f}")
        same = [k for k in (u or {}).get("outputs", {}) if results.get(("upgraded", 1)) and
                results[("upgraded", 1)]["outputs"][k]["token_ids"] == u["outputs"][k]["token_ids"]]
        if u and tp != 1 and results.get(("upgraded", 1)):
            print(f"TP={tp}: upgraded rows equal to TP=1 token for token: {len(same)}/{len(u['outputs'])}")


if __name__ == "__main__":
    main()
