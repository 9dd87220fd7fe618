"""Test setup: import the repo's packages (hints, data, model, train_gpt) from the checkout,
and the fixture that keeps torch to one thread in the tests that run models."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from threads, and spinning threads crawl on a shared 2-core box.
    Test modules that run torch use it: pytestmark = pytest.mark.usefixtures("one_torch_thread")."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
