"""Fallback start-up hook used by ``tokenrails lmdeploy ...`` when the ``.pth`` is not installed.

The CLI prepends this directory to ``PYTHONPATH``; every child Python (api_server engine process,
TP workers) then runs this file at start-up. It loads ``startup.py`` by path (no heavy imports),
installs the lazy import hook, then runs the next ``sitecustomize`` on ``sys.path``, if any.
"""
import importlib.machinery as _m
import importlib.util as _u
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))
_startup = _os.path.join(_os.path.dirname(_os.path.dirname(_here)), "startup.py")
if "_tokenrails_lmdeploy_startup" not in _sys.modules:
    _spec = _u.spec_from_file_location("_tokenrails_lmdeploy_startup", _startup)
    _mod = _u.module_from_spec(_spec)
    _sys.modules[_spec.name] = _mod
    _spec.loader.exec_module(_mod)
    _mod.install()
_next = _m.PathFinder.find_spec("sitecustomize", [p for p in _sys.path if _os.path.abspath(p or ".") != _here])
if _next is not None and _next.loader is not None:
    _chained = _u.module_from_spec(_next)
    _next.loader.exec_module(_chained)
