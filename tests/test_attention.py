"""Module 14: tokenizers, embeddings, positional encodings and attention.

Tokenizers: round trips on any text, BPE's merges and encoding against a plain
reference (minbpe's rule), their state as plain data (through a checkpoint), and
loads that refuse bad states without changing anything. Layers and functions run
on every device: values against NumPy references and (when installed) PyTorch,
gradients with ``tt.gradcheck`` in float64, and every error names what is wrong.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
import tinytrain.nn as nn
import tinytrain.nn.functional as F
from tinytrain.nn.attention import MaskedSoftmax
from tinytrain.nn.embedding import sinusoidal_encoding
from tinytrain.serialization import read_checkpoint, write_checkpoint
from tinytrain.text import BPETokenizer, CharTokenizer, merge, pair_counts

try:
    import torch
except ImportError:
    torch = None

TEXTS = st.text(max_size=40)
SHORT = st.text(alphabet="abcé ", max_size=60)


def t64(array, device="cpu", requires_grad=False):
    return tt.tensor(np.asarray(array, dtype=np.float64), dtype="float64", device=device, requires_grad=requires_grad)


# -- tokenizers ------------------------------------------------------------------------------------

@given(corpus=TEXTS, text=TEXTS)
def test_char_tokenizer_round_trips_every_text_of_its_characters(corpus, text) -> None:
    tokenizer = CharTokenizer().train(corpus + text)
    assert tokenizer.chars == sorted(set(corpus + text)) and tokenizer.vocab_size == len(set(corpus + text))
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text and all(isinstance(i, int) for i in ids)


def test_char_tokenizer_errors_name_the_character_and_the_id() -> None:
    tokenizer = CharTokenizer().train("hello")
    with pytest.raises(ValueError, match=r"'z' \(first at position 2\)"):
        tokenizer.encode("hez")
    with pytest.raises(ValueError, match="id 4 at position 1"):
        tokenizer.decode([0, 4])
    with pytest.raises(TypeError, match="integer ids"):
        tokenizer.decode([0.0])
    assert tokenizer.decode(np.array([0, 1])) == "eh" and tokenizer.decode(tt.tensor([3, 2])) == "ol"


@given(corpus=SHORT, text=TEXTS, merges=st.integers(0, 40))
def test_bpe_round_trips_any_text_and_encodes_like_minbpe(corpus, text, merges) -> None:
    tokenizer = BPETokenizer().train(corpus, 256 + merges)
    assert tokenizer.vocab_size <= 256 + merges and list(tokenizer.merges.values()) == list(
        range(256, tokenizer.vocab_size))
    for sample in (corpus, text):
        ids = tokenizer.encode(sample)
        assert tokenizer.decode(ids) == sample
        rank = {pair: new for pair, new in tokenizer.merges.items()}
        expected = list(sample.encode("utf-8"))
        while True:  # minbpe: merge the earliest-learned pair present, until none is
            present = [pair for pair in zip(expected, expected[1:]) if pair in rank]
            if not present:
                break
            pair = min(present, key=rank.get)
            expected = merge(expected, pair, rank[pair])
        assert ids == expected


def test_bpe_learns_the_worked_example_and_counts_pairs_in_order() -> None:
    assert pair_counts([1, 2, 1, 2, 3]) == {(1, 2): 2, (2, 1): 1, (2, 3): 1}
    assert list(pair_counts([3, 3, 1, 2])) == [(3, 3), (3, 1), (1, 2)]
    tokenizer = BPETokenizer().train("aaabdaaabac", 1000)
    assert tokenizer.encode("aaabdaaabac") == [tokenizer.vocab_size - 1], "merged until one id is left"
    assert tokenizer.vocab()[256:259] == [b"aa", b"aaa", b"aaab"]


def test_bpe_decodes_a_broken_character_as_the_replacement_character() -> None:
    tokenizer = BPETokenizer()
    assert tokenizer.decode(list("é".encode("utf-8"))[:1]) == "\ufffd"
    with pytest.raises(ValueError, match="id 256 at position 0"):
        tokenizer.decode([256])


def test_tokenizer_states_are_plain_data_that_survive_a_checkpoint(tmp_path) -> None:
    bpe = BPETokenizer().train("the cat sat on the mat with the hat", 280)
    chars = CharTokenizer().train("to be or not")
    write_checkpoint(tmp_path / "tokenizers.pkl", {"bpe": bpe.state_dict(), "chars": chars.state_dict()})
    state = read_checkpoint(tmp_path / "tokenizers.pkl")
    again, chars_again = BPETokenizer(), CharTokenizer()
    again.load_state_dict(state["bpe"])
    chars_again.load_state_dict(state["chars"])
    assert again.merges == bpe.merges and again.encode("the rat") == bpe.encode("the rat")
    assert chars_again.chars == chars.chars and chars_again.encode("not") == chars.encode("not")


@pytest.mark.parametrize("state, error, words", [
    ([], TypeError, ["state"]),
    ({"kind": "char", "merges": []}, ValueError, ["'char'", "'bpe'"]),
    ({"kind": "bpe"}, ValueError, ["no 'merges'"]),
    ({"kind": "bpe", "merges": "ab"}, ValueError, ["list of pairs"]),
    ({"kind": "bpe", "merges": [[97, 98], [256, 300]]}, ValueError, ["merge 1", "below 257", "[256, 300]"]),
    ({"kind": "bpe", "merges": [[97, 98], [97, 98]]}, ValueError, ["merge 1 repeats", "merge 0"]),
    ({"kind": "bpe", "merges": [[97, 98, 99]]}, ValueError, ["merge 0"]),
    ({"kind": "bpe", "merges": [[-1, 98]]}, ValueError, ["merge 0"]),
    ({"kind": "bpe", "merges": [[True, 98]]}, ValueError, ["merge 0"]),
])
def test_bpe_load_refuses_a_bad_state_and_changes_nothing(state, error, words) -> None:
    tokenizer = BPETokenizer().train("abab", 257)
    with pytest.raises(error) as raised:
        tokenizer.load_state_dict(state)
    assert all(word in str(raised.value) for word in words), raised.value
    assert tokenizer.merges == {(97, 98): 256}


@pytest.mark.parametrize("state, words", [
    ({"kind": "char", "chars": "abca"}, ["repeated"]), ({"kind": "char", "chars": ["a"]}, ["string"]),
    ({"kind": "bpe", "chars": "ab"}, ["'bpe'", "'char'"]), ({"kind": "char"}, ["no 'chars'"]),
])
def test_char_load_refuses_a_bad_state_and_changes_nothing(state, words) -> None:
    tokenizer = CharTokenizer().train("xy")
    with pytest.raises(ValueError) as raised:
        tokenizer.load_state_dict(state)
    assert all(word in str(raised.value) for word in words), raised.value
    assert tokenizer.chars == ["x", "y"]


def test_tokenizer_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="vocab_size must be a whole number >= 256"):
        BPETokenizer().train("abc", 255)
    with pytest.raises(TypeError, match="text"):
        BPETokenizer().train(b"abc", 300)
    with pytest.raises(TypeError, match="text"):
        CharTokenizer().train(["a"])
    with pytest.raises(TypeError, match="text"):
        BPETokenizer().encode(None)
    assert merge([1, 2, 1, 2, 2], (1, 2), 7) == [7, 7, 2] and merge([1, 1, 1], (1, 1), 5) == [5, 1]


def test_shakespeare_trains_a_char_tokenizer_of_65_symbols() -> None:
    text = tt.datasets.shakespeare()
    tokenizer = CharTokenizer().train(text)
    assert tokenizer.vocab_size == 65 and tokenizer.encode("\n ") == [0, 1]
    assert tokenizer.decode(tokenizer.encode(text[:1000])) == text[:1000]


# -- embeddings ----------------------------------------------------------------------------------------

@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=3), seed=st.integers(0, 2**32 - 1))
def test_embedding_gathers_rows_and_adds_up_gradients_of_repeated_ids(device, shape, seed) -> None:
    rng = np.random.default_rng(seed)
    weight, ids = rng.standard_normal((4, 3)), rng.integers(0, 4, shape)
    w = t64(weight, device, requires_grad=True)
    out = F.embedding(tt.tensor(ids, device=device), w)
    assert out.shape == (*shape, 3) and out.device == w.device
    np.testing.assert_array_equal(out.numpy(), weight[ids])
    upstream = rng.standard_normal(out.shape)
    out.backward(t64(upstream, device))
    expected = np.zeros((4, 3))
    np.add.at(expected, ids, upstream)
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-12, atol=1e-12)
    assert tt.gradcheck(lambda w: F.embedding(tt.tensor(ids, device=device), w), [t64(weight, device, True)])


def test_embedding_layer(device) -> None:
    tt.manual_seed(0)
    layer = nn.Embedding(1000, 50).to(device)
    assert layer.weight.shape == (1000, 50) and layer.weight.dtype == np.float32
    assert [name for name, _ in layer.named_parameters()] == ["weight"] and repr(layer) == "Embedding(1000, 50)"
    values = layer.weight.numpy()
    assert abs(values.mean()) < 0.01 and abs(values.std() - 1) < 0.01, "N(0, 1) as in PyTorch"
    out = layer([[3, 999], [0, 3]])
    np.testing.assert_array_equal(out.numpy()[0, 0], values[3])
    out.sum().backward()
    assert layer.weight.grad.numpy()[3].tolist() == [2.0] * 50 and layer.weight.grad.dtype == np.float32


def test_embedding_errors_name_the_ids_and_the_table(device, other_device) -> None:
    weight = tt.zeros(5, 2, device=device)
    with pytest.raises(IndexError, match=r"range\(0, 5\).*\(5, 2\).*from -1 to 4"):
        F.embedding([4, -1], weight)
    with pytest.raises(IndexError, match="from 0 to 5"):
        F.embedding([[0], [5]], weight)
    with pytest.raises(TypeError, match=r"of ids in \[0, 5\), got dtype float32 of shape \(1,\)"):
        F.embedding(tt.tensor([1.0], device=device), weight)
    with pytest.raises(RuntimeError, match="same device"):
        F.embedding(tt.tensor([1], device=other_device), weight)
    with pytest.raises(ValueError, match=r"\(num_embeddings, embedding_dim\), got \(5,\)"):
        F.embedding([1], tt.zeros(5, device=device))
    assert F.embedding(tt.zeros(0, dtype="int64", device=device), weight).shape == (0, 2)
    with pytest.raises(ValueError, match="num_embeddings"):
        nn.Embedding(0, 3)


def test_embedding_of_one_int_id_and_of_bad_ids(device) -> None:
    """An int is one id (shape (D,), like weight[id]), not a float32 tensor refused with 'the ids must be
    integers, got dtype float32'. Ids that are no integers name the input and what was expected."""
    layer = nn.Embedding(3, 2).to(device)
    np.testing.assert_array_equal(layer(1).numpy(), layer.weight.numpy()[1])
    np.testing.assert_array_equal(layer(np.int64(2)).numpy(), layer.weight.numpy()[2])
    with pytest.raises(IndexError, match=r"range\(0, 3\).*from 3 to 3"):
        layer(3)
    expected = r"expected an integer tensor \(or array, list or int\) of ids in \[0, 3\), "
    for bad, error, shown in ((1.0, TypeError, "got dtype float32 of shape \\(\\)"),
                              ([0.5, 1], TypeError, "got dtype float32 of shape \\(2,\\)"),
                              (True, TypeError, "got dtype bool"),
                              ("a", TypeError, "got input='a' of type str"),
                              (None, TypeError, "got input=None of type NoneType"),
                              ([[0, 1], [2]], ValueError, r"got input=\[\[0, 1\], \[2\]\] .*inhomogeneous")):
        with pytest.raises(error, match="embedding: " + expected + shown):
            layer(bad)


