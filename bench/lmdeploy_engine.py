"""Real-engine decode throughput on someone else's workload: LMDeploy 0.18's PyTorch engine on CPU,
upgraded vs stock vs unguided, whole-step time, every output validated.

Runs LMDeploy's own Engine / Scheduler / model agent / sampling / logits processing and its Llama
forward (tokenrails.engine_patch.lmdeploy.cpu) on the embedded SmolLM2-135M, one thread, greedy.

Workload (printed with its provenance at the start of every run):

* ``public``: every row of
  - JSON schemas of JSONSchemaBench's MaskBench subsets (``../shared/data/jsonschemabench`` when
    present: Github_easy, Glaiveai2K, Handwritten, Snowplow, Synthesized; the first ``--per-subset``
    schemas of each, in file order, that both stock LMDeploy's xgrammar and the upgrade compile);
  - BFCL tool calls: 8 functions of the Berkeley Function Calling Leaderboard's ``simple_python``
    category (bench/data/, provenance in bench/data/README.md) as ``{"name": ..., "arguments": ...}``;
  - regexes from outlines' and vLLM's documentation (IPv4 address, US zip code and phone number,
    the e-mail address of vLLM's structured-output example).
* ``pathological``: the regex ``([A-Za-z]+[ ,]){120,}[A-Za-z]+\\.`` on every row, a separate row of
  the table: it costs xgrammar ~48 ms per row per step and says nothing about ordinary requests.

Measured per batch size (default 1, 8, 32), configurations interleaved round by round (load from
elsewhere hits them alike), figures are medians over rounds. Each engine configuration has
``--instances`` engines (default 2) built in ABBA order, and round r runs on instance r mod 2: an
engine built later in the process runs slower (two identical stock engines: 0.935), so a single
build order charged that to whichever configuration was built second:

* ``unguided``: the same prompts without a format (``ignore_eos``);
* ``stock``: LMDeploy's own xgrammar path (upgrade inactive, its own engine);
* ``upgraded``: the same requests with ``activate()`` (its own engine, built with the upgrade on);
* ``unguided@upgraded``: the public prompts unguided, each row exactly as long as the upgraded row was
  in the batch's first round, so both run the same rows per step: the ratio is guided decoding's own
  cost (plain ``unguided`` rows ignore EOS and never end early, so a grammar that ends a row sooner
  lowers tokens per step though no step got dearer);
* ``unguided@upgraded, upgraded engine``: the same unguided rows on the upgraded engine (the upgrade
  active, no row guided). Each engine is its own instance (weights, KV cache, threads), so this
  separates what the instance costs from what guided decoding costs;
* ``upgraded+drafts`` (``--drafts``, on by default; public workload): the upgrade with grammar
  drafts, ``SpeculativeConfig(method="tokenrails_grammar", num_speculative_tokens=--draft-tokens)``
  (its own engine; docs/lmdeploy.md "Grammar drafts"). A decode step there emits several tokens
  per row: its tokens/s counts *emitted* tokens (from the verification's output), and it prints
  forward passes per output token (row-steps / emitted tokens; 1.00 without drafts).

Time: the **whole engine step**, start to start of consecutive decoding steps of the model agent
(``BaseModelAgent._async_step``): scheduling, inputs, forward, the guided wrapper, the mask fill
(overlapped with the forward or not), sampling, accept, outputs. Tokens/s = tokens emitted in those
steps (one per row and step without drafts) / their summed duration (rows finish at different
lengths; the mean occupancy, rows per step, is printed).
The breakdown columns time the model forward and the logits processor call + accept of both
engines (the upgrade's fill that overlaps the forward shows up in neither, only in the step). A
third table gives the process CPU time per decode step (all threads, so an overlapped fill is
counted) and rows decoded per CPU-second: on a shared machine wall time moves with other load,
CPU time much less. ``--dtype`` sets the model dtype of both engines alike (LMDeploy's ``auto``
is float16 for SmolLM2, whose config says float32; bfloat16 has the fast CPU kernels). A fourth
table gives the same requests' whole pipeline calls (prefill included) as requests completed per
process CPU-second: per-row figures charge an engine for rows it ends sooner (a schema that admits
one short value: stock's xgrammar leaves some such schemas unenforced and writes to the cap).

Validation: every guided output is checked: finished ones against the schema (jsonschema, format
keywords not asserted, JSON without NaN or repeated member names) or ``re.fullmatch``; length-capped
JSON by harness/json_prefix_oracle.py, independent of xgrammar and of tokenrails' backends (valid iff
some completion validates with jsonschema: refuted from the partial value, or proved by a witness
completion; otherwise *undecided*, counted and printed, never counted valid); length-capped regex
outputs by a partial match of Python's ``regex`` module. Cross-checks, printed per configuration
with how many outputs each check judged: a fresh xgrammar matcher on capped JSON (stock's own
grammar: it passes what stock leaves unenforced, e.g. ``{"allOf": [...`` for JSONSchemaBench's
``allOf`` + ``enum`` schemas) and the prefix oracle on finished JSON (it must never refute what
jsonschema accepts). Failures are counted and printed, never hidden.

Every public row runs at every batch size (calls of ``batch`` rows until all ran), with ``--tokens``
(160) enough that JSON outputs finish and jsonschema judges them. Configurations run in ABBA order
across rounds, the load average is printed with every round. ``--stream`` (on by default) adds a
continuous request stream of every public row (``--rate`` requests/s, Poisson, or all at once), at
most ``batch`` running, a finished row refilled at once: stock, upgraded and upgraded+drafts with
CPU-time ratios as the headline (``--stream-only``: that comparison alone).

    python bench/lmdeploy_engine.py [--batches 1,8,32] [--tokens 160] [--rounds 2] [--per-subset 4]
                                    [--dtype auto|float16|bfloat16] [--no-drafts] [--draft-tokens 4]
                                    [--stream/--no-stream] [--stream-only] [--rate 0]
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import REPO, load_average, median, print_table, round_order, stream_requests  # noqa: E402

import torch  # noqa: E402

def _shared_maskbench() -> Path:
    """``shared/data/jsonschemabench`` beside the checkout (or beside a folder of worktrees)."""
    for root in (REPO.parent, REPO.parent.parent):
        path = root / "shared" / "data" / "jsonschemabench"
        if path.exists():
            return path
    return REPO.parent / "shared" / "data" / "jsonschemabench"


MASKBENCH = _shared_maskbench()
BFCL = Path(__file__).resolve().parent / "data" / "bfcl_v4_simple_python_sample.jsonl"
PATHOLOGICAL = r"([A-Za-z]+[ ,]){120,}[A-Za-z]+\."
# (pattern, where it is documented, prompt)
DOC_REGEXES = [
    (r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)",
     "outlines docs, reference/generation/regex (IP address)", "What is the IP address of the Google DNS servers?"),
    (r"\d{5}(?:-\d{4})?", "outlines library types, outlines.types.locale.us.zip_code", "Give a US zip code."),
    (r"(\([0-9]{3}\) |[0-9]{3}-)[0-9]{3}-[0-9]{4}", "outlines library types, outlines.types.locale.us.phone_number",
     "Give a US phone number."),
    (r"\w+@\w+\.com\n", "vLLM docs, features/structured_outputs (guided_regex example)",
     "Generate an email address for Alan Turing, who works in Enigma. End in .com and new line."),
]


@dataclass
class Row:
    kind: str            # "maskbench" | "bfcl" | "regex" | "pathological"
    label: str
    prompt: str
    response_format: dict
    schema: Any = None   # JSON rows: the schema outputs are validated against
    pattern: str | None = None


# ---- workload ----------------------------------------------------------------------------------
def _bfcl_schema(p: Any) -> Any:
    """BFCL's parameter types as JSON Schema ("dict" -> object, "float" -> number, "tuple" -> array,
    "any" -> unconstrained); descriptions dropped."""
    if not isinstance(p, dict):
        return p
    out = {k: _bfcl_schema(v) if k in ("items", "additionalProperties") else v for k, v in p.items()
           if k != "description"}
    t = out.get("type")
    mapped = {"dict": "object", "float": "number", "tuple": "array"}.get(t, t)
    if mapped == "any":
        out.pop("type")
    elif mapped is not None:
        out["type"] = mapped
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _bfcl_schema(v) for k, v in out["properties"].items()}
    return out


def bfcl_rows() -> list[Row]:
    rows = []
    for line in BFCL.read_text().splitlines():
        item = json.loads(line)
        fn = item["function"][0]
        schema = {"type": "object", "properties": {"name": {"const": fn["name"]},
                                                   "arguments": _bfcl_schema(fn["parameters"])},
                  "required": ["name", "arguments"], "additionalProperties": False}
        question = item["question"][0][-1]["content"]
        prompt = (f"{question}\nCall the function {fn['name']} ({fn['description']}) and answer with the JSON "
                  "call only.")
        rows.append(Row("bfcl", item["id"], prompt,
                        {"type": "json_schema", "json_schema": {"name": "call", "schema": schema}}, schema=schema))
    return rows


def maskbench_rows(per_subset: int, tokenizer: Any, vocab: Any) -> tuple[list[Row], list[str]]:
    """The first ``per_subset`` schemas of each MaskBench subset that both engines compile; provenance."""
    if not MASKBENCH.exists():
        return [], [f"MaskBench: {MASKBENCH} absent: no JSONSchemaBench rows"]
    import xgrammar as xgr

    from tokenrails.guided.registry import compile_guide
    from tokenrails.requests import spec_from_request

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab.vocab_size))
    rows, notes = [], []
    for path in sorted(MASKBENCH.glob("maskbench_*.json")):
        doc = json.loads(path.read_text())
        taken, skipped = [], 0
        for i, item in enumerate(doc["items"]):
            if len(taken) >= per_subset:
                break
            schema = item["schema"]
            text = json.dumps(schema)
            if len(text) > 6000:
                skipped += 1
                continue
            fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
            try:
                compiler.compile_json_schema(text)
                compile_guide(spec_from_request(fmt), vocab)
            except Exception:  # noqa: BLE001 - a schema one engine cannot compile is not a speed sample
                skipped += 1
                continue
            label = item.get("description", f"{doc['subset']}/{i}").replace("sample ", "")
            prompt = f"Write a JSON document valid against this JSON schema:\n{text[:500]}\nJSON:"
            taken.append(Row("maskbench", label, prompt, fmt, schema=schema))
        rows += taken
        notes.append(f"MaskBench {doc['subset']}: {len(taken)} schemas ({skipped} skipped: >6000 chars or not "
                     f"compiled by both), from {doc.get('source')} @ {doc.get('commit')}")
    return rows, notes


def regex_rows() -> list[Row]:
    return [Row("regex", where, prompt, {"type": "regex_schema", "regex_schema": pattern}, pattern=pattern)
            for pattern, where, prompt in DOC_REGEXES]


def interleave(groups: list[list[Row]]) -> list[Row]:
    """One of each kind in turn, so every batch size sees a mix."""
    out: list[Row] = []
    for k in range(max(len(g) for g in groups)):
        out += [g[k] for g in groups if k < len(g)]
    return out


def pathological_row() -> Row:
    return Row("pathological", "([A-Za-z]+[ ,]){120,}[A-Za-z]+\\.", "Write a long story about a cat.",
               {"type": "regex_schema", "regex_schema": PATHOLOGICAL}, pattern=PATHOLOGICAL)


# ---- validation --------------------------------------------------------------------------------
CHECK_FINISHED_JSON = "jsonschema (finished JSON)"
CHECK_ORACLE = "prefix oracle (capped JSON; harness/json_prefix_oracle.py)"
CHECK_XGRAMMAR = "xgrammar prefix (capped JSON; stock's own grammar, cross-check)"
CHECK_ORACLE_FINISHED = "prefix oracle on finished JSON (consistency with jsonschema)"
CHECK_REGEX = "re.fullmatch (finished regex)"
CHECK_REGEX_PARTIAL = "regex partial match (capped regex)"


@dataclass
class Judgement:
    status: str                      # "valid" | "invalid" | "undecided" (the deciding check's)
    why: str | None = None
    checks: list[tuple[str, str]] = field(default_factory=list)  # (check, its verdict) of every check run
    disagreement: str | None = None  # a cross-check that contradicts the deciding one


class Validator:
    """Finished outputs against their schema / regex; capped JSON by the independent prefix oracle
    (xgrammar's prefix acceptance kept as a cross-check); capped regex by a partial match."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size))
        self._compiled: dict[str, Any] = {}
        self._oracles: dict[str, Any] = {}

    def _key(self, row: Row) -> str:
        return json.dumps(row.response_format, sort_keys=True)

    def _grammar(self, row: Row):
        key = self._key(row)
        if key not in self._compiled:
            if row.pattern is not None:
                self._compiled[key] = self.compiler.compile_regex(row.pattern)
            else:
                self._compiled[key] = self.compiler.compile_json_schema(json.dumps(row.schema))
        return self._compiled[key]

    def _oracle(self, row: Row):
        from harness.json_prefix_oracle import PrefixOracle

        key = self._key(row)
        if key not in self._oracles:
            self._oracles[key] = PrefixOracle(row.schema)
        return self._oracles[key]

    def _judge_prefix(self, row: Row, text: str):
        from harness.json_prefix_oracle import UNDECIDED, Verdict

        try:
            return self._oracle(row).judge(text)
        except Exception as exc:  # noqa: BLE001 - an oracle failure is undecided, never valid
            return Verdict(UNDECIDED, f"oracle error {type(exc).__name__}: {str(exc)[:60]}")

    def check(self, row: Row, out: Any) -> Judgement:
        if out.finish_reason == "stop":
            if row.pattern is not None:
                ok = re.fullmatch(row.pattern, out.text) is not None
                return Judgement("valid" if ok else "invalid", None if ok else f"regex mismatch: {out.text[:80]!r}",
                                 [(CHECK_REGEX, "valid" if ok else "invalid")])
            import jsonschema

            from harness.json_prefix_oracle import INVALID, loads_strict
            why = None
            try:
                jsonschema.validate(loads_strict(out.text), row.schema)
            except Exception as exc:  # noqa: BLE001
                why = f"{type(exc).__name__}: {str(exc)[:80]} in {out.text[:80]!r}"
            verdict = self._judge_prefix(row, out.text)
            j = Judgement("valid" if why is None else "invalid", why,
                          [(CHECK_FINISHED_JSON, "valid" if why is None else "invalid"),
                           (CHECK_ORACLE_FINISHED, verdict.status)])
            if why is None and verdict.status == INVALID:  # a valid document is a valid prefix
                j.disagreement = f"oracle refutes a finished output jsonschema accepts: {verdict.reason[:100]}"
            return j
        if row.pattern is not None:
            import regex

            text = out.text.rstrip("\ufffd")  # a character cut by the length cap
            ok = regex.fullmatch(_as_python_re(row.pattern, text), text, partial=True)
            return Judgement("valid" if ok else "invalid", None if ok else f"not a prefix of a match: {out.text[:80]!r}",
                             [(CHECK_REGEX_PARTIAL, "valid" if ok else "invalid")])
        verdict = self._judge_prefix(row, out.text)
        matcher = self.xgr.GrammarMatcher(self._grammar(row))
        refused = next((t for t in out.token_ids if not matcher.accept_token(int(t))), None)
        xgr_status = "valid" if refused is None else "invalid"
        why = None
        if verdict.status == "invalid":
            why = f"capped prefix refuted: {verdict.reason[:100]} in {out.text[:80]!r}"
        elif verdict.status == "undecided":
            why = f"capped prefix undecided: {verdict.reason[:80]} in {out.text[:60]!r}"
        j = Judgement(verdict.status, why, [(CHECK_ORACLE, verdict.status), (CHECK_XGRAMMAR, xgr_status)])
        if verdict.status != "undecided" and verdict.status != xgr_status:
            j.disagreement = (f"oracle {verdict.status}, xgrammar {xgr_status}"
                              + (f" (refused token {refused})" if refused is not None else "")
                              + f": {verdict.reason[:80]} {out.text[:80]!r}")
        return j


def _as_python_re(pattern: str, text: str) -> str:
    r"""``pattern`` for the ``regex`` module (which has partial matching) with Python ``re``'s ``\w``
    on the characters of ``text``: ``re``'s ``\w`` is ``str.isalnum()`` + ``_`` (e.g. U+1F109), the
    ``regex`` module's is Unicode TR18's. Only ``\w`` outside character classes (the workload's)."""
    import regex

    extra = "".join(sorted(regex.escape(c) for c in set(text)
                           if re.fullmatch(r"\w", c) and not regex.fullmatch(r"\w", c)))
    return pattern.replace(r"\w", f"[\\w{extra}]") if extra else pattern


# ---- timing ------------------------------------------------------------------------------------
class StepTimer:
    """Start times of the agent's steps (with the tokens each emitted and the rows it ran), forward
    and logits time."""

    def __init__(self, stops: frozenset[int] = frozenset()) -> None:
        # [t, decoding, tokens emitted, forward s, logits s, process CPU s, rows, cyclic GC s]
        self.starts: list[list[Any]] = []
        self.stops = stops  # stop token ids: a draft step's row emits nothing after one
        self._undo: list = []
        self._gc_t0 = 0.0

    def _gc_callback(self, phase: str, info: dict) -> None:
        """The cyclic GC's pauses, charged to the step they fall in (any thread: the GC holds the GIL)."""
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0:
            if self.starts:
                self.starts[-1][7] += time.perf_counter() - self._gc_t0
            self._gc_t0 = 0.0  # a stop without its start (installed mid-collection) adds nothing

    def reset(self) -> None:
        self.starts = []

    def decode_steps(self) -> tuple[float, int, int, float, float, float, int, float]:
        """(seconds, tokens, steps, forward s, logits s, process CPU s, row-steps, GC s) over consecutive
        decoding steps (a prefill breaks the chain); forward/logits of the steps counted. Without
        drafts a row emits one token per step (tokens == row-steps). Process CPU time (all threads:
        the overlapped fill included) is what other load on the machine moves least."""
        secs, toks, n, fwd, lg, cpu, rows, gcs = 0.0, 0, 0, 0.0, 0.0, 0.0, 0, 0.0
        for a, b in zip(self.starts, self.starts[1:]):
            if a[1] and b[1] and a[2]:
                secs += b[0] - a[0]
                toks += a[2]
                n += 1
                fwd += a[3]
                lg += a[4]
                cpu += b[5] - a[5]
                rows += a[6]
                gcs += a[7]
        return secs, toks, n, fwd, lg, cpu, rows, gcs

    def decode_cpu(self) -> tuple[int, float, int]:
        """(tokens, process CPU s, row-steps) of every decoding step that emitted tokens, each step
        charged up to the next step's start, whatever that step is: a stream refills rows, and
        ``decode_steps`` leaves out the decoding step before each prefill."""
        toks, cpu, rows = 0, 0.0, 0
        for a, b in zip(self.starts, self.starts[1:]):
            if a[1] and a[2]:
                toks += a[2]
                cpu += b[5] - a[5]
                rows += a[6]
        return toks, cpu, rows

    def _wrap_async(self, owner: Any, name: str, slot: int) -> None:
        original = getattr(owner, name)

        async def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                if self.starts:
                    self.starts[-1][slot] += time.perf_counter() - t0

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def install(self, spec: bool = False) -> None:
        """``spec``: an engine with speculative decoding (grammar drafts): tokens and rows come from
        its verification (``SpecModelAgent._rejection_sampling``, timed as the logits part: mask,
        verification, accept), where one row may emit several tokens per step."""
        from lmdeploy.pytorch.engine import logits_process
        from lmdeploy.pytorch.engine.model_agent import agent

        self._wrap_async(agent.BaseModelAgent, "_async_model_forward", 3)
        if spec:
            self._install_spec()
        else:
            flp = logits_process.FusedLogitsProcessor
            self._wrap_async(flp, "__call__", 4)
            self._wrap_async(flp, "accept_guided_tokens", 4)
            original_sampling = flp.sampling

            def sampling(proc, logits):
                out = original_sampling(proc, logits)
                if self.starts:
                    self.starts[-1][2] += int(out.numel())
                    self.starts[-1][6] += int(out.numel())
                return out

            flp.sampling = sampling
            self._undo.append((flp, "sampling", original_sampling))
        original_step = agent.BaseModelAgent._async_step

        async def _async_step(agent_self, inputs=None, *args, **kwargs):
            decoding = inputs is None or bool(inputs.is_decoding)  # None: a decoding step from a delta
            self.starts.append([time.perf_counter(), decoding, 0, 0.0, 0.0, time.process_time(), 0, 0.0])
            return await original_step(agent_self, inputs, *args, **kwargs)

        agent.BaseModelAgent._async_step = _async_step
        self._undo.append((agent.BaseModelAgent, "_async_step", original_step))
        gc.callbacks.append(self._gc_callback)

    def _install_spec(self) -> None:
        from lmdeploy.pytorch.spec_decode.spec_agent import SpecModelAgent

        from tokenrails.engine_patch.lmdeploy.speculative.draft_metrics import emitted_counts

        original = SpecModelAgent._rejection_sampling  # the upgrade's adaptive version when active

        async def _rejection_sampling(agent_self, model_inputs, extra_inputs, sampling_inputs):
            t0 = time.perf_counter()
            res = await original(agent_self, model_inputs, extra_inputs, sampling_inputs)
            if self.starts:
                self.starts[-1][4] += time.perf_counter() - t0
                if model_inputs.is_decoding and not model_inputs.is_dummy:
                    counts = emitted_counts(res.output_token_ids, self.stops)
                    self.starts[-1][2] += sum(counts)
                    self.starts[-1][6] += len(counts)
            return res

        SpecModelAgent._rejection_sampling = _rejection_sampling
        self._undo.append((SpecModelAgent, "_rejection_sampling", original))

    def uninstall(self) -> None:
        if self._gc_callback in gc.callbacks:
            gc.callbacks.remove(self._gc_callback)
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


@dataclass
class Tally:
    outputs: int = 0
    invalid: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)
    checks: dict[str, dict[str, int]] = field(default_factory=dict)  # check -> verdict -> outputs
    texts: list[str] = field(default_factory=list)

    def add(self, row: Row, judgement: Judgement) -> None:
        for check, verdict in judgement.checks:
            counts = self.checks.setdefault(check, {})
            counts[verdict] = counts.get(verdict, 0) + 1
        where = f"{row.kind} {row.label}: "
        if judgement.status == "invalid":
            self.invalid.append(where + (judgement.why or ""))
        elif judgement.status == "undecided":
            self.undecided.append(where + (judgement.why or ""))
        if judgement.disagreement:
            self.disagreements.append(where + judgement.disagreement)


