"""outlines' own generation loop, FSM wrappers, 1.x backends and inputs on the shim.

The loop and the backends are driven by adversarial samplers (always the allowed token the model
likes least, or a random allowed one) and checked against ``re.fullmatch`` / ``json.loads``; the
vocabulary test fails on a shim that builds guides from ``convert_token_to_string`` text."""
from __future__ import annotations

import math
import random
import re

import pytest
import torch

from tokenrails.compat import outlines
from tokenrails.compat.outlines._vocabulary import vocabulary_for
from tokenrails.compat.outlines.fsm.guide import RegexGuide
from tokenrails.compat.outlines.generate.api import SequenceGenerator
from tokenrails.compat.outlines.generate.generator import (
    bias_logits,
    sequence_generator,
    update_attention_masks,
    update_token_ids,
)
from tokenrails.compat.outlines.models.transformers import TransformerTokenizer


class RandomLogitsModel:
    """outlines 0.x's model callable: random logits, no kv cache; checks the shapes it is fed."""

    def __init__(self, tokenizer: TransformerTokenizer, seed: int):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer.tokenizer)
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, token_ids, attention_masks, kv_cache=None):
        assert token_ids.shape == attention_masks.shape
        logits = torch.randn((token_ids.shape[0], self.vocab_size), generator=self.gen)
        return logits, None


def worst_allowed(biased_logits, weights, rng):
    """The allowed token with the lowest logit, per row (never a masked one)."""
    masked = torch.where(torch.isinf(biased_logits), torch.full_like(biased_logits, math.inf), biased_logits)
    ids = masked.argmin(dim=-1, keepdim=True)
    return ids, torch.arange(biased_logits.shape[0]), weights


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return TransformerTokenizer(smollm2_tokenizer)


@pytest.mark.parametrize("seed", range(4))
def test_outlines_loop_with_adversarial_sampler_stays_in_the_language(tokenizer, seed):
    pattern = r"(-)?[1-9][0-9]{0,3}(\.[0-9]{1,2})?"
    guide = RegexGuide(pattern, tokenizer)
    generator = SequenceGenerator(guide, RandomLogitsModel(tokenizer, seed), worst_allowed, "cpu")
    texts = generator(["Number:", "Another number:"], max_tokens=20)
    assert len(texts) == 2
    for text in texts:
        assert re.fullmatch(pattern, text), text


def test_outlines_loop_step_functions_follow_ancestors():
    token_ids = torch.tensor([[1, 2], [3, 5]])
    assert torch.equal(update_token_ids(token_ids, torch.tensor([[3], [4]]), torch.tensor([1, 0])),
                       torch.tensor([[3, 5, 3], [1, 2, 4]]))
    masks = torch.tensor([[0, 1], [1, 1]])
    assert torch.equal(update_attention_masks(masks, torch.tensor([1, 1])), torch.tensor([[1, 1, 1], [1, 1, 1]]))
    logits = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    biased = bias_logits(logits, [[0, 2], None])
    assert torch.equal(biased, torch.tensor([[1.0, -math.inf, 3.0], [4.0, 5.0, 6.0]]))


def test_sequence_generator_stops_when_every_row_is_final(tokenizer):
    guide = RegexGuide("(yes|no)", tokenizer)
    states = sequence_generator(RandomLogitsModel(tokenizer, 0), worst_allowed, [guide.copy(), guide.copy()],
                                *_prompt(tokenizer, 2), rng=torch.Generator())
    steps = list(states)
    assert 1 <= len(steps) <= 4
    assert all(guide.is_final_state(s) for s in steps[-1].fsm_states)


def _prompt(tokenizer, rows):
    ids, mask = tokenizer.encode(["Answer:"] * rows)
    return ids, torch.zeros(rows), mask, [0] * rows


