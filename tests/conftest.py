"""Test setup: the fixture that keeps torch to one thread in the tests that run models. The repo's
packages import from the checkout (pyproject.toml sets pytest's pythonpath to the repo root)."""
import pytest


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from threads, and spinning threads crawl on a shared 2-core box.
    Test modules that run torch use it: pytestmark = pytest.mark.usefixtures("one_torch_thread")."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