def run_once(pipe, timer: StepTimer, rows: list[Row], tokens: int | list[int], guided: bool, validator: Validator,
             tally: Tally | None) -> dict:
    """One call of ``rows``; ``tokens``: the cap of every row, or of each row (unguided rows ignore
    EOS and run exactly that long)."""
    from lmdeploy import GenerationConfig

    caps = tokens if isinstance(tokens, list) else [tokens] * len(rows)
    gens = [GenerationConfig(top_k=1, max_new_tokens=n, response_format=r.response_format) if guided
            else GenerationConfig(top_k=1, max_new_tokens=n, ignore_eos=True) for r, n in zip(rows, caps)]
    timer.reset()
    call_cpu = time.process_time()
    outs = pipe([r.prompt for r in rows], gen_config=gens)
    call_cpu = time.process_time() - call_cpu
    secs, decoded, steps, fwd, logits, cpu, row_steps, gcs = timer.decode_steps()
    if tally is not None:
        for r, o in zip(rows, outs):
            tally.outputs += 1
            tally.texts.append(o.text)
            if guided:
                tally.add(r, validator.check(r, o))
    return {"secs": secs, "rows": decoded, "steps": steps, "forward": fwd, "logits": logits, "cpu": cpu, "gc": gcs,
            "call_cpu": call_cpu, "requests": len(rows), "row_steps": row_steps,
            # decode steps each row took: its tokens, plus the step that sampled its stop token
            "lengths": [max(1, len(o.token_ids) + (o.finish_reason == "stop")) for o in outs]}


