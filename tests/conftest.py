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
