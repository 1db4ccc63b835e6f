"""Legacy outlines code, run unchanged on the shim with the real SmolLM2-135M-Instruct model;
every output is checked against its oracle (jsonschema / re.fullmatch / the choice list)."""
from __future__ import annotations

import json
import re
import textwrap

import jsonschema
import pytest
import torch
from pydantic import BaseModel
from transformers import LogitsProcessorList

from tokenrails.compat import outlines

pytestmark = pytest.mark.slow  # runs the real model (about half a minute on one CPU thread)


class User(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def loaded():
    from tokenrails.demo_model import load_model

    torch.set_num_threads(1)
    return load_model(quiet=True)


@pytest.fixture(scope="module")
def model(loaded):
    return outlines.models.Transformers(loaded.model, loaded.tokenizer)


GREEDY = outlines.samplers.greedy()


def test_generate_json_with_a_pydantic_model(model) -> None:
    generator = outlines.generate.json(model, User, sampler=GREEDY)
    user = generator("Return a JSON user with a name and an age.\n", max_tokens=48)
    assert isinstance(user, User)
    raw = outlines.generate.json(model, json.dumps(User.model_json_schema()), sampler=GREEDY)
    data = raw("Return a JSON user with a name and an age.\n", max_tokens=48)
    jsonschema.validate(data, User.model_json_schema())


def test_generate_regex_batch(model) -> None:
    pattern = r"[0-9]{3}-[a-z]{2,3}"
    generator = outlines.generate.regex(model, pattern, sampler=GREEDY)
    out = generator(["Ticket code:", "Another ticket code:"], max_tokens=12)
    assert len(out) == 2 and all(re.fullmatch(pattern, o) for o in out), out


def test_generate_choice_and_format(model) -> None:
    choices = ["Positive", "Negative", "Neutral"]
    sentiment = outlines.generate.choice(model, choices, sampler=GREEDY)
    assert sentiment("Review: I loved this film!\nSentiment:", max_tokens=6) in choices
    number = outlines.generate.format(model, int, sampler=GREEDY)
    value = number("Question: what is 3 + 4?\nAnswer:", max_tokens=6)
    assert isinstance(value, int)


def test_generate_cfg(model) -> None:
    grammar = 'root ::= "[" num ("," num)? ("," num)? "]"\nnum ::= [1-9] [0-9]?'
    out = outlines.generate.cfg(model, grammar, sampler=GREEDY)("A short list of numbers:", max_tokens=16)
    assert re.fullmatch(r"\[[1-9][0-9]?(,[1-9][0-9]?){0,2}\]", out), out


def test_processors_with_a_transformers_model(loaded) -> None:
    """outlines 0.1 recipe: a processor passed straight to ``model.generate``."""
    tokenizer = outlines.models.TransformerTokenizer(loaded.tokenizer)
    processor = outlines.processors.JSONLogitsProcessor(User, tokenizer)
    loaded.tokenizer.padding_side = "left"
    inputs = loaded.tokenizer(["A user as JSON:", "Give one user record in JSON:"],
                              return_tensors="pt", padding=True)
    out = loaded.model.generate(**inputs, logits_processor=LogitsProcessorList([processor]),
                                max_new_tokens=48, do_sample=False,
                                eos_token_id=loaded.tokenizer.eos_token_id,
                                pad_token_id=loaded.tokenizer.pad_token_id)
    texts = loaded.tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    for text in texts:
        jsonschema.validate(json.loads(text), User.model_json_schema())

    regex_processor = outlines.processors.RegexLogitsProcessor(r"(yes|no)\.", tokenizer)
    inputs = loaded.tokenizer("Is water wet? Answer:", return_tensors="pt")
    out = loaded.model.generate(**inputs, logits_processor=LogitsProcessorList([regex_processor]),
                                max_new_tokens=5, do_sample=False,
                                eos_token_id=loaded.tokenizer.eos_token_id)
    text = loaded.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert re.fullmatch(r"(yes|no)\.", text), text


def test_outlines_1x_generator_and_model_call(loaded) -> None:
    from typing import Literal

    model = outlines.from_transformers(loaded.model, loaded.tokenizer)
    generator = outlines.Generator(model, User)
    text = generator("A user as JSON:", max_new_tokens=48, do_sample=False)
    User.model_validate_json(text)
    answer = model("Is the sky blue? Answer yes or no:", Literal["yes", "no"], max_new_tokens=4, do_sample=False)
    assert answer in ("yes", "no")
    code = model("Code:", outlines.types.Regex(r"[A-Z]{2}[0-9]{2}"), max_new_tokens=8, do_sample=False)
    assert re.fullmatch(r"[A-Z]{2}[0-9]{2}", code), code


LEGACY_SNIPPET = textwrap.dedent('''
    import outlines
    from outlines import generate, samplers
    from outlines.models.transformers import Transformers
    from outlines.fsm.guide import RegexGuide
    from pydantic import BaseModel

    class Pet(BaseModel):
        name: str
        legs: int

    model = Transformers(HF_MODEL, HF_TOKENIZER)
    pet = generate.json(model, Pet, sampler=samplers.greedy())("A pet as JSON:", max_tokens=48)
    color = generate.choice(model, ["red", "blue"], sampler=samplers.greedy())("Sky color:", max_tokens=4)
    guide = RegexGuide.from_regex(r"[0-9]+", model.tokenizer)
    first = guide.get_next_instruction(guide.initial_state).tokens
    RESULT = (pet, color, first)
''')


def test_unmodified_import_outlines_code_runs_after_install(loaded) -> None:
    outlines.install()
    try:
        scope = {"HF_MODEL": loaded.model, "HF_TOKENIZER": loaded.tokenizer}
        exec(compile(LEGACY_SNIPPET, "legacy_app.py", "exec"), scope)
        pet, color, first = scope["RESULT"]
        assert type(pet).__name__ == "Pet" and isinstance(pet.legs, int)
        assert color in ("red", "blue")
        assert {loaded.tokenizer.decode([int(t)]).strip() for t in first} <= set("0123456789") | {""}
    finally:
        outlines.uninstall()
    import sys

    assert "outlines" not in sys.modules or sys.modules["outlines"] is not outlines


def test_legacy_loader_by_path(loaded) -> None:
    model = outlines.models.transformers(loaded.path)  # 0.x: the module is callable
    assert isinstance(model, outlines.models.Transformers)
    out = outlines.generate.regex(model, r"(cat|dog)", sampler=GREEDY)("My pet is a", max_tokens=3)
    assert out in ("cat", "dog")


def test_stream_pieces_add_up_to_the_call_output(model) -> None:
    """``generator.stream``: one piece per step (a list per sequence in a batch); the pieces add up to
    what the same greedy call returns, and the text is valid."""
    pattern = r"[0-9]{3}-[a-z]{2,3}"
    generator = outlines.generate.regex(model, pattern, sampler=GREEDY)
    pieces = list(generator.stream("Ticket code:", max_tokens=12))
    assert len(pieces) > 1 and all(isinstance(p, str) for p in pieces)
    assert "".join(pieces) == generator("Ticket code:", max_tokens=12)
    assert re.fullmatch(pattern, "".join(pieces))
    outs = ["", ""]
    for step in generator.stream(["Ticket code:", "Another ticket code:"], max_tokens=12):
        assert isinstance(step, list) and len(step) == 2
        outs = [o + p for o, p in zip(outs, step)]
    assert all(re.fullmatch(pattern, o) for o in outs), outs


def test_a_stream_left_early_stops_its_generation(model) -> None:
    """A consumer that stops reading (``break``, then the generator is closed) ends the generation
    thread at its next step: it must not keep running the model unseen, nor still be inside a native
    call when the interpreter exits."""
    import threading

    generator = outlines.generate.regex(model, r"[a-z ]{200}", sampler=GREEDY)
    stream = generator.stream("Write a long sentence:", max_tokens=200)
    first = next(stream)
    assert isinstance(first, str)
    stream.close()
    assert not [t for t in threading.enumerate() if t.name == "tokenrails-outlines-stream"]
