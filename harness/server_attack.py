"""Hostile clients against LMDeploy's api_server (issue 27): what ``bench/server_attack.py``
reports and ``tests/engine_patch/lmdeploy/test_server_attack.py`` bounds.

While one client sends benign guided requests in a loop and another pings ``/v1/models``, an
attacker sends each hostile shape of issue 27 (with a fresh nonce, so no memo helps). Measured:
each hostile request's status, message and time, the longest ping while it was in flight (the
front end's stall), every ping's latency and failure, benign latency with and without the attack,
and whether every 200 answer satisfies its constraint (the oracles: ``jsonschema``,
``re.fullmatch``).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx
import jsonschema

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
REPO = Path(__file__).resolve().parents[1]


# ---- the hostile shapes -------------------------------------------------------------------
def _chain(levels: int, nonce: str) -> dict:
    defs = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(levels)}
    defs[f"d{levels}"] = {"type": "object", "properties": {"a": {"type": "integer"}}, "description": nonce}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _json_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _optional(n: int, nonce: str) -> dict:
    return {"type": "object", "description": nonce, "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


def _tools(n: int) -> list:
    return [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(n)]


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@dataclass(frozen=True)
class Shape:
    """One hostile request: ``body(nonce)`` gives its extra request fields; ``expect`` is "400"
    (refused with a reason), "valid" (served, output checked by ``check``) or "either" (served
    validly, or refused with the typed reason: which one depends on the real vocabulary)."""

    name: str
    body: Callable[[str], dict]
    expect: str = "400"
    check: Callable[[str, dict], bool] | None = None


def _regex_shape() -> Shape:
    base = r"[\u0000-\uffff]{0,9}" * 300  # the regex escapes, as a client's JSON spells them

    def body(nonce: str) -> dict:
        return {"response_format": {"type": "regex_schema", "regex_schema": base + f"(?:{nonce})?"}}

    def check(text: str, sent: dict) -> bool:
        return re.fullmatch(sent["response_format"]["regex_schema"], text, re.S) is not None

    return Shape("regex 300 x [\\u0000-\\uffff]{0,9}", body, "400", check)


def _optional_shape(n: int) -> Shape:
    def check(text: str, sent: dict) -> bool:
        try:
            jsonschema.validate(json.loads(text), sent["response_format"]["json_schema"]["schema"])
        except (ValueError, jsonschema.ValidationError):
            return False
        return True

    return Shape(f"{n:,} optional properties", lambda nonce: {"response_format": _json_format(_optional(n, nonce))},
                 "valid", check)


def _enum_tool(n: int, nonce: str) -> list:
    """Issue 36 attack 1: one tool whose parameters hold an ``n``-object enum (~25 bytes each)."""
    return [{"type": "function", "function": {"name": f"pick{nonce}", "parameters": {
        "type": "object", "properties": {"x": {"enum": [{"k": f"v{i}", "n": i} for i in range(n)]}},
        "required": ["x"]}}}]


def _text_enum_shape(n: int) -> Shape:
    """Issue 36 attack 2: a schema the front end accepts whose compile on the real vocabulary is
    long (an ``n``-value enum of short strings; a fresh nonce per request defeats every cache)."""
    def body(nonce: str) -> dict:
        return {"response_format": _json_format({"enum": [f"{nonce}{i:05d}" for i in range(n)]})}

    def check(text: str, sent: dict) -> bool:
        try:
            return json.loads(text) in sent["response_format"]["json_schema"]["schema"]["enum"]
        except ValueError:
            return False

    return Shape(f"{n:,}-value enum, fresh nonce (accepted)", body, "either", check)


def compile_shapes() -> list[Shape]:
    """Issue 36's attacks on compile capacity: the 10,000-object enum tool (``tool_choice`` auto)
    and a long-compiling accepted schema, each sent twice (a burst, fresh nonces)."""
    tool = Shape("tool with a 10,000-object enum (auto)", lambda n: {"tools": _enum_tool(10_000, n),
                                                                     "tool_choice": "auto"}, "either")
    text = _text_enum_shape(9_000)
    return [tool, text, tool, text]


def hostile_shapes(*, quick: bool = False) -> list[Shape]:
    """Issue 27's shapes; ``quick`` keeps one of each family (the test's time budget)."""
    shapes = [
        Shape("allOf/$ref chain, 30 levels (2.2 KB)", lambda n: {"response_format": _json_format(_chain(30, n))}),
        _regex_shape(),
        Shape("grammar, 15 x 16 KB literals", lambda n: {"response_format": {"type": "grammar", "grammar": "root ::= " + " | ".join(
            f'"{n}{chr(97 + i) * 16000}"' for i in range(15))}}),
        Shape("3,000 tools, tool_choice=auto", lambda n: {"tools": _tools(3000) + [{"type": "function", "function": {
            "name": f"n{n}", "parameters": {"type": "object"}}}], "tool_choice": "auto"}),
        Shape("structural tag, 3,000 tags", lambda n: {"response_format": {"type": "structural_tag", "triggers": ["<f"], "structures": [
            {"begin": f"<f{i}{n}>", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}, "end": "</f>"}
            for i in range(3000)]}}),
        _optional_shape(600),
        Shape("choice [1, {a:1}, null]", lambda n: {"response_format": {"type": "choice", "choice": [1, {"a": n}, None]}}),
        Shape("tool_choice names a missing function", lambda n: {
            "tools": WEATHER, "tool_choice": {"type": "function", "function": {"name": f"missing{n}"}}}),
        Shape("tool_choice=required + response_format", lambda n: {
            "tools": WEATHER, "tool_choice": "required", "response_format": _json_format({**PERSON, "description": n})}),
        Shape("100k-value enum", lambda n: {"response_format": _json_format({"enum": [f"{n}{i}" for i in range(100_000)]})}),
        Shape('{"$ref": "#"}', lambda n: {"response_format": _json_format({"$ref": "#", "description": n})}),
    ]
    if not quick:
        shapes.append(_optional_shape(2000))
    return shapes


# ---- the server ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path | str, log: Path, *, stock: bool = False, limits: dict | None = None,
                 tool_call_parser: str | None = "qwen", extra_args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """``cpu.serve`` in its own session (``stop_server`` ends it and its engine process); output to ``log``."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    if limits:
        env["TOKENRAILS_LMDEPLOY_LIMITS"] = json.dumps(limits)
    cmd = [sys.executable, "-m", "tokenrails.engine_patch.lmdeploy.cpu.serve", str(model), "--port", str(port),
           "--max-batch-size", "4", "--session-len", "512", *extra_args]
    if tool_call_parser is not None:
        cmd += ["--tool-call-parser", tool_call_parser]
    if stock:
        cmd.append("--stock")
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen, base: str, timeout: float) -> str | None:
    """The served model id; None when the server exited or did not come up in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        try:
            return httpx.get(f"{base}/v1/models", timeout=2).json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            time.sleep(0.25)  # a refused connect is cheap; each start waited half a period on average
    return None


def stop_server(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except ProcessLookupError:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---- the run ------------------------------------------------------------------------------
@dataclass
class HostileResult:
    name: str
    expect: str
    status: int | None
    seconds: float
    message: str
    stall_s: float = 0.0  # longest ping latency (or failure wait) while this request was in flight
    valid: bool | None = None  # for a 200: did the output satisfy the constraint


@dataclass
class AttackRun:
    baseline: list[float] = field(default_factory=list)        # benign latencies, no attack
    under_attack: list[float] = field(default_factory=list)    # benign latencies during the attack
    after: list[float] = field(default_factory=list)           # benign latencies once the attack ended
    pings: list[tuple[float, float]] = field(default_factory=list)  # (start, latency) of each ping
    ping_failures: int = 0
    benign_invalid: int = 0
    benign_errors: list[str] = field(default_factory=list)
    hostile: list[HostileResult] = field(default_factory=list)
    attack_start: float = float("inf")  # perf_counter() when the first hostile request was sent
    fresh_client: tuple[int | None, float] | None = None  # another client's fresh schema right after
    rss_mb: tuple[float, float] | None = None  # the server's process tree before / after the attack
    rss_at_start: Any = None  # what ``run_attack``'s ``rss_of`` read when the attack started

    windows: list[tuple[float, float]] = field(default_factory=list)  # each hostile request's (start, end)

    def ping_latencies(self, *, attack: bool) -> list[float]:
        """Ping latencies during the attack (``attack=True``) or before it."""
        return [lat for start, lat in self.pings if (start >= self.attack_start) == attack]

    def pings_in_flight(self) -> list[float]:
        """Latencies of the pings sent while a hostile request was in flight."""
        return [lat for start, lat in self.pings if any(a <= start <= b for a, b in self.windows)]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _benign_body(model_id: str) -> dict:
    return {"model": model_id, "messages": [{"role": "user", "content": "Give me a person as JSON."}],
            "temperature": 0, "max_tokens": 40, "response_format": _json_format(PERSON)}


class _Pinger(threading.Thread):
    def __init__(self, base: str, run: AttackRun, period: float, timeout: float):
        super().__init__(daemon=True)
        self.base, self.run_, self.period, self.timeout = base, run, period, timeout
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=self.timeout) as client:
            while not self.stop.is_set():
                start = time.perf_counter()
                try:
                    ok = client.get(f"{self.base}/v1/models").status_code == 200
                except httpx.HTTPError:
                    ok = False
                latency = time.perf_counter() - start
                self.run_.pings.append((start, latency))
                if not ok:
                    self.run_.ping_failures += 1
                self.stop.wait(max(0.0, self.period - latency))


def _benign_once(client: httpx.Client, base: str, model_id: str, run: AttackRun) -> float | None:
    start = time.perf_counter()
    try:
        resp = client.post(f"{base}/v1/chat/completions", json=_benign_body(model_id))
    except httpx.HTTPError as exc:
        run.benign_errors.append(repr(exc)[:200])
        return None
    seconds = time.perf_counter() - start
    if resp.status_code != 200:
        run.benign_errors.append(f"{resp.status_code}: {resp.text[:200]}")
        return None
    choice = resp.json()["choices"][0]
    try:
        jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)
    except (ValueError, jsonschema.ValidationError, TypeError):
        if choice.get("finish_reason") == "stop":
            run.benign_invalid += 1
    return seconds


ATTACKER_KEY = "attacker-key"  # the hostile client's API key: capacity is shared per key (or address)


def _send_hostile(client: httpx.Client, base: str, model_id: str, shape: Shape, nonce: str) -> HostileResult:
    extra = shape.body(nonce)
    body = {"model": model_id, "messages": [{"role": "user", "content": "Answer."}], "temperature": 0,
            "max_tokens": 16, **extra}
    start = time.perf_counter()
    try:
        resp = client.post(f"{base}/v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {ATTACKER_KEY}"})
    except httpx.HTTPError as exc:
        return HostileResult(shape.name, shape.expect, None, time.perf_counter() - start, f"client: {exc!r}"[:200])
    seconds = time.perf_counter() - start
    try:
        payload = resp.json()
    except ValueError:
        payload = {"message": resp.text[:300]}
    result = HostileResult(shape.name, shape.expect, resp.status_code, seconds,
                           str(payload.get("message") or payload.get("error") or "")[:300])
    if resp.status_code == 200:
        choice = payload["choices"][0]
        text = choice["message"].get("content") or ""
        result.message = f"finish={choice.get('finish_reason')} text={text[:60]!r}"
        result.valid = shape.check(text, extra) if shape.check else None
        if result.valid is False and choice.get("finish_reason") == "length":
            result.valid = None  # cut by max_tokens: not checkable as a whole
    return result


def run_attack(base: str, model_id: str, shapes: list[Shape], *, baseline_requests: int = 5,
               min_attack_benign: int = 5, hostile_timeout: float = 60.0, ping_period: float = 0.25,
               ping_timeout: float = 5.0, budget_s: float = 600.0, benign_timeout: float = 120.0,
               after_requests: int = 0, rss_of: Callable[[], float] | None = None) -> AttackRun:
    """Baseline benign latencies, then every shape (one at a time, fresh nonce) while benign
    requests and pings continue, then ``after_requests`` benign ones with no attack (on a shared
    machine the load drifts: a baseline on both sides of the attack bounds what the drift did).
    ``rss_of``: the server's RSS, read when the attack starts (warm: the first requests' own
    allocations are not the attack's) into ``run.rss_at_start``.
    Past ``budget_s`` no new request starts (a bounded run)."""
    run = AttackRun()
    give_up = time.monotonic() + budget_s
    pinger = _Pinger(base, run, ping_period, ping_timeout)
    pinger.start()
    try:
        with httpx.Client(timeout=120) as client:
            _benign_once(client, base, model_id, AttackRun())  # warm-up: compile PERSON once
            for _ in range(baseline_requests):
                seconds = _benign_once(client, base, model_id, run)
                if seconds is not None:
                    run.baseline.append(seconds)
        attack_done = threading.Event()

        def attacker() -> None:
            with httpx.Client(timeout=hostile_timeout) as client:
                for i, shape in enumerate(shapes):
                    if time.monotonic() > give_up:
                        run.hostile.append(HostileResult(shape.name, shape.expect, None, 0.0, "not sent: run budget"))
                        continue
                    nonce = f"z{time.time_ns() % 10**9}{i}"
                    t0 = time.perf_counter()
                    result = _send_hostile(client, base, model_id, shape, nonce)
                    t1 = time.perf_counter()
                    run.windows.append((t0, t1))
                    in_flight = [lat for start, lat in list(run.pings) if t0 <= start <= t1]
                    result.stall_s = max(in_flight, default=0.0)
                    run.hostile.append(result)
            attack_done.set()

        thread = threading.Thread(target=attacker, daemon=True)
        if rss_of is not None:
            run.rss_at_start = rss_of()
        run.attack_start = time.perf_counter()
        thread.start()
        with httpx.Client(timeout=benign_timeout) as client:
            while (not attack_done.is_set() or len(run.under_attack) < min_attack_benign) and time.monotonic() < give_up:
                seconds = _benign_once(client, base, model_id, run)
                if seconds is not None:
                    run.under_attack.append(seconds)
                elif attack_done.is_set() and len(run.benign_errors) > 20:
                    break
        thread.join()
        run.fresh_client = fresh_schema(base, model_id)
        with httpx.Client(timeout=benign_timeout) as client:
            for _ in range(after_requests):
                seconds = _benign_once(client, base, model_id, run)
                if seconds is not None:
                    run.after.append(seconds)
    finally:
        pinger.stop.set()
        pinger.join(timeout=10)
    return run


def fresh_schema(base: str, model_id: str, timeout: float = 120.0) -> tuple[int | None, float]:
    """(status, seconds) of a fresh small schema from another client (its own API key), sent as
    soon as the attack ends: the attacker's refusals and compiles must not close the server to it."""
    schema = {**PERSON, "description": f"fresh {time.time_ns()}"}
    body = {"model": model_id, "messages": [{"role": "user", "content": "A person."}], "temperature": 0,
            "max_tokens": 24, "response_format": _json_format(schema)}
    start = time.perf_counter()
    try:
        with httpx.Client(timeout=timeout) as client:
            status = client.post(f"{base}/v1/chat/completions", json=body,
                                 headers={"Authorization": "Bearer another-client"}).status_code
    except httpx.HTTPError:
        status = None
    return status, time.perf_counter() - start


