"""CI runs exactly the test command the README gives users, so what a user runs is what CI
checked; the plugins that command needs come with the dev install a fresh machine gets."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _test_commands(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if "python -m pytest" in line and "scripts/setup.sh" in line]


def test_ci_runs_the_readme_test_command():
    readme = _test_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    ci = _test_commands((ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    assert len(readme) == 1 and ci == readme, (readme, ci)


def test_the_test_commands_plugins_are_in_the_dev_install():
    command = _test_commands((ROOT / "README.md").read_text(encoding="utf-8"))[0].split()
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]["dev"]
    if "-n" in command or "--dist" in command:
        assert any(req.replace(" ", "").startswith("pytest-xdist==") for req in dev), dev


def test_every_grouped_test_file_exists():
    """A renamed or moved module would silently fall out of its xdist group (and start its own
    engine or server beside the group's)."""
    from tests.conftest import XDIST_GROUPS

    for group, members in XDIST_GROUPS.items():
        for member in members:
            assert (ROOT / member).is_dir() if member.endswith("/") else (ROOT / member).is_file(), (group, member)


def test_every_weighted_unit_exists_and_the_heaviest_starts_first():
    """A renamed module or group would silently lose its weight (and start last again)."""
    from tests.conftest import UNIT_SECONDS, XDIST_GROUPS, heaviest_unit

    for unit in UNIT_SECONDS:
        assert unit in XDIST_GROUPS or (unit.startswith("tests/") and (ROOT / unit).is_file()), unit
    light = ["tests/test_cli.py", "tests/test_layering.py"]
    heavy = sorted(UNIT_SECONDS, key=UNIT_SECONDS.get)
    assert heaviest_unit(light + heavy) == heavy[-1]
    assert heaviest_unit(light) == light[0]  # unweighted units keep xdist's order
