"""Module 15: the GPT (tinytrain.nn.transformer).

Gradients of a tiny GPT's loss in float64, cached against uncached logits, reproducible
sampling, top-k and greedy decoding, checkpointed against plain gradients, the parameter
formula, and errors that name what is wrong. Runs on every device.
"""
import math

import numpy as np
import pytest

import tinytrain as tt
import tinytrain.nn as nn


def tiny(device="cpu", dtype="float64", seed=0, **sizes):
    config = dict(vocab_size=7, block_size=10, n_layer=2, n_head=2, n_embd=4)
    config.update(sizes)
    tt.manual_seed(seed)
    return nn.GPT(nn.GPTConfig(**config)).to(device, dtype=dtype)


def ids(shape, vocab=7, device="cpu", seed=0):
    return tt.tensor(np.random.default_rng(seed).integers(0, vocab, shape), device=device)


def test_gradcheck_of_the_loss_wrt_every_parameter(device) -> None:
    model = tiny(device)
    x, y = ids((2, 5), device=device), ids((2, 5), device=device, seed=1)
    params = model.parameters()
    assert tt.gradcheck(lambda *p: model(x, targets=y)[1], params)


def test_tied_head_gets_both_gradients_and_counts_once(device) -> None:
    model = tiny(device)
    assert model.lm_head.weight is model.wte.weight
    assert "lm_head.weight" not in dict(model.named_parameters())
    assert set(model.state_dict()) == {name for name, _ in model.named_parameters()}


@pytest.mark.parametrize("bias", [True, False])
def test_parameter_count_formula(bias) -> None:
    for sizes in [dict(vocab_size=7, block_size=10, n_layer=2, n_head=2, n_embd=4),
                  dict(vocab_size=65, block_size=32, n_layer=3, n_head=4, n_embd=16)]:
        config = nn.GPTConfig(bias=bias, **sizes)
        assert nn.GPT(config).num_parameters() == nn.gpt_num_parameters(config)
    gpt2 = nn.GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    assert nn.gpt_num_parameters(gpt2) == 124_439_808  # OpenAI's GPT-2 small (124M)
    assert nn.flops_per_token(gpt2, 1) == 6 * (124_439_808 - 1024 * 768) + 12 * 12 * 768


def test_init_scales_the_residual_projections() -> None:
    tt.manual_seed(0)
    model = nn.GPT(nn.GPTConfig(vocab_size=300, block_size=200, n_layer=8, n_head=4, n_embd=64))
    assert abs(model.wte.weight.numpy().std() - 0.02) < 1e-3
    assert abs(model.h[3].attn.c_proj.weight.numpy().std() - 0.02 / 4) < 3e-4
    assert not model.h[0].mlp.c_fc.bias.numpy().any()


def test_cached_logits_equal_the_uncached_ones(device) -> None:
    model = tiny(device).eval()
    x = ids((3, 10), device=device)
    full = model(x).numpy()
    cache = nn.KVCache(2)
    parts = [model(x[:, a:b], cache=cache).numpy() for a, b in [(0, 4), (4, 5), (5, 8), (8, 9), (9, 10)]]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, rtol=1e-10, atol=1e-12)
    assert cache.length == 10


def test_generate_is_reproducible_and_the_same_with_and_without_the_cache(device) -> None:
    model = tiny(device, dtype=None).train()
    runs = []
    for use_cache in (True, True, False):
        tt.manual_seed(4)
        runs.append(model.generate(ids((2, 3), device=device), 20, temperature=1.3, top_k=5,
                                   use_cache=use_cache).numpy())
    assert runs[0].shape == (2, 23) and (runs[0][:, :3] == ids((2, 3)).numpy()).all()
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])  # past block_size=10, too
    assert model.training, "generate restores the training mode"


def test_top_k_never_samples_outside_the_top_k() -> None:
    logits = tt.tensor(np.random.default_rng(0).standard_normal((500, 20)))
    probs = nn.next_token_probs(logits, temperature=3.0, top_k=4)
    tt.manual_seed(0)
    drawn = nn.sample(probs).numpy()
    top = np.argsort(logits.numpy(), axis=-1)[:, -4:]
    assert all(d in t for d, t in zip(drawn, top))
    assert len(set(drawn.tolist())) > 4  # it does sample, not only take the maximum


def test_temperature_zero_is_argmax_and_small_temperatures_approach_it() -> None:
    logits = tt.tensor(np.random.default_rng(1).standard_normal((50, 9)))
    tt.manual_seed(0)
    assert np.array_equal(nn.sample(nn.next_token_probs(logits, temperature=0)).numpy(),
                          logits.numpy().argmax(-1))
    np.testing.assert_allclose(nn.next_token_probs(logits, temperature=1e-4).numpy(),
                               nn.next_token_probs(logits, temperature=0).numpy(), atol=1e-6)


def test_greedy_generation_stays_on_the_models_device(device) -> None:
    """generate(temperature=0) appends to a context on the model's device: the greedy one-hot rows live there."""
    model = tiny(device, dtype=None)
    probs = nn.next_token_probs(model(ids((2, 3), device=device))[:, -1], temperature=0)
    assert str(probs.device) == str(model.wte.weight.device) and probs.dtype == np.float32
    greedy = model.generate(ids((2, 3), device=device), 6, temperature=0)
    assert np.array_equal(greedy.numpy(), tiny(dtype=None).generate(ids((2, 3)), 6, temperature=0).numpy())


def test_sample_follows_the_probabilities() -> None:
    tt.manual_seed(0)
    probs = tt.tensor(np.tile([[0.1, 0.0, 0.6, 0.3]], (20000, 1)))
    counts = np.bincount(nn.sample(probs).numpy(), minlength=4) / 20000
    np.testing.assert_allclose(counts, [0.1, 0.0, 0.6, 0.3], atol=0.015)


def test_checkpointing_gives_identical_gradients(device) -> None:
    grads = []
    for checkpointing in (False, True):
        model = tiny(device, dropout=0.2, checkpointing=checkpointing)
        tt.manual_seed(9)
        _, loss = model(ids((2, 6), device=device), targets=ids((2, 6), device=device, seed=1))
        loss.backward()
        grads.append([p.grad.numpy() for p in model.parameters()])
    for plain, ckpt in zip(*grads):
        assert np.array_equal(plain, ckpt)


def test_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="n_embd=6 must be divisible by n_head=4"):
        nn.GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=4, n_embd=6)
    model = tiny()
    with pytest.raises(ValueError, match="positions 0 to 10 do not fit in block_size=10"):
        model(ids((1, 11)))
    with pytest.raises(RuntimeError, match="model.eval()"):
        model.train()(ids((1, 2)), cache=nn.KVCache(2))
    with pytest.raises(ValueError, match="top_k"):
        nn.next_token_probs(tt.zeros(1, 3), top_k=0)
    with pytest.raises(ValueError, match="temperature"):
        nn.next_token_probs(tt.zeros(1, 3), temperature=-1.0)