def flood_latency(base: str, model_id: str, n: int, shape: Shape | None = None, timeout: float = 300.0) -> dict:
    """One client (``ATTACKER_KEY``) sends ``n`` slow accepted specs at once (``shape``: the
    9,000-value enum with fresh nonces, more than the server's request handles); 2 s later another
    client sends a fresh small schema (``fresh_schema``). Its latency, and the flood's answers."""
    shape = shape or _text_enum_shape(9_000)
    flood: list[HostileResult] = []

    def one(i: int) -> None:
        with httpx.Client(timeout=timeout) as client:
            flood.append(_send_hostile(client, base, model_id, shape, f"f{time.time_ns()}x{i}"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    other = fresh_schema(base, model_id, timeout)
    for t in threads:
        t.join(timeout)
    return {"other": other, "flood": [(r.status, r.seconds) for r in flood]}


def _is_compile_worker(pid: int) -> bool:
    try:
        return b"tokenrails.guided.compile_worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def tree_rss_mb(pid: int, *, workers: bool | None = None) -> float:
    """RSS of ``pid`` and every descendant (the engine process, compile workers), MB; ``workers``
    True/False: only / all but the compile worker processes (tokenrails.guided.compile_worker)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, stack = 0.0, [pid]
    while stack:
        p = stack.pop()
        try:
            mb = rss_mb(p)
        except OSError:
            continue
        if mb == mb and (workers is None or workers == _is_compile_worker(p)):  # a zombie has no VmRSS
            total += mb
        stack.extend(children.get(p, []))
    return total


def refused_payload_growth(base: str, model_id: str, pid: int, count: int, *, mb: float = 1.0) -> tuple[float, int]:
    """RSS growth (MB) of the api_server process after ``count`` distinct refused ~``mb`` MB
    specs (20k+-value enums: over ``max_enum_values``); and how many were answered 400."""
    values = int(mb * 1_000_000 / 48)
    refused = 0
    with httpx.Client(timeout=120) as client:
        for warm in range(5):
            client.post(f"{base}/v1/chat/completions", json=_enum_body(model_id, f"w{warm}", values))
        before = rss_mb(pid)
        for i in range(count):
            resp = client.post(f"{base}/v1/chat/completions", json=_enum_body(model_id, f"n{i}", values))
            refused += resp.status_code == 400
        time.sleep(1.0)
        return rss_mb(pid) - before, refused


def _enum_body(model_id: str, nonce: str, values: int) -> dict:
    enum = [f"{nonce}-{i:08d}-" + "v" * 30 for i in range(values)]
    return {"model": model_id, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
            "response_format": _json_format({"enum": enum})}


# ---- large request bodies (parsed and tokenized on the event loop by LMDeploy) ---------------
def large_bodies(model_id: str) -> list[tuple[str, bytes, int, str]]:
    """``(name, encoded body, status the upgrade answers, the limit's param or env name)`` for each
    large-body shape; encoded once, so the client's own encoding is not measured."""
    def chat(**extra: Any) -> dict:
        return {"model": model_id, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
                "temperature": 0, **extra}

    many_props = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}}
    shapes = [
        ("100k stop words", chat(stop=[f"w{i} x" for i in range(100_000)]), 400, "stop"),
        ("8 MB message", chat(messages=[{"role": "user", "content": "a " * 4_000_000}]), 400, "messages"),
        ("100k turns", chat(messages=[{"role": ("user", "assistant")[i % 2], "content": "hi"}
                                      for i in range(100_000)]), 400, "messages"),
        ("256 tools x 1000 properties", chat(tools=[
            {"type": "function", "function": {"name": f"f{i}", "parameters": many_props}} for i in range(256)]),
         400, "tools"),
        ("72 MB body", chat(padding="x" * (72 * 1024 * 1024)), 413, "TOKENRAILS_MAX_BODY_BYTES"),
    ]
    return [(name, json.dumps(body).encode(), status, needle) for name, body, status, needle in shapes]


@dataclass
class BodyResult:
    name: str
    status: int | None
    seconds: float
    stall_s: float  # the longest ping while it was in flight
    log_bytes: int  # server log growth while it was in flight
    message: str = ""


def run_bodies(base: str, model_id: str, log: Path, *, timeout: float = 120.0,
               ping_period: float = 0.1) -> tuple[list[BodyResult], list[float], list[float], list[str]]:
    """Each large body in turn while a client pings ``/v1/models``: the results, the pings before the
    first body (quiet), the pings during the bodies, and the ping failures."""
    bodies = large_bodies(model_id)
    pings: list[tuple[float, float]] = []
    failures: list[str] = []
    stop = threading.Event()

    def pinger() -> None:
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    c.get(f"{base}/v1/models").raise_for_status()
                    pings.append((t0, time.perf_counter() - t0))
                except httpx.HTTPError as exc:
                    failures.append(repr(exc)[:200])
                time.sleep(ping_period)

    thread = threading.Thread(target=pinger, daemon=True)
    thread.start()
    results: list[BodyResult] = []
    try:
        time.sleep(1.0)
        first = time.perf_counter()
        with httpx.Client(timeout=timeout) as client:
            for name, body, _, _ in bodies:
                size = log.stat().st_size
                t0 = time.perf_counter()
                try:
                    resp = client.post(f"{base}/v1/chat/completions", content=body,
                                       headers={"content-type": "application/json"})
                    status, text = resp.status_code, resp.text[:300]
                except httpx.HTTPError as exc:
                    status, text = None, f"client: {exc!r}"[:300]
                t1 = time.perf_counter()
                time.sleep(2 * ping_period)  # a ping sent just before the answer returns
                stall = max((lat for s, lat in pings if t0 - lat <= s <= t1), default=0.0)
                results.append(BodyResult(name, status, t1 - t0, stall, log.stat().st_size - size, text))
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(timeout=15)
    quiet = [lat for s, lat in pings if s < first]
    during = [lat for s, lat in pings if s >= first]
    return results, quiet, during, failures
