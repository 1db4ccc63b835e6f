"""Other people's tool definitions against the upgraded and the stock CPU api_server, same run.

Tool sets:

* BFCL: the Berkeley Function Calling Leaderboard's function docs, read from the ``bfcl-eval``
  package's data files at run time (installed with ``pip --no-deps`` into this interpreter when
  missing: the data is all the bench needs, not BFCL's evaluation stack). Categories
  ``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``, ``live_simple``,
  ``live_multiple``; each entry's functions become OpenAI tools as BFCL's own OpenAI handler sends
  them (``.`` in names -> ``_``, BFCL's types -> JSON Schema types), descriptions kept.
* pydantic: models written the way application code writes them, with ``Field`` constraints
  (``max_length``, ``ge``/``le``, ``pattern``, enums, nested models, ``Optional``), sent once as
  ``openai.pydantic_function_tool`` makes them (strict) and once as ``model_json_schema()`` (what
  LangChain and instructor send).

Every tool set is sent with ``tool_choice`` required, named (its first function) and auto, to both
servers at once (each server decodes one request at a time, so load from elsewhere hits both
alike). Measured per source and mode: requests served (HTTP 200) by each server; calls whose
arguments validate against the tool's schema (jsonschema) for required and named, and for auto
whenever the model calls; answers cut at ``max_tokens`` (a truncated call cannot validate; counted
apart); tool-call tokens/s (completion tokens / request wall time over the requests both served).

    OMP_NUM_THREADS=1 .venv/bin/python bench/tool_corpus.py [--limit 12] [--modes required,named,auto]
        [--max-tokens 96] [--json out.json] [--servers running.json]

``--limit N``: N BFCL entries, taken round-robin over the categories (the pydantic sets are always
all sent). ``--servers FILE``: use running servers ({"upgraded": {"base", "model"}, "stock": {...}})
instead of starting both.
"""
from __future__ import annotations

import argparse
import copy
import enum
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Iterable, Literal, Optional

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BFCL_PACKAGE = "bfcl-eval==2026.3.23"
BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple")
MODES = ("required", "named", "auto")
NAME_OK = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_TOOLS_CHARS = 8000  # a tool list longer than this (in the prompt) does not fit the bench's session

# BFCL's parameter types (Python, Java and JavaScript spellings) as JSON Schema types; "any" has none.
GORILLA_TYPES = {
    "integer": "integer", "number": "number", "float": "number", "double": "number", "string": "string",
    "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array", "tuple": "array", "dict": "object",
    "object": "object", "byte": "integer", "short": "integer", "long": "integer", "Bigint": "integer",
    "char": "string", "String": "string", "ArrayList": "array", "Array": "array", "Queue": "array", "Stack": "array",
    "HashMap": "object", "Hashtable": "object", "any": None, "Any": None,
}


# ---- tool sets ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolSet:
    """One request's tools and conversation; ``source`` groups the table's rows."""

    source: str
    label: str
    messages: list
    tools: list

    def schema(self, name: str) -> dict | None:
        for tool in self.tools:
            if tool["function"]["name"] == name:
                return tool["function"].get("parameters") or {"type": "object"}
        return None


def json_schema_from_bfcl(p: Any) -> Any:
    """A BFCL parameter schema as JSON Schema: BFCL's type names mapped (an unknown one, like BFCL's
    own OpenAI handler, as string), everything else kept."""
    if not isinstance(p, dict):
        return p
    out = dict(p)
    if "type" in out:
        t = out["type"]
        mapped = GORILLA_TYPES.get(t, "string") if isinstance(t, str) else t
        if mapped is None:
            del out["type"]
        else:
            out["type"] = mapped
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: json_schema_from_bfcl(v) for k, v in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = json_schema_from_bfcl(out[key])
    return out


def openai_tool_from_bfcl(fn: dict) -> dict:
    """One BFCL function doc as an OpenAI tool (OpenAI names allow no ``.``)."""
    params = json_schema_from_bfcl(copy.deepcopy(fn.get("parameters") or {}))
    params["type"] = "object"
    out = {"name": re.sub(r"\.", "_", fn["name"]), "parameters": params}
    if fn.get("description"):
        out["description"] = fn["description"]
    return {"type": "function", "function": out}


