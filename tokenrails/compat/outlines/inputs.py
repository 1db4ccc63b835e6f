"""``outlines.inputs`` (1.x): typed model inputs — ``Chat`` conversations and media wrappers.

The shim's transformers model formats a ``Chat`` with the tokenizer's chat template; media inputs
(``Image``/``Video``/``Audio``) are accepted as data here, but the shim runs text-only models, so a
prompt containing them is refused by the model rather than run without them.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any, Dict, List, Union


@dataclass
class Image:
    """A PIL image with a known format; ``image_str`` is its base64 encoding in that format."""

    image: Any

    def __post_init__(self) -> None:
        fmt = getattr(self.image, "format", None)
        if not fmt:
            raise TypeError("Could not read the format of the image passed to the model.")
        buffer = BytesIO()
        self.image.save(buffer, format=fmt)
        self.image_str = base64.b64encode(buffer.getvalue()).decode("utf-8")
        self.image_format = f"image/{fmt.lower()}"


@dataclass
class Video:
    video: Any


@dataclass
class Audio:
    audio: Any


Message = Dict[str, Any]


@dataclass
class Chat:
    """A conversation: a list of ``{"role", "content"}`` messages."""

    messages: List[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.messages is None:
            self.messages = []

    def append(self, message: Message) -> None:
        self.messages.append(message)

    def extend(self, messages: List[Message]) -> None:
        self.messages.extend(messages)

    def pop(self) -> Message:
        return self.messages.pop()

    def add_system_message(self, content: Union[str, List[Any]]) -> None:
        self.messages.append({"role": "system", "content": content})

    def add_user_message(self, content: Union[str, List[Any]]) -> None:
        self.messages.append({"role": "user", "content": content})

    def add_assistant_message(self, content: Union[str, List[Any]]) -> None:
        self.messages.append({"role": "assistant", "content": content})

    def __str__(self) -> str:
        return "\n".join(str(message) for message in self.messages)

    def __repr__(self) -> str:
        return f"Chat(messages={self.messages!r})"


def has_media(value: Any) -> bool:
    """Whether a prompt (str, list, message content) carries an image, video or audio input."""
    if isinstance(value, (Image, Video, Audio)):
        return True
    if isinstance(value, dict):
        return any(has_media(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_media(v) for v in value)
    return False


__all__ = ["Audio", "Chat", "Image", "Message", "Video", "has_media"]
