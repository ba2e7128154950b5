"""Tests marked `cuda` skip, with the reason, on machines without an NVIDIA GPU (CI has none)."""
import pytest
import torch

# NOTE: the CPU tests run tiny tensors; one thread avoids oversubscribing CI's two cores.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU: torch.cuda.is_available() is False")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
