"""Shared fixtures.  Without a CUDA device, Triton kernels run through the Triton interpreter:
TRITON_INTERPRET must be set before triton is first imported, so it is set here."""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def device():
    return DEVICE


SELECTED_MATRIX_BACKENDS = set()


def pytest_collection_finish(session):
    """Which backends have matrix cases selected in this run (-k may select a part)."""
    for item in session.items:
        spec = getattr(item, "callspec", None)
        if item.name.startswith("test_backend_matches_reference") and spec is not None:
            SELECTED_MATRIX_BACKENDS.add(spec.params["backend"])
