"""FlashAttention (Module 17): ``scaled_dot_product_attention(..., flash=True)``.

On every device, flash attention gives plain attention's outputs and gradients (float32
tolerance, against a float64 reference) for any lengths and tile sizes, with no mask, a
boolean mask, a causal mask and Module 14's KV-cache alignment (L < S), and 0 for a query
that may attend nothing; ``gradcheck`` in float64; PyTorch agrees when installed. It keeps
no (L, S) array for backward, and at T = 1024 its peak memory is at most a quarter of the
plain attention's. ``use_flash_attention()`` and ``GPTConfig(flash=True)`` switch it on;
dropout on the weights is refused, not ignored.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
import tinytrain.nn as nn
import tinytrain.nn.functional as F
from tinytrain.nn.attention import use_flash_attention
from tinytrain.nn.flash_attention import FlashAttention, flash_attention

try:
    import torch
except ImportError:
    torch = None


def tensors(shapes, device, dtype="float64", seed=0):
    rng = np.random.default_rng(seed)
    return [tt.tensor(rng.standard_normal(shape), dtype=dtype, device=device, requires_grad=True) for shape in shapes]


def outputs_and_gradients(inputs, weights, **options):
    """The attention's output and the gradients of sum(output * weights) for the inputs."""
    for t in inputs:
        t.grad = None
    out = F.scaled_dot_product_attention(*inputs, **options)
    (out * tt.tensor(weights, dtype=out.dtype, device=out.device)).sum().backward()
    return [out.numpy()] + [t.grad.numpy() for t in inputs]


@given(length=st.integers(1, 9), source=st.integers(1, 9), block=st.integers(1, 5), mask=st.sampled_from(
    ["none", "causal", "boolean"]), heads_of_key=st.sampled_from([1, 2]), seed=st.integers(0, 1000))
def test_flash_equals_plain_attention_outputs_and_gradients(device, length, source, block, mask, heads_of_key,
                                                            seed) -> None:
    rng = np.random.default_rng(seed)
    shapes = [(2, 2, length, 3), (2, heads_of_key, source, 3), (2, heads_of_key, source, 4)]  # keys broadcast
    options = {"is_causal": True} if mask == "causal" else {}
    if mask == "boolean":
        options["attn_mask"] = tt.tensor(rng.random((2, 1, length, source)) < 0.6, device=device)
    weights = rng.standard_normal((2, 2, length, 4))
    plain = outputs_and_gradients(tensors(shapes, device, seed=seed), weights, **options)
    inputs = tensors(shapes, device, dtype="float32", seed=seed)
    for t in inputs:
        t.grad = None
    out = flash_attention(*inputs, block_size=block, **options)
    (out * tt.tensor(weights, dtype="float32", device=device)).sum().backward()
    flash = [out.numpy()] + [t.grad.numpy() for t in inputs]
    for name, a, b in zip(("output", "d_query", "d_key", "d_value"), plain, flash):
        assert b.dtype == np.float32 and a.shape == b.shape, name
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=name)


def test_flash_attention_passes_gradcheck(device) -> None:
    q, k, v = tensors([(1, 2, 5, 3), (1, 2, 7, 3), (1, 2, 7, 2)], device)
    assert tt.gradcheck(lambda q, k, v: flash_attention(q, k, v, is_causal=True, block_size=2), [q, k, v])
    mask = tt.tensor(np.random.default_rng(1).random((5, 7)) < 0.5, device=device)
    assert tt.gradcheck(lambda q, k, v: flash_attention(q, k, v, attn_mask=mask, scale=0.7, block_size=3), [q, k, v])


def test_a_query_that_may_attend_nothing_gets_zero_and_no_nan(device) -> None:
    q, k, v = tensors([(1, 5, 3), (1, 3, 3), (1, 3, 2)], device, dtype="float32")
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, flash=True)  # L > S: queries 0 and 1 see nothing
    out.sum().backward()
    assert np.all(out.numpy()[0, :2] == 0) and np.all(q.grad.numpy()[0, :2] == 0)
    assert all(np.isfinite(t.grad.numpy()).all() for t in (q, k, v))
    mask = tt.tensor(np.array([[True, True, False], [False, False, False]] * 2 + [[True, False, True]]), device=device)
    plain = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).numpy()
    flash = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, flash=True).numpy()
    assert np.array_equal(flash[0, 1], [0, 0]) and np.allclose(flash, plain, atol=1e-6)


def test_the_kv_cache_alignment_of_is_causal(device) -> None:
    """With fewer queries than keys, the queries are the last positions: query i sees keys 0 .. i + S - L."""
    q, k, v = tensors([(2, 8, 4), (2, 8, 4), (2, 8, 4)], device, dtype="float32")
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, flash=True).numpy()
    last = F.scaled_dot_product_attention(q[:, 5:], k, v, is_causal=True, flash=True).numpy()
    np.testing.assert_allclose(last, full[:, 5:], rtol=1e-6, atol=1e-6)


def test_flash_keeps_no_square_array_for_backward() -> None:
    q, k, v = tensors([(1, 4, 96, 8), (1, 4, 96, 8), (1, 4, 96, 8)], "cpu", dtype="float32")
    out = flash_attention(q, k, v, is_causal=True, block_size=32)
    node = out._ctx
    assert isinstance(node, FlashAttention)
    kept = [value for value in [*vars(node).values(), *node.saved, *vars(node.tiles).values()]
            if hasattr(value, "nbytes")]
    assert len(kept) >= 5 and max(value.size for value in kept) <= 4 * 96 * 8, [value.shape for value in kept]


