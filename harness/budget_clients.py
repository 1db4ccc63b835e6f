"""Real client libraries asking for a structured answer at a tight ``max_tokens``, with and without
the budget key: what the client test and ``bench/budget_engine.py --clients`` send.

A schema with free-text fields: a small model writes strings until the budget runs out, so
without the rule the clients raise on the truncated JSON (openai ``LengthFinishReasonError``,
instructor's incomplete output, LangChain's parser). The budget key goes in as the request's
whole ``response_format`` (``extra_body``, the way each client passes extra request fields), the
same format the client builds itself plus ``tokenrails_budget``, so the client still parses the
answer with its own model.
"""
from __future__ import annotations

from typing import Any, Callable

from pydantic import BaseModel, Field

MAX_TOKENS = 48
PROMPT = ("Review the film 'The Matrix' in detail: a title, a long summary of the plot, the pros and the cons "
          "and a rating from 1 to 5. Answer in JSON.")


class Review(BaseModel):
    """A film review with free-text fields."""

    title: str
    summary: str
    pros: list[str]
    cons: list[str]
    rating: int = Field(ge=1, le=5)


def budget_format(model: type[BaseModel] = Review) -> dict:
    """The ``response_format`` the openai SDK builds for ``model``, plus the budget key."""
    from openai.lib._parsing._completions import type_to_response_format_param

    return {**type_to_response_format_param(model), "tokenrails_budget": "close"}


def _extra(budget: bool) -> dict:
    return {"extra_body": {"response_format": budget_format()}} if budget else {}


def openai_parse(base_v1: str, model_id: str, budget: bool) -> Review:
    import openai

    client = openai.OpenAI(base_url=base_v1, api_key="none", max_retries=0, timeout=300)
    done = client.beta.chat.completions.parse(
        model=model_id, messages=[{"role": "user", "content": PROMPT}], response_format=Review,
        temperature=0, max_tokens=MAX_TOKENS, **_extra(budget))
    parsed = done.choices[0].message.parsed
    if not isinstance(parsed, Review):
        raise AssertionError(f"openai parse returned {parsed!r}")
    return parsed


def instructor_create(base_v1: str, model_id: str, budget: bool) -> Review:
    import instructor
    import openai

    client = instructor.from_openai(openai.OpenAI(base_url=base_v1, api_key="none", max_retries=0, timeout=300),
                                    mode=instructor.Mode.JSON_SCHEMA)
    return client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}],
                                          response_model=Review, temperature=0, max_tokens=MAX_TOKENS,
                                          max_retries=0, **_extra(budget))


def langchain_invoke(base_v1: str, model_id: str, budget: bool) -> Review:
    import langchain_openai

    chat = langchain_openai.ChatOpenAI(base_url=base_v1, api_key="none", model=model_id, temperature=0,
                                       max_tokens=MAX_TOKENS, max_retries=0, timeout=300,
                                       extra_body=_extra(budget).get("extra_body"))
    parsed = chat.with_structured_output(Review, method="json_schema").invoke(PROMPT)
    if not isinstance(parsed, Review):
        raise AssertionError(f"LangChain parsed {parsed!r}")
    return parsed


CLIENTS: dict[str, Callable[[str, str, bool], Any]] = {
    "openai beta.chat.completions.parse": openai_parse,
    "instructor Mode.JSON_SCHEMA": instructor_create,
    "LangChain with_structured_output(json_schema)": langchain_invoke,
}