def measure(pipe, timer: StepTimer, rows: list[Row], batch: int, tokens: int, guided: bool, validator: Validator,
            tally: Tally | None, warm: bool, lengths: list[list[int]] | None = None) -> dict:
    """Calls of ``batch`` rows until every row of the workload ran (the last call filled up from the
    start); ``lengths``: unguided rows run exactly as long as another configuration's rows did (per call)."""
    calls = max(1, math.ceil(len(rows) / batch))
    chunks = [[rows[(c * batch + i) % len(rows)] for i in range(batch)] for c in range(calls)]
    caps = lengths or [tokens] * calls
    if warm:
        for chunk, cap in zip(chunks, caps):
            run_once(pipe, timer, chunk, cap, guided, validator, None)  # compiles, tables, allocator
    agg = {"secs": 0.0, "rows": 0, "steps": 0, "forward": 0.0, "logits": 0.0, "cpu": 0.0, "gc": 0.0, "call_cpu": 0.0,
           "requests": 0, "row_steps": 0}
    emitted = []
    wall = time.perf_counter()
    for chunk, cap in zip(chunks, caps):
        r = run_once(pipe, timer, chunk, cap, guided, validator, tally)
        emitted.append(r["lengths"])
        for k in agg:
            agg[k] += r[k]
    wall = time.perf_counter() - wall
    if not agg["secs"]:  # every decode step followed by a prefill: nothing to time, said, not a crash
        print(f"WARNING: no consecutive decode steps timed at batch {batch} (figures nan); the last call's steps "
              f"[t, decoding, tokens, fwd, logits, cpu, rows]: "
              f"{[[round(x, 3) if isinstance(x, float) else x for x in st] for st in timer.starts[:20]]}",
              file=sys.stderr, flush=True)
        agg["secs"] = agg["cpu"] = math.nan
    steps = max(1, agg["steps"])
    # "rows" are tokens emitted in decode steps (one per row and step without drafts)
    return {"tok_s": agg["rows"] / agg["secs"], "step_ms": 1e3 * agg["secs"] / steps,
            "occupancy": agg["row_steps"] / steps, "fwd_per_token": agg["row_steps"] / max(agg["rows"], 1),
            "wall_s": wall, "forward_ms": 1e3 * agg["forward"] / steps,
            "logits_ms": 1e3 * agg["logits"] / steps, "cpu_ms": 1e3 * agg["cpu"] / steps,
            "gc_ms": 1e3 * agg["gc"] / steps,
            "cpu_tok_s": agg["rows"] / max(agg["cpu"], 1e-9),
            "req_cpu_s": agg["requests"] / max(agg["call_cpu"], 1e-9), "lengths": emitted}


