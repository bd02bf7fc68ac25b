"""One C++ call that tells whether a call's tensors match a memoized call's (decode's fast path).

``gdnzoo.decode`` memoizes validation per signature: shapes, strides, dtypes and devices of
every tensor (:func:`gdnzoo.contract.signature`).  Building that key in Python costs some 40
tensor attribute reads per call (4-6 us on the lent H100 hosts), more than half of an eager
call.  torch's dynamo keeps a C++ checker for exactly this (``TensorGuards``: per tensor the
Python type, dispatch keys, dtype, device, requires_grad, sizes and strides); one ``check``
of ten tensors costs about 1 us.  It is stricter than the signature (type and dispatch keys
too), so a guard can only miss where the signature would hit, never the reverse.

It is a torch-internal API: :func:`make` self-tests it once (a match, and a miss per property
the signature covers) and returns None from then on if anything is off, and decode then keeps
its Python signature.  ``GDNZOO_NO_GUARDS=1`` turns it off.
"""
from __future__ import annotations

import os

import torch

_state = {}          # "ok": bool, once the self-test ran


def _self_test(TG) -> bool:
    x, y = torch.zeros(2, 3, 4), torch.zeros(4)
    g = TG(x, y, dynamic_dims_sizes=None, dynamic_dims_strides=None)
    same = g.check(torch.ones(2, 3, 4), torch.ones(4))
    misses = (
        g.check(torch.zeros(2, 3, 5), y),                     # size
        g.check(torch.zeros(2, 4, 3).transpose(1, 2), y),     # stride
        g.check(torch.zeros(2, 3, 8)[..., :4], y),            # stride, same size
        g.check(x, torch.zeros(4, dtype=torch.float64)),      # dtype
        g.check(x, torch.zeros(4, device="meta")),            # device
        g.check(x, torch.zeros(4, requires_grad=True)),       # requires_grad
        g.check(x.to_sparse(), y),                            # layout
        g.check(x, None),                                     # not a tensor
    )
    return bool(same) and not any(misses)


def available() -> bool:
    """Whether guards are in use (self-tested once per process)."""
    ok = _state.get("ok")
    if ok is None:
        ok = False
        if os.environ.get("GDNZOO_NO_GUARDS", "0") in ("", "0"):
            try:
                from torch._C._dynamo.guards import TensorGuards
                ok = _self_test(TensorGuards)
            except Exception:
                ok = False
        _state["ok"] = ok
    return ok


def make(tensors):
    """A checker ``g`` with ``g.check(*same_kind_of_tensors) -> bool`` for exactly these
    shapes, strides, dtypes, devices and tensor types; None when guards are not in use."""
    if not available():
        return None
    from torch._C._dynamo.guards import TensorGuards
    try:
        return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)
    except Exception:
        return None
