"""The documentation-examples bench's own logic (bench/outlines_doc_examples.py): how it cuts a
markdown page into Python examples and classifies them, and how it judges an output against the
structure its example asked for. No model, no outlines, no network: a small page written here."""
from __future__ import annotations

import enum
import sys
import typing
from pathlib import Path

import pydantic
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from outlines_doc_extract import classify, fenced_blocks, page_blocks  # noqa: E402
from outlines_doc_runner import adapt_code  # noqa: E402
from outlines_doc_validate import check  # noqa: E402

PAGE = '''# A page

```bash
pip install outlines
```

```python
import outlines
from pydantic import BaseModel

class User(BaseModel):
    name: str
```

=== "tab"

    ```python title="indented"
    model = outlines.models.transformers("some/model", device="cuda")
    user = outlines.generate.json(model, User)("Describe a user:")
    ```

```python
model = outlines.models.openai("gpt-4o")
```

```python
print(model("hi"))
```

```py
answer = generator(prompt)
```

```python
>>> x = 1 +
```

```python
>>> import outlines
>>> print(outlines.types.integer)
Regex('[+-]?(0|[1-9][0-9]*)')
```

```python
from huggingface_hub import login
login()
```

```python
config = Settings()
```

```python
settings = config.copy()
```

```python
%pip install chess -q
def legal(board):
    return board
```

```python
print(legal(board))
```

```python
grammar = """
    ?start: NUMBER
    %import common.NUMBER
"""
```

```python
from .function import joke
```
'''


def test_fences_languages_and_indentation():
    blocks = fenced_blocks(PAGE)
    assert [lang for _, lang, _ in blocks] == ["bash", "python", "python", "python", "python", "py", "python",
                                               "python", "python", "python", "python", "python", "python", "python", "python"]
    indented = blocks[2][2]
    assert indented.startswith("model = outlines.models.transformers(") and "\n    " not in indented


def test_classification():
    blocks = classify(page_blocks("page.md", PAGE))
    status = [(b.status, b.reason.split(":")[0]) for b in blocks]
    assert status == [
        ("run", ""),                                  # imports, a pydantic model
        ("run", ""),                                  # transformers model + generation
        ("skipped", "another provider"),              # OpenAI
        ("skipped", "uses the OpenAI model of an earlier block"),
        ("skipped", "fragment"),                      # generator, prompt: never defined
        ("not-python", "does not parse (invalid syntax, line 1)"),
        ("run", ""),                                  # a console transcript: its code lines
        ("skipped", "needs Hugging Face login (network)"),
        ("skipped", "fragment"),                      # Settings: never defined
        ("skipped", "needs names only a skipped block defines"),
        ("run", ""),                                  # a notebook magic line is dropped
        ("skipped", "fragment"),                      # board: only a function's parameter
        ("run", ""),                                  # Lark's %import is no notebook magic
        ("skipped", "fragment"),                      # relative import
    ]
    assert blocks[-1].reason.endswith("(relative import)")
    assert "%import common.NUMBER" in blocks[-2].code
    assert "generator" in blocks[4].free_names and "prompt" in blocks[4].free_names
    assert blocks[6].code.splitlines() == ["import outlines", "print(outlines.types.integer)"]


def test_only_cuda_devices_change():
    code = 'rng = torch.Generator(device="cuda")\nm = f("org/cuda-model", device=\'cuda:0\')'
    assert adapt_code(code) == 'rng = torch.Generator(device="cpu")\nm = f("org/cuda-model", device="cpu")'


class Color(str, enum.Enum):
    red = "red"
    blue = "blue"


class Person(pydantic.BaseModel):
    name: str
    age: int


def add(a: int, b: int):
    return a + b


@pytest.mark.parametrize("request_, output, ok", [
    (("regex", r"[0-9]{3}"), "123", True),
    (("regex", r"[0-9]{3}"), "1234", False),          # fullmatch, not match
    (("choice", ["yes", "no"]), "yes", True),
    (("choice", ["yes", "no"]), "maybe", False),
    (("format", int), 3, True),
    (("format", int), "3", False),
    (("format", float), 3, True),
    (("json", Person), Person(name="a", age=1), True),
    (("json", Person), {"name": "a", "age": 1}, False),
    (("json", '{"type": "object", "required": ["a"]}'), {"a": 1}, True),
    (("json", '{"type": "object", "required": ["a"]}'), {"b": 1}, False),
    (("json", add), {"a": 1, "b": 2}, True),
    (("json", add), {"a": "x", "b": 2}, False),
    (("cfg", '?start: "a"+'), "aaa", True),
    (("cfg", '?start: "a"+'), "ab", False),
])
def test_0x_checks(request_, output, ok):
    assert (check("0.x", request_, output) is None) is ok


