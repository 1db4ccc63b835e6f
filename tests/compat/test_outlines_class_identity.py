"""The shim's stand-in classes read as outlines' own (issue 28, "Reprs and class identity"):
``type(x)``, ``__module__`` and ``__qualname__`` are the names outlines gives the class it stands
in for, per outlines release (0.0.46, 0.1.14, 1.3.3: the shim's ``set_api_version``).

Expected names are read at test time from the sdists of those releases (fetched from the package
registry by bench/outlines_suites.py; nothing of outlines is in this repository and outlines is
not imported): every ``class`` statement, ``X = Enum("Name", ...)`` assignment and ``from ...
import`` of each module, imports followed to the module that defines the class. Then for every
class the shim exports under an ``outlines.*`` path where that release binds a class, the shim's
class must carry the name of the class outlines binds there. On main 46 of the 46 classes checked
for 0.0.46, 36 of 36 for 0.1.14 and 40 of 57 for 1.3.3 failed this (there only the DSL's term
classes and the re-exported outlines-core classes read as outlines').

Pickling, copying and reprs of instances are tested in test_outlines_stand_in_pickling.py.
"""
from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

import tokenrails.compat.outlines as shim
from tokenrails.compat.outlines._install import shim_modules
from outlines_peer import _suites

VERSIONS = ["0.0.46", "0.1.14", "1.3.3"]


def _package(version: str) -> Path:
    try:
        root = _suites().fetch(version)
    except Exception as exc:  # noqa: BLE001 - registry unreachable
        pytest.skip(f"outlines {version} could not be fetched from the package registry: {exc}")
    return root / "src" / "outlines" if (root / "src" / "outlines").is_dir() else root / "outlines"


def _modules(package: Path) -> dict[str, ast.Module]:
    out = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = ast.parse(path.read_text(errors="replace"))
    return out


def _runtime_statements(body: list[ast.stmt]):
    """Top-level statements, including ``try`` bodies; not ``if TYPE_CHECKING:`` imports."""
    for node in body:
        if isinstance(node, ast.Try):
            yield from _runtime_statements(node.body)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            yield from _runtime_statements(node.body)
        else:
            yield node


def _bindings(trees: dict[str, ast.Module]) -> dict[tuple[str, str], tuple]:
    """``{(module, attribute): ("class", module, name) | ("import", module, name)}``."""
    out: dict[tuple[str, str], tuple] = {}
    for module, tree in trees.items():
        package = module if any(m.startswith(module + ".") for m in trees) else module.rpartition(".")[0]
        for node in _runtime_statements(tree.body):
            if isinstance(node, ast.ClassDef):
                out[(module, node.name)] = ("class", module, node.name)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and ast.unparse(node.value.func) in ("Enum", "enum.Enum") and node.value.args \
                    and isinstance(node.value.args[0], ast.Constant):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        out[(module, target.id)] = ("class", module, node.value.args[0].value)
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([source] if source else []))
                for alias in node.names:
                    if alias.name != "*":
                        out.setdefault((module, alias.asname or alias.name), ("import", source, alias.name))
    return out


def class_names(version: str) -> dict[tuple[str, str], tuple[str, str]]:
    """``{(module, attribute): (module, qualname) of the class bound there}`` for outlines
    ``version``; an import from outside outlines (``outlines_core``) names the class it imports."""
    trees = _modules(_package(version))
    bindings = _bindings(trees)
    out = {}
    for key in bindings:
        seen, kind, module, name = set(), *bindings[key]
        while kind == "import" and (module, name) in bindings and (module, name) not in seen:
            seen.add((module, name))
            kind, module, name = bindings[(module, name)]
        if kind == "class":
            out[key] = (module, name)
        elif kind == "import" and module.split(".")[0] == "outlines_core" and name[:1].isupper():
            out[key] = (module, name)  # a class outlines re-exports from outlines-core
    return out


def shim_exports() -> dict[type, set[str]]:
    """``{class: {"outlines.x:Name", ...}}`` for every class the shim binds under ``outlines.*``."""
    out: dict[type, set[str]] = {}
    for name, module in shim_modules().items():
        for attr, value in vars(module).items():
            if inspect.isclass(value) and not attr.startswith("_"):
                out.setdefault(value, set()).add(f"{name}:{attr}")
    return out


@pytest.fixture
def release():
    yield shim.set_api_version
    shim.set_api_version(None)


