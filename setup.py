"""Only job: ship the LMDeploy start-up hook (a ``.pth``) at the wheel root, i.e. site-packages.

The hook costs one environment lookup per interpreter start and activates the engine upgrade
only in processes started with ``TOKENRAILS_LMDEPLOY=1`` (see docs/lmdeploy.md). Editable installs
use ``tokenrails lmdeploy install-hook`` instead.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = Path("tokenrails/engine_patch/lmdeploy/tokenrails_lmdeploy.pth")


class BuildWithStartupHook(build_py):
    def run(self) -> None:
        super().run()
        shutil.copyfile(PTH, Path(self.build_lib) / PTH.name)


setup(cmdclass={"build_py": BuildWithStartupHook})
