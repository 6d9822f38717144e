"""Loaded at the start of every Python process the tests start (tests/conftest.py puts this folder on
their PYTHONPATH, with ``TORCH_DISTRIBUTED_DEBUG=DETAIL``: torch then checks that every rank issues the
same collective, and a desynchronised run fails at once instead of hanging).

Under that setting ``DistributedDataParallel``'s constructor crashes on gloo (torch 2.13, see
:func:`lightning_hybrid.comm.collectives.ddp_group`). The suite's strategies avoid it by giving DDP
that function's group; Lightning's own ``DDPStrategy`` (``strategy=ddp``) does not, so here, once
``torch.nn.parallel.distributed`` is imported (not before: most processes never import it), a DDP
built without a ``process_group`` gets the same group. Nothing else changes."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_TARGET = "torch.nn.parallel.distributed"


def _patch(module) -> None:
    ddp = module.DistributedDataParallel
    original = ddp.__init__

    def __init__(self, *args, process_group=None, **kwargs):
        if process_group is None:
            from lightning_hybrid.comm.collectives import ddp_group

            process_group = ddp_group()
        original(self, *args, process_group=process_group, **kwargs)

    ddp.__init__ = __init__


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)
        sys.meta_path.remove(self)


if "TORCH_DISTRIBUTED_DEBUG" in __import__("os").environ:
    if _TARGET in sys.modules:
        _patch(sys.modules[_TARGET])
    else:
        sys.meta_path.insert(0, _PatchAfterImport())