def settle(timer: StepTimer, quiet_s: float = 1.0, limit_s: float = 10.0) -> None:
    """Wait until the engine has started no step for ``quiet_s``: the pipeline call returns while the
    agent may still finish a step it launched ahead (its accept runs after the outputs went out), and
    the bench deactivates the upgrade between configurations, which in the middle of a step hands an
    upgraded engine stock methods (seen: a grammar-drafts step calling the stock guided helper's
    ``accept_token`` on the upgrade's manager, which killed that engine)."""
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        seen = len(timer.starts)
        last = timer.starts[-1][0] if timer.starts else 0.0
        time.sleep(0.2)
        if len(timer.starts) == seen and time.perf_counter() - last >= quiet_s:
            return


def paired_ratios(a: list[dict], b: list[dict], key: str = "tok_s") -> list[float]:
    """Round by round ``a / b`` (both measured in the same round)."""
    return [x[key] / y[key] for x, y in zip(a, b) if y[key] == y[key] and y[key] > 0]


def _median_finite(values: list[float]) -> float:
    """The median of the rounds that measured something (nan: none did)."""
    finite = [v for v in values if v == v]
    return median(finite) if finite else math.nan


def _pipeline(batches: list[int], tokens: int, dtype: str = "auto", draft_tokens: int = 0):
    """An engine for the bench; ``draft_tokens`` > 0: with grammar drafts (the upgrade must be active)."""
    from lmdeploy import pipeline
    from lmdeploy.messages import SpeculativeConfig

    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    from tokenrails.demo_model import resolve_model_dir
    path, _, _ = resolve_model_dir(quiet=True)
    max_batch = max(batches)
    blocks_per_seq = (400 + tokens + draft_tokens + 63) // 64 + 1
    cfg = cpu_engine_config(max_batch_size=max_batch, session_len=1024, block_size=64,
                            num_gpu_blocks=max(64, max_batch * blocks_per_seq + 8), dtype=dtype)
    spec = SpeculativeConfig(method="tokenrails_grammar", num_speculative_tokens=draft_tokens) if draft_tokens else None
    return pipeline(str(path), backend_config=cfg, speculative_config=spec)


