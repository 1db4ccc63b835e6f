"""The C modules must be built in this checkout (CI installs with a compiler), and the switch works."""
from __future__ import annotations

import os

import pytest

from tokenrails import native


@pytest.mark.skipif(os.environ.get(native.NATIVE_ENV, "1") == "0", reason="native kernels disabled on purpose")
@pytest.mark.parametrize("name", native.MODULES)
def test_native_module_is_built(name):
    assert native.load(name) is not None, (
        f"tokenrails._{name}_native is not built: run `pip install -e .` with a C compiler present"
    )


def test_env_switch_disables_every_module(monkeypatch):
    monkeypatch.setenv(native.NATIVE_ENV, "0")
    assert native.status() == {name: False for name in native.MODULES}
    assert all(native.load(name) is None for name in native.MODULES)
