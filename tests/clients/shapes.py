"""The pydantic models and prompts the client tests send: what a user's code would declare.

Values are bounded (``le``, enums) where the small model would otherwise write digits until
``max_tokens`` (a truncated answer is a different issue: these tests measure what is served).
"""
from __future__ import annotations

import enum
from typing import Literal, Optional

from pydantic import BaseModel, Field


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    city: str
    zip_code: Optional[str] = None


class Person(BaseModel):
    """Nested model, enum, Optional and list: the shapes ``chat.completions.parse`` users write."""

    name: str
    age: int = Field(ge=0, le=120)
    favourite: Color
    tags: list[str] = Field(max_length=3)
    address: Address


class City(BaseModel):
    """A city and its country."""

    name: str
    country: str
    population: int = Field(ge=0, le=50_000_000)


class CityMaybe(BaseModel):
    """For JSON mode, where the server guarantees JSON, not the keys: every key may be missing."""

    name: Optional[str] = None
    country: Optional[str] = None
    population: Optional[int] = None


class GetWeather(BaseModel):
    """Get the current weather for a city."""

    city: str = Field(description="the city name")
    unit: Literal["c", "f"]


class GetTime(BaseModel):
    """Get the current time in a time zone."""

    zone: Literal["UTC", "CET", "EST"]


class SearchWeb(BaseModel):
    """Search the web (a length-bounded query, as ``Field(max_length=...)`` spells it)."""

    query: str = Field(max_length=40)
    limit: int = Field(default=3, ge=1, le=10)


CITY_PROMPT = "Tell me about Paris as JSON with name, country and population."
PERSON_PROMPT = "Describe a person as JSON."

# SmolLM2's chat template does not show the tools to the model: one worked example teaches it the
# call format (the qwen parser's <tool_call> block), so tool_choice="auto" has a call to make.
TOOL_MESSAGES = [
    {"role": "system", "content": 'You call tools. Answer with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'},
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": '<tool_call>\n{"name": "GetWeather", "arguments": {"city": "Rome", "unit": "c"}}\n</tool_call>'},
    {"role": "user", "content": "What is the weather in Paris?"},
]
