"""Grammar drafts (engine_patch/lmdeploy/grammar_drafts.py) in LMDeploy 0.18's real engine on CPU.

The grammar is the draft model: guided rows propose the tokens their grammar forces, LMDeploy's
rejection sampler verifies them. Oracles: greedy outputs token for token equal to plain guided
decoding (several schemas, regex, choice, an unguided row, a bad schema in the batch); sampled
outputs (temperature 1) over a string with several tokenizations distributed like plain guided
decoding by a chi-square test that does reject a deliberately biased verifier (one that accepts
every grammar draft, i.e. jump-forward in the canonical tokenization).

Lookup drafts (the default) against forced drafts alone: the drafted engine runs the greedy batch
again with ``TOKENRAILS_LOOKUP_DRAFTS=0`` (read per step): the same outputs in fewer steps.

Cost: two float32 engines for the whole module (plain guided, then grammar drafts; the biased verifier is
patched into the second for its own run), ``BATCH`` sampled requests in flight at once and a short
raw prompt, so the 2 x 160 sampled requests take a fraction of the forwards and prefill tokens
they took with one engine per run, a batch of 8 and the chat template's system prompt. The biased
arm is sequential: it stops at the first ``BATCH`` that already rejects it (``_until_caught``).
"""
from __future__ import annotations

import collections
import json
import re

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

from .schemas import PERSON  # noqa: E402
ORDER = {"type": "object", "properties": {
    "status": {"enum": ["pending", "shipped", "delivered"]},
    "items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 6},
                                                                          "qty": {"type": "integer"}},
                                         "required": ["sku", "qty"], "additionalProperties": False},
              "maxItems": 2},
    "express": {"type": "boolean"}}, "required": ["status", "items", "express"], "additionalProperties": False}
PATTERN = r"(alpha|beta)-[0-9]{2}\.done"
CHOICES = ["internationalization", "internal", "interval"]
WORD = "abracadabra"  # its canonical tokenization ab|rac|ad|ab|ra is far from the only one the model picks


def _compact(schema):
    from tokenrails import GuideSpec
    return GuideSpec.json_schema(json.dumps(schema), any_whitespace=False)


def _requests():
    """(prompt, response_format, max_new_tokens): a mix the grammar forces much or little of."""
    return [
        ("Give me a person as JSON.", _compact(PERSON), 40),
        ("An order as JSON.", _compact(ORDER), 64),
        ("Give me a person as JSON.", {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}, 40),
        ("A code please.", {"type": "regex_schema", "regex_schema": PATTERN}, 16),
        ("Pick a word.", {"type": "choice", "choice": CHOICES}, 8),
        ("Hi", None, 8),
        ("Bad schema.", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, 8),
    ]


DRAFTS = 4  # grammar drafts per step of the drafted engine (greedy and sampled runs)
N_SAMPLED = 160  # sampled requests per arm (plain, drafted; biased at most): the chi-square test's sample
P_CAUGHT = 1e-6  # the biased verifier is caught when the test's p-value is below this
BATCH = 32  # requests in flight at once; one 64-token KV block each (prompt + WORD + drafts)
# raw (no chat template, whose system prompt is 34 tokens): prefill dominated the sampled runs
# FLOAT32: both engines run float32, not ``dtype='auto'`` (float16 for this float32 checkpoint, whose
# CPU matmuls have no fast kernel): the module compares drafts with plain decoding at one dtype,
# and a float32 forward costs a fraction of a float16 one here (docs/lmdeploy.md, dtype)
WORD_PROMPT = "<|im_start|>user\nSay one word.<|im_end|>\n<|im_start|>assistant\n"


def _pipe(model_dir, drafts: int):
    from lmdeploy import pipeline

    from tokenrails.engine_patch.lmdeploy import activate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    torch.set_num_threads(1)
    activate(grammar_drafts=drafts)
    cfg = cpu_engine_config(max_batch_size=BATCH, session_len=512)
    cfg.dtype = "float32"  # (the config's own check admits only half types; see FLOAT32)
    return pipeline(model_dir, backend_config=cfg)


def _generate(pipe, prompts, gens, **kw):
    """Outputs and the grammar-draft counters of this call alone."""
    from tokenrails.engine_patch.lmdeploy.speculative import draft_metrics
    draft_metrics.reset()
    outs = pipe(prompts, gen_config=gens, **kw)
    return outs, draft_metrics.grammar_totals()


