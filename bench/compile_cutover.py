"""Where large compiles should move to a worker process: in-process compile time vs a warm
worker's round trip (send the spec, compile there, export, restore here), by spec size.

    OMP_NUM_THREADS=1 .venv/bin/python bench/compile_cutover.py [--vocab probe|model] [--repeat 3]

Fresh specs each time (a nonce), the api_server's probe vocabulary or the demo model's. Prints the
median wall and CPU seconds of both ways and the load average beside each row.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

torch.set_num_threads(1)

import tokenrails as tr  # noqa: E402
from tokenrails.guided.compile_procs import ProcessCompiler, compile_cost  # noqa: E402
from tokenrails.guided.limits import DEFAULT_LIMITS  # noqa: E402
from tokenrails.guided.registry import compile_guide  # noqa: E402


def spec_of_size(props: int, nonce: str) -> tr.GuideSpec:
    return tr.GuideSpec.json_schema({"type": "object", "description": nonce, "properties": {
        f"field_{i:05d}": {"type": ["string", "integer"][i % 2]} for i in range(props)}})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default="probe", choices=("probe", "model"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.vocab == "probe":
        from tokenrails.engine_patch.lmdeploy.server.request_parsing import _probe_vocab

        vocab = _probe_vocab()
    else:
        from transformers import AutoTokenizer

        from tokenrails.demo_model import resolve_model_dir

        vocab = tr.Vocabulary.from_huggingface(AutoTokenizer.from_pretrained(resolve_model_dir(quiet=True)[0]))
    procs = ProcessCompiler(vocab, "auto", DEFAULT_LIMITS, workers=1)
    procs.compile(tr.GuideSpec.regex("warm"), time.monotonic() + 300)
    compile_guide(tr.GuideSpec.regex("warm"), vocab, "auto")
    print(f"{'properties':>10} {'spec bytes':>10} {'in-process s':>12} {'cpu s':>7} {'worker s':>9} {'cpu s':>7} "
          f"{'worker/in':>9}  load")
    for props in (4, 40, 160, 400, 1000, 1900):
        inner, inner_cpu, outer, outer_cpu, size = [], [], [], [], 0
        for r in range(args.repeat):
            spec = spec_of_size(props, f"n{time.time_ns()}{r}")
            size = compile_cost(spec)
            w, c = time.perf_counter(), time.process_time()
            compile_guide(spec, vocab, "auto")
            inner.append(time.perf_counter() - w)
            inner_cpu.append(time.process_time() - c)
            spec = spec_of_size(props, f"m{time.time_ns()}{r}")
            w, c = time.perf_counter(), time.process_time()
            procs.compile(spec, time.monotonic() + 300)
            outer.append(time.perf_counter() - w)
            outer_cpu.append(time.process_time() - c)  # this process only: send + restore
        a, b = statistics.median(inner), statistics.median(outer)
        print(f"{props:>10} {size:>10} {a:>12.4f} {statistics.median(inner_cpu):>7.4f} {b:>9.4f} "
              f"{statistics.median(outer_cpu):>7.4f} {b / a:>9.2f}  {os.getloadavg()[0]:.1f}")
    procs.close()


if __name__ == "__main__":
    main()
