"""Grammar drafts without running the engine: registration, reversibility, settings, command line."""
from __future__ import annotations

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("lmdeploy.pytorch.spec_decode.proposers.base")


def test_activate_registers_the_proposer_and_deactivate_removes_it(monkeypatch):
    from lmdeploy.pytorch.config import SpecDecodeConfig
    from lmdeploy.pytorch.spec_decode.proposers.base import SPEC_PROPOSERS
    from lmdeploy.pytorch.spec_decode.spec_agent import SpecModelAgent

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.speculative import grammar_drafts
    monkeypatch.delenv(grammar_drafts.ENV_DRAFTS, raising=False)
    stock_from_config = SpecDecodeConfig.__dict__["from_config"]
    stock_warmup = SpecModelAgent.__dict__["warmup"]
    assert grammar_drafts.METHOD not in SPEC_PROPOSERS.module_dict
    activate(grammar_drafts=3)
    try:
        cls = SPEC_PROPOSERS.module_dict[grammar_drafts.METHOD]
        assert cls.needs_draft_model is False
        assert grammar_drafts.configured_drafts() == 3
    finally:
        deactivate()
    assert grammar_drafts.METHOD not in SPEC_PROPOSERS.module_dict
    assert SpecDecodeConfig.__dict__["from_config"] is stock_from_config
    assert SpecModelAgent.__dict__["warmup"] is stock_warmup
    assert grammar_drafts.configured_drafts() == 0  # the environment is restored too


def test_injection_only_without_a_speculative_config(monkeypatch):
    from lmdeploy.messages import SpeculativeConfig

    from tokenrails.engine_patch.lmdeploy.speculative import grammar_drafts
    monkeypatch.setenv(grammar_drafts.ENV_DRAFTS, "2")
    cfg = grammar_drafts.speculative_config_for(None)
    assert cfg.method == grammar_drafts.METHOD and cfg.num_speculative_tokens == 2
    mine = SpeculativeConfig(method="eagle", model="m", num_speculative_tokens=1)
    assert grammar_drafts.speculative_config_for(mine) is mine  # a user's own config is left alone
    monkeypatch.setenv(grammar_drafts.ENV_DRAFTS, "0")
    assert grammar_drafts.speculative_config_for(None) is None


@pytest.mark.parametrize("argv, rest, k", [
    (["serve", "api_server", "m", "--grammar-drafts", "3", "--port", "1"], ["serve", "api_server", "m", "--port", "1"], 3),
    (["serve", "--grammar-drafts=0"], ["serve"], 0),
    (["chat", "m"], ["chat", "m"], None),
])
def test_cli_option(argv, rest, k):
    from tokenrails.engine_patch.lmdeploy.speculative.grammar_drafts import pop_cli_option
    assert pop_cli_option(argv) == (rest, k)


@pytest.mark.parametrize("argv", [["serve", "--grammar-drafts"], ["serve", "--grammar-drafts", "x"],
                                  ["serve", "--grammar-drafts=-1"]])
def test_cli_option_rejects_bad_values(argv):
    from tokenrails.engine_patch.lmdeploy.speculative.grammar_drafts import pop_cli_option
    with pytest.raises(SystemExit):
        pop_cli_option(argv)


def test_negative_setting_is_refused():
    from tokenrails.engine_patch.lmdeploy.boot import settings
    with pytest.raises(ValueError):
        settings.configure(grammar_drafts=-1)
