"""Work to do when a module is first imported inside a trace: a user's file that loads a model
in 4 or 8 bits through transformers' BitsAndBytesConfig never imports bitsandbytes itself;
transformers imports it inside from_pretrained (its quantizer), inside the trace, after the
trace's patches of bitsandbytes were to be installed.

`after_import(name, callback)` puts a finder first on `sys.meta_path` (importlib's protocol)
that finds the module as the path finder does and, at its first import, executes it with
every dispatch mode off (a real run imports it without the trace's fake tensors: a tensor a
module makes at import is the host's, not the trace's) and then calls `callback`.

Standard library and torch_private only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

from pipeline.core import torch_private


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, callback) -> None:
        self.loader, self.callback = loader, callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        with torch_private._disable_current_modes():
            self.loader.exec_module(module)
        self.callback()


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self.callback)
        return spec


def after_import(name: str, callback):
    """`callback()` once the top-level module `name` is first imported; returns the undo."""
    finder = _AfterImport(name, callback)
    sys.meta_path.insert(0, finder)

    def undo() -> None:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)

    return undo