def test_transformer_tokenizer_guides_read_exact_token_bytes(smollm2_tokenizer, tokenizer):
    """Byte-level tokens that are part of a UTF-8 character: ``convert_token_to_string`` gives
    U+FFFD for them, the guide must see their real bytes (same vocabulary as the raw tokenizer)."""
    wrapped = vocabulary_for(tokenizer)
    raw = vocabulary_for(smollm2_tokenizer)
    assert wrapped.token_bytes == raw.token_bytes
    partial = [i for i, b in enumerate(raw.token_bytes) if b and b[0] >= 0x80 and not _decodes(b)]
    assert partial, "SmolLM2 has byte tokens that are not whole characters"
    assert all(wrapped.token_bytes[i] == raw.token_bytes[i] for i in partial[:50])


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_transformer_tokenizer_equality_is_by_content(smollm2_tokenizer):
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(smollm2_tokenizer.name_or_path)
    first, second = TransformerTokenizer(smollm2_tokenizer), TransformerTokenizer(again)
    assert first == second and hash(first) == hash(second)
    again.add_tokens(["<tokenrails_test_token>"])
    assert TransformerTokenizer(again) != first
    clone = TransformerTokenizer.__new__(TransformerTokenizer)
    clone.__setstate__(first.__getstate__())
    assert clone == first


def test_spiece_word_start_keeps_its_space(tokenizer):
    assert tokenizer.convert_token_to_string("\u2581hello").startswith(" ")


def test_fsm_wrappers_warn_and_walk(tokenizer):
    from tokenrails.compat.outlines.fsm import fsm as fsm_module

    with pytest.warns(UserWarning):
        fsm = fsm_module.RegexFSM("[0-9]{2}", tokenizer)
    state = fsm.start_state
    for _ in range(2):
        allowed = fsm.allowed_token_ids(state)
        digits = [t for t in allowed if re.fullmatch("[0-9]", tokenizer.tokenizer.decode([t]))]
        assert digits and all(re.fullmatch("[0-9]+", tokenizer.tokenizer.decode([t])) for t in allowed)
        state = fsm.next_state(state, digits[0])
    assert fsm.is_final_state(state)
    assert fsm.next_state(state, tokenizer.eos_token_id) in fsm.final_states
    with pytest.warns(UserWarning):
        eos = fsm_module.StopAtEosFSM(tokenizer)
    assert eos.allowed_token_ids(eos.start_state) is None
    assert eos.next_state(eos.start_state, tokenizer.eos_token_id) == eos.final_state


def test_ready_made_grammars_are_lark_and_parse_with_lark():
    lark = pytest.importorskip("lark")
    grammars = outlines.grammars
    text = '{"a": [1, -2.5e3, "x\\"y"], "b": null, "c": true}'
    lark.Lark(grammars.json, parser="lalr", import_paths=[grammars.GRAMMAR_PATH]).parse(text)
    lark.Lark(grammars.arithmetic, parser="lalr", import_paths=[grammars.GRAMMAR_PATH]).parse("(1 * 2) - -3.5")
    assert grammars.check_ebnf(grammars.json_ebnf) == grammars.json_ebnf
    with pytest.raises(Exception):
        grammars.check_ebnf(grammars.json)


def test_cfg_guide_on_the_lark_json_grammar_accepts_json(smollm2_tokenizer):
    guide = outlines.fsm.guide.CFGGuide(outlines.grammars.json, smollm2_tokenizer)
    assert guide.compiled.backend == "llguidance"
    rng = random.Random(0)
    state = guide.initial_state
    text = ""
    for _ in range(30):  # random allowed tokens: whatever is produced must stay a JSON prefix
        allowed = [t for t in guide.get_next_instruction(state).tokens.tolist() if t != smollm2_tokenizer.eos_token_id]
        if not allowed or guide.is_final_state(state):
            break
        token = rng.choice(allowed)
        text += smollm2_tokenizer.decode([token])
        state = guide.get_next_state(state, token)
    assert text.strip()[:1] in '{["-0123456789tfn', text


