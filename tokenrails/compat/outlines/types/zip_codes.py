"""outlines 0.x zip-code types (``types.zip_codes.USZipCode``)."""
from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

from .locale import us

USZipCode = Annotated[str, StringConstraints(pattern=us.zip_code.pattern)]
