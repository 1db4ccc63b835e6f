"""openai ``parse``, instructor and LangChain at ``max_tokens`` 48 with a free-text schema: with
``tokenrails_budget: "close"`` every call returns the client's own parsed object.

Without the key the small model writes the summary until the budget runs out and the clients
raise on the truncated JSON; with the package's ledger on (conftest.py) those outcomes (upgraded
without the key, and stock) are sent and recorded (printed in the terminal summary), not asserted:
the assertion is the budget's.
"""
from __future__ import annotations

import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("openai")

from harness.budget_clients import CLIENTS, Review  # noqa: E402

from .conftest import LEDGER, _attempt, side_by_side  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("client", list(CLIENTS))
def test_budget_returns_the_clients_parsed_object(servers, client):
    if client.startswith("instructor"):
        pytest.importorskip("instructor")
    if client.startswith("LangChain"):
        pytest.importorskip("langchain_openai")
    call = CLIENTS[client]
    budget = _attempt(lambda s: call(s.v1, s.model, True), servers.upgraded)
    if servers.stock is not None:  # the ledger's comparison calls
        plain, stock = side_by_side(servers, f"{client}, max_tokens 48, no budget", lambda s: call(s.v1, s.model, False))
        LEDGER.rows.append((f"{client}, max_tokens 48, budget", budget, stock))
    review = budget.get()
    assert isinstance(review, Review)
    jsonschema.validate(review.model_dump(), Review.model_json_schema())