def test_backends_by_name_and_their_errors(tokenizer):
    class Model:  # what a backend needs of a model
        tensor_library_name = "torch"

    model = Model()
    model.tokenizer = tokenizer
    from tokenrails.compat.outlines import backends

    for name, cls in [("outlines_core", backends.OutlinesCoreBackend), ("xgrammar", backends.XGrammarBackend),
                      ("llguidance", backends.LLGuidanceBackend), ("tokenrails", backends.TokenrailsBackend)]:
        assert isinstance(backends._get_backend(name, model), cls)
    with pytest.raises(ValueError, match="not supported"):
        backends._get_backend("nope", model)
    with pytest.raises(NotImplementedError, match="Outlines Core does not support context-free grammar"):
        backends.get_cfg_logits_processor("outlines_core", model, 'start: "a"')


@pytest.mark.parametrize("backend", ["outlines_core", "xgrammar", "llguidance", "tokenrails"])
def test_backend_processors_with_random_logits_stay_in_the_language(tokenizer, backend):
    class Model:
        tensor_library_name = "torch"

    model = Model()
    model.tokenizer = tokenizer
    from tokenrails.compat.outlines import backends

    pattern = r"[0-9]{3}"
    processor = backends.get_regex_logits_processor(backend, model, pattern)
    vocab = len(tokenizer.tokenizer)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, 5), generator=gen)
    for _ in range(6):
        logits = processor(ids, torch.randn((2, vocab), generator=gen))
        nxt = logits.argmax(dim=-1, keepdim=True)
        assert not torch.isinf(logits.gather(1, nxt)).any()
        ids = torch.cat([ids, nxt], dim=-1)
        if (nxt == tokenizer.eos_token_id).all():
            break
    for row in ids[:, 5:].tolist():
        text = tokenizer.tokenizer.decode([t for t in row if t != tokenizer.eos_token_id])
        assert re.fullmatch(pattern, text), (backend, text)


_JAX_ROUND_TRIP = """
import jax.numpy as jnp
from tokenrails.compat.outlines.processors.base_logits_processor import OutlinesLogitsProcessor

class Double(OutlinesLogitsProcessor):
    def process_logits(self, input_ids, logits):
        return logits * 2

data = jnp.array([[1, 2], [3, 4]], dtype=jnp.float32)
out = Double()(data, data)
assert type(out) is type(data), (type(out), type(data))
assert out.tolist() == [[2, 4], [6, 8]], out.tolist()
print("JAX_OK")
"""


def test_jax_arrays_round_trip_through_a_processor():
    """In its own interpreter: JAX starts threads on import, and the rest of the suite forks
    (LMDeploy's engines and servers), which JAX warns may deadlock."""
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax not installed")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
               JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _JAX_ROUND_TRIP], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "JAX_OK" in proc.stdout, proc.stderr[-4000:]


def test_inputs_and_type_adapter(smollm2_tokenizer):
    from PIL import Image as PILImage

    from tokenrails.compat.outlines.inputs import Chat, Image
    from tokenrails.compat.outlines.models.transformers import TransformersTypeAdapter

    image = PILImage.new("RGB", (4, 4))
    with pytest.raises(TypeError, match="format"):
        Image(image)
    image.format = "PNG"
    assert Image(image).image_format == "image/png"
    chat = Chat()
    chat.add_system_message("Be brief.")
    chat.add_user_message("Hi")
    assert [m["role"] for m in chat.messages] == ["system", "user"] and chat.pop()["content"] == "Hi"
    adapter = TransformersTypeAdapter(smollm2_tokenizer)
    with pytest.raises(TypeError, match="is not available"):
        adapter.format_input(["look", Image(image)])
    adapter.has_chat_template = False
    assert adapter.format_input("plain") == "plain"
    adapter.has_chat_template = True
    assert "plain" in adapter.format_input("plain") and adapter.format_input("plain") != "plain"


def test_set_additional_properties_false_reaches_nullable_objects():
    from tokenrails.compat.outlines.models.utils import set_additional_properties_false_json_schema

    schema = {"type": "object", "properties": {"a": {"type": ["object", "null"], "properties": {}},
                                               "k": {"type": "string", "const": "object"}}}
    out = set_additional_properties_false_json_schema(schema)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in out["properties"]["k"]


