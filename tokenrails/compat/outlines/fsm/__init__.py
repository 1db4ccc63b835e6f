"""``outlines.fsm``: guides and the JSON-schema → regex compiler."""
from . import guide, json_schema, types  # noqa: F401
