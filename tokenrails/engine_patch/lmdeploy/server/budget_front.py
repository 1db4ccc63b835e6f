"""Up-front refusal of a budget request whose shortest output cannot fit its ``max_tokens``.

The engine checks the same thing at the request's first step (``Budget.check_fits``), but by then
a stream has answered 200 and the request can only end with ``finish_reason`` "error". The front
check (front_check.py) compiles against a byte-level probe vocabulary, whose token counts are not
the model's. So for a budget spec with a ``max_new_tokens`` the front end also compiles it on the
model's own vocabulary (the tokenizer the api_server already holds), through the front's core
manager for that vocabulary (the engine's backend setting and limits; its compile cache, in-flight
table and negative cache), and reads ``D(start)`` — the fewest tokens of any complete output, the
final EOS included — from the compiled guide's budget table. Thinking only adds tokens (the end
marker, then the answer), so ``D(start)`` is a lower bound of what any request with that spec
needs: refusing when it exceeds ``max_tokens`` never refuses a request the engine could serve.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from ....guided.budget import INF, budget_table, is_budget_spec
from ....guided.errors import GuideError, GuideLimitError, GuideTimeoutError
from ....guided.limits import GuideLimits
from ....guided.spec import GuideSpec


def hf_tokenizer(engine: Any) -> Any:
    """The Hugging Face tokenizer behind LMDeploy's ``AsyncEngine.tokenizer`` (None if absent)."""
    return getattr(getattr(getattr(engine, "tokenizer", None), "model", None), "model", None)


def too_small(need: int, max_tokens: int) -> GuideLimitError:
    what = f"the shortest output this constraint allows needs {need} tokens" if need < INF else \
        "no output of this constraint can end"
    return GuideLimitError(
        f"max_tokens={max_tokens} is too small: {what} (the final EOS included; any thinking adds to "
        "it) under this model's vocabulary", limit="max_tokens", value=need)


async def refusal(compiled: Callable[..., Awaitable[Any]], engine: Any, spec: GuideSpec | None, max_tokens: Any,
                  limits: GuideLimits) -> GuideError | None:
    """The typed error refusing this request up front (``compiled``: ``FrontCheck.compiled``), or None (not a budget request, no
    ``max_tokens``, no tokenizer here, the compile missed its deadline — the engine's own
    first-step check then decides — or the shortest output fits)."""
    if spec is None or not is_budget_spec(spec) or not isinstance(max_tokens, int) or max_tokens <= 0:
        return None
    tokenizer = hf_tokenizer(engine)
    if tokenizer is None:
        return None
    guide = await compiled(spec, limits, tokenizer)
    if isinstance(guide, GuideTimeoutError) and guide.limit == "compile_timeout_s":
        return None
    if isinstance(guide, GuideError):
        return guide
    try:
        need = budget_table(guide, limits).start  # built with the guide, in the compile pool
    except GuideError as exc:
        return exc
    return too_small(need, max_tokens) if need > max_tokens else None