def test_function_download_checks_the_path():
    from tokenrails.compat.outlines.function import download_from_github, extract_function_from_file

    with pytest.raises(ValueError, match="Please provide"):
        download_from_github("user/program")
    with pytest.raises(ValueError, match="Do not append"):
        download_from_github("user/repo/program.py")
    with pytest.raises(AttributeError, match="Could not find"):
        extract_function_from_file("x = 1\n", "fn")
    assert extract_function_from_file("def fn():\n    return 7\n", "fn")() == 7


def test_to_regex_is_outlines_core_for_one_node():
    from outlines_core.json_schema import INTEGER

    assert outlines.fsm.json_schema.to_regex(None, {"type": "integer"}) == INTEGER
    assert re.fullmatch(INTEGER, "-12") and not re.fullmatch(INTEGER, "012")



FSM_PATTERNS = [r"a b c d e", r"(123456789)|(abcdefghijklmnop)", r"([a-z]{3})@([a-z]{2})\.([a-z]{3})",
                r"[^a-c]x*|ab+", r"(ab|a)*c?", r"-?[0-9]+(\.[0-9]+)?", r"[\]\-^]+\\"]


@pytest.mark.parametrize("pattern", FSM_PATTERNS)
def test_interegular_fsm_to_regex_keeps_the_language(pattern):
    """Oracle: the FSM's own ``accepts``, on strings of the language and random strings."""
    interegular = pytest.importorskip("interegular")
    from hypothesis import given, settings, strategies as st

    from tokenrails.compat.outlines.fsm.fsm_regex import fsm_to_regex

    fsm = interegular.parse_pattern(pattern).to_fsm().reduce()
    regex = fsm_to_regex(fsm)

    @settings(max_examples=150, deadline=None, database=None)
    @given(st.one_of(st.from_regex(pattern, fullmatch=True), st.text(alphabet="abcx-.019@ \n]^\\", max_size=10)))
    def same(text):
        assert bool(re.fullmatch(regex, text)) == fsm.accepts(text), (regex, text)

    same()


def test_generate_fsm_follows_the_automaton(tokenizer):
    interegular = pytest.importorskip("interegular")

    class Model:  # generate.* needs only the tokenizer to build the processor
        pass

    model = Model()
    model.tokenizer = tokenizer
    generator = outlines.generate.fsm(model, interegular.parse_pattern(r"[0-9]{2}-[a-z]").to_fsm())
    guide = generator.logits_processor.guide
    generated = SequenceGenerator(guide, RandomLogitsModel(tokenizer, 3), worst_allowed, "cpu")("Code:", max_tokens=10)
    assert re.fullmatch(r"[0-9]{2}-[a-z]", generated), generated


def _cfg_accepts(grammar: str, text: str, hf_tokenizer) -> bool:
    guide = outlines.fsm.guide.CFGGuide(grammar, hf_tokenizer)
    state = guide.initial_state
    for token in hf_tokenizer.encode(text, add_special_tokens=False):
        state = guide.get_next_state(state, token)
        if state == -1:
            return False
    return guide.can_terminate_state(state)


@pytest.mark.parametrize("grammar, texts", [
    ('start: LETTER+\nLETTER: "a"\nWS: " "\n%ignore WS\n', ["aa", "a a", " a", "  a a ", "b", " "]),
    # nothing can follow "]": an ignored terminal after it only by the rewritten start
    ('start: "[" "]"\n%import common.WS\n%ignore WS\n', ["[]", " [] ", "[ ]  ", "[]\n", "[] ]", "  "]),
])
def test_lark_ignored_terminals_may_come_first_and_last_as_in_lark(grammar, texts, smollm2_tokenizer):
    """Lark accepts %ignore'd terminals before the first token and after the last; llguidance
    alone only between tokens."""
    lark = pytest.importorskip("lark")
    parser = lark.Lark(grammar, parser="lalr")
    for text in texts:
        try:
            parser.parse(text)
            expected = True
        except lark.exceptions.LarkError:
            expected = False
        assert _cfg_accepts(grammar, text, smollm2_tokenizer) == expected, text
    rewritten = outlines.grammars.edge_ignores('start: "start" /start/ // start\nWS: " "\n%ignore WS\n')
    assert '"start" /start/ // start' in rewritten and rewritten.startswith("start: (WS)* ")


