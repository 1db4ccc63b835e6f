"""SGLang's outlines jump-forward (its own code, fetched at run time) on the outlines shim.

SGLang 0.2's ``sglang/srt/constrained/jump_forward.py`` builds a jump-forward map from
``outlines.fsm.regex`` (``make_byte_level_fsm``, ``make_deterministic_fsm``, ``FSMInfo``) and
looks it up with the *guide's* state numbers (``RegexGuide.get_next_state``). This downloads the
sglang wheel from the package registry (nothing of it is committed), imports that module with
``import outlines`` resolved to the shim, and checks two things per regex:

* the map equals the one SGLang builds on outlines 0.0.46's own ``outlines.fsm.regex``
  (fetched the same way; see bench/outlines_regex_differential.py);
* walking the shim's ``RegexGuide`` over a text of the language, the map's jump from the guide's
  state is the rest of the forced text and ends in the state the guide reaches by reading it.

    OMP_NUM_THREADS=1 .venv/bin/python bench/sglang_jump_forward.py [--sglang 0.2.15]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

IP = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"
# (regex, a text of its language) — SGLang's own examples first
CASES = [
    (r"The google's DNS sever address is " + IP, "The google's DNS sever address is 8.8.8.8"),
    (r"霍格沃茨特快列车|霍比特人比尔博", "霍比特人比尔博"),
    (r"[-+]?[0-9]+[ ]*", "-42  "),
    (r'\{"name": "[a-z]+", "age": [0-9]+\}', '{"name": "ada", "age": 36}'),
    (r"(yes|no) sir, (yes|no) madam", "no sir, yes madam"),
    (r"(ab|cd)e{2}f and then some", "cdeef and then some"),
    (r"[^a]é😀x", "bé😀x"),
]


def sglang_jump_forward_module(version: str, workdir: Path):
    """SGLang's ``sglang.srt.constrained.jump_forward`` from its wheel, imported on the shim."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--disable-pip-version-check",
                    f"sglang=={version}", "-d", str(workdir)], check=True)
    wheel = next(workdir.glob(f"sglang-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(workdir / "src", [n for n in zf.namelist() if n.startswith("sglang/srt/constrained/")])
    sys.path.insert(0, str(workdir / "src"))
    from tokenrails.compat.outlines import install

    install()
    import outlines.caching

    outlines.caching.disable_cache()
    import sglang.srt.constrained.jump_forward as jump_forward

    return jump_forward


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang", default="0.2.15")
    args = ap.parse_args()
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-outlines-")

    import outlines_regex_differential
    from transformers import AutoTokenizer

    workdir = Path(tempfile.mkdtemp(prefix="sglang-"))
    jf = sglang_jump_forward_module(args.sglang, workdir)
    theirs = outlines_regex_differential.load_theirs()
    from outlines.fsm.guide import RegexGuide
    from outlines.models.transformers import TransformerTokenizer

    tokenizer = TransformerTokenizer(AutoTokenizer.from_pretrained(str(ROOT / "tests" / "fixtures" / "smollm2")))

    def edges(regex: str, module) -> dict:
        jf.make_byte_level_fsm, jf.make_deterministic_fsm = module.make_byte_level_fsm, module.make_deterministic_fsm
        m = jf.JumpForwardMap(regex)
        return {s: (e.symbol, e.symbol_next_state, e.byte, e.byte_next_state) for s, e in m.state_to_jump_forward.items()}

    from tokenrails.compat.outlines._vocabulary import vocabulary_for
    from tokenrails.compat.outlines.fsm import regex as ours

    same_maps = agreeing = checked = 0
    print(f"SGLang {args.sglang} jump-forward on the outlines shim ({len(CASES)} regexes)")
    for regex, text in CASES:
        mine, reference = edges(regex, ours), edges(regex, theirs)
        same_maps += mine == reference
        jf.make_byte_level_fsm, jf.make_deterministic_fsm = ours.make_byte_level_fsm, ours.make_deterministic_fsm
        jump_map = jf.JumpForwardMap(regex)
        guide = RegexGuide(regex, tokenizer)
        token_bytes = vocabulary_for(tokenizer).token_bytes
        state, done, ok = guide.initial_state, b"", True
        for token in tokenizer.tokenizer.encode(text, add_special_tokens=False):
            state = guide.get_next_state(state, token)
            done += token_bytes[token]
            forced, target = jump_map.jump_forward_symbol(state)
            if forced:  # the jump must continue the text and land where the guide lands
                checked += 1
                walked = state
                for t in tokenizer.tokenizer.encode(forced, add_special_tokens=False):
                    walked = guide.copy().get_next_state(walked, t) if walked >= 0 else walked
                good = text.encode()[len(done):].startswith(forced.encode()) and walked == target
                agreeing += good
                ok &= good
        print(f"  {regex[:48]:50s} map {'= outlines' if mine == reference else '≠ outlines'}   "
              f"jumps from guide states {'agree' if ok else 'DISAGREE'}")
    print(f"maps identical to SGLang-on-outlines-0.0.46: {same_maps}/{len(CASES)} "
          f"(the [^a]é😀x difference is the shim's byte-level fix); "
          f"jumps checked against the guide: {agreeing}/{checked} agree")


if __name__ == "__main__":
    main()
