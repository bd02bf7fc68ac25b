"""Shared fixtures.  Without a CUDA device, Triton kernels run through the Triton interpreter:
TRITON_INTERPRET must be set before triton is first imported, so it is set here.  Inputs come
from the one factory, gdnzoo.inputs; the fixtures below are its builders on this run's device."""
import functools
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from gdnzoo import inputs  # noqa: E402  (torch only: triton is not imported here)

DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def pool_case():
    """make(**kw): gdnzoo.inputs.make_pool_case on this run's device (decode inputs over a
    page-strided pool, random distinct slots, padding)."""
    return functools.partial(inputs.make_pool_case, device=DEVICE)


@pytest.fixture
def verify_case():
    """make(form, **kw): gdnzoo.inputs.make_verify_case on this run's device."""
    return functools.partial(inputs.make_verify_case, device=DEVICE)


@pytest.fixture
def pool():
    """make(P, HV, V, K, **kw): gdnzoo.inputs.paged_pool on this run's device."""
    return functools.partial(inputs.paged_pool, device=DEVICE)


@pytest.fixture
def problem():
    """make(**kw): gdnzoo.inputs.make_problem (the contest geometry on an sm_90 GPU)."""
    return inputs.make_problem


SELECTED_MATRIX_BACKENDS = set()


def pytest_collection_finish(session):
    """Which backends have matrix cases selected in this run (-k may select a part)."""
    for item in session.items:
        spec = getattr(item, "callspec", None)
        if item.name.startswith("test_backend_matches_reference") and spec is not None:
            SELECTED_MATRIX_BACKENDS.add(spec.params["backend"])
