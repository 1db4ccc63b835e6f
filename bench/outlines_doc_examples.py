"""outlines' documentation examples, run on tokenrails' outlines shim (issue 28).

What is fetched, at run time (nothing of outlines is committed here): the source distribution
of each outlines version from the package registry (``pip download --no-binary :all:``, cached,
the same ``fetch`` as ``bench/outlines_suites.py``). All three default versions ship their whole
documentation in the sdist, so nothing else is needed and nothing was unreachable:

* 0.0.46: ``README.md``, ``docs/`` (quickstart, reference, cookbook);
* 0.1.14: ``README.md``, ``docs/`` (quickstart, reference incl. ``generation/``, cookbook);
* 1.3.3 (the newest 1.3.x): ``README.md``, ``docs/`` (guide, features, examples = the cookbook).

Pages under ``docs/community/`` (contributing), ``docs/blog/`` and ``docs/api*/`` are left out
(no user examples), as are the ``examples/*.py`` scripts (programs, not documentation; most use
llama.cpp, vLLM or deployment platforms).

How (``bench/outlines_doc_extract.py``, ``outlines_doc_runner.py``, ``outlines_doc_validate.py``):
each page's Python code blocks run in order in one namespace, like a notebook, in a child
process where ``import outlines`` is the shim (installed as ``bench/outlines_shim_plugin.py``
does, told which version it stands in for: ``TOKENRAILS_OUTLINES_API``). The only change to an
example is its model: every Hugging Face hub name loads the
embedded SmolLM2-135M-Instruct (``tokenrails.demo_model``), whether through
``models.transformers("...")`` or ``from_transformers(AutoModelForCausalLM.from_pretrained("..."),
...)``, and CUDA devices become the CPU. A page that uses ``model`` without building one gets
that model (the docs' "assume a model"). Blocks for other providers (OpenAI, vLLM, llama.cpp,
MLX, API clients...), blocks needing what this machine lacks (network, GPU, deployment
platforms, images/PDFs) and fragments (names no block of the page defines) are skipped, each with
its reason. A block is an *example* when it generated through outlines' public API
(``generate.*``, ``Generator``, ``model(prompt, output_type)``) or raised; blocks that only define
things are setup. Every generation is checked against the structure its example asked for
(pydantic, jsonschema, ``re.fullmatch``, membership, ``int``/``float``/``bool`` parsing, Lark for
CFGs); a block passes when it ran without an exception and every output fits. Each block starts
from torch seed 0 and has ``--timeout`` seconds. A limit the example sets (``max_tokens`` /
``max_new_tokens``) is part of the example and is honoured in full; a generation whose example
sets none gets at most ``--cap`` new tokens — in transformers' ``generate`` and in outlines 0.x's
own token loop alike (what 0.0.x's ``generate.*`` run). A failure says when a generation ran to
the bench's cap or to the example's own limit.

*Runnable* (the denominator): an example outlines itself can run to a valid output on this
machine. ``--real`` runs every page with a failure again on outlines itself, same version, same
model, seed and limits (its sdist first on ``sys.path``, the libraries it pins installed by pip
``--no-deps --target`` into the cache, never into the venv and never torch). A block the shim
failed is *not runnable* — listed apart as "fails on outlines too", with outlines' own error —
when outlines fails it too; when the failure is the model running to a token limit, only if
outlines wrote the identical text (whole-output digests), else it counts against the shim.
Without ``--real`` every failure counts against the shim. outlines 0.0.46 runs with one
adaptation of the machine: its loop reorders the KV cache as transformers 4's tuple of tuples,
which transformers 5 no longer returns, so a ``Cache`` object is reordered by its own
``reorder_cache`` (``outlines_doc_runner._cache_object_reorder``).

    OMP_NUM_THREADS=1 .venv/bin/python bench/outlines_doc_examples.py [--versions 0.0.46,0.1.14,1.3.3]
        [--limit N] [--pages REGEX] [--cap 128] [--timeout 240] [--real] [--verbose] [--save FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from outlines_doc_extract import extract  # noqa: E402
from outlines_suites import CACHE, fetch, package_root  # noqa: E402

VERSIONS = ["0.0.46", "0.1.14", "1.3.3"]
# what each version's own import needs beyond the venv (pinned as each version pinned them)
REAL_LIBS = {"0.0.46": ["numpy==1.26.4", "numba==0.60.0", "llvmlite==0.43.0", "nest_asyncio"],  # numpy < 2
             "0.1.14": ["outlines_core==0.1.26", "genson", "nest_asyncio"],
             "1.3.3": ["genson"]}


def api_of(version: str) -> str:
    return "1.x" if int(version.split(".")[0]) >= 1 else "0.x"


def real_sys_path(version: str) -> list[str]:
    target = CACHE.parent / f"outlines-{version}-doclibs"
    if not (target / ".done").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", str(target), *REAL_LIBS.get(version, [])], check=True)
        (target / ".done").write_text("")
    return [str(package_root(version)), str(target)]


def run_blocks(version: str, pages: list[dict], mode: str, cap: int, timeout: int, verbose: bool) -> dict[str, dict]:
    """Run ``pages`` in child processes (a new one after a crash or hang); ``{ident: result}``."""
    work = Path(tempfile.mkdtemp(prefix=f"outlines-docs-{version}-{mode}-"))
    job = {"version": version, "api": api_of(version), "mode": mode, "cap": cap, "timeout": timeout,
           "pages": pages, "sys_path": real_sys_path(version) if mode == "real" else []}
    (work / "job.json").write_text(json.dumps(job))
    results_path = work / "results.jsonl"
    # the shim follows the behaviour of the outlines version it stands in for (0.0.x's stopping rule)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               TOKENRAILS_OUTLINES_API=version,
               PYTHONPATH=os.pathsep.join([str(ROOT / "bench"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    order = [b["ident"] for p in pages for b in p["blocks"] if b["run"]]
    page_of = {b["ident"]: p["page"] for p in pages for b in p["blocks"]}
    for _attempt in range(len(order) + 1):
        budget = timeout * (len(order) + 2)
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "outlines_doc_runner.py"), str(work / "job.json"),
                               str(results_path)], env=env, capture_output=True, text=True, timeout=budget)
        results = _read(results_path)
        missing = [i for i in order if i not in results]
        if not missing:
            break
        # the child died inside the first missing block: that block failed; the rest of its page
        # lost its namespace and is not counted (each such block is reported as not run)
        crashed = missing[0]
        tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        lines = [{"ident": crashed, "page": page_of[crashed], "records": [], "cap_hits": 0,
                  "error": f"the process died: {tail[0][:200]}", "error_type": "Crash", "after_failure": False}]
        lines += [{"ident": i, "page": page_of[i], "not_run": "its page's process died in an earlier block"}
                  for i in missing[1:] if page_of[i] == page_of[crashed]]
        with results_path.open("a") as fh:
            for line in lines:
                fh.write(json.dumps(line) + "\n")
        if verbose:
            print(f"  [{mode}] child died in {crashed}: {tail[0][:200]}", file=sys.stderr)
    results = _read(results_path)
    shutil.rmtree(work, ignore_errors=True)
    return results


def _read(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    return {r["ident"]: r for r in map(json.loads, path.read_text().splitlines())}


def outcome(result: dict, cap: int) -> tuple[str, str]:
    """("passed" | "failed" | "setup" | "cascade" | "not-run", reason) of one block's result."""
    if "not_run" in result:
        return "not-run", result["not_run"]
    capped = " (a generation reached the bench's token cap)" if result.get("cap_hits") else (
        f" (a generation ran to the example's own {result['own_limit_hits'][0]}-token limit)"
        if result.get("own_limit_hits") else "")
    expected = result.get("expected_error")
    if expected and result.get("error_type") == expected:
        return "passed", ""  # the page shows this very exception
    if expected and "error" not in result:
        return "failed", f"the page shows {expected} raised; nothing was raised"
    if "error" in result:
        if result.get("after_failure") and result.get("error_type") == "NameError":
            return "cascade", "needs what a failed earlier block of its page should have defined"
        return "failed", result["error"] + capped
    bad = [r for r in result["records"] if not r["ok"] and not r["unchecked"]]
    if bad:
        return "failed", bad[0]["reason"] + capped
    if not result["records"]:
        return "setup", ""
    return "passed", ""