@pytest.mark.parametrize("output_type, text, ok", [
    (Person, '{"name": "a", "age": 1}', True),
    (Person, '{"name": "a", "age": "x"}', False),
    (Person, '{"name": "a", "age"', False),           # cut short
    (typing.Literal["yes", "no"], "no", True),
    (typing.Literal["yes", "no"], '"no"', False),     # 1.x: a Literal is plain text, not JSON
    (int, "-12", True),
    (int, "012", False),
    (float, "1.5", True),
    (bool, "True", True),
    (bool, "true", False),
    (Color, "blue", True),
    (Color, "green", False),
    (typing.List[int], "[1, 2]", True),
    (typing.Dict[int, str], '{"1": "a"}', True),
    (typing.Union[Person, typing.Literal["I don't know"]], "I don't know", True),
    (typing.Union[Person, typing.Literal["I don't know"]], '{"name": "a", "age": 2}', True),
    (typing.Union[Person, typing.Literal["I don't know"]], "no idea", False),
    (None, "anything", True),
    ({"type": "array", "items": {"type": "integer"}}, "[1, 2]", True),
    ({"type": "array", "items": {"type": "integer"}}, '["a"]', False),
    (add, '{"a": 1, "b": 2}', True),
])
def test_1x_checks(output_type, text, ok):
    assert (check("1.x", ("output_type", output_type), text) is None) is ok


def test_batches_check_every_element():
    assert check("0.x", ("choice", ["a", "b"]), ["a", "b"], batched=True) is None
    assert check("0.x", ("choice", ["a", "b"]), [["a", "b"], ["b", "c"]], batched=True) is not None


def test_unknown_output_types_are_unchecked_not_passed():
    reason = check("1.x", ("output_type", object()), "x")
    assert reason is not None and reason.startswith("unchecked")


def test_a_block_followed_by_a_traceback_documents_that_error():
    page = ('```python\n@outlines.prompt\ndef greet(name):\n    """Hi {{ surname }}"""\n```\n\n'
            '```text\nTraceback (most recent call last):\n  File "x.py", line 9, in <module>\n'
            '    return render()\njinja2.exceptions.UndefinedError: \'surname\' is undefined\n```\n\n'
            '```python\nx = 1\n```\n\n```text\n1\n```\n')
    blocks = page_blocks("p.md", page)
    assert [b.expected_error for b in blocks] == ["UndefinedError", None]


def test_a_class_field_named_like_a_parameter_is_not_a_free_name():
    page = ("```python\nclass Item(BaseModel):\n    sub: str\n\ndef show(sub):\n    print(sub)\n```\n\n"
            "```python\nclass Step(BaseModel):\n    Action: Action\n```\n")
    blocks = classify(page_blocks("p.md", page))
    assert blocks[0].free_names == ["BaseModel"]
    assert "Action" in blocks[1].free_names


def test_placeholder_values_make_a_fragment():
    blocks = classify(page_blocks("p.md", "```python\nimport outlines\nmodel = ...\nprint(model)\n```\n"))
    assert blocks[0].status == "skipped" and "placeholder" in blocks[0].reason


# --- limits: the example's own limit in full, the bench's cap otherwise, in outlines 0.x's loop too ---

import types  # noqa: E402

import outlines_doc_runner as runner  # noqa: E402
from outlines_doc_examples import outlines_too  # noqa: E402


@pytest.fixture
def token_loop(monkeypatch):
    """A stand-in ``outlines.generate.generator`` / ``.api`` pair whose loop yields 20 states,
    with the runner's token-loop cap installed on it (sys.modules restored afterwards)."""
    generator, api = types.ModuleType("outlines.generate.generator"), types.ModuleType("outlines.generate.api")

    def sequence_generator(n=20):
        yield from range(n)

    generator.sequence_generator = api.sequence_generator = sequence_generator
    monkeypatch.setitem(sys.modules, "outlines.generate.generator", generator)
    monkeypatch.setitem(sys.modules, "outlines.generate.api", api)
    monkeypatch.setattr(runner, "CAP", [5])
    monkeypatch.setattr(runner, "CAP_HITS", [])
    monkeypatch.setattr(runner, "OWN_LIMIT_HITS", [])
    runner._cap_token_loop()
    assert api.sequence_generator is generator.sequence_generator is not sequence_generator
    return generator