def _outlines_json_string(text: str) -> bool:
    """Oracle, outlines' ``common.ESCAPED_STRING`` in words: a quote; then characters that are
    neither a quote, a backslash nor a control character (C0, DEL, C1), or a backslash followed by
    any character but a control character; a closing quote."""
    control = lambda c: ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F  # noqa: E731
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        return False
    i, body = 0, text[1:-1]
    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 == len(body) or control(body[i + 1]):
                return False
            i += 2
        elif c == '"' or control(c):
            return False
        else:
            i += 1
    return True


class _Chars:
    """outlines' tokenizer interface: one token per character (EOS = 0)."""

    special_tokens = {"<eos>"}
    eos_token_id = 0

    def __init__(self, chars: str):
        self.vocabulary = {"<eos>": 0, **{c: i + 1 for i, c in enumerate(chars)}}

    def convert_token_to_string(self, token: str) -> str:
        return token


_STRING_ALPHABET = '"\\a\u00e9 \n\t\x00\x7f\x85/'


def test_common_imports_mean_outlines_common_grammar():
    """outlines' CFGGuide read ``%import common.X`` from outlines' own common grammar, whose
    strings differ from Lark's (no control characters; a backslash escapes any other character):
    every string up to 5 characters over quotes, backslashes, control and ordinary characters is
    accepted exactly when the oracle accepts it, through a plain, a renamed and a grouped import."""
    import itertools

    tokenizer = _Chars(_STRING_ALPHABET)
    grammars = ['start: ESCAPED_STRING\n%import common.ESCAPED_STRING\n',
                'start: S\n%import common.ESCAPED_STRING -> S\n',
                'start: ESCAPED_STRING WS?\n%import common (WS, ESCAPED_STRING)\n']
    for grammar in grammars:
        guide = outlines.fsm.guide.CFGGuide(grammar, tokenizer)
        checked = 0
        for n in range(2, 6):
            for chars in itertools.product(_STRING_ALPHABET, repeat=n - 2):
                text = '"' + "".join(chars) + '"'
                state = guide.initial_state
                for c in text:
                    state = guide.get_next_state(state, tokenizer.vocabulary[c])
                accepted = state != -1 and guide.can_terminate_state(state)
                assert accepted == _outlines_json_string(text), (grammar, text)
                checked += 1
        assert checked > 1000
    # outlines 1.x hands grammars to llguidance as they are: its common is kept there
    assert "%import common.ESCAPED_STRING" in outlines.grammars.grammar_spec(grammars[0]).payload


class _CharTokenizer:
    """outlines' tokenizer interface: one token per character, EOS last."""

    def __init__(self, chars: str):
        self.vocabulary = {c: i + 1 for i, c in enumerate(chars)}
        self.eos_token_id = len(chars) + 1
        self.vocabulary["<eos>"] = self.eos_token_id
        self.special_tokens = {"<eos>"}

    def convert_token_to_string(self, token):
        return token


def test_paths_to_one_automaton_state_share_an_id_and_the_state_space_stays_finite():
    tokenizer = _CharTokenizer("abc")
    guide = RegexGuide("(ab)*c?", tokenizer)
    a, b = tokenizer.vocabulary["a"], tokenizer.vocabulary["b"]
    state = guide.initial_state
    for _ in range(50):  # 100 tokens around the loop: still the same two states
        state = guide.get_next_state(guide.get_next_state(state, a), b)
        assert state == guide.initial_state
    assert len(guide.states) == 2
    maps = guide.states_to_token_maps
    assert maps == {0: {a: 1, tokenizer.vocabulary["c"]: 2}, 1: {b: 0}}
    # every listed transition is what walking the guide gives
    for source, row in maps.items():
        for token, target in row.items():
            assert guide.get_next_state(source, token) == target


def test_states_to_token_maps_numbers_breadth_first():
    tokenizer = _CharTokenizer("1a")
    guide = RegexGuide("[1-9]", tokenizer)
    assert guide.states_to_token_maps == {0: {1: 1}}  # outlines' own example
    assert guide.is_final_state(1) and not guide.is_final_state(0)
