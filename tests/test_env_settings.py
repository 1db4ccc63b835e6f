"""Every environment variable tokenrails reads is listed once (``tokenrails._env.SETTINGS``) and
reaches Ray workers (``inherit.child_env``), whose environment is the cluster's, not ours: the
source is scanned, so a new setting cannot be forgotten."""
from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tokenrails"
NAME = re.compile(r"\bTOKENRAILS_[A-Z0-9_]*[A-Z0-9]\b")


def names_in_source() -> set[str]:
    found: set[str] = set()
    for path in PACKAGE.rglob("*"):
        if path.suffix in (".py", ".pth", ".c", ".h") and path.is_file():
            found.update(NAME.findall(path.read_text(encoding="utf-8", errors="replace")))
    return found


def test_the_settings_list_is_the_source_s_variables():
    from tokenrails._env import SETTINGS

    found = names_in_source()
    assert {"TOKENRAILS_GRAMMAR_DRAFTS_FIXED", "TOKENRAILS_OVERLAP", "TOKENRAILS_LMDEPLOY"} <= found  # the scan works
    assert found - set(SETTINGS) == set(), "read in tokenrails/ but missing from tokenrails._env.SETTINGS"
    assert set(SETTINGS) - found == set(), "listed in SETTINGS but read nowhere"


def test_ray_workers_get_every_setting(monkeypatch):
    from tokenrails.engine_patch.lmdeploy.boot.inherit import child_env

    values = {name: f"value-of-{name.lower()}" for name in names_in_source()}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    carried = child_env()
    missing = sorted(name for name in values if carried.get(name) != values[name])
    assert missing == [], f"child_env() does not carry {missing}"
