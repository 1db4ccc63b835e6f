"""Decode-tick stalls while hostile requests compile (issue 16). Prints the longest stall of a
50 ms tick and its p99 gap, quiet and with issue 16's hostile compiles in flight (``--each``: one
hostile spec per phase, to find the staller). See harness/stall.py.

    OMP_NUM_THREADS=1 .venv/bin/python bench/stall.py [--seconds 8] [--backend auto] [--each]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--each", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from tokenrails import GuidedDecodingManager, Vocabulary
    from harness.stall import hostile_specs, measure_stalls

    tok = AutoTokenizer.from_pretrained(str(Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "smollm2"))
    mgr = GuidedDecodingManager(Vocabulary.from_huggingface(tok), backend=args.backend)
    hostile = list(hostile_specs())
    phases = [("quiet", [])]
    phases += [(name, [s]) for name, s in hostile] if args.each else [("hostile (all at once)", [s for _, s in hostile])]
    report = {}
    for name, specs in phases:
        r = measure_stalls(mgr, specs, args.seconds)
        report[name] = vars(r)
        print(f"{name:40s} ticks {r.ticks:4d}  max stall {r.max_stall_ms:7.1f} ms  p99 gap {r.p99_gap_ms:6.1f} ms",
              flush=True)
    print(json.dumps(report))
    mgr.close()


if __name__ == "__main__":
    main()