def select(pages: dict, pattern: str | None, limit: int | None) -> list[dict]:
    out, n = [], 0
    for page, blocks in pages.items():
        if pattern and not re.search(pattern, page):
            continue
        if limit is not None and n >= limit:
            break
        out.append({"page": page, "blocks": [{"ident": b.ident, "code": b.code, "run": b.status == "run",
                                              "expected_error": b.expected_error, "assumes": b.assumes} for b in blocks]})
        n += sum(b.status == "run" for b in blocks)
    return out


# exceptions an example raises while reading the generated text (its own ``model_validate_json``,
# ``json.loads``, a parse): the text is what failed, as with an output the bench's check refused
TEXT_ERRORS = {"ValidationError", "JSONDecodeError", "ValueError", "UnexpectedCharacters", "UnexpectedToken",
               "UnexpectedEOF", "UnexpectedInput"}


def _outputs(result: dict) -> list[str]:
    """Digests of every generated text of a block: the outputs checked, and the raw texts a 0.x
    generator parsed (present even when parsing raised)."""
    return [r.get("digest", r["output"]) for r in result.get("records", [])] + result.get("raw", [])


def about_the_text(result: dict) -> bool:
    """Did the block fail because of the text generated (an invalid output, or an exception raised
    reading it), rather than because of the page's code?"""
    bad = [r for r in result.get("records", []) if not r["ok"] and not r["unchecked"]]
    return bool(bad) if "error" not in result else result.get("error_type") in TEXT_ERRORS


