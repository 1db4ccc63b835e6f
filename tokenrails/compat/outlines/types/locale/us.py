"""United States formats."""
from __future__ import annotations

from ..dsl import Regex

phone_number = Regex(r"(\([0-9]{3}\) |[0-9]{3}-)[0-9]{3}-[0-9]{4}")
zip_code = Regex(r"[0-9]{5}(-[0-9]{4})?")
