"""Real-engine decode throughput: LMDeploy 0.18's PyTorch engine on CPU, unguided vs guided.

Runs LMDeploy's own Engine / Scheduler / model agent / sampling / logits processing and its Llama
forward (tokenrails.engine_patch.lmdeploy.cpu) on the embedded SmolLM2-135M, one thread
(``torch.set_num_threads(1)``), greedy. For each batch size (default 1, 8, 32):

* ``unguided``: no response_format (``ignore_eos``, so every row decodes the full length);
* ``stock``:    every row guided through LMDeploy's own xgrammar path (upgrade not active);
* ``upgraded``: the same requests with ``tokenrails.engine_patch.lmdeploy.activate()``.

Guided rows alternate a JSON schema (an array of at least 40 strings) and a regex (at least 120
words): neither can finish inside the measured length, so every row decodes every step.

Decode tokens/s = batch / (median interval between the starts of consecutive decoding steps of the
model agent, ``BaseModelAgent._async_step``): the interval is the whole engine-loop iteration
(scheduling, inputs, forward, logits processing, sampling, outputs), prefill steps are left out, and
the median keeps one slow step (GC, the OS) from moving the figure. Each configuration runs a
warm-up call first with the same formats (grammar compiles and vocabulary tables are cached, never
timed), then ``--repeat`` timed calls of N new tokens per row. Guided time per step is the time
spent inside the guided calls (stock: ``_fill_guided_bitmask`` + ``apply_batched_bitmap`` +
``_accept_guided_tokens``; upgraded: the mask step and the accept step of
tokenrails/engine_patch/lmdeploy/logits.py) over the number of sampling steps.

Two engines in one process: the stock one (built, and only ever run, with the upgrade inactive; it
also runs ``unguided``) and the upgraded one (built and run with it active; it re-runs ``unguided``
as a check that unguided decoding does not slow down under the upgrade). The four configurations
are interleaved over ``--rounds`` rounds and each figure is the median over rounds, so load from
elsewhere on the machine is spread over all of them.

    python bench/lmdeploy_engine.py [--batches 1,8,32] [--tokens 32] [--repeat 1] [--rounds 3]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import median, print_table  # noqa: E402  (also sets one torch thread)

import torch  # noqa: E402

LIST = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 40}},
        "required": ["items"], "additionalProperties": False}
FORMATS = [
    {"type": "json_schema", "json_schema": {"name": "list", "schema": LIST}},
    {"type": "regex_schema", "regex_schema": r"([A-Za-z]+[ ,]){120,}[A-Za-z]+\."},
]
PROMPTS = ["List many fruits.", "Write a long story about a cat.", "Name many cities in Europe.",
           "Describe the ocean in detail."]


class GuidedTimer:
    """Wall time inside the guided functions, sampling steps, and the decoding steps' start times."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.steps = 0
        self.starts: list[tuple[float, bool]] = []
        self._undo: list = []

    def reset(self) -> None:
        self.seconds, self.steps, self.starts = 0.0, 0, []

    def decode_intervals(self) -> list[float]:
        """Start-to-start intervals of consecutive decoding steps (a prefill step breaks the chain)."""
        return [b[0] - a[0] for a, b in zip(self.starts, self.starts[1:]) if a[1] and b[1]]

    def _wrap(self, owner, name: str) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def install(self, upgraded: bool) -> None:
        from lmdeploy.pytorch.engine import guided_process, logits_process

        flp = logits_process.FusedLogitsProcessor
        if upgraded:
            from tokenrails.engine_patch.lmdeploy import logits as tr_logits
            self._wrap(tr_logits, "_guided_step")  # fill + apply + empty-row repair (worker thread)
            self._wrap(tr_logits, "_accept")
        else:
            self._wrap(flp, "_fill_guided_bitmask")
            self._wrap(guided_process.GuidedDecodingManager, "apply_batched_bitmap")
            self._wrap(flp, "_accept_guided_tokens")
        original_sampling = flp.sampling

        def sampling(proc, logits):
            self.steps += 1
            return original_sampling(proc, logits)

        flp.sampling = sampling
        self._undo.append((flp, "sampling", original_sampling))
        from lmdeploy.pytorch.engine.model_agent import agent
        original_step = agent.BaseModelAgent._async_step

        async def _async_step(agent_self, inputs=None, *args, **kwargs):
            decoding = inputs is None or bool(inputs.is_decoding)  # None: a decoding step from a delta
            self.starts.append((time.perf_counter(), decoding))
            return await original_step(agent_self, inputs, *args, **kwargs)

        agent.BaseModelAgent._async_step = _async_step
        self._undo.append((agent.BaseModelAgent, "_async_step", original_step))

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def _gen_configs(batch: int, tokens: int, guided: bool):
    from lmdeploy import GenerationConfig
    out = []
    for i in range(batch):
        if guided:
            out.append(GenerationConfig(top_k=1, max_new_tokens=tokens, response_format=FORMATS[i % len(FORMATS)]))
        else:
            out.append(GenerationConfig(top_k=1, max_new_tokens=tokens, ignore_eos=True))
    return out


