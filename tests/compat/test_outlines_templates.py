"""outlines prompt templates in the shim (1.x ``Template``, 0.x ``@prompt``): docstring dedent,
word-space collapsing, Jinja block trimming, the describe-a-function filters (outlines' own
suites: bench/outlines_suites.py, test_prompts/test_templates all pass)."""

import pytest
from pydantic import BaseModel, Field

from tokenrails.compat import outlines


def test_prompt_decorator_binds_the_signature():
    @outlines.prompt
    def greet(name, punct="!"):
        """
        Hello, \
        {{ name }}{{ punct }}
        """

    assert greet("Ada") == "Hello, Ada!"
    assert greet.parameters == ["name", "punct"]
    with pytest.raises(TypeError):
        greet(nope=1)


def test_template_blocks_and_filters():
    class Answer(BaseModel):
        text: str = Field(description="the answer")
        score: int

    def tool(x: int, y: str = "a"):
        """Does a thing.

        Details."""

    tpl = outlines.Template.from_string("""
        {% for i in items %}
        - {{ i }}
        {% endfor -%}
        {{ fn | name }}({{ fn | args }}): {{ fn | description }}
        {{ model | schema }}
    """)
    out = tpl(items=[1, 2], fn=tool, model=Answer)
    assert out == ('- 1\n- 2\ntool(x: int, y: str = \'a\'): Does a thing.\n'
                   '{\n  "text": "the answer",\n  "score": "<score>"\n}')
