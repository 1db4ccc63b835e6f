"""outlines 0.x phone-number types (``types.phone_numbers.USPhoneNumber``): pydantic-ready
``Annotated[str, ...]`` over the same patterns as the 1.x terms."""
from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

from .locale import us

USPhoneNumber = Annotated[str, StringConstraints(pattern=us.phone_number.pattern)]
