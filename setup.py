"""Two jobs: ship the LMDeploy start-up hook (a ``.pth``) at the wheel root, and build the optional
C kernels (``tokenrails._apply_native``: bitmask apply; ``tokenrails._fsm_native``: token-trie
walk; ``tokenrails._dfa_native``: Thompson NFA, subset construction and minimization).

The hook costs one environment lookup per interpreter start and activates the engine upgrade
only in processes started with ``TOKENRAILS_LMDEPLOY=1`` (see docs/lmdeploy.md). Editable installs
use ``tokenrails lmdeploy install-hook`` instead.

The C modules are plain CPython extensions with no dependency beyond a C compiler. They are
``optional``: without a compiler the install still succeeds and the numpy paths run instead
(``tokenrails.native.status()`` tells which is active).
"""
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PTH = Path("tokenrails/engine_patch/lmdeploy/tokenrails_lmdeploy.pth")
C_FLAGS = ["-O3", "-std=c11", "-fno-strict-aliasing", "-Wall"]


class BuildWithStartupHook(build_py):
    def run(self) -> None:
        super().run()
        shutil.copyfile(PTH, Path(self.build_lib) / PTH.name)


def native(name: str) -> Extension:
    """``csrc/<name>_native.c``, or every ``.c`` of ``csrc/<name>_native/`` (one extension split by stage)."""
    folder = Path("csrc") / f"{name}_native"
    if folder.is_dir():
        sources = sorted(str(p) for p in folder.glob("*.c"))
        depends = sorted(str(p) for p in folder.glob("*.h")) + ["csrc/native_common.h"]
    else:
        sources, depends = [f"csrc/{name}_native.c"], ["csrc/native_common.h"]
    return Extension(f"tokenrails._{name}_native", sources, depends=depends, extra_compile_args=C_FLAGS,
                     optional=True)


setup(cmdclass={"build_py": BuildWithStartupHook}, ext_modules=[native("apply"), native("fsm"), native("dfa")])