def test_at_t_1024_flash_attention_peaks_below_a_quarter_of_plain_attention() -> None:
    """Batch 1, 4 heads of 32 channels, causal: one forward + backward, measured with tracemalloc."""
    results = {}
    for flash in (False, True):
        q, k, v = tensors([(1, 4, 1024, 32)] * 3, "cpu", dtype="float32", seed=3)
        tracemalloc.start()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, flash=flash)
        out.sum().backward()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        results[flash] = peak, [out.numpy()] + [t.grad.numpy() for t in (q, k, v)]
    assert results[True][0] <= results[False][0] / 4, (results[True][0], results[False][0])
    for name, a, b in zip(("output", "d_query", "d_key", "d_value"), results[False][1], results[True][1]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=name)


def test_bfloat16_flash_attention_adds_its_tiles_up_in_float32(device) -> None:
    q, k, v = tensors([(1, 2, 40, 8)] * 3, device, dtype="float32")
    low = [t.detach().astype("bfloat16") for t in (q, k, v)]
    out = flash_attention(*low, is_causal=True, block_size=16)
    reference = F.scaled_dot_product_attention(*[t.astype("float32") for t in low], is_causal=True).numpy()
    assert out.dtype == tt.bfloat16
    np.testing.assert_allclose(out.numpy().astype(np.float32), reference, rtol=2**-7, atol=2**-7)


def test_use_flash_attention_switches_calls_that_do_not_say(device) -> None:
    q, k, v = tensors([(1, 6, 4)] * 3, device, dtype="float32")
    assert type(F.scaled_dot_product_attention(q, k, v)._ctx).__name__ == "MatMul"
    with use_flash_attention():
        assert isinstance(F.scaled_dot_product_attention(q, k, v)._ctx, FlashAttention)
        assert type(F.scaled_dot_product_attention(q, k, v, flash=False)._ctx).__name__ == "MatMul"
        with use_flash_attention(False):
            assert type(F.scaled_dot_product_attention(q, k, v)._ctx).__name__ == "MatMul"
    with pytest.raises(KeyError):
        with use_flash_attention():
            raise KeyError("inside")
    assert type(F.scaled_dot_product_attention(q, k, v)._ctx).__name__ == "MatMul", "restored after an error"


def test_bad_arguments_are_refused_by_name(device) -> None:
    q, k, v = tensors([(1, 6, 4)] * 3, device, dtype="float32")
    with pytest.raises(ValueError, match="dropout_p=0.1"):
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, flash=True)
    with pytest.raises(ValueError, match="block_size must be a whole number >= 1, got block_size=0"):
        flash_attention(q, k, v, block_size=0)
    with pytest.raises(TypeError, match="attn_mask must be boolean"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=tt.ones(6, 6, device=device), flash=True)
    with pytest.raises(ValueError, match=r"query \(1, 6, 4\), key \(1, 6, 3\)"):
        F.scaled_dot_product_attention(q, tt.ones(1, 6, 3, device=device), v, flash=True)
    assert F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, flash=True).shape == (1, 6, 4)


def gpt_loss_and_gradients(flash: bool, checkpointing: bool = False):
    tt.manual_seed(0)
    config = nn.GPTConfig(vocab_size=11, block_size=40, n_layer=2, n_head=2, n_embd=8, flash=flash,
                          checkpointing=checkpointing)
    model = nn.GPT(config)
    ids = tt.tensor(np.random.default_rng(0).integers(0, 11, (2, 40)))
    logits, loss = model(ids, targets=ids)
    loss.backward()
    return logits.numpy(), [p.grad.numpy() for p in model.parameters()]


def test_a_flash_gpt_computes_what_the_plain_one_does() -> None:
    plain = gpt_loss_and_gradients(False)
    for checkpointing in (False, True):  # a checkpointed block recomputes its attention with flash too
        flash = gpt_loss_and_gradients(True, checkpointing)
        np.testing.assert_allclose(flash[0], plain[0], rtol=1e-5, atol=1e-6)
        for a, b in zip(plain[1], flash[1]):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    assert "flash=True" in repr(nn.GPT(nn.GPTConfig(11, 8, 1, 2, 8, flash=True)))
    with pytest.raises(ValueError, match="dropout=0.1"):
        nn.GPTConfig(11, 8, 1, 2, 8, dropout=0.1, flash=True)
    with pytest.raises(TypeError, match="flash"):
        nn.GPTConfig(11, 8, 1, 2, 8, flash="yes")


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
def test_flash_attention_agrees_with_pytorch() -> None:
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 50, 16)).astype(np.float32) for _ in range(3))
    mask = rng.random((50, 50)) < 0.7
    for options in ({"is_causal": True}, {"attn_mask": mask}, {}):
        ours = flash_attention(*(tt.tensor(a) for a in (q, k, v)), block_size=16,
                               **{key: tt.tensor(value) if key == "attn_mask" else value
                                  for key, value in options.items()}).numpy()
        theirs = torch.nn.functional.scaled_dot_product_attention(
            *(torch.from_numpy(a) for a in (q, k, v)),
            **{key: torch.from_numpy(value) if key == "attn_mask" else value for key, value in options.items()})
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5, atol=1e-5)