def test_the_cap_reaches_outlines_own_token_loop(token_loop):
    assert list(token_loop.sequence_generator()) == [0, 1, 2, 3, 4]  # no limit of its own: the cap
    assert runner.CAP_HITS == [5] and runner.OWN_LIMIT_HITS == []


def test_an_example_limit_above_the_cap_is_honoured(token_loop):
    with runner._asked(12):
        states = []
        for count, state in enumerate(token_loop.sequence_generator(), start=1):
            states.append(state)
            if count >= 12:  # the consumer (SequenceGenerator) stops at max_tokens itself
                break
    assert len(states) == 12 and runner.CAP_HITS == [] and runner.OWN_LIMIT_HITS == [12]
    with runner._asked(500):
        assert len(list(token_loop.sequence_generator())) == 20  # ended on its own: no limit reached
    assert runner.OWN_LIMIT_HITS == [12] and runner.CAP_HITS == []


def test_the_example_limit_is_read_from_keywords_or_0x_position():
    assert runner._asked_limit(("x",), {"max_tokens": 500}) == 500
    assert runner._asked_limit((), {"max_new_tokens": 7}) == 7
    assert runner._asked_limit((30,), {}, positional=True) == 30
    assert runner._asked_limit((30,), {}) is None and runner._asked_limit((True,), {}, positional=True) is None


def _result(error=None, output="x", own=(), cap_hits=0):
    result = {"records": [] if error else [{"ok": False, "unchecked": False, "reason": "invalid", "output": output,
                                            "digest": output}],
              "cap_hits": cap_hits, "own_limit_hits": list(own)}
    if error:
        result.update(error=error, error_type=error.split(":")[0])
    return result


def test_fails_on_outlines_too_needs_outlines_to_fail_and_the_same_text_at_a_limit():
    passed = {"records": [{"ok": True, "unchecked": False, "reason": None, "output": "y", "digest": "y"}]}
    assert outlines_too(_result("TypeError: f() got x"), passed, 128) is None           # the shim's
    assert "TypeError" in outlines_too(_result("TypeError: f() got x"), _result("TypeError: f() got x"), 128)
    shim = _result(output="aaaa", own=[100])
    assert outlines_too(shim, _result(output="aaaa", own=[100]), 128).startswith("outlines writes the identical")
    assert outlines_too(shim, _result(output="aaab", own=[100]), 128) is None          # another text: the shim's
    assert outlines_too(_result(output="a", cap_hits=1), _result(output="b", cap_hits=1), 128) is None
    cascade = {"error": "NameError: x", "error_type": "NameError", "after_failure": True, "records": []}
    assert "earlier block" in outlines_too(_result("ValueError: v"), cascade, 128)


def test_a_failure_of_the_page_code_at_a_limit_needs_no_identical_text():
    # a 4-token stream read five times: StopIteration whatever the text
    shim = dict(_result("StopIteration: "), own_limit_hits=[4], raw=["a"])
    assert outlines_too(shim, dict(_result("StopIteration: "), raw=["b"]), 128) is not None
    # the example's own model_validate_json on a cut text: the text is what failed
    shim = dict(_result("ValidationError: 1 validation error"), own_limit_hits=[200], raw=["a"])
    assert outlines_too(shim, dict(_result("ValidationError: 1 validation error"), raw=["b"]), 128) is None
    assert outlines_too(shim, dict(_result("ValidationError: 1 validation error"), raw=["a"]), 128) is not None


def test_0x_parsed_texts_are_digested_even_when_parsing_raises(monkeypatch):
    monkeypatch.setattr(runner, "RAW", [])

    class Inner:
        format_sequence = None

    def parse(text):
        raise ValueError(text)

    recorded = runner.RecordedGenerator(Inner(), ("json", dict))
    recorded.format_sequence = parse
    with pytest.raises(ValueError):
        recorded._inner.format_sequence('{"a": 1')
    assert runner.RAW == [runner._digest('{"a": 1')]