def _run(pipe, batch: int, tokens: int, guided: bool) -> tuple[float, int]:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    gens = _gen_configs(batch, tokens, guided)
    t0 = time.perf_counter()
    outs = pipe(prompts, gen_config=gens)
    dt = time.perf_counter() - t0
    bad = [o for o in outs if o.finish_reason != "length"]
    if bad:
        raise SystemExit(f"a row did not decode the full length (guided={guided}): {bad[0]}")
    return dt, sum(o.generate_token_len for o in outs)


def measure(pipe, timer: GuidedTimer, batch: int, tokens: int, guided: bool, repeat: int, warm: bool = True) -> dict:
    if warm:
        _run(pipe, batch, tokens, guided)  # warm-up: compiles, tables, allocator
    intervals: list[float] = []
    guided_s, steps = 0.0, 0
    for _ in range(repeat):
        timer.reset()
        _, ntok = _run(pipe, batch, tokens, guided)
        assert ntok == batch * tokens, (ntok, batch, tokens)
        intervals += timer.decode_intervals()
        guided_s += timer.seconds
        steps += timer.steps
    step = median(intervals)
    return {"tok_s": batch / step, "step_ms": 1e3 * step, "guided_ms_per_step": 1e3 * guided_s / max(1, steps)}


def _pipeline(batches: list[int], tokens: int):
    from lmdeploy import pipeline

    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    from tokenrails.demo_model import resolve_model_dir
    path, _, _ = resolve_model_dir(quiet=True)
    max_batch = max(batches)
    blocks_per_seq = (64 + tokens + 63) // 64 + 1
    cfg = cpu_engine_config(max_batch_size=max_batch, session_len=512, block_size=64,
                            num_gpu_blocks=max(64, max_batch * blocks_per_seq + 8))
    return pipeline(str(path), backend_config=cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per row in the timed call")
    ap.add_argument("--repeat", type=int, default=1, help="timed calls per configuration and round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; figures are medians over rounds")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(1)
    import tokenrails.engine_patch.lmdeploy as patch

    # both engines stay alive; the upgrade is active exactly while the upgraded engine runs (the
    # stock engine was built and only ever runs with it inactive). Configurations are interleaved
    # round by round so that load from elsewhere on the machine hits them alike.
    patch.deactivate()
    engines = {"stock": _pipeline(batches, args.tokens)}
    patch.activate()
    engines["upgraded"] = _pipeline(batches, args.tokens)
    patch.deactivate()
    timers = {name: GuidedTimer() for name in engines}
    configs = [("unguided", "stock", False), ("stock", "stock", True),
               ("unguided (upgrade active)", "upgraded", False), ("upgraded", "upgraded", True)]
    samples: dict[tuple[str, int], list[dict]] = {}
    try:
        for batch in batches:
            for rnd in range(args.rounds):
                for name, engine, guided in configs:
                    if engine == "upgraded":
                        patch.activate()
                    timer = timers[engine]
                    timer.install(upgraded=engine == "upgraded")
                    try:
                        r = measure(engines[engine], timer, batch, args.tokens, guided, args.repeat, warm=rnd == 0)
                    finally:
                        timer.uninstall()
                        patch.deactivate()
                    samples.setdefault((name, batch), []).append(r)
                    print(f"batch {batch} round {rnd}: {name} {r['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
    finally:
        for pipe in engines.values():
            pipe.close()
    results = {key: {k: median([r[k] for r in rs]) for k in rs[0]} for key, rs in samples.items()}

    print(f"\nLMDeploy 0.18 PyTorch engine on CPU (1 thread), SmolLM2-135M, greedy, {args.tokens} new tokens/row; "
          "decode tokens/s (prefill excluded)\n")
    rows = []
    for batch in batches:
        u = results[("unguided", batch)]
        ua = results[("unguided (upgrade active)", batch)]
        s = results[("stock", batch)]
        g = results[("upgraded", batch)]
        rows.append([batch, u["tok_s"], ua["tok_s"], s["tok_s"], g["tok_s"], g["tok_s"] / u["tok_s"],
                     g["tok_s"] / s["tok_s"], s["tok_s"] / u["tok_s"]])
    print_table(["batch", "unguided", "unguided(up)", "stock guided", "upgraded guided", "upgraded/unguided",
                 "upgraded/stock", "stock/unguided"], rows)
    print("\nper decode step (ms): step time, and time inside guided calls (fill + apply + accept)\n")
    rows = []
    for batch in batches:
        u = results[("unguided", batch)]
        s = results[("stock", batch)]
        g = results[("upgraded", batch)]
        rows.append([batch, u["step_ms"], s["step_ms"], s["guided_ms_per_step"], g["step_ms"],
                     g["guided_ms_per_step"], g["guided_ms_per_step"] / s["guided_ms_per_step"]])
    print_table(["batch", "unguided step", "stock step", "stock guided", "upgraded step", "upgraded guided",
                 "guided upgraded/stock"], rows)


if __name__ == "__main__":
    main()