def outlines_too(shim: dict, real: dict, cap: int, earlier: str = "") -> str | None:
    """Why a block the shim failed is not runnable — outlines itself, same version, same machine,
    model, seed and limits, fails it too — or ``None`` (the failure counts against the shim).

    * The page's code fails on outlines too (an exception, or an invalid output): not runnable.
    * The model running to a token limit (the example's own, or the bench's cap) and the text
      failing for it: only when outlines wrote the identical text (whole-output digests equal),
      as the shim's output is then outlines' own; a different text counts against the shim.
    * A block outlines cannot reach because it fails an earlier block of the page (``earlier``:
      that block and its error): the page's code does not run on outlines this far."""
    kind, reason = outcome(real, cap)
    if kind == "cascade":
        return f"outlines fails an earlier block of the page ({earlier or '?'}), so this one cannot run there"
    if kind != "failed":
        return None
    same = bool(_outputs(shim)) and _outputs(shim) == _outputs(real)
    if about_the_text(shim):
        if shim.get("cap_hits") or shim.get("own_limit_hits"):
            return f"outlines writes the identical text and fails the same way: {reason}" if same else None
        return f"{reason} ({'the identical text' if same else 'another text'})" if _outputs(shim) else reason
    return reason


def _first_failure(page: dict, real: dict, cap: int) -> str:
    """The first block of ``page`` that outlines itself failed, and its error (``"#0: ImportError: ..."``)."""
    for block in page["blocks"]:
        result = real.get(block["ident"])
        if result is not None and outcome(result, cap)[0] == "failed":
            return f"#{block['ident'].split('#')[1].split('@')[0]}: {outcome(result, cap)[1][:120]}"
    return ""


