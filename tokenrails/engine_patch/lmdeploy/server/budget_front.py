"""Up-front refusal of a budget request whose shortest output cannot fit its ``max_tokens``.

The engine checks the same thing at the request's first step (``Budget.check_fits``), but by then
a stream has answered 200 and the request can only end with ``finish_reason`` "error". The front
check (front_check.py) compiles against a byte-level probe vocabulary, whose token counts are not
the model's. So for a budget spec with a ``max_new_tokens`` the front end also computes ``D(start)``
— the fewest tokens of any complete output, the final EOS included — on the model's own vocabulary
(the tokenizer the api_server already holds; the same ``budget_table`` the engine builds), off the
event loop, memoized per spec. Thinking only adds tokens (the end marker, then the answer), so
``D(start)`` is a lower bound of what any request with that spec needs: refusing when it exceeds
``max_tokens`` never refuses a request the engine could serve.
"""
from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from typing import Any

from ....guided.budget import INF, budget_table, is_budget_spec
from ....guided.errors import GuideError, GuideLimitError, detached_copy
from ....guided.limits import GuideLimits
from ....guided.spec import GuideSpec

MEMO = 1024  # spec keys whose shortest output is remembered
_LOCK = threading.Lock()
_SHORTEST: "OrderedDict[str, int | GuideError]" = OrderedDict()


def hf_tokenizer(engine: Any) -> Any:
    """The Hugging Face tokenizer behind LMDeploy's ``AsyncEngine.tokenizer`` (None if absent)."""
    tok = getattr(engine, "tokenizer", None)
    inner = getattr(getattr(tok, "model", None), "model", None)
    return inner if inner is not None else None


def shortest_tokens(spec: GuideSpec, tokenizer: Any, limits: GuideLimits) -> int | GuideError:
    """``D(start)`` of ``spec`` on ``tokenizer``'s vocabulary, or the typed error compiling it
    there raises (blocking: call it off the loop)."""
    with _LOCK:
        hit = _SHORTEST.get(spec.key)
    if hit is not None:
        return hit
    from ....guided.registry import compile_guide
    from ..boot.settings import backend
    from ..tokenizer_vocab import build_vocabulary

    try:  # the engine's backend setting: the routing the engine itself will apply
        guide = compile_guide(spec, build_vocabulary(tokenizer, None), backend(), limits=limits)
        value: int | GuideError = budget_table(guide, limits).start
    except GuideError as exc:
        value = detached_copy(exc)
    with _LOCK:
        _SHORTEST[spec.key] = value
        while len(_SHORTEST) > MEMO:
            _SHORTEST.popitem(last=False)
    return value


def too_small(need: int, max_tokens: int) -> GuideLimitError:
    what = f"the shortest output this constraint allows needs {need} tokens" if need < INF else \
        "no output of this constraint can end"
    return GuideLimitError(
        f"max_tokens={max_tokens} is too small: {what} (the final EOS included; any thinking adds to "
        "it) under this model's vocabulary", limit="max_tokens", value=need)


async def refusal(engine: Any, spec: GuideSpec | None, max_tokens: Any, limits: GuideLimits) -> GuideError | None:
    """The typed error refusing this request up front, or None (not a budget request, no
    ``max_tokens``, no tokenizer here, or the shortest output fits)."""
    if spec is None or not is_budget_spec(spec) or not isinstance(max_tokens, int) or max_tokens <= 0:
        return None
    tokenizer = hf_tokenizer(engine)
    if tokenizer is None:
        return None
    with _LOCK:
        need = _SHORTEST.get(spec.key)
    if need is None:
        try:
            need = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(None, shortest_tokens, spec, tokenizer, limits),
                timeout=limits.compile_timeout_s)
        except asyncio.TimeoutError:
            return None  # the engine's own first-step check still refuses it, with its compile deadline
    if isinstance(need, GuideError):
        return detached_copy(need)
    return too_small(need, max_tokens) if need > max_tokens else None
