"""Schemas the real-engine tests share: small enough that SmolLM2 finishes them in a few dozen
tokens, with a bounded string so a drafts run and a budget both have something to force."""

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