def _gens(reqs, **sampling):
    from lmdeploy import GenerationConfig
    return [GenerationConfig(max_new_tokens=n, response_format=rf, **sampling) for _, rf, n in reqs]


def _sampled_gens(drafts: int, n: int, biased: bool):
    """``n`` sampled (temperature 1) requests for the regex ``WORD``.

    top_k=50: with top_k=0 LMDeploy samples from the whole sorted vocabulary with
    ``torch.multinomial``, which on CPU now and then returns a zero-probability token (about 1 in
    100 requests here, plain guided decoding too: the request then fails closed)."""
    from lmdeploy import GenerationConfig
    return [GenerationConfig(max_new_tokens=14, do_sample=True, temperature=1.0, top_k=50, top_p=1.0,
                             random_seed=1000 * drafts + i + (7 if biased else 0),
                             response_format={"type": "regex_schema", "regex_schema": WORD}) for i in range(n)]


def _bias_the_verifier(monkeypatch) -> None:
    """The biased verifier: the target 'agrees' with every draft (jump-forward)."""
    from lmdeploy.pytorch.backends.default import rejection_sampling as rs
    original = rs.DefaultRejectionSamplingImpl.forward

    def accept_every_draft(self, target_logits, draft_token_ids, bonus_token_ids, **kw):
        rigged = torch.full_like(target_logits, -1e4)
        rigged.scatter_(-1, draft_token_ids.unsqueeze(-1), 0.0)
        return original(self, rigged, draft_token_ids, bonus_token_ids, **kw)

    monkeypatch.setattr(rs.DefaultRejectionSamplingImpl, "forward", accept_every_draft)


@pytest.fixture(scope="module")
def runs(model_dir):
    """Every run of the module: per engine (drafts 0, then ``DRAFTS``) the greedy batch of
    ``_requests()`` and ``N_SAMPLED`` sampled ``WORD`` requests; on the drafted engine also the
    sampled requests under the biased verifier. {(kind, drafts): (outputs, draft counters)}."""
    from tokenrails.engine_patch.lmdeploy import deactivate
    reqs = _requests()
    out = {}
    for drafts in (0, DRAFTS):
        pipe = _pipe(model_dir, drafts)
        try:
            out["greedy", drafts] = _generate(pipe, [p for p, _, _ in reqs], _gens(reqs, top_k=1))
            if drafts:  # the same engine with forced drafts only (lookup drafts off, read per step)
                with pytest.MonkeyPatch.context() as mp:
                    mp.setenv("TOKENRAILS_LOOKUP_DRAFTS", "0")
                    out["greedy forced only", drafts] = _generate(pipe, [p for p, _, _ in reqs], _gens(reqs, top_k=1))
            out["sampled", drafts] = _generate(pipe, [WORD_PROMPT] * N_SAMPLED, _sampled_gens(drafts, N_SAMPLED, False),
                                               do_preprocess=False)
            if drafts:
                with pytest.MonkeyPatch.context() as mp:
                    _bias_the_verifier(mp)
                    out["biased", drafts] = _until_caught(pipe, _lengths(out["sampled", 0][0]), drafts)
        finally:
            pipe.close()
            deactivate()
    return out


def _until_caught(pipe, plain: collections.Counter, drafts: int):
    """The biased arm, ``BATCH`` requests at a time, until the chi-square test rejects it against
    ``plain`` (``P_CAUGHT``) or ``N_SAMPLED`` requests ran: at ``N_SAMPLED`` it is the fixed-size test,
    so the power is at least that; each earlier look adds at most ``P_CAUGHT`` to the chance of
    rejecting a verifier that is not biased (5 looks: 5e-6)."""
    gens = _sampled_gens(drafts, N_SAMPLED, True)
    outs: list = []
    while len(outs) < N_SAMPLED:
        batch = gens[len(outs):len(outs) + BATCH]
        outs += _generate(pipe, [WORD_PROMPT] * len(batch), batch, do_preprocess=False)[0]
        if _chi2_p(plain, _lengths(outs)) < P_CAUGHT:
            break
    return outs, None


