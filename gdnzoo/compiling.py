"""Public functions under ``torch.compile``: dynamo traces each of them (the faces
``gdnzoo.decode``/``prefill``/``commit``, the callables of ``gdnzoo.get``, the adapters'
helpers) as a substitute, one call of the operation's torch operator (:mod:`gdnzoo.op`), while
eager calls keep running the function itself.  Nothing here imports torch: the substitutes are
registered when ``torch._dynamo`` is imported, by whoever imports it."""
from __future__ import annotations

import importlib.util
import sys

_SUBSTITUTES = []    # [function, its substitute (or a maker of it), substituted?]


def compiled_as_operator(fn, op_name: str, algo=None):
    """Have torch.compile trace the public function ``fn`` as one call of the operation's
    torch operator (:func:`gdnzoo.op.traced`)."""
    def make():
        from gdnzoo import op, operation
        return op.traced(operation.get(op_name), algo)
    when_compiled(fn, make)


def when_compiled(fn, substitute):
    """Have torch.compile trace ``substitute`` (a function, or a function of no argument that
    makes it) in place of ``fn``, which eager calls keep running: at once when
    ``torch._dynamo`` is imported, else as soon as it is (importing it costs seconds, so gdnzoo
    never does)."""
    _SUBSTITUTES.append([fn, substitute, False])
    if "torch._dynamo" in sys.modules:
        _substitute_all()
    elif not any(isinstance(f, _AfterDynamo) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDynamo())


def _substitute_all():
    import torch._dynamo
    substitute = getattr(torch._dynamo, "substitute_in_graph", None)
    if substitute is None:       # torch < 2.5 (below gdnzoo's 2.10): dynamo traces the functions
        return
    for entry in _SUBSTITUTES:
        if not entry[2]:
            fn, sub = entry[0], entry[1]
            if sub.__name__ == "make":
                sub = sub()
            substitute(fn, skip_signature_check=True)(sub)
            entry[2] = True


class _AfterDynamo:
    """A meta-path finder that runs :func:`_substitute_all` right after ``torch._dynamo``'s
    module has executed (and does nothing else)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _substitute_all()
        spec.loader.exec_module = exec_module
        return spec