def build_engines(batches: list[int], args: Any, patch: Any) -> dict[str, list[Any]]:
    """``--instances`` engines per configuration, built in ABBA order (stock, upgraded, drafts, then
    drafts, upgraded, stock, ...). Engines built later in a process run slower: two identical stock
    engines in one process measured 0.935 (median of 8 interleaved rounds) for the second one, as
    large as the batch-8 gap this bench reported when it built stock first and upgraded second.
    Round ``r`` uses instance ``r % instances``, so an even number of rounds sees every build position
    equally."""
    names = ["stock", "upgraded"] + (["drafts"] if args.drafts else [])
    engines: dict[str, list[Any]] = {name: [] for name in names}
    for k in range(args.instances):
        for name in names if k % 2 == 0 else reversed(names):
            (patch.activate if name != "stock" else patch.deactivate)()
            draft_tokens = args.draft_tokens if name == "drafts" else 0
            engines[name].append(_pipeline(batches, args.tokens, args.dtype, draft_tokens=draft_tokens))
    patch.deactivate()
    return engines


def forced_bound(rows: list[Row], outputs: list[list[int]], vocab: Any, encode: Any) -> float:
    """Forward passes per output token grammar drafts need at best on these outputs: 1 - the share of
    tokens the forced rule drafts (``bench/_common.ceiling``: one-token masks and forced strings
    in canonical tokenization, replayed through fresh matchers). Every verified draft accepted, any k."""
    from bench._common import ceiling
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import spec_of

    _, rule, _ = ceiling(outputs, [spec_of(r.response_format) for r in rows], vocab, encode)
    return 1.0 - rule


def lookup_on() -> bool:
    from tokenrails.engine_patch.lmdeploy.boot import settings

    return settings.lookup_drafts()


def lookup_bound(pipe: Any, rows: list[Row], outputs: list[list[int]], vocab: Any, encode: Any) -> float:
    """``bench/_common.lookup_share`` on these outputs, each row's prompt as the engine saw it (chat
    template applied, tokenized)."""
    from bench._common import lookup_share
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import spec_of

    eng = pipe.async_engine
    prompts = [eng.tokenizer.encode(eng.chat_template.messages2prompt(r.prompt)) for r in rows]
    return lookup_share(outputs, [spec_of(r.response_format) for r in rows], vocab, encode, prompts)


