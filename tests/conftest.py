import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "vllm: needs vLLM (the [vllm] extra) and a GPU; skipped where vllm is absent")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the GPU machine with `pytest -m gpu`)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