# -- positional encodings ---------------------------------------------------------------------------------

def test_sinusoidal_encoding_interleaves_sines_and_cosines() -> None:
    table = sinusoidal_encoding(20, 6, base=50.0)
    for p in (0, 1, 19):
        for i in range(3):
            angle = p / 50.0 ** (2 * i / 6)
            assert table[p, 2 * i] == pytest.approx(math.sin(angle), abs=1e-15)
            assert table[p, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-15)
    with pytest.raises(ValueError, match="even dim.*dim=5"):
        sinusoidal_encoding(3, 5)
    if torch is not None:  # the table of PyTorch's tutorial's PositionalEncoding, built the same way
        position = torch.arange(20, dtype=torch.float64).unsqueeze(1)
        div = torch.exp(torch.arange(0, 6, 2, dtype=torch.float64) * (-math.log(50.0) / 6))
        expected = torch.zeros(20, 6, dtype=torch.float64)
        expected[:, 0::2], expected[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
        np.testing.assert_allclose(table, expected.numpy(), atol=1e-12)


@pytest.mark.parametrize("kind", [nn.LearnedPositionalEncoding, nn.SinusoidalPositionalEncoding])
def test_positional_encodings_add_the_rows_from_start(device, kind) -> None:
    tt.manual_seed(0)
    layer = kind(10, 4).to(device, dtype="float64")
    table = (layer.weight if kind is nn.LearnedPositionalEncoding else layer.encoding).numpy()
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    np.testing.assert_allclose(layer(t64(x, device)).numpy(), x + table[:3])
    np.testing.assert_allclose(layer(t64(x, device), start=7).numpy(), x + table[7:10])
    np.testing.assert_allclose(layer(t64(x[0], device), start=2).numpy(), x[0] + table[2:5])
    with pytest.raises(ValueError, match=r"positions 8 to 10 \(start=8, T=3\).*max_length=10"):
        layer(t64(x, device), start=8)
    with pytest.raises(ValueError, match=r"\(\.\.\., T, 4\), got \(2, 3, 5\)"):
        layer(tt.zeros(2, 3, 5, dtype="float64", device=device))
    leaf = t64(x, device, requires_grad=True)
    assert tt.gradcheck(lambda x, *rest: layer(x, start=1), [leaf, *layer.parameters()])


def test_the_sinusoidal_table_is_a_buffer_and_the_learned_one_a_parameter() -> None:
    fixed, learned = nn.SinusoidalPositionalEncoding(8, 4), nn.LearnedPositionalEncoding(8, 4)
    assert fixed.parameters() == [] and list(fixed.state_dict()) == ["encoding"]
    np.testing.assert_allclose(fixed.encoding.numpy(), sinusoidal_encoding(8, 4).astype(np.float32))
    assert list(learned.state_dict()) == ["weight"] and learned.weight.shape == (8, 4)
    with pytest.raises(ValueError, match="even dim"):
        nn.SinusoidalPositionalEncoding(8, 3)


# -- attention ------------------------------------------------------------------------------------------------

def reference_attention(q, k, v, allowed=None, scale=None):
    """softmax(q k^T * scale) v with masked scores left out, a row with nothing allowed giving zeros."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    allowed = np.ones(s.shape[-2:], bool) if allowed is None else allowed
    allowed = np.broadcast_to(allowed, s.shape)
    s = np.where(allowed, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    return (e / np.where(total > 0, total, 1)) @ v


def causal_mask(length, source):
    return np.arange(source)[None, :] <= np.arange(length)[:, None] + (source - length)


def test_masked_softmax_gradients_and_fully_masked_rows(device) -> None:
    scores = np.random.default_rng(0).standard_normal((2, 3, 4))
    allowed = np.random.default_rng(1).random((3, 4)) < 0.5
    allowed[1] = False
    on_device = tt.get_backend(device).from_host(allowed)
    x = t64(scores, device, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 0/0 or inf - inf on the way
        out = MaskedSoftmax.apply(x, allowed=on_device)
        out.sum().backward()
    assert (out.numpy()[:, 1] == 0).all() and (x.grad.numpy()[:, 1] == 0).all()
    assert tt.gradcheck(lambda x: MaskedSoftmax.apply(x, allowed=on_device), [t64(scores, device, True)])


@given(lead=st.lists(st.integers(1, 2), max_size=2), length=st.integers(1, 4), source=st.integers(1, 4),
       features=st.integers(1, 3), value_features=st.integers(1, 3), causal=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_attention_matches_the_reference_and_its_gradients(device, lead, length, source, features, value_features,
                                                           causal, seed) -> None:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*lead, length, features))
    k, v = rng.standard_normal((*lead, source, features)), rng.standard_normal((*lead, source, value_features))
    out = F.scaled_dot_product_attention(t64(q, device), t64(k, device), t64(v, device), is_causal=causal)
    assert out.shape == (*lead, length, value_features)
    expected = reference_attention(q, k, v, causal_mask(length, source) if causal else None)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-12)
    leaves = [t64(a, device, True) for a in (q, k, v)]
    assert tt.gradcheck(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), leaves)


def test_attention_with_a_mask_a_scale_and_broadcast_heads(device) -> None:
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((1, 3, 5, 4)), rng.standard_normal((2, 3, 5, 2))
    mask = rng.random((2, 1, 3, 5)) < 0.6
    mask[0, 0, 2] = False
    out = F.scaled_dot_product_attention(t64(q, device), t64(k, device), t64(v, device),
                                         attn_mask=tt.tensor(mask, device=device), scale=0.7)
    assert out.shape == (2, 3, 3, 2)
    np.testing.assert_allclose(out.numpy(), reference_attention(q, k, v, mask, scale=0.7), rtol=1e-10, atol=1e-12)
    assert (out.numpy()[0, :, 2] == 0).all(), "a query that may attend nothing gets zeros"


def test_attention_in_float32_stays_float32_and_stable(device) -> None:
    q = tt.tensor(np.full((1, 2, 3), 300.0), device=device)
    out = F.scaled_dot_product_attention(q, q, tt.ones(1, 2, 5, device=device), is_causal=True)
    assert out.dtype == np.float32 and np.isfinite(out.numpy()).all() and np.allclose(out.numpy(), 1.0)


def test_attention_dropout_zeroes_weights_in_proportion(device) -> None:
    tt.manual_seed(0)
    q, k = tt.zeros(1, 200, 4, device=device), tt.zeros(1, 200, 4, device=device)
    out = F.scaled_dot_product_attention(q, k, tt.ones(1, 200, 1, device=device), dropout_p=0.25).numpy()
    assert 0.9 < out.mean() < 1.1 and out.std() > 0.01, "inverted dropout: the expected output is unchanged"
    same = F.scaled_dot_product_attention(q, k, tt.ones(1, 200, 1, device=device), dropout_p=0.0).numpy()
    np.testing.assert_allclose(same, 1.0, rtol=1e-6)


def test_attention_errors_name_the_shapes(device, other_device) -> None:
    q, k, v = tt.zeros(2, 3, 4, device=device), tt.zeros(2, 5, 4, device=device), tt.zeros(2, 5, 6, device=device)
    sdpa = F.scaled_dot_product_attention
    with pytest.raises(ValueError, match="not both"):
        sdpa(q, k, v, attn_mask=tt.ones(3, 5, dtype="bool", device=device), is_causal=True)
    with pytest.raises(TypeError, match="boolean.*float32"):
        sdpa(q, k, v, attn_mask=tt.zeros(3, 5, device=device))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 4\).*\(2, 3, 5\)"):
        sdpa(q, k, v, attn_mask=tt.ones(3, 4, dtype="bool", device=device))
    with pytest.raises(ValueError, match=r"query \(2, 3, 4\), key \(2, 5, 4\) and value \(2, 4, 6\)"):
        sdpa(q, k, tt.zeros(2, 4, 6, device=device))
    with pytest.raises(ValueError, match=r"key needs shape \(\.\.\., length, features\), got \(4,\)"):
        sdpa(q, tt.zeros(4, device=device), v)
    with pytest.raises(ValueError, match="leading axes"):
        sdpa(q, tt.zeros(3, 5, 4, device=device), tt.zeros(3, 5, 6, device=device))
    with pytest.raises(RuntimeError, match="same device"):
        sdpa(q, tt.zeros(2, 5, 4, device=other_device), v)
    with pytest.raises(ValueError, match="dropout|p must"):
        sdpa(q, k, v, dropout_p=1.0)


@pytest.mark.skipif(torch is None, reason="needs PyTorch")
def test_attention_matches_pytorch() -> None:
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 6, 4)) for _ in range(3))
    mask = rng.random((6, 6)) < 0.7
    mask[2] = False  # a query that may attend nothing: zeros in both
    as_torch = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    ours = [t64(a, requires_grad=True) for a in (q, k, v)]
    for kwargs in ({"is_causal": True}, {"attn_mask": mask}, {"scale": 0.3}):
        expected = torch.nn.functional.scaled_dot_product_attention(
            *as_torch, **{**kwargs, **({"attn_mask": torch.tensor(mask)} if "attn_mask" in kwargs else {})})
        got = F.scaled_dot_product_attention(*ours, **kwargs)
        np.testing.assert_allclose(got.numpy(), expected.detach().numpy(), rtol=1e-10, atol=1e-12)
        upstream = rng.standard_normal(got.shape)
        expected.backward(torch.tensor(upstream))
        got.backward(t64(upstream))
        for mine, theirs in zip(ours, as_torch):
            np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-9, atol=1e-12)
            mine.grad, theirs.grad = None, None


# -- CausalSelfAttention ------------------------------------------------------------------------------------

def test_causal_self_attention_layout_and_errors() -> None:
    layer = nn.CausalSelfAttention(8, 2, dropout=0.1)
    assert [(name, p.shape) for name, p in layer.named_parameters()] == [
        ("c_attn.weight", (24, 8)), ("c_attn.bias", (24,)), ("c_proj.weight", (8, 8)), ("c_proj.bias", (8,))]
    assert layer.head_dim == 4 and layer.num_parameters() == 4 * 8 * 8 + 4 * 8
    assert len(nn.CausalSelfAttention(8, 4, bias=False).parameters()) == 2
    with pytest.raises(ValueError, match="embed_dim=10 must be divisible by num_heads=4"):
        nn.CausalSelfAttention(10, 4)
    with pytest.raises(ValueError, match="dropout"):
        nn.CausalSelfAttention(8, 2, dropout=1.0)
    with pytest.raises(ValueError, match=r"\(B, T, 8\), got \(3, 8\)"):
        layer(tt.zeros(3, 8))
    assert layer(tt.zeros(2, 3, 8)).dtype == np.float32


def test_causal_self_attention_gradients_and_causality(device) -> None:
    tt.manual_seed(0)
    layer = nn.CausalSelfAttention(6, 3).to(device, dtype="float64")
    x = np.random.default_rng(0).standard_normal((2, 4, 6))
    leaf = t64(x, device, requires_grad=True)
    assert tt.gradcheck(lambda x, *weights: layer(x), [leaf, *layer.parameters()])
    changed = x.copy()
    changed[:, 2:] += 5.0
    np.testing.assert_allclose(layer(t64(changed, device)).numpy()[:, :2], layer(t64(x, device)).numpy()[:, :2])


def test_causal_self_attention_uses_dropout_in_training_only(device) -> None:
    tt.manual_seed(0)
    layer = nn.CausalSelfAttention(8, 2, dropout=0.5).to(device)
    x = tt.randn(2, 6, 8, device=device)
    assert not np.allclose(layer(x).numpy(), layer(x).numpy()), "two training-mode calls draw different masks"
    layer.eval()
    np.testing.assert_array_equal(layer(x).numpy(), layer(x).numpy())


@pytest.mark.skipif(torch is None, reason="needs PyTorch")
def test_causal_self_attention_matches_nanogpt_in_pytorch() -> None:
    """nanoGPT's CausalSelfAttention (model.py), written out in PyTorch with our weights."""
    tt.manual_seed(0)
    layer = nn.CausalSelfAttention(12, 3).to(dtype="float64")
    weights = {name: torch.tensor(p.numpy(), requires_grad=True) for name, p in layer.named_parameters()}
    x = np.random.default_rng(1).standard_normal((2, 5, 12))

    def nanogpt(x):
        batch, length, channels = x.size()
        qkv = torch.nn.functional.linear(x, weights["c_attn.weight"], weights["c_attn.bias"])
        q, k, v = qkv.split(channels, dim=2)
        q, k, v = (t.view(batch, length, 3, channels // 3).transpose(1, 2) for t in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(batch, length, channels)
        return torch.nn.functional.linear(y, weights["c_proj.weight"], weights["c_proj.bias"])

    expected = nanogpt(torch.tensor(x))
    got = layer(t64(x))
    np.testing.assert_allclose(got.numpy(), expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    expected.sum().backward()
    got.sum().backward()
    for name, parameter in layer.named_parameters():
        np.testing.assert_allclose(parameter.grad.numpy(), weights[name].grad.numpy(), rtol=1e-9, atol=1e-12)