def bfcl_toolsets(lines: Iterable[str], category: str) -> list[ToolSet]:
    """BFCL entries (one JSON object a line) as tool sets: the first turn's messages and the tools."""
    sets = []
    for line in lines:
        if not line.strip():
            continue
        item = json.loads(line)
        functions = item.get("function") or []
        if not functions:
            continue
        sets.append(ToolSet(f"bfcl:{category}", item["id"], list(item["question"][0]),
                            [openai_tool_from_bfcl(fn) for fn in functions]))
    return sets


def bfcl_data_dir(install: bool = True) -> Path:
    """bfcl-eval's data folder, found without importing the package (its modules need its whole
    stack); installed with ``--no-deps`` when missing."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None and install:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        BFCL_PACKAGE], check=True)
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"bfcl-eval not installed ({BFCL_PACKAGE})")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def load_bfcl(data_dir: Path, categories: Iterable[str], limit: int) -> list[ToolSet]:
    """``limit`` entries taken round-robin over ``categories``, each category in file order."""
    per = [bfcl_toolsets((data_dir / f"BFCL_v4_{c}.json").read_text().splitlines(), c) for c in categories]
    out: list[ToolSet] = []
    i = 0
    while len(out) < limit and any(i < len(p) for p in per):
        out += [p[i] for p in per if i < len(p)][: limit - len(out)]
        i += 1
    return out


# ---- pydantic tool definitions, written as application code writes them -----------------------
def _pydantic_models() -> list[tuple[list[type], str]]:
    """(models of one tool set, the user's question), the first model the question is about."""
    from pydantic import BaseModel, Field

    class Cabin(str, enum.Enum):
        economy = "economy"
        business = "business"
        first = "first"

    class BookFlight(BaseModel):
        """Book a flight between two airports."""

        origin: str = Field(pattern=r"^[A-Z]{3}$", description="IATA code of the departure airport")
        destination: str = Field(pattern=r"^[A-Z]{3}$", description="IATA code of the arrival airport")
        day: date
        passengers: int = Field(default=1, ge=1, le=9)
        cabin: Cabin = Cabin.economy
        return_day: Optional[date] = None

    class ConvertCurrency(BaseModel):
        """Convert an amount of money between currencies."""

        amount: float = Field(gt=0, le=1_000_000)
        source: str = Field(pattern=r"^[A-Z]{3}$")
        target: str = Field(pattern=r"^[A-Z]{3}$")

    class Role(str, enum.Enum):
        admin = "admin"
        editor = "editor"
        viewer = "viewer"

    class CreateUser(BaseModel):
        """Create a user account."""

        username: str = Field(min_length=3, max_length=16, pattern=r"^[a-z0-9_]+$")
        email: str = Field(max_length=64, pattern=r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$")
        age: Optional[int] = Field(default=None, ge=13, le=120)
        roles: list[Role] = Field(min_length=1, max_length=3)

    class SearchProducts(BaseModel):
        """Search the product catalogue."""

        query: str = Field(min_length=1, max_length=50)
        max_price: float = Field(gt=0, le=10_000)
        category: Optional[Literal["books", "music", "garden", "toys"]] = None
        in_stock: bool = True

    class AddTodo(BaseModel):
        """Add an item to the to-do list."""

        text: str = Field(max_length=80)
        due: Optional[date] = None
        tags: list[str] = Field(default_factory=list, max_length=5)
        priority: int = Field(default=3, ge=1, le=5)

    class SetThermostat(BaseModel):
        """Set a room's thermostat."""

        room: str = Field(max_length=20)
        celsius: float = Field(ge=10, le=30)
        mode: Literal["heat", "cool", "auto"] = "auto"

    class Attendee(BaseModel):
        name: str = Field(max_length=40)
        email: Optional[str] = Field(default=None, pattern=r"^[^@\s]+@[^@\s]+$")

    class Place(BaseModel):
        latitude: float = Field(ge=-90, le=90)
        longitude: float = Field(ge=-180, le=180)

    class CreateEvent(BaseModel):
        """Put an event in the calendar."""

        title: str = Field(max_length=40)
        day: date
        minutes: int = Field(ge=5, le=480)
        attendees: list[Attendee] = Field(max_length=4)
        place: Optional[Place] = None

    class SendEmail(BaseModel):
        """Send an e-mail."""

        to: list[str] = Field(min_length=1, max_length=3)
        subject: str = Field(max_length=60)
        body: str = Field(max_length=200)
        priority: Optional[Literal["low", "normal", "high"]] = None

    return [
        ([BookFlight, ConvertCurrency], "Book me a flight from Paris CDG to New York JFK on 2025-05-04 for two people."),
        ([CreateUser], "Create an account for alice, alice@example.com, 31 years old, as an editor."),
        ([SearchProducts, AddTodo], "Find garden tools under 50 dollars."),
        ([SetThermostat], "Make the living room 21 degrees."),
        ([CreateEvent, SendEmail], "Schedule a one-hour meeting called Roadmap on 2025-06-02 with Bob."),
        ([ConvertCurrency], "How much is 120 euros in US dollars?"),
    ]


def pydantic_toolsets() -> list[ToolSet]:
    """Each pydantic tool set twice: as ``openai.pydantic_function_tool`` (strict) and as
    ``model_json_schema()`` in a plain function (LangChain's and instructor's shape)."""
    import openai

    sets = []
    for models, question in _pydantic_models():
        messages = [{"role": "user", "content": question}]
        label = "+".join(m.__name__ for m in models)
        sets.append(ToolSet("pydantic:strict", label, messages, [openai.pydantic_function_tool(m) for m in models]))
        sets.append(ToolSet("pydantic:schema", label, messages, [
            {"type": "function", "function": {"name": m.__name__, "description": (m.__doc__ or "").strip(),
                                              "parameters": m.model_json_schema()}} for m in models]))
    return sets


# ---- requests and their checks ------------------------------------------------------------------
def prompt_messages(ts: ToolSet) -> list[dict]:
    """The conversation with the tools shown to the model (SmolLM2's template does not render them):
    names and parameters (descriptions stay in ``tools``: the prompt is prefilled on a CPU), the
    qwen parser's call syntax, and BFCL's own instruction to answer with the calls; the entry's own
    system message follows ours."""
    listing = json.dumps([{"name": t["function"]["name"], "parameters": t["function"].get("parameters")}
                          for t in ts.tools], separators=(",", ":"))
    system = ("You are an expert in composing function calls. You can call these functions:\n" + listing +
              "\nIf the question can be answered with them, answer only with the call(s), each as "
              '<tool_call>{"name": <function name>, "arguments": <arguments object>}</tool_call>.')
    own = [m for m in ts.messages if m.get("role") == "system"]
    if own:
        system += "\n\n" + "\n".join(str(m.get("content", "")) for m in own)
    return [{"role": "system", "content": system}] + [m for m in ts.messages if m.get("role") != "system"]


def tool_choice(ts: ToolSet, mode: str) -> Any:
    if mode == "named":
        return {"type": "function", "function": {"name": ts.tools[0]["function"]["name"]}}
    return mode


def check_call(ts: ToolSet, name: str, arguments: str, named: str | None = None) -> str | None:
    """Why one call is not valid for ``ts`` (None when it is): an unknown or wrong function,
    arguments that are not JSON, or that fail the tool's schema."""
    import jsonschema

    if named is not None and name != named:
        return f"called {name!r}, named {named!r}"
    schema = ts.schema(name)
    if schema is None:
        return f"unknown function {name!r}"
    try:
        args = json.loads(arguments)
    except ValueError as exc:
        return f"arguments not JSON: {exc}"
    try:
        jsonschema.validate(args, schema)
    except jsonschema.ValidationError as exc:
        return f"{'/'.join(map(str, exc.absolute_path)) or '(root)'}: {exc.message[:120]}"
    except jsonschema.SchemaError as exc:
        return f"schema itself invalid: {exc.message[:120]}"
    return None


@dataclass
class Answer:
    """One server's answer to one request."""

    status: int
    seconds: float
    tokens: int = 0
    finish: str = ""
    calls: int = 0
    problems: list = field(default_factory=list)  # one per invalid call, or "no call" where one is owed
    message: str = ""

    @property
    def served(self) -> bool:
        return self.status == 200

    @property
    def cut(self) -> bool:
        return self.served and self.finish == "length"

    @property
    def checked(self) -> bool:
        """Whether the answer is judged: every served answer owes a call, except auto without one
        (``judge`` files the missing call as a problem)."""
        return self.served and (self.calls > 0 or bool(self.problems))

    @property
    def valid(self) -> bool:
        return self.checked and not self.problems


def judge(ts: ToolSet, mode: str, status: int, seconds: float, body: dict) -> Answer:
    """An HTTP answer judged: required and named owe at least one valid call (named: of that
    function); auto is judged whenever it calls."""
    if status != 200:
        return Answer(status, seconds, message=str(body.get("message") or body)[:200])
    choice = body["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    named = ts.tools[0]["function"]["name"] if mode == "named" else None
    problems = [p for p in (check_call(ts, c["function"]["name"], c["function"]["arguments"] or "", named)
                            for c in calls) if p]
    if not calls and mode != "auto":
        problems.append("no call")
    return Answer(status, seconds, (body.get("usage") or {}).get("completion_tokens", 0), choice.get("finish_reason") or "",
                  len(calls), problems)


def send(server: dict, ts: ToolSet, mode: str, max_tokens: int) -> Answer:
    import httpx

    body = {"model": server["model"], "messages": prompt_messages(ts), "tools": ts.tools,
            "tool_choice": tool_choice(ts, mode), "temperature": 0, "max_tokens": max_tokens}
    t0 = time.perf_counter()
    try:
        resp = httpx.post(f"{server['base']}/v1/chat/completions", json=body, timeout=600)
    except httpx.HTTPError as exc:
        return Answer(0, time.perf_counter() - t0, message=f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - t0
    try:
        payload = resp.json()
    except ValueError:
        payload = {"message": resp.text[:200]}
    return judge(ts, mode, resp.status_code, seconds, payload)


# ---- the run -------------------------------------------------------------------------------------
def start_servers(session_len: int, attempts: int = 3) -> tuple[dict, list]:
    """Both servers, started together; one that dies of LMDeploy's engine-start manager race
    (``EOFError`` in its log, see tests/engine_patch/lmdeploy/test_real_server.py) is started again."""
    from harness import server_attack as atk
    from tokenrails.demo_model import resolve_model_dir

    model = str(resolve_model_dir(quiet=True)[0])
    logdir = Path(tempfile.mkdtemp(prefix="tool-corpus-"))

    def start(name: str):
        return atk.start_server(model, logdir / f"{name}.log", stock=name == "stock",
                                extra_args=("--session-len", str(session_len)))

    started = {name: start(name) for name in ("upgraded", "stock")}
    servers: dict = {}
    try:
        for name in started:
            for attempt in range(attempts):
                proc, base = started[name]
                model_id = atk.wait_ready(proc, base, 300)
                if model_id is not None:
                    servers[name] = {"base": base, "model": model_id}
                    break
                atk.stop_server(proc)
                if "EOFError" not in (logdir / f"{name}.log").read_text() or attempt == attempts - 1:
                    raise SystemExit(f"{name} server did not start; log: {logdir / (name + '.log')}")
                started[name] = start(name)
    except BaseException:
        for proc, _ in started.values():
            atk.stop_server(proc)
        raise
    print(f"servers up (logs in {logdir})", flush=True)
    return servers, [proc for proc, _ in started.values()]


@dataclass
class Tally:
    requests: int = 0
    served: int = 0
    checked: int = 0
    valid: int = 0
    cut: int = 0
    tokens: int = 0
    seconds: float = 0.0
    problems: list = field(default_factory=list)


def tally(rows: list[dict], side: str, speed: str = "") -> Tally:
    """Counts for one server; tokens and seconds only over the rows ``speed`` selects: "served" (both
    servers answered 200) or "same" (both answered with as many tokens: like for like)."""
    t = Tally()
    for row in rows:
        a: Answer = row[side]
        t.requests += 1
        t.served += a.served
        if a.checked and not (a.cut and a.problems):
            t.checked += 1
            t.valid += a.valid
        t.cut += a.cut and bool(a.problems)
        if a.problems and not a.cut and a.served:
            t.problems.append(f"{row['source']} {row['label']} [{row['mode']}]: {a.problems[0]}")
        both = row["upgraded"].served and row["stock"].served
        if both and (speed == "served" or (speed == "same" and row["upgraded"].tokens == row["stock"].tokens)):
            t.tokens += a.tokens
            t.seconds += a.seconds
    return t


def _tps(t: Tally) -> float:
    return t.tokens / t.seconds if t.seconds else 0.0


def _ratio(a: float, b: float) -> str:
    return "-" if not b else f"{a / b:.2f}"


def report(rows: list[dict]) -> None:
    groups: dict[tuple[str, str], list[dict]] = {}
    for source in [*dict.fromkeys(r["source"].split(":")[0] for r in rows), "all"]:
        for mode in [*dict.fromkeys(r["mode"] for r in rows), "all"]:
            rs = [r for r in rows if source in ("all", r["source"].split(":")[0]) and mode in ("all", r["mode"])]
            if rs and (mode != "all" or source == "all"):
                groups[(source, mode)] = rs
    header = ("source", "mode", "n", "served up/stock", "ratio", "valid up", "valid stock", "cut, no call up/stock",
              "tok/s up", "tok/s stock", "ratio", "same-length ratio (n)")
    table = []
    for (source, mode), rs in groups.items():
        up, st = tally(rs, "upgraded"), tally(rs, "stock")
        up_tps, st_tps = (_tps(tally(rs, side, "served")) for side in ("upgraded", "stock"))
        up_same, st_same = (_tps(tally(rs, side, "same")) for side in ("upgraded", "stock"))
        n_same = sum(r["upgraded"].served and r["stock"].served and r["upgraded"].tokens == r["stock"].tokens
                     for r in rs)
        table.append((source, mode, str(len(rs)), f"{up.served}/{st.served}", _ratio(up.served, st.served),
                      f"{up.valid}/{up.checked}", f"{st.valid}/{st.checked}", f"{up.cut}/{st.cut}",
                      f"{up_tps:.1f}", f"{st_tps:.1f}", _ratio(up_tps, st_tps), f"{_ratio(up_same, st_same)} ({n_same})"))
    widths = [max(len(str(r[i])) for r in [header] + table) for i in range(len(header))]
    for n, r in enumerate([header] + table):
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    refused = [(f"{r['source']} {r['label']}", r["mode"], r["upgraded"].status, r["upgraded"].message) for r in rows
               if r["stock"].served and not r["upgraded"].served]
    if refused:
        print(f"\nserved by stock, not by the upgrade ({len(refused)}):")
        for label, mode, status, msg in refused:
            print(f"  {label} [{mode}]: {status} {msg}")
    for side in ("upgraded", "stock"):
        problems = tally(rows, side).problems
        if problems:
            print(f"\n{side}: calls that do not validate ({len(problems)}, first 15):")
            for p in problems[:15]:
                print("  " + p)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=12, help="BFCL entries (round-robin over the categories)")
    ap.add_argument("--categories", default=",".join(BFCL_CATEGORIES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--session-len", type=int, default=4096)
    ap.add_argument("--no-pydantic", action="store_true")
    ap.add_argument("--servers", type=Path, help="JSON file naming running servers instead of starting both")
    ap.add_argument("--json", type=Path, help="write every answer here")
    ap.add_argument("--report", type=Path, help="print the tables of a --json file written before, and stop")
    args = ap.parse_args(argv)
    if args.report:
        report([{**r, "upgraded": Answer(**r["upgraded"]), "stock": Answer(**r["stock"])}
                for r in json.loads(args.report.read_text())])
        return

    sets = load_bfcl(bfcl_data_dir(), args.categories.split(","), args.limit)
    if not args.no_pydantic:
        sets += pydantic_toolsets()
    too_long = [s for s in sets if len(json.dumps([t["function"] for t in s.tools])) > MAX_TOOLS_CHARS]
    sets = [s for s in sets if s not in too_long]
    modes = args.modes.split(",")
    print(f"{len(sets)} tool sets x {len(modes)} modes ({len(too_long)} BFCL entries skipped: tool list over "
          f"{MAX_TOOLS_CHARS} characters); {BFCL_PACKAGE} data; max_tokens {args.max_tokens}", flush=True)
    procs: list = []
    if args.servers:
        servers = json.loads(args.servers.read_text())
    else:
        servers, procs = start_servers(args.session_len)
    rows = []
    try:
        with ThreadPoolExecutor(2) as pool:
            for i, ts in enumerate(sets):
                for mode in modes:
                    futures = {side: pool.submit(send, servers[side], ts, mode, args.max_tokens)
                               for side in ("upgraded", "stock")}
                    row = {"source": ts.source, "label": ts.label, "mode": mode,
                           **{side: f.result() for side, f in futures.items()}}
                    rows.append(row)
                    up, st = row["upgraded"], row["stock"]
                    print(f"[{i + 1}/{len(sets)}] {ts.source} {ts.label} {mode}: upgraded {up.status} "
                          f"{'valid' if up.valid else (up.problems or ['-'])[0]} {up.seconds:.1f}s | stock {st.status} "
                          f"{'valid' if st.valid else (st.problems or ['-'])[0]} {st.seconds:.1f}s", flush=True)
    finally:
        if procs:
            from harness import server_attack as atk
            for p in procs:
                atk.stop_server(p)
    print()
    report(rows)
    if args.json:
        args.json.write_text(json.dumps([{**r, "upgraded": asdict(r["upgraded"]), "stock": asdict(r["stock"])}
                                         for r in rows], indent=1))


if __name__ == "__main__":
    main()