def report(version: str, pages: dict, selected: list[dict], results: dict, real: dict | None, cap: int,
           verbose: bool) -> dict:
    """Per-version figures: passed / runnable, where *runnable* leaves out the blocks outlines itself
    fails (``outlines_too``; only known when ``--real`` ran them), each listed with its evidence."""
    chosen = {p["page"] for p in selected}
    skipped = Counter()
    for page, blocks in pages.items():
        if page in chosen:
            for b in blocks:
                if b.status == "skipped":
                    skipped[re.sub(r": .*", "", b.reason) if b.reason.startswith("fragment") else b.reason] += 1
    counts, failures, excluded, after = Counter(), [], [], []
    for p in selected:
        for b in p["blocks"]:
            if b["ident"] not in results:
                continue
            kind, reason = outcome(results[b["ident"]], cap)
            if kind == "failed" and real is not None and b["ident"] in real:
                why = outlines_too(results[b["ident"]], real[b["ident"]], cap, _first_failure(p, real, cap))
                if why is not None:
                    kind = "outlines-too"
                    excluded.append(f"{b['ident']}: shim: {reason} | outlines {version}: {why}")
            counts[kind] += 1
            if kind in ("cascade", "not-run"):
                after.append(f"{b['ident']}: {reason}")
            if kind == "failed":
                if real is None:
                    note = " | outlines: not run (no --real)"
                elif b["ident"] not in real:
                    note = " | outlines: not run"
                else:
                    rk, rr = outcome(real[b["ident"]], cap)
                    note = f" | outlines {version}: {rk}{': ' + rr if rr else ''}"
                failures.append(f"{b['ident']}: {reason}{note}")
            elif verbose and kind == "passed":
                print(f"  pass {b['ident']} ({results[b['ident']].get('seconds')} s)")
    runnable = counts["passed"] + counts["failed"]
    pct = 100 * counts["passed"] / runnable if runnable else 0.0
    print(f"\n== outlines {version}: passed {counts['passed']} / runnable {runnable} ({pct:.1f} %); "
          f"failed on the shim {counts['failed']}; fails on outlines too (not runnable) {counts['outlines-too']}"
          + ("" if real is not None else " (not known: no --real)")
          + f"; setup blocks {counts['setup']}, after a failure {counts['cascade']}, not run {counts['not-run']}, "
          f"skipped {sum(skipped.values())}")
    for line in failures:
        print(f"  FAIL {line}")
    for line in excluded:
        print(f"  OUTLINES-TOO {line}")
    for line in after:
        print(f"  NOT-COUNTED {line}")
    for why, n in skipped.most_common():
        print(f"  skipped {n:3d}: {why}")
    return {"runnable": runnable, "passed": counts["passed"], "failed": counts["failed"],
            "outlines_too": counts["outlines-too"], "skipped": sum(skipped.values()), "failures": failures,
            "excluded": excluded, "not_counted": after, "skipped_reasons": dict(skipped)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--versions", default=",".join(VERSIONS))
    ap.add_argument("--limit", type=int, default=None, help="at most about N runnable blocks per version (whole pages)")
    ap.add_argument("--pages", default=None, help="regex on page paths (README.md, docs/...)")
    ap.add_argument("--cap", type=int, default=128, help="new tokens per generation at most")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per block")
    ap.add_argument("--real", action="store_true", help="run pages with failures on outlines itself too")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--save", type=Path, default=None, help="write every block's result (JSON) here")
    args = ap.parse_args()
    summary, saved = {}, {}
    for version in args.versions.split(","):
        t0 = time.perf_counter()
        pages = extract(fetch(version))
        selected = select(pages, args.pages, args.limit)
        results = run_blocks(version, selected, "shim", args.cap, args.timeout, args.verbose)
        real = None
        if args.real:
            failed_pages = {results[b["ident"]]["page"] for p in selected for b in p["blocks"]
                            if b["ident"] in results and outcome(results[b["ident"]], args.cap)[0] == "failed"}
            real = run_blocks(version, [p for p in selected if p["page"] in failed_pages], "real", args.cap,
                              args.timeout, args.verbose) if failed_pages else {}
        summary[version] = report(version, pages, selected, results, real, args.cap, args.verbose)
        summary[version]["seconds"] = round(time.perf_counter() - t0)
        saved[version] = {"shim": results, "real": real}
        print(f"  ({summary[version]['seconds']} s)")
    if args.save:
        args.save.write_text(json.dumps(saved, indent=1))
    print("\n" + json.dumps({v: {k: s[k] for k in ("passed", "runnable", "failed", "outlines_too", "skipped")}
                             for v, s in summary.items()}))


if __name__ == "__main__":
    main()