def stream_section(engines: dict[str, list[Any]], rows: list[Row], batches: list[int], args: Any,
                   validator: Validator, timer: StepTimer, patch: Any, vocab: Any = None, encode: Any = None) -> None:
    """Every public row as a continuous stream: requests arrive (``--rate``, Poisson, or all at once),
    at most ``batch`` run, a finished row is refilled from the queue at once. Stock, upgraded and
    upgraded+drafts in ABBA order across rounds on ABBA-built instances; headline: requests and
    output tokens per process CPU-second, wall-clock beside them; the load average per round."""
    from lmdeploy import GenerationConfig

    names = ["stock", "upgraded"] + (["drafts"] if args.drafts else [])
    print(f"\ncontinuous stream: every public row ({len(rows)}), arrivals "
          f"{f'{args.rate:g}/s (Poisson)' if args.rate else 'all at once'}, at most `batch` running, refilled; "
          f"{args.rounds} rounds, configurations in ABBA order", flush=True)
    table = []
    for batch in batches:
        n = max(len(rows), 2 * batch)
        chosen = [rows[i % len(rows)] for i in range(n)]
        gens = [GenerationConfig(top_k=1, max_new_tokens=args.tokens, response_format=r.response_format)
                for r in chosen]
        res: dict[str, list[dict]] = {k: [] for k in names}
        loads = []
        upgraded_ids: list[list[int]] = []
        for rnd in range(args.rounds):
            load = load_average()
            loads.append(load)
            for name in round_order(names, rnd):
                instances = engines[name]
                pipe = instances[rnd % len(instances)]
                if name != "stock":
                    patch.activate()
                timer.install(spec=name == "drafts")
                try:
                    if rnd < len(instances):  # warm-up of this instance: compiles, tables
                        stream_requests(pipe, [r.prompt for r in rows], [
                            GenerationConfig(top_k=1, max_new_tokens=2, response_format=r.response_format)
                            for r in rows], limit=batch)
                    timer.reset()
                    outs, wall, cpu = stream_requests(pipe, [r.prompt for r in chosen], gens, limit=batch,
                                                      rate=args.rate, seed=rnd)
                    dec_toks, dec_cpu, dec_rows = timer.decode_cpu()
                    if name != "stock":
                        settle(timer)
                finally:
                    timer.uninstall()
                    patch.deactivate()
                tally = Tally()
                for r, o in zip(chosen, outs):
                    tally.outputs += 1
                    tally.add(r, validator.check(r, o))
                if name == "upgraded" and not upgraded_ids:
                    upgraded_ids = [list(o.token_ids) for o in outs]
                ntok = sum(o.generate_token_len for o in outs)
                finished = sum(o.finish_reason == "stop" for o in outs)
                res[name].append({"tok_s": ntok / wall, "cpu_tok_s": ntok / max(cpu, 1e-9),
                                  "req_cpu_s": n / max(cpu, 1e-9), "req_s": n / wall, "wall": wall,
                                  "valid": tally.outputs - len(tally.invalid) - len(tally.undecided),
                                  "finished": finished, "invalid": tally.invalid[:3],
                                  # the decode steps alone (consecutive decoding steps) and what is left:
                                  # prefill, front end, steps a prefill interrupts (per request)
                                  "dec_tok_cpu_s": dec_toks / max(dec_cpu, 1e-9),
                                  "fwd_tok": dec_rows / max(dec_toks, 1),
                                  "rest_cpu_req": (cpu - dec_cpu) / n, "tok_req": ntok / n})
                r = res[name][-1]
                print(f"  stream batch {batch} round {rnd} (load {load:.1f}): {name} {r['tok_s']:.1f} tok/s, "
                      f"{r['cpu_tok_s']:.1f} tok/cpu-s, {r['req_cpu_s']:.3f} req/cpu-s, {r['wall']:.1f} s, "
                      f"{r['valid']}/{n} valid, {finished} finished; decode steps {r['dec_tok_cpu_s']:.1f} tok/cpu-s, "
                      f"{r['fwd_tok']:.2f} fwd/tok; {r['tok_req']:.1f} tok/request; rest {r['rest_cpu_req']*1e3:.0f} "
                      f"cpu-ms/request", flush=True)
                for why in r["invalid"]:
                    print(f"    invalid: {why}", flush=True)

        def paired(a: str, key: str) -> float:
            return median([x[key] / y[key] for x, y in zip(res[a], res["stock"])])

        if args.drafts and vocab is not None and upgraded_ids:
            # what the workload lets drafts win: with per-row-step cost unchanged and the rest
            # (prefill, front end) per request unchanged, tokens per CPU-second over plain guided is
            # at most 1 / (rest share + decode share x forwards per token)
            bound = forced_bound(chosen, upgraded_ids, vocab, encode)
            up = res["upgraded"]
            rest = median([u["rest_cpu_req"] / (u["rest_cpu_req"] + u["tok_req"] / u["dec_tok_cpu_s"]) for u in up])
            over_plain = 1.0 / (rest + (1.0 - rest) * bound)
            print(f"  workload bound at batch {batch}: the forced rule drafts {1 - bound:.1%} of the upgraded outputs' "
                  f"tokens (>= {bound:.3f} forwards per token); the rest (prefill, front end) is {rest:.1%} of the "
                  f"upgraded engine's CPU, so forced-only drafts / upgraded <= {over_plain:.2f}x tok/cpu-s and / stock "
                  f"<= {over_plain * paired('upgraded', 'cpu_tok_s'):.2f}x at zero drafts overhead", flush=True)
            if lookup_on():
                share = lookup_bound(engines["drafts"][0], chosen, upgraded_ids, vocab, encode)
                over = 1.0 / (rest + (1.0 - rest) * (1.0 - share))
                print(f"  with lookup drafts: the proposer's first draft names {share:.1%} of those tokens from the state "
                      f"before each (forced rule, else the grammar-checked prompt lookup; an estimate, a step's later "
                      f"drafts come from its first state): ~{1 - share:.3f} forwards per token, drafts / upgraded "
                      f"~{over:.2f}x and / stock ~{over * paired('upgraded', 'cpu_tok_s'):.2f}x at zero drafts overhead; "
                      f"rejected lookup drafts cost verified positions this does not count", flush=True)

        row = [batch, n, median([r["tok_s"] for r in res["stock"]]), median([r["tok_s"] for r in res["upgraded"]])]
        row += [paired("upgraded", "req_cpu_s"), paired("upgraded", "cpu_tok_s"), paired("upgraded", "tok_s")]
        row += [paired("upgraded", "dec_tok_cpu_s")]
        if args.drafts:
            row += [median([r["tok_s"] for r in res["drafts"]]), paired("drafts", "req_cpu_s"),
                    paired("drafts", "cpu_tok_s"), paired("drafts", "tok_s"), paired("drafts", "dec_tok_cpu_s"),
                    median([r["fwd_tok"] for r in res["drafts"]])]
        row += [" ".join(f"{res[k][0]['valid']}/{n}" for k in names),
                " ".join(f"{res[k][0]['finished']}" for k in names), f"{min(loads):.1f}-{max(loads):.1f}"]
        table.append(row)
    headers = ["batch", "requests", "stock tok/s", "upgraded tok/s", "upgraded/stock req/cpu-s",
               "upgraded/stock tok/cpu-s", "upgraded/stock wall tok/s", "upgraded/stock decode tok/cpu-s"]
    if args.drafts:
        headers += ["drafts tok/s", "drafts/stock req/cpu-s", "drafts/stock tok/cpu-s", "drafts/stock wall tok/s",
                    "drafts/stock decode tok/cpu-s", "drafts fwd/tok"]
    headers += [f"valid ({' '.join(names)})", "finished", "load"]
    print()
    print_table(headers, table)
    print("(ratios: medians of per-round ratios; CPU = process CPU time, all threads; req/cpu-s charges each "
          "engine for the whole request, prefill included; decode tok/cpu-s: the decode steps alone, without the "
          "prefill and front end each request pays once; first round validated: jsonschema on finished JSON, "
          "the prefix oracle on capped JSON, re.fullmatch on regexes)\n", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=160,
                    help="max new tokens per row (enough that JSON outputs finish and jsonschema judges them)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; figures are medians over rounds")
    ap.add_argument("--per-subset", type=int, default=4, help="MaskBench schemas per subset")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16"],
                    help="the model's dtype (LMDeploy's; 'auto' is float16 for SmolLM2, whose config says float32; "
                         "LMDeploy's engine refuses float32)")
    ap.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                    help="also a continuous stream of every public row (stock, upgraded, drafts), refilled")
    ap.add_argument("--stream-only", action="store_true", help="only the continuous-stream comparison")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="stream arrivals, requests/s (Poisson; 0: all at once, the engine kept full)")
    ap.add_argument("--drafts", action=argparse.BooleanOptionalAction, default=True,
                    help="also run upgraded+drafts (grammar drafts) on the public workload, interleaved")
    ap.add_argument("--draft-tokens", type=int, default=4, help="num_speculative_tokens of upgraded+drafts")
    ap.add_argument("--instances", type=int, default=2,
                    help="engines per configuration, built in ABBA order; round r runs on instance r %% instances")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(1)
    import tokenrails.engine_patch.lmdeploy as patch
    from tokenrails.guided.vocabulary import Vocabulary
    from tokenrails.demo_model import load_tokenizer

    tok = load_tokenizer(quiet=True)
    vocab = Vocabulary.from_huggingface(tok, vocab_size=len(tok))
    mask_rows, notes = maskbench_rows(args.per_subset, tok, vocab)
    public = interleave([mask_rows, bfcl_rows(), regex_rows()])
    workloads = {"public": public, "pathological": [pathological_row()]}
    print("Workload provenance:")
    for n in notes:
        print("  " + n)
    print(f"  BFCL: {len(bfcl_rows())} functions of BFCL_v4_simple_python (bench/data/README.md)")
    for pattern, where, _ in DOC_REGEXES:
        print(f"  regex {pattern!r}: {where}")
    print(f"  pathological (separate row): {PATHOLOGICAL!r}")
    print(f"  public rows in order: {', '.join(r.kind for r in public)}", flush=True)
    print(f"  engines: {args.instances} per configuration, built in ABBA order; round r runs on instance r mod "
          f"{args.instances}\n", flush=True)

    validator = Validator(tok, vocab.vocab_size)
    engines = build_engines(batches, args, patch)
    timer = StepTimer(frozenset(vocab.eos_ids))
    if args.stream or args.stream_only:
        try:
            stream_section(engines, public, batches, args, validator, timer, patch, vocab,
                           lambda text: tuple(tok.encode(text, add_special_tokens=False)))
        finally:
            if args.stream_only:
                for instances in engines.values():
                    for pipe in instances:
                        pipe.close()
        if args.stream_only:
            return
    # "unguided@upgraded": the public prompts unguided, each row exactly as long as the upgraded row
    # was in this batch's first round: the same rows per step, so the ratio is guided decoding's own cost
    # (plain "unguided" rows never end early, and rows a grammar ends sooner lower tokens per step)
    configs = [("unguided", "stock", None), ("stock", "stock", "public"), ("upgraded", "upgraded", "public"),
               ("unguided@upgraded", "stock", None), ("unguided@upgraded, upgraded engine", "upgraded", None),
               ("stock", "stock", "pathological"), ("upgraded", "upgraded", "pathological")]
    if args.drafts:
        configs.insert(3, ("upgraded+drafts", "drafts", "public"))
    samples: dict[tuple, list[dict]] = {}
    tallies: dict[tuple, Tally] = {}
    upgraded_lengths: dict[int, list[list[int]]] = {}
    try:
        for batch in batches:
            for rnd in range(args.rounds):
                for name, engine, workload in round_order(configs, rnd):
                    if engine in ("upgraded", "drafts"):
                        patch.activate()
                    rows = workloads[workload or "public"]
                    key = (name, workload, batch)
                    tally = tallies.setdefault(key, Tally()) if workload and rnd == 0 else None
                    timer.install(spec=engine == "drafts")
                    matched = upgraded_lengths.get(batch) if name.startswith("unguided@upgraded") else None
                    try:
                        instances = engines[engine]
                        r = measure(instances[rnd % len(instances)], timer, rows, batch, args.tokens, workload is not None,
                                    validator, tally, warm=rnd < len(instances), lengths=matched)
                        if engine in ("upgraded", "drafts"):
                            settle(timer)
                    finally:
                        timer.uninstall()
                        patch.deactivate()
                    if name == "upgraded" and workload == "public" and rnd == 0:
                        upgraded_lengths[batch] = r["lengths"]
                    r.pop("lengths")
                    samples.setdefault(key, []).append(r)
                    print(f"batch {batch} round {rnd} (load {load_average():.1f}): {name} {workload or ''} "
                          f"{r['tok_s']:.1f} tok/s "
                          f"(occupancy {r['occupancy']:.1f}, fwd/token {r['fwd_per_token']:.2f}, "
                          f"{r['wall_s']:.1f} s)", file=sys.stderr, flush=True)
    finally:
        for instances in engines.values():
            for pipe in instances:
                pipe.close()
    res = {key: {k: _median_finite([r[k] for r in rs]) for k in rs[0]} for key, rs in samples.items()}

    print(f"\nLMDeploy 0.18 PyTorch engine on CPU (1 thread), SmolLM2-135M, dtype {args.dtype}, greedy, up to {args.tokens} new "
          "tokens/row; decode tokens/s over whole engine steps (prefill excluded)\n")
    out_rows = []
    for workload in ("public", "pathological"):
        for batch in batches:
            u, s, g = res[("unguided", None, batch)], res[("stock", workload, batch)], res[("upgraded", workload, batch)]
            paired = paired_ratios(samples[("upgraded", workload, batch)], samples[("stock", workload, batch)])
            out_rows.append([workload, batch, u["tok_s"], s["tok_s"], g["tok_s"], g["tok_s"] / s["tok_s"],
                             _median_finite(paired), " ".join(f"{x:.2f}" for x in paired),
                             g["tok_s"] / u["tok_s"], s["tok_s"] / u["tok_s"], s["occupancy"], g["occupancy"]])
    print_table(["workload", "batch", "unguided", "stock", "upgraded", "upgraded/stock", "paired upgraded/stock",
                 "per round", "upgraded/unguided", "stock/unguided", "rows/step stock", "rows/step upgraded"], out_rows)
    print("(paired: upgraded / stock tokens/s within each round, measured seconds apart, then the median over rounds: "
          "load from elsewhere drifts over minutes and cancels in a pair)")
    print("\nguided decoding's own cost: the public prompts unguided, each row exactly as long as its upgraded "
          "row (same rows per step; plain unguided rows never end early), on the stock engine and on the upgraded "
          "engine (the upgrade active, no row guided). The two engines are separate instances (own weights, own KV "
          "cache): 'engine instance' compares them on the same unguided rows, so a difference there is not guided "
          "work\n")
    out_rows = []
    for batch in batches:
        m, g = res[("unguided@upgraded", None, batch)], res[("upgraded", "public", batch)]
        e = res[("unguided@upgraded, upgraded engine", None, batch)]
        out_rows.append([batch, m["tok_s"], e["tok_s"], g["tok_s"], g["tok_s"] / m["tok_s"], g["tok_s"] / e["tok_s"],
                         e["tok_s"] / m["tok_s"], m["cpu_ms"], e["cpu_ms"], g["cpu_ms"], m["forward_ms"], e["forward_ms"],
                         g["forward_ms"], m["occupancy"], g["occupancy"]])
    print_table(["batch", "unguided@upgraded tok/s (stock engine)", "same, upgraded engine", "upgraded tok/s",
                 "upgraded / unguided@upgraded", "upgraded / same, upgraded engine",
                 "engine instance: upgraded / stock engine, unguided", "cpu ms/step unguided (stock engine)",
                 "cpu ms/step unguided (upgraded engine)", "cpu ms/step upgraded", "fwd ms unguided (stock engine)",
                 "fwd ms unguided (upgraded engine)", "fwd ms upgraded", "rows/step unguided@upgraded",
                 "rows/step upgraded"], out_rows)
    print("\nper decode step (ms): whole step, model forward, logits processor call + accept, cyclic GC pauses\n")
    out_rows = []
    for workload in ("public", "pathological"):
        for batch in batches:
            u, s, g = res[("unguided", None, batch)], res[("stock", workload, batch)], res[("upgraded", workload, batch)]
            out_rows.append([workload, batch, u["step_ms"], s["step_ms"], g["step_ms"], u["forward_ms"], s["forward_ms"],
                             g["forward_ms"], u["logits_ms"], s["logits_ms"], g["logits_ms"], u["gc_ms"], s["gc_ms"],
                             g["gc_ms"]])
    print_table(["workload", "batch", "step unguided", "step stock", "step upgraded", "fwd unguided", "fwd stock",
                 "fwd upgraded", "logits unguided", "logits stock", "logits upgraded", "GC unguided", "GC stock",
                 "GC upgraded"], out_rows)
    print("\nprocess CPU time per decode step (all threads; moves least with other load on the machine) and "
          "rows decoded per CPU-second\n")
    out_rows = []
    for workload in ("public", "pathological"):
        for batch in batches:
            u, s, g = res[("unguided", None, batch)], res[("stock", workload, batch)], res[("upgraded", workload, batch)]
            out_rows.append([workload, batch, u["cpu_ms"], s["cpu_ms"], g["cpu_ms"], u["cpu_tok_s"], s["cpu_tok_s"],
                             g["cpu_tok_s"], g["cpu_tok_s"] / s["cpu_tok_s"], g["cpu_tok_s"] / u["cpu_tok_s"]])
    print_table(["workload", "batch", "cpu unguided", "cpu stock", "cpu upgraded", "rows/cpu-s unguided",
                 "rows/cpu-s stock", "rows/cpu-s upgraded", "upgraded/stock", "upgraded/unguided"], out_rows)
    print("\nthe same requests, whole pipeline call (prefill, every step, outputs): requests completed per process "
          "CPU-second. Rows that end sooner (a grammar that admits one short value) count for the engine that ends "
          "them, which rows per CPU-second above charges against it\n")
    out_rows = []
    for workload in ("public", "pathological"):
        for batch in batches:
            s, g = res[("stock", workload, batch)], res[("upgraded", workload, batch)]
            out_rows.append([workload, batch, s["req_cpu_s"], g["req_cpu_s"], g["req_cpu_s"] / s["req_cpu_s"]])
    # (no unguided column: unguided rows ignore EOS and always run the full length)
    print_table(["workload", "batch", "req/cpu-s stock", "req/cpu-s upgraded", "upgraded/stock"], out_rows)
    if args.drafts:
        print(f"\nupgraded+drafts (grammar drafts, k = {args.draft_tokens}) on the public workload: tokens/s counts "
              "emitted tokens (several per row in a step that accepts drafts); fwd/token = row-steps / emitted "
              "tokens (1.00 without drafts); rows/cpu-s = emitted tokens per process CPU-second\n")
        out_rows = []
        for batch in batches:
            u, s, g = res[("unguided", None, batch)], res[("stock", "public", batch)], res[("upgraded", "public", batch)]
            d = res[("upgraded+drafts", "public", batch)]
            paired = paired_ratios(samples[("upgraded+drafts", "public", batch)], samples[("stock", "public", batch)])
            out_rows.append([batch, d["tok_s"], d["tok_s"] / s["tok_s"], _median_finite(paired),
                             d["tok_s"] / u["tok_s"], d["tok_s"] / g["tok_s"],
                             d["fwd_per_token"], d["occupancy"], d["step_ms"], d["forward_ms"], d["logits_ms"],
                             d["cpu_tok_s"] / s["cpu_tok_s"], d["req_cpu_s"] / s["req_cpu_s"]])
        print_table(["batch", "drafts tok/s", "drafts/stock", "paired drafts/stock", "drafts/unguided", "drafts/upgraded",
                     "fwd/token",
                     "rows/step", "step ms", "fwd ms", "verify ms", "rows/cpu-s drafts/stock",
                     "req/cpu-s drafts/stock"], out_rows)
    walls: dict[str, float] = {}
    for (name, workload, _), rs in samples.items():
        label = f"{name} {workload or ''}".strip()
        walls[label] = walls.get(label, 0.0) + sum(r["wall_s"] for r in rs)
    total = sum(walls.values())
    print("\nmeasured wall time per configuration (all batches and rounds, warm-up calls excluded): "
          + ", ".join(f"{k} {v:.0f} s ({v / total:.0%})" for k, v in walls.items()))
    print("\nvalidation (first round of every configuration): valid / invalid / undecided (undecided is never "
          "counted valid), then every check with the outputs it judged")
    for (name, workload, batch), t in sorted(tallies.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        valid = t.outputs - len(t.invalid) - len(t.undecided)
        print(f"  {workload:12s} batch {batch:2d} {name:15s}: {valid}/{t.outputs} valid, {len(t.invalid)} invalid, "
              f"{len(t.undecided)} undecided")
        for check, counts in sorted(t.checks.items()):
            judged = sum(counts.values())
            print(f"      {check}: {judged} judged: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
        for why in t.invalid[:5]:
            print(f"      invalid: {why}")
        for why in t.undecided[:5]:
            print(f"      undecided: {why}")
        for why in t.disagreements[:5]:
            print(f"      checks disagree: {why}")
    for workload in ("public", "pathological"):
        for batch in batches:
            s, g = tallies.get(("stock", workload, batch)), tallies.get(("upgraded", workload, batch))
            if s and g:
                same = sum(a == b for a, b in zip(s.texts, g.texts))
                print(f"  {workload} batch {batch}: {same}/{len(s.texts)} outputs identical stock vs upgraded")
            d = tallies.get(("upgraded+drafts", workload, batch))
            if d and g:
                same = sum(a == b for a, b in zip(g.texts, d.texts))
                print(f"  {workload} batch {batch}: {same}/{len(g.texts)} outputs identical upgraded vs upgraded+drafts "
                      "(greedy; bfloat16 near-ties can flip with the forward's shape, docs/lmdeploy.md)")


if __name__ == "__main__":
    main()
