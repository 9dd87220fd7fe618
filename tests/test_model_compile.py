"""torch.compile's structure on the GPU path, traced on the CPU with dynamo's "eager" backend
(dynamo's guards and graph breaks are the GPU's; only Inductor's code generation is skipped):
  * the blocks compiled one by one (GPT.compile_regions) fit the recompile limit set in
    model/device.py through training, a growing window and no-grad validation at two batch shapes,
    and would not fit torch's default limit of 8;
  * the BlockMask builder and FlexAttention trace into one graph each, without breaks, and agree
    with their eager forms."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from hints import n_kinds
from model import GPT, RECORD_BACKBONE, GPTConfig
from model.attention import flex_attention_op, window_block_mask
from model.device import RECOMPILE_LIMIT, configure_compile

VOCAB, T, K, BLOCK, BOS = 500, 64, 3, 8, 7

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def fresh_dynamo():
    """A clean dynamo cache and counters, and the recompile settings restored afterwards."""
    config = torch._dynamo.config
    saved = config.recompile_limit, config.fail_on_recompile_limit_hit
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    config.recompile_limit, config.fail_on_recompile_limit_hit = saved


def run_record_variants():
    """Train, grow the window, validate at the training and at another batch shape: every block
    variant the trainer compiles. Returns the number of distinct block graphs."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_layer=12, n_head=2, n_embd=32, max_seq_len=T, n_hint_lengths=K,
                          n_hint_kinds=n_kinds(K), attn_block_size=BLOCK, bos_id=BOS, **RECORD_BACKBONE))
    for block in model.blocks:  # what compile_regions does on the GPU path, with dynamo's eager backend
        block.compile(dynamic=False, backend="eager")

    def forward(batch, window, grad):
        model.set_window_blocks(window)
        idx = torch.randint(0, VOCAB, (batch, T))
        hint_tokens = torch.randint(-1, VOCAB, (batch, T, K))
        hint_kinds = torch.randint(0, n_kinds(K), (batch, T, K)).masked_fill(hint_tokens < 0, -1)
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(idx, idx.roll(-1, 1), hint_tokens, hint_kinds)
        if grad:
            loss.backward()

    for window in (1, 2, 5):
        forward(2, window, grad=True)
    forward(2, 5, grad=False)   # validation at the training batch shape
    forward(4, 5, grad=False)   # ... and at another
    return counters["stats"]["unique_graphs"]


def test_block_variants_fit_the_recompile_limit(fresh_dynamo):
    configure_compile()
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    graphs = run_record_variants()
    # 3 block kinds (value embeddings, attention alone, MLP only) x (training, no-grad) + 3 for the
    # second validation shape; the growing window adds none
    assert graphs == 9 <= RECOMPILE_LIMIT


def test_torch_default_limit_would_be_hit(fresh_dynamo):
    torch._dynamo.config.recompile_limit = 8
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    with pytest.raises(Exception, match="recompile_limit|cache_size_limit"):
        run_record_variants()


def documents(T_, generator):
    idx = torch.randint(0, VOCAB, (2, T_), generator=generator)
    idx[idx == BOS] = BOS + 1
    idx[:, torch.randint(1, T_, (4,), generator=generator)] = BOS
    return idx


def test_block_mask_builder_traces_whole(fresh_dynamo):
    built = torch.compile(window_block_mask, backend="eager", fullgraph=True, dynamic=False)
    g = torch.Generator().manual_seed(3)
    for window in (1, 3, 16):  # the window is a tensor: no recompile as it grows
        idx = documents(128, g)
        w = torch.tensor(window, dtype=torch.int32)
        ours, eager = built(idx, w, 8, BOS), window_block_mask(idx, w, 8, BOS)
        for a, b in zip(ours.as_tuple()[2:10], eager.as_tuple()[2:10]):
            assert torch.equal(a, b)
    assert counters["stats"]["unique_graphs"] == 1


def test_flex_attention_traces_into_the_callers_graph(fresh_dynamo):
    g = torch.Generator().manual_seed(4)
    idx = documents(128, g)
    mask = window_block_mask(idx, torch.tensor(3, dtype=torch.int32), 8, BOS)
    q, k, v = (torch.randn(2, 2, 128, 16, generator=g) for _ in range(3))
    traced = torch.compile(lambda q, k, v, m: flex_attention_op(q, k, v, m) * 2, backend="eager", fullgraph=True)
    torch.testing.assert_close(traced(q, k, v, mask), 2 * flex_attention_op(q, k, v, mask))