@pytest.mark.slow  # fetches outlines' sdists from the package registry on first use
@pytest.mark.parametrize("version", VERSIONS)
def test_every_stand_in_reads_as_the_class_outlines_binds_there(version, release):
    release(version)
    names = class_names(version)
    checked, wrong = 0, []
    for cls, paths in shim_exports().items():
        expected = {names[tuple(p.split(":"))] for p in paths if tuple(p.split(":")) in names}
        if not expected:
            continue  # no path the shim exports it under binds a class in this release
        checked += 1
        actual = (cls.__module__, cls.__qualname__)
        if actual not in expected:
            wrong.append(f"{sorted(paths)[0]}: reads {'.'.join(actual)}, outlines {version}: "
                         f"{sorted('.'.join(e) for e in expected)}")
        elif cls.__name__ != cls.__qualname__.rpartition(".")[2]:
            wrong.append(f"{sorted(paths)[0]}: __name__ {cls.__name__} vs __qualname__ {cls.__qualname__}")
    assert checked > {"0.0.46": 40, "0.1.14": 30, "1.3.3": 30}[version], checked
    assert wrong == []


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_every_stand_in_name_is_a_class_of_some_release(version, release):
    """Where a release lacks the class (``Write`` under 1.x), the shim keeps the name of the
    nearest release that has it; every name it gives is one outlines really used."""
    from tokenrails.compat.outlines import _identity

    release(version)
    known = {name for v in VERSIONS for name in class_names(v).values()}
    for key in _identity.HOMES:
        expected = _identity.outlines_name(key, version)
        assert expected in known, (key, expected)


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_renamed_classes_follow_the_release(version, release):
    """The classes outlines moved or renamed read as the chosen release's."""
    from tokenrails.compat.outlines import _identity, processors, samplers

    release(version)
    from tokenrails.compat.outlines.fsm import guide

    line = _identity.release_line(version)
    # the base outlines' RegexLogitsProcessor extends (FSM- / GuideLogitsProcessor; 1.x has none:
    # the nearest earlier release's, 0.1.14)
    source = version if line != "1" else "0.1.14"
    module, name = class_names(source)[("outlines.processors.structured", "RegexLogitsProcessor")]
    bases = [ast.unparse(b) for node in _modules(_package(source))[module].body
             if isinstance(node, ast.ClassDef) and node.name == name for b in node.bases]
    parent = processors.structured.RegexLogitsProcessor.__mro__[1]
    assert [parent.__qualname__] == bases
    assert samplers.SamplingParameters.__module__ == ("outlines.generate.api" if line == "0.0" else "outlines.samplers")
    # 0.1 re-exported outlines-core's; 1.x has none (the shim's ``outlines.fsm.guide`` keeps it)
    assert guide.Write.__module__ == {"0.1": "outlines_core.fsm.guide"}.get(line, "outlines.fsm.guide")


@pytest.mark.slow
def test_dsl_and_lazily_built_classes_read_as_outlines():
    """Enums built on first use take outlines' names when built (``outlines.types.airports.Airport``)."""
    from tokenrails.compat.outlines.types import airports, countries

    assert repr(airports.IATA.JFK) == "<Airport.JFK: 'JFK'>"
    assert (airports.IATA.__module__, airports.IATA.__qualname__) == ("outlines.types.airports", "Airport")
    assert countries.Numeric.__qualname__ == "Numeric_code"
    names = class_names("1.3.3")
    assert names[("outlines.types.airports", "IATA")] == ("outlines.types.airports", "Airport")
    for attr in ("Alpha2", "Alpha3", "Numeric", "Name", "Flag"):
        cls = getattr(countries, attr)
        assert (cls.__module__, cls.__qualname__) == names[("outlines.types.countries", attr)]
    assert shim.types.Regex.__module__ == "outlines.types.dsl"


def test_type_hints_resolve_although_the_module_is_outlines():
    """``typing.get_type_hints`` (and pydantic) evaluate string annotations in
    ``sys.modules[cls.__module__]``, which without ``install()`` does not exist: the stand-ins'
    annotations are evaluated in their tokenrails module when they are renamed."""
    import pydantic

    from tokenrails.compat.outlines import _identity

    stand_ins = _identity.stand_ins()
    assert len(stand_ins) >= 90
    for cls in stand_ins:
        typing.get_type_hints(cls)
    chat = pydantic.TypeAdapter(shim.inputs.Chat).validate_python({"messages": [{"role": "user", "content": "hi"}]})
    assert chat.messages[0]["content"] == "hi"
    assert typing.get_type_hints(shim.samplers.SamplingParameters)["top_k"] == typing.Optional[int]