def test_greedy_equals_plain_guided_token_for_token(runs):
    plain, none = runs["greedy", 0]
    drafted, totals = runs["greedy", DRAFTS]
    assert none["grammar_draft_steps"] == 0  # off: the engine has no speculative agent at all
    for a, b in zip(plain, drafted):
        assert list(a.token_ids) == list(b.token_ids) and a.text == b.text and a.finish_reason == b.finish_reason, (a, b)
    # the oracles hold on both
    for out, schema in zip(plain[:3], (PERSON, ORDER, PERSON)):
        if out.finish_reason == "stop":  # (a small model may loop in a string until the length cap)
            jsonschema.validate(json.loads(out.text), schema)
    assert plain[0].finish_reason == "stop", plain[0]
    assert re.fullmatch(PATTERN, plain[3].text) and plain[4].text in CHOICES, plain[3:5]
    assert plain[5].generate_token_len > 0
    assert drafted[6].finish_reason == "error" and drafted[6].text == "", drafted[6]  # typed, this request only
    # drafts were proposed and accepted, and they saved forward passes
    assert totals["grammar_drafted"] >= 10 and totals["grammar_draft_accepted"] >= 8, totals
    assert totals["grammar_forced"] <= totals["grammar_draft_accepted"], totals  # one-token masks always pass
    assert totals["grammar_draft_steps"] < totals["grammar_draft_emitted"] / 2, totals


def test_lookup_drafts_keep_greedy_outputs_and_take_fewer_steps(runs):
    """Lookup drafts (on by default) after the forced runs: the same greedy outputs as plain guided
    decoding and as forced drafts alone, in fewer verification steps for as many tokens."""
    plain, _ = runs["greedy", 0]
    looked, with_lookup = runs["greedy", DRAFTS]
    forced, forced_only = runs["greedy forced only", DRAFTS]
    for a, b, c in zip(plain, looked, forced):
        assert list(a.token_ids) == list(b.token_ids) == list(c.token_ids), (a, b, c)
    assert with_lookup["grammar_draft_emitted"] == forced_only["grammar_draft_emitted"], (with_lookup, forced_only)
    # measured 61 vs 46 drafts accepted and 25 vs 37 steps; two runs of forced drafts alone differ by a
    # step or a draft (what is guessed beside the forward), so the margins are wide
    assert with_lookup["grammar_draft_accepted"] >= forced_only["grammar_draft_accepted"] + 8, (with_lookup, forced_only)
    assert with_lookup["grammar_draft_steps"] <= 0.85 * forced_only["grammar_draft_steps"], (with_lookup, forced_only)


def _lengths(outs) -> collections.Counter:
    """How many tokens each output of the regex ``WORD`` took: the tokenization's length. The
    first token is sampled at prefill, before any draft; from there on a verifier that favours the
    canonical tokenization makes outputs shorter."""
    assert all(o.text == WORD for o in outs), [o.text for o in outs if o.text != WORD]
    return collections.Counter(len(o.token_ids) for o in outs)


def _chi2_p(a: collections.Counter, b: collections.Counter, min_count: int = 5) -> float:
    """Chi-square homogeneity test of two samples; rare categories pooled."""
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    common = [k for k in keys if a[k] + b[k] >= min_count]
    table = [[a[k] for k in common], [b[k] for k in common]]
    rest = [sum(a[k] for k in keys if k not in common), sum(b[k] for k in keys if k not in common)]
    if sum(rest) >= min_count:
        table[0].append(rest[0])
        table[1].append(rest[1])
    if len(table[0]) < 2:
        return 1.0
    stats = pytest.importorskip("scipy.stats")  # imported where it is used, not at collection
    return float(stats.chi2_contingency(table)[1])


def test_sampled_distribution_equals_plain_guided_and_biased_variant_is_caught(runs):
    plain = _lengths(runs["sampled", 0][0])
    assert len(plain) >= 3, plain  # the model spreads over several tokenizations: the test has power
    drafted_outs, totals = runs["sampled", DRAFTS]
    drafted = _lengths(drafted_outs)
    assert totals["grammar_drafted"] > N_SAMPLED and 0 < totals["grammar_draft_accepted"] < totals["grammar_drafted"], totals
    p_same = _chi2_p(plain, drafted)
    biased = _lengths(runs["biased", DRAFTS][0])
    p_biased = _chi2_p(plain, biased)
    print(f"biased verifier: p = {p_biased:.2g} after {sum(biased.values())} requests")
    assert p_same > 1e-3, (p_same, plain, drafted)
    assert p_biased < P_CAUGHT, (p_biased, plain, biased)
