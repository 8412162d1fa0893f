# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Module 14 — Tokens and attention
#
# *One sitting, about 2.5 hours: the lesson, 8 functions to write, and the measurements.*
#
# Every model so far saw a fixed-size input: 64 pixels, a 28×28 image. Text is
# different: a sequence of any length, made of symbols that are not numbers. A
# language model reads the sequence so far and predicts the next symbol, and to
# do that each position must be able to look back at every earlier one. This
# module builds the three pieces that make that possible, and that GPT is made
# of (Module 15 stacks them into a transformer):
#
# 1. **tokens** — text cut into pieces with integer ids: one id per character,
#    or *byte-pair encoding*, which learns frequent chunks of text;
# 2. **embeddings** — a learned vector per token id, plus a vector per
#    position, so the model knows what is where;
# 3. **attention** — each position computes a weighted average over the
#    positions before it, with weights it computes from the data.
#
# **You will**
# 1. write byte-pair encoding: merge a pair, learn merges from a text, encode
#    with them (the character tokenizer is given);
# 2. write the backward pass of the embedding lookup: a *scatter-add*;
# 3. write the sinusoidal positional encoding of "Attention is all you need";
# 4. write a numerically stable masked softmax, scaled dot-product attention
#    with a causal mask, and multi-head causal self-attention (GPT-2's layout);
# 5. measure how attention's time and memory grow with the square of the
#    context length.

# %%
import math
import time
import tracemalloc

import matplotlib.pyplot as plt
import numpy as np

import tinytrain as tt
from tinytrain import Tensor

try:
    import torch  # optional: only for comparisons
except ImportError:
    torch = None

# %% [markdown]
# ## 1. Text as numbers: one id per character
#
# Our corpus is *Tiny Shakespeare*: 1.1 million characters of Shakespeare's plays,
# the standard small text for character-level language models (Karpathy's
# char-rnn, 2015). It ships with tinytrain, compressed (see
# `tinytrain/datasets/files/README.md`):

# %%
text = tt.datasets.shakespeare()
print(f"{len(text):,} characters, {len(set(text))} different ones\n")
print(text[:250])

# %% [markdown]
# The simplest tokenizer gives every character that occurs in the training
# text an id: sort the characters, number them 0, 1, 2, … *Encoding* maps a
# string to its list of ids, *decoding* maps ids back. Sorting makes the ids
# the same on every run and every machine — a model trained with one tokenizer
# is useless with another numbering. `CharTokenizer` is given; it refuses to
# encode a character it never saw (there is no id for it), and every tokenizer
# here saves its vocabulary as plain data with `state_dict()`, so it can go into
# a checkpoint next to the weights.

# %% export="text"
"""Tokenizers: text to integer ids and back.

``CharTokenizer`` gives each character of its training text an id;
``BPETokenizer`` is byte-level byte-pair encoding: the UTF-8 bytes of the text
(ids 0-255) merged, pair by pair, into the frequent chunks of its training text.
Both offer ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``vocab_size``
and ``state_dict()`` / ``load_state_dict(state)`` as plain data (strings,
lists, numbers), so a tokenizer travels in a checkpoint with its model.
"""
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from tinytrain.arguments import check_int, check_type


def _token_ids(ids: Any, vocab_size: int, who: str) -> list[int]:
    """``ids`` (a sequence, 1-D NumPy array or tensor of integers) as a list of ints in range(vocab_size)."""
    if hasattr(ids, "numpy"):  # a tensor
        ids = ids.numpy()
    values = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
    for position, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{who} takes a sequence of integer ids, got {value!r} at position {position}")
        if not 0 <= value < vocab_size:
            raise ValueError(f"{who}: id {value} at position {position} is not in the vocabulary "
                             f"(ids 0 to {vocab_size - 1})")
    return [int(value) for value in values]


def _state_of(kind: str, state: Any, key: str) -> Any:
    """``state[key]`` of a tokenizer state dict of ``kind``; ValueError naming what is wrong otherwise."""
    check_type("state", state, Mapping, f"a dict as a {kind} tokenizer's state_dict() returns")
    if state.get("kind") != kind:
        raise ValueError(f"not the state of a {kind} tokenizer: its 'kind' is {state.get('kind')!r}, expected {kind!r}")
    if key not in state:
        raise ValueError(f"the {kind} tokenizer state has no {key!r}: keys {sorted(state)}")
    return state[key]


class CharTokenizer:
    """One id per character: the sorted characters of the training text get ids 0, 1, 2, ...

    ``train(text)`` sets the vocabulary and returns the tokenizer; ``encode``
    raises ``ValueError`` naming a character that is not in it.
    """

    def __init__(self) -> None:
        self.chars: list[str] = []
        self._ids: dict[str, int] = {}

    def train(self, text: str) -> "CharTokenizer":
        check_type("text", text, str, "a string")
        self._set(sorted(set(text)))
        return self

    def _set(self, chars: list[str]) -> None:
        self.chars = chars
        self._ids = {char: i for i, char in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        check_type("text", text, str, "a string")
        try:
            return [self._ids[char] for char in text]
        except KeyError as error:
            raise ValueError(f"CharTokenizer.encode: the character {error.args[0]!r} (first at position "
                             f"{text.index(error.args[0])}) is not among the {self.vocab_size} characters of "
                             "its vocabulary; train it on a text that has it") from None

    def decode(self, ids: Any) -> str:
        return "".join(self.chars[i] for i in _token_ids(ids, self.vocab_size, "CharTokenizer.decode"))

    def state_dict(self) -> dict:
        """``{"kind": "char", "chars": the vocabulary as one string}``."""
        return {"kind": "char", "chars": "".join(self.chars)}

    def load_state_dict(self, state: Mapping) -> None:
        """Take the vocabulary of a ``state_dict()``; a bad state raises and changes nothing."""
        chars = _state_of("char", state, "chars")
        if not isinstance(chars, str) or len(set(chars)) != len(chars):
            raise ValueError(f"the 'chars' of a char tokenizer state must be a string without repeated characters, "
                             f"got {chars!r:.80}")
        self._set(list(chars))

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


# %% [markdown]
# Encode, decode, and see that nothing is lost:

# %%
chars = CharTokenizer().train(text)
print(chars, repr("".join(chars.chars)))
ids = chars.encode("To be, or not to be")
print(ids)
assert chars.decode(ids) == "To be, or not to be"

# %% [markdown]
# 65 symbols, and one token per character: the 1.1 million characters are 1.1
# million tokens. A model that reads 256 tokens at a time then sees 256
# characters — about nine lines of a play. We will see in section 7 that the
# cost of attention grows with the *square* of the number of tokens it reads,
# so shorter sequences are worth a lot.
#
# ## 2. Byte-pair encoding
#
# Whole words would make sequences short, but the vocabulary would be enormous
# (every form of every word, every name) and still miss words never seen.
# **Byte-pair encoding** (BPE) sits in between: start from small symbols and
# *learn* the frequent chunks. It began as a compression method (Gage, 1994),
# was brought to translation by Sennrich et al. (2016), and in its *byte-level*
# form is GPT-2's tokenizer (Radford et al., 2019):
#
# 1. write the text as its UTF-8 **bytes**: 256 possible symbols, ids 0–255 —
#    any text at all can be written, there is never an unknown symbol
#    (`"é"` is the two bytes 195, 169);
# 2. count every **adjacent pair** of ids; take the most frequent pair, give it
#    the next free id (256, then 257, …), and replace every occurrence of the
#    pair by that id — a **merge**;
# 3. repeat until the vocabulary has the size you want.
#
# **Worked example** (Wikipedia's), with letters for bytes: `aaabdaaabac`.
#
# | step | most frequent pair | new id | sequence |
# |---|---|---|---|
# | 0 | | | `a a a b d a a a b a c` |
# | 1 | `a a` (4 times) | `Z` | `Z a b d Z a b a c` |
# | 2 | `Z a` and `a b` (2 each): `Z a` occurs first | `Y` | `Y b d Y b a c` |
# | 3 | `Y b` (2 times) | `X` | `X d X a c` |
#
# Eleven symbols became five, and the vocabulary grew by three. Two rules make
# the procedure exact, and you must follow them:
#
# * **merging scans left to right** and continues after what it just merged:
#   `a a a` with the merge `a a → Z` becomes `Z a` (step 1), not `a Z` and not
#   two `Z`s;
# * **ties**: among pairs with the same count, the one that occurs *first* in
#   the current sequence wins (step 2). Counting pairs into a dictionary in order
#   of first occurrence and taking `max(counts, key=counts.get)` does exactly
#   that (`max` keeps the first of equal maxima). `pair_counts` below is given.
#
# Write `merge` first: one pass over the list, building a new one.

# %% export="text"
def pair_counts(ids: list[int]) -> dict[tuple[int, int], int]:
    """How often each adjacent pair occurs in ``ids``, in the order the pairs first occur."""
    return dict(Counter(zip(ids, ids[1:])))


def merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """A new list: ``ids`` with each occurrence of ``pair`` replaced by ``new_id``.

    Scans left to right; after a replacement it continues after the pair, so
    occurrences that overlap one just replaced are not replaced
    (``merge([5, 5, 5], (5, 5), 9) == [9, 5]``). ``ids`` itself is not changed.
    """
    ### BEGIN SOLUTION
    out = []
    i = 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out
    ### END SOLUTION


# %% check=1
a, b, c, d = map(ord, "abcd")
assert merge([a, a, a, b, d, a, a, a, b, a, c], (a, a), 256) == [256, a, b, d, 256, a, b, a, c]
assert merge([5, 5, 5], (5, 5), 9) == [9, 5] and merge([5, 5, 5, 5], (5, 5), 9) == [9, 9]
assert merge([1, 2, 1, 2], (1, 2), 7) == [7, 7] and merge([2, 1], (1, 2), 7) == [2, 1] and merge([], (1, 2), 7) == []
ids = [3, 4, 3]
assert merge(ids, (3, 4), 8) == [8, 3] and ids == [3, 4, 3], "merge returns a new list and leaves ids as they were"
print("merge OK")

# %% [markdown]
# Now the tokenizer. Its state is `merges`: a dictionary from each learned pair
# to its new id, **in the order the merges were learned** (Python dictionaries
# keep insertion order), so merge $k$ (counting from 0) made id $256 + k$ and the
# vocabulary has $256 + $ `len(merges)` ids.
#
# * `train(text, vocab_size)` starts from `list(text.encode("utf-8"))` and
#   learns `vocab_size - 256` merges, as above. It stops early when no pair is
#   left (a sequence of one id). It replaces any merges learned before.
# * `encode(text)` turns a new text into ids: its bytes, then **every merge,
#   in the order it was learned**, applied to the whole sequence. The order
#   matters: with the merges `b c → X` then `a b → Y`, `abc` is `a X`; applied
#   the other way round it would be `Y c`, a sequence the model never saw in
#   training.
# * `decode(ids)` (given) joins the bytes of each id and decodes them as UTF-8.
#   An id sequence cut in the middle of a character cannot be decoded exactly;
#   the damaged character becomes `"\ufffd"` (�), as in GPT-2's tokenizer.

# %% export="text"
class BPETokenizer:
    """Byte-level byte-pair encoding (Sennrich et al. 2016; GPT-2's byte-level form, without its
    splitting of the text into words first).

    Ids 0-255 are the bytes of the UTF-8 text; ``merges`` maps each learned pair of
    ids to its new id, in the order the merges were learned: merge ``k`` (from 0)
    made id ``256 + k``. ``vocab_size`` is ``256 + len(merges)``.
    """

    def __init__(self) -> None:
        self.merges: dict[tuple[int, int], int] = {}

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.merges)

    def train(self, text: str, vocab_size: int) -> "BPETokenizer":
        """Learn ``vocab_size - 256`` merges from ``text``; returns the tokenizer.

        Start from the UTF-8 bytes of ``text``; repeatedly find the most frequent
        adjacent pair (``pair_counts``; among equally frequent pairs the one that
        occurs first), replace it everywhere with the next id (256, 257, ...) by
        ``merge``, and record it in ``merges``. Stop early when no pair is left.
        Merges learned before are replaced.
        """
        check_type("text", text, str, "a string")
        vocab_size = check_int("vocab_size", vocab_size, minimum=256)
        ### BEGIN SOLUTION
        ids = list(text.encode("utf-8"))
        merges = {}
        for new_id in range(256, vocab_size):
            counts = pair_counts(ids)
            if not counts:
                break
            pair = max(counts, key=counts.get)
            ids = merge(ids, pair, new_id)
            merges[pair] = new_id
        self.merges = merges
        return self
        ### END SOLUTION

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``: its UTF-8 bytes, then every merge, in the order learned, applied to the whole list."""
        check_type("text", text, str, "a string")
        ### BEGIN SOLUTION
        ids = list(text.encode("utf-8"))
        for pair, new_id in self.merges.items():
            ids = merge(ids, pair, new_id)
        return ids
        ### END SOLUTION

    def vocab(self) -> list[bytes]:
        """The bytes of every id: ``bytes([i])`` for ``i < 256``, then each merge's two parts joined."""
        table = [bytes([i]) for i in range(256)]
        for first, second in self.merges:
            table.append(table[first] + table[second])
        return table

    def decode(self, ids: Any) -> str:
        """The text of ``ids``: their bytes joined and decoded as UTF-8 (a broken character becomes "\\ufffd")."""
        table = self.vocab()
        return b"".join(table[i] for i in _token_ids(ids, len(table), "BPETokenizer.decode")).decode(
            "utf-8", errors="replace")

    def state_dict(self) -> dict:
        """``{"kind": "bpe", "merges": [[first, second], ...]}``, the merges in the order learned."""
        return {"kind": "bpe", "merges": [list(pair) for pair in self.merges]}

    def load_state_dict(self, state: Mapping) -> None:
        """Take the merges of a ``state_dict()``; a bad state raises ``ValueError`` and changes nothing."""
        pairs = _state_of("bpe", state, "merges")
        if not isinstance(pairs, (list, tuple)):
            raise ValueError(f"the 'merges' of a bpe tokenizer state must be a list of pairs, got {pairs!r:.80}")
        merges: dict[tuple[int, int], int] = {}
        for k, pair in enumerate(pairs):
            valid = isinstance(pair, (list, tuple)) and len(pair) == 2 and all(
                isinstance(i, (int, np.integer)) and not isinstance(i, bool) and 0 <= i < 256 + k for i in pair)
            if not valid:
                raise ValueError(f"merge {k} must be a pair of ids below {256 + k} (ids made before it), got {pair!r}")
            if tuple(pair) in merges:
                raise ValueError(f"merge {k} repeats the pair {list(pair)} of merge {merges[tuple(pair)] - 256}")
            merges[(int(pair[0]), int(pair[1]))] = 256 + k
        self.merges = merges

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


# %% check=2
bpe = BPETokenizer().train("aaabdaaabac", 259)
a, b = ord("a"), ord("b")
assert list(bpe.merges.items()) == [((a, a), 256), ((256, a), 257), ((257, b), 258)], bpe.merges
assert bpe.vocab_size == 259 and bpe.encode("aaabdaaabac") == [258, ord("d"), 258, a, ord("c")]
assert bpe.decode(bpe.encode("aaabdaaabac")) == "aaabdaaabac" and bpe.vocab()[258] == b"aaab"
assert BPETokenizer().train("ab", 300).vocab_size == 257, "stop when no pair is left"
order = BPETokenizer()
order.load_state_dict({"kind": "bpe", "merges": [[ord("b"), ord("c")], [ord("a"), ord("b")]]})
assert order.encode("abc") == [ord("a"), 256], "apply the merges in the order they were learned"
assert bpe.train("xyxy", 257).merges == {(ord("x"), ord("y")): 256}, "train again: the old merges are replaced"
word = "naïve café"
assert BPETokenizer().train(word * 3, 270).decode(BPETokenizer().train(word * 3, 270).encode(word)) == word
print("BPETokenizer OK")

# %% [markdown]
# ### Train it on Shakespeare
#
# Learn 256 merges from the first 100,000 characters (a few seconds: every
# merge counts and rewrites the whole sequence once) and look at what it found:

# %%
start = time.perf_counter()
bpe = BPETokenizer().train(text[:100_000], vocab_size=512)
print(f"256 merges learned in {time.perf_counter() - start:.1f} s")
pieces = bpe.vocab()
print("the first 20 merges:", [pieces[256 + k].decode("utf-8", "replace") for k in range(20)])
print("the last 10:        ", [pieces[502 + k].decode("utf-8", "replace") for k in range(10)])
print(bpe.encode("To be, or not to be"))

# %% [markdown]
# The first merges are the commonest pairs of English text — an `e` before a
# space, `th`, a `t` or `s` before a space, `ou`; a few later ` th` joins them
# (`th` after a space) — and the last ones are whole words with their space
# (`good `, `with `, `shall `). Measure what that buys: the
# number of tokens per character on text the tokenizer did **not** learn from,
# for vocabularies of growing size. Training is greedy, so the tokenizer trained
# to $256 + k$ ids is exactly the first $k$ merges of this one.

# %%
held_out = text[100_000:120_000]
print(f"{'vocabulary':>10s} {'tokens per character':>21s} {'characters in 256 tokens':>25s}")
for size in (256, 288, 320, 384, 448, 512):
    partial = BPETokenizer()
    partial.load_state_dict({"kind": "bpe", "merges": bpe.state_dict()["merges"][:size - 256]})
    ratio = len(partial.encode(held_out)) / len(held_out)
    print(f"{size:10d} {ratio:21.3f} {256 / ratio:25.0f}")

# %% [markdown]
# 256 merges cut the sequence to about half a token per character, so a
# 256-token context covers about twice as much text; GPT-2's 50,257 tokens average about four
# characters of English each. The price is a larger embedding table (next
# section) and a tokenizer to carry with the model. Real tokenizers also split
# the text into words before learning merges (GPT-2 with a regular expression),
# so no token spans a word boundary and each word's encoding can be cached; the
# character tokenizer is what the GPT milestone uses, for its simplicity.
#
# ## 3. Embeddings: a vector per token
#
# A token id is a category, not a quantity: id 42 is not "twice" id 21. The
# classic input for a category is a **one-hot** vector (all zeros, a 1 at the
# id), and a linear layer on it, $\text{onehot}(i)\, W = W_i$, simply picks row
# $i$ of $W$. An **embedding** is that product without the zeros: a table $W$
# of shape `(num_embeddings, embedding_dim)` = $(V, D)$, and the forward pass
# is the lookup `W[ids]` — for ids of shape `(B, T)` a result of shape
# `(B, T, D)`.
#
# **Backward.** Output position $p$ is a copy of row $\text{id}_p$, so the
# gradient of row $v$ is the sum of the upstream gradients $G_p$ of all the
# positions that hold id $v$, and zero for ids that do not occur:
#
# $$\bar W_v = \sum_{p\,:\,\text{id}_p = v} G_p .$$
#
# In a batch of text the same id occurs many times (every `e`, every space).
# That is where the obvious code goes wrong: `grad_w[ids] += grad` reads all the
# selected rows, adds, and writes them back — and when an id repeats, the
# later write overwrites the earlier one instead of adding to it:

# %%
rows = np.zeros(3)
rows[[0, 0, 2]] += 1.0
print("rows[[0, 0, 2]] += 1     ->", rows, " (row 0 got one of its two additions)")
rows = np.zeros(3)
np.add.at(rows, [0, 0, 2], 1.0)
print("np.add.at(rows, [0, 0, 2], 1) ->", rows)

# %% [markdown]
# The operation that adds up repeated indices is a **scatter-add**. Every
# backend offers it as `backend.scatter_add(target, index, values)`, which
# does `target[index] += values` with repeats adding up: `np.add.at` on the CPU
# (Module 01), `cupyx.scatter_add` on a GPU (Module 12, with atomic additions).
# Module 02's indexing (`GetItem`) already uses it; here it gets a `Function`
# of its own. Write `EmbeddingFunction.backward`: a zero gradient of the
# weight's shape in `grad`'s dtype, then one scatter-add of `grad` at the ids.

# %% export="nn/embedding"
"""Embeddings and positional encodings: ``Embedding`` (with ``embedding``, its functional form),
``LearnedPositionalEncoding``, ``SinusoidalPositionalEncoding`` and ``sinusoidal_encoding``.

An embedding is a lookup ``weight[ids]``; its backward pass adds the upstream
gradient of every position into the row of its id with the backend's
``scatter_add``, so repeated ids add up. A positional encoding adds a vector per
position ``start, start + 1, ...`` to a sequence of shape ``(..., T, D)``.
"""
import reprlib
from typing import Any

import numpy as np

from tinytrain.arguments import check_int, check_number
from tinytrain.autograd import Function
from tinytrain.backend import get_backend
from tinytrain.nn.module import Module, Parameter
from tinytrain.tensor import Tensor


class EmbeddingFunction(Function):
    """``weight[ids]``: the rows of ``weight`` (V, D) for the integer array ``ids`` of any shape,
    shape ``ids.shape + (D,)``.

    Backward: row ``v`` of the weight's gradient is the sum of the upstream gradients
    of every position whose id is ``v`` (zero for ids that do not occur), in
    ``grad``'s dtype -- one ``self.backend.scatter_add`` into zeros of the weight's shape.
    """

    def forward(self, weight: Any, *, ids: Any) -> Any:
        self.ids, self.weight_shape = ids, weight.shape
        return weight[ids]

    def backward(self, grad: Any) -> tuple:
        ### BEGIN SOLUTION
        grad_weight = self.xp.zeros(self.weight_shape, dtype=grad.dtype)
        self.backend.scatter_add(grad_weight, self.ids, grad)
        return (grad_weight,)
        ### END SOLUTION


def embedding(input: Any, weight: Tensor) -> Tensor:
    """``weight[input]``: the rows of ``weight`` (num_embeddings, embedding_dim) for the integer
    ids ``input`` (a tensor, array or list of any shape); shape ``input.shape + (embedding_dim,)``.

    A single int is one id (shape ``(embedding_dim,)``). Raises ``TypeError`` for ids
    that are not integers (naming their dtype, or the input when it is no array at all),
    ``ValueError`` for a ragged list, ``IndexError`` naming the smallest and largest id
    when one is outside ``range(num_embeddings)``, ``RuntimeError`` for ids on another device.
    """
    if weight.ndim != 2:
        raise ValueError(f"embedding: the weight must have shape (num_embeddings, embedding_dim), got {weight.shape}")
    expected = f"embedding: expected an integer tensor (or array, list or int) of ids in [0, {weight.shape[0]})"
    if isinstance(input, Tensor):
        ids = weight._operand(input)  # which refuses a tensor on another device
    else:
        try:
            ids = Tensor(input, device=weight._backend)  # not weight._operand: that makes an int a float
        except (TypeError, ValueError) as error:  # a string, None, a ragged list
            raise type(error)(f"{expected}, got input={reprlib.repr(input)} of type {type(input).__name__} "
                              f"({error})") from None
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{expected}, got dtype {ids.dtype} of shape {ids.shape}")
    if ids.size:
        low, high = int(ids.data.min()), int(ids.data.max())
        if low < 0 or high >= weight.shape[0]:
            raise IndexError(f"embedding: ids must lie in range(0, {weight.shape[0]}) for a weight of shape "
                             f"{weight.shape}, got ids from {low} to {high}")
    return EmbeddingFunction.apply(weight, ids=ids.data)


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of size ``embedding_dim``: ``Embedding(V, D)(ids)`` is
    ``weight[ids]``, of shape ``ids.shape + (D,)``.

    ``weight`` (V, D) starts as samples of N(0, 1), as in PyTorch.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = check_int("num_embeddings", num_embeddings, minimum=1)
        self.embedding_dim = check_int("embedding_dim", embedding_dim, minimum=1)
        self.weight = Parameter(get_backend("cpu").random_normal((self.num_embeddings, self.embedding_dim)))

    def forward(self, input: Any) -> Tensor:
        return embedding(input, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


# %% check=2
weight = tt.tensor(np.arange(12.0).reshape(4, 3), requires_grad=True)
ids = tt.tensor([[1, 3, 1], [1, 0, 0]])
out = EmbeddingFunction.apply(weight, ids=ids.data)
assert out.shape == (2, 3, 3) and out.numpy()[0, 1].tolist() == [9.0, 10.0, 11.0]
out.backward(tt.ones(2, 3, 3))
assert weight.grad.numpy()[:, 0].tolist() == [2.0, 3.0, 0.0, 1.0], "id 1 occurs 3 times: its row gets 3 gradients"
assert weight.grad.dtype == np.float32
w64 = tt.randn(5, 2, dtype="float64", requires_grad=True)
assert tt.gradcheck(lambda w: embedding([[4, 4, 0], [2, 4, 1]], w), [w64])
print("EmbeddingFunction OK")

# %% [markdown]
# The layer is given. It draws its table from N(0, 1), as PyTorch does, and
# checks the ids: a negative id would silently wrap around to the end of the
# table in NumPy, so out-of-range ids raise an error naming them.

# %%
tt.manual_seed(0)
table = Embedding(chars.vocab_size, 8)
batch = tt.tensor([chars.encode("To be"), chars.encode("or no")])
print(table, "->", table(batch).shape)
try:
    table(tt.tensor([3, 65]))
except IndexError as error:
    print("IndexError:", error)

# %% [markdown]
# ## 4. Where is each token? Positional encodings
#
# Attention (next section) computes each output as a weighted average over the
# other positions, with weights that depend only on the *vectors* there. Shuffle
# the input tokens and the outputs are shuffled the same way: without help,
# attention cannot tell "dog bites man" from "man bites dog". So we add to each
# token's vector a vector that says *where* it is. Two common choices:
#
# * **learned** (GPT-2): a second embedding table, one row per position
#   $0, 1, \dots, T_\text{max} - 1$, trained like the token table — the model
#   learns what it needs, but knows no position beyond $T_\text{max}$;
# * **sinusoidal** (Vaswani et al., 2017, *Attention is all you need*): a fixed
#   table. Position $p$, dimensions $2i$ and $2i + 1$, for $i = 0, \dots, D/2 - 1$:
#
# $$\text{PE}_{p,\,2i} = \sin\frac{p}{10000^{2i/D}}, \qquad \text{PE}_{p,\,2i+1} = \cos\frac{p}{10000^{2i/D}}.$$
#
# Each pair of dimensions is a point on a circle turning at its own speed, from
# one radian per position ($i = 0$) down to almost $1/10000$ of one (the last
# pair, $i = D/2 - 1$, turns $10000^{-(D-2)/D}$ radians); together they are like
# the hands of a clock, and no two positions get the same vector. Position 0 is
# $(0, 1, 0, 1, \dots)$. Because moving by $k$ positions turns every circle by
# a fixed angle, $\text{PE}_{p+k}$ is a fixed linear map (a rotation) of
# $\text{PE}_p$: attention can learn "$k$ tokens back" from it.
#
# Write `sinusoidal_encoding(length, dim, base=10000.0)`: the table for
# positions $0, \dots, \text{length} - 1$, a float64 NumPy array of shape
# `(length, dim)` (a table computed once, on the host). The interleaving —
# sines in the even columns, cosines in the odd ones — is the paper's; some
# code puts all sines first, which is a different table.

# %% export="nn/embedding"
def sinusoidal_encoding(length: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """The sinusoidal positional encodings of positions ``0 .. length - 1``: a float64 array
    ``(length, dim)`` with ``[p, 2i] = sin(p / base**(2i / dim))`` and ``[p, 2i + 1] =
    cos(p / base**(2i / dim))`` for ``i = 0 .. dim/2 - 1``. ``dim`` must be even."""
    length = check_int("length", length, minimum=0)
    dim = check_int("dim", dim, minimum=2)
    base = check_number("base", base, minimum=1)
    if dim % 2:
        raise ValueError(f"sinusoidal_encoding needs an even dim (sine and cosine pairs), got dim={dim}")
    ### BEGIN SOLUTION
    angles = np.arange(length)[:, None] / base ** (np.arange(0, dim, 2) / dim)  # (length, dim / 2)
    table = np.empty((length, dim))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table
    ### END SOLUTION


# %% check=2
pe = sinusoidal_encoding(50, 8)
assert pe.shape == (50, 8) and pe.dtype == np.float64
assert pe[0].tolist() == [0.0, 1.0] * 4, "position 0: sin(0) = 0 and cos(0) = 1"
assert np.allclose(pe[1, :2], [math.sin(1), math.cos(1)]) and np.allclose(pe[7, 6:], [math.sin(7e-3), math.cos(7e-3)])
assert np.allclose(pe[3, 2:4], [math.sin(3 / 10), math.cos(3 / 10)]), "dims 2, 3 (i = 1): 10000 ** (2/8) = 10"
assert np.allclose(sinusoidal_encoding(4, 2, base=100.0)[3], [math.sin(3), math.cos(3)])
print("sinusoidal_encoding OK")

# %% [markdown]
# Both kinds are layers with one call: `encoding(x, start=0)` adds the vectors
# of positions `start, start + 1, …, start + T - 1` to a sequence `x` of shape
# `(..., T, D)`. `start` is 0 when the whole sequence is processed at once;
# Module 15 generates text one token at a time and passes the position of the
# first new token. Both are given.

# %% export="nn/embedding"
class _PositionalEncoding(Module):
    """Adds the rows ``start .. start + T - 1`` of a table of ``max_length`` positions to ``x`` (..., T, D);
    a subclass's ``table()`` returns the (max_length, D) table."""

    def __init__(self, max_length: int, embed_dim: int) -> None:
        super().__init__()
        self.max_length = check_int("max_length", max_length, minimum=1)
        self.embed_dim = check_int("embed_dim", embed_dim, minimum=1)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        start = check_int("start", start, minimum=0)
        name = type(self).__name__
        if x.ndim < 2 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{name} expects input of shape (..., T, {self.embed_dim}), got {x.shape}")
        end = start + x.shape[-2]
        if end > self.max_length:
            raise ValueError(f"{name}: positions {start} to {end - 1} (start={start}, T={x.shape[-2]}) do not fit "
                             f"in its max_length={self.max_length} positions")
        return x + self.table()[start:end]

    def extra_repr(self) -> str:
        return f"max_length={self.max_length}, embed_dim={self.embed_dim}"


class LearnedPositionalEncoding(_PositionalEncoding):
    """Adds a learned vector per position: ``x + weight[start : start + T]`` for ``x`` of shape ``(..., T, D)``.

    ``weight`` (max_length, embed_dim) starts as samples of N(0, 1), like ``Embedding``'s.
    """

    def __init__(self, max_length: int, embed_dim: int) -> None:
        super().__init__(max_length, embed_dim)
        self.weight = Parameter(get_backend("cpu").random_normal((self.max_length, self.embed_dim)))

    def table(self) -> Tensor:
        return self.weight


class SinusoidalPositionalEncoding(_PositionalEncoding):
    """Adds the fixed sinusoidal encoding of each position (``sinusoidal_encoding``; ``embed_dim``
    even): ``x + encoding[start : start + T]``. The table is a buffer: saved and moved, not trained."""

    def __init__(self, max_length: int, embed_dim: int) -> None:
        super().__init__(max_length, embed_dim)
        self.register_buffer("encoding", Tensor(sinusoidal_encoding(self.max_length, self.embed_dim)))

    def table(self) -> Tensor:
        return self.encoding


# %% [markdown]
# The table as a picture: every column pair oscillates, fast on the left and
# slowly on the right.

# %%
fig, ax = plt.subplots(figsize=(9, 3.5))
image = ax.imshow(sinusoidal_encoding(100, 64).T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
ax.set_xlabel("position p")
ax.set_ylabel("dimension")
ax.set_title("sinusoidal positional encoding, D = 64")
fig.colorbar(image)
plt.show()

x = tt.zeros(2, 5, 8)
fixed = SinusoidalPositionalEncoding(16, 8)
assert np.allclose(fixed(x, start=3).numpy()[0], sinusoidal_encoding(8, 8)[3:8])
print(fixed, [name for name, _ in fixed.named_buffers()], "|", LearnedPositionalEncoding(16, 8))

# %% [markdown]
# ## 5. Attention
#
# Now the heart of the transformer. Every position $i$ of a sequence turns its
# vector into three vectors of size $d$ (with three `Linear` layers):
#
# * a **query** $q_i$ — what it is looking for,
# * a **key** $k_j$ — what it offers to the queries of others,
# * a **value** $v_j$ — what it hands over when it is chosen.
#
# The output at position $i$ is an average of the values, weighted by how well
# each key matches the query:
#
# $$s_{ij} = \frac{q_i \cdot k_j}{\sqrt d}, \qquad w_{ij} = \frac{e^{s_{ij}}}{\sum_{j'} e^{s_{ij'}}}, \qquad
#   o_i = \sum_j w_{ij}\, v_j ,$$
#
# or, for all positions at once, with the queries, keys and values as rows of
# $Q$ $(L, d)$, $K$ $(S, d)$ and $V$ $(S, d_v)$:
#
# $$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\Big(\frac{Q K^\top}{\sqrt d}\Big)\, V,$$
#
# the softmax taken along each row of the $(L, S)$ **score matrix**. Two
# matrix products and a softmax: "scaled dot-product attention".
#
# **Why divide by $\sqrt d$?** If the components of $q$ and $k$ are
# independent with mean 0 and variance 1, then $q \cdot k$ is a sum of $d$ such
# products: variance $d$. With $d = 64$ the scores spread over $\pm 16$ or so,
# the softmax puts nearly all its weight on one key, and its gradient — which
# is $w(1 - w)$-like — almost vanishes. Dividing by $\sqrt d$ brings the
# variance back to 1. See it:

# %%
rng = np.random.default_rng(0)
for d in (4, 64, 512):
    q, k = rng.standard_normal((200, d)), rng.standard_normal((50, d))
    for name, s in (("q.k", q @ k.T), ("q.k / sqrt(d)", q @ k.T / math.sqrt(d))):
        w = np.exp(s - s.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        print(f"d = {d:3d}, scores {name:13s}: std {s.std():5.2f}, largest weight per row on average {w.max(axis=1).mean():.2f}")

# %% [markdown]
# With 50 keys, uniform attention would give each key 0.02. Unscaled, at
# $d = 512$ the average row gives one key almost everything; scaled, the
# weights stay spread out whatever $d$ is, and the model can learn to sharpen
# them where it needs to.
#
# ### The causal mask
#
# A language model is trained to predict token $t + 1$ from tokens $0..t$, at
# every position of the sequence at once. If position $i$ could attend to
# position $j > i$, it would simply read the answer. So we **mask** the future:
# set $s_{ij} = -\infty$ for every $j > i$ before the softmax; $e^{-\infty} = 0$,
# so those keys get weight exactly 0. The allowed pairs form a lower triangle:
#
# ```
#            keys j = 0 1 2 3
# query i = 0        x . . .
#           1        x x . .
#           2        x x x .
#           3        x x x x
# ```
#
# When there are more keys than queries, $L < S$, the queries are the **last**
# $L$ of the $S$ positions (query $i$ is at position $S - L + i$), so query $i$
# may attend key $j$ when $j \le i + (S - L)$. That case comes up in Module 15:
# while generating, the keys and values of the tokens already seen are kept (a
# *KV cache*) and only the new token's query is computed. With $L = S$ the rule
# is the lower triangle above.
#
# ### A stable masked softmax
#
# The softmax must stay finite (Module 03): subtract each row's largest score
# first. With a mask, that is the largest *allowed* score. One case needs
# care: a row in which **nothing** is allowed (a padding token that may attend
# nothing, say). Its largest score is $-\infty$, and
# $-\infty - (-\infty)$ is `nan`, which would spread through the whole
# network in the backward pass. Our rule, the same as recent PyTorch's:
# **a row with nothing allowed gets weights that are all 0** —
# so that query's output is 0 — and passes back a zero gradient.
#
# Write `MaskedSoftmax.forward(scores, allowed)`. `allowed` is a boolean array
# that broadcasts against the scores (`True` where attention is allowed), or
# `None` for no mask. A recipe:
#
# 1. put $-\infty$ where it is not allowed: `xp.where(allowed, scores, -xp.inf)`
#    (skip this step when `allowed` is `None`: `xp.where(None, ...)` would
#    disallow everything);
# 2. the row maxima (`keepdims=True`); where a maximum is $-\infty$ (nothing
#    allowed — and scores that are $-\infty$ themselves count as not allowed),
#    use 0 instead, so that every $e^{s - m}$ of that row is $e^{-\infty} = 0$;
# 3. exponentiate, and divide by the row sums — where a sum is 0, divide by 1
#    instead (the row stays all 0).
#
# Never write into `scores`: it is the input's own array, which another
# operation may have saved for its backward, so writing into it (`scores -= m`)
# would corrupt that gradient. Writing into an array you made is fine, and
# faster: step 1's `where` (or `scores.copy()` without a mask) is new, so the
# subtraction, `xp.exp(out, out=out)` and the division can all work in place on
# it — one array of the scores' size instead of four, which matters since the
# scores are the biggest arrays of a transformer. Keep the scores' dtype:
# `-xp.inf` is a Python number, so `where` keeps float32, while an array of
# `-inf` would be float64.
#
# Save the result as `self.out`: the backward pass (given) is the softmax's
# from Module 02, $\bar s = w \odot (\bar w - \sum_j \bar w_j w_j)$, which is
# automatically 0 wherever $w$ is. It takes its row sums with
# `trailing_sum(xp, a, (-1,))`, which is `a.sum(axis=-1, keepdims=True)` as a
# product with a vector of ones (`tinytrain/kernels/reductions.py`; Module 05 says
# why it is faster on short rows): use either in step 3.
#
# The reference solution in `tinytrain/nn/attention.py` is faster in two places,
# both free to copy and neither needed for the checks:
#
# * step 1 *adds* a mask of 0 and $-\infty$ the size of `allowed`
#   (`scores + xp.where(allowed, 0, -xp.inf).astype(scores.dtype)`): one pass
#   over the scores instead of `where`'s slower three-way choice. It is what
#   PyTorch does with a boolean mask, and shares its one catch: a masked score of
#   $+\infty$ or `nan` gives `nan` instead of 0.
# * steps 2 and 3 go through `exp_shifted_by_row_max` (`tinytrain/kernels/softmax.py`).
#   The softmax of a row does not change when all its scores move by the same
#   number, so $m$ need not be the row's own maximum: any number that keeps
#   $e^{s - m}$ from overflowing and the row from vanishing will do. NumPy finds
#   the largest value of the whole array ten times faster than the maximum of each
#   short row, so the kernel tries that one $m$ first, and checks afterwards that
#   every row's sum is still a healthy number (at least $2^{-60}$); a row far below
#   the others (or with nothing allowed) is done again by the recipe above, with
#   its own maximum. In the GPT milestone's trained model that is 0.2% of the rows.

# %% export="nn/attention"
"""Attention: ``MaskedSoftmax``, ``scaled_dot_product_attention`` and ``CausalSelfAttention``.

``scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
is_causal=False, scale=None, flash=None)`` computes ``softmax(query @ key^T * scale) @ value``
with PyTorch's arguments; masked scores get weight 0, and a query that may attend
no key gets an output of 0 (never nan). ``flash=True`` (or, with ``flash=None``, a call
inside ``with use_flash_attention():``) computes the same tile by tile without keeping
the (L, S) weights (FlashAttention, Module 17). ``CausalSelfAttention`` is GPT-2's
multi-head self-attention layer, with nanoGPT's names (``c_attn``, ``c_proj``).
"""
import contextlib
import importlib
import math
from typing import Any, Iterator

import numpy as np

from tinytrain.arguments import check_int, check_number
from tinytrain.autograd import Function
from tinytrain.kernels.reductions import trailing_sum
from tinytrain.kernels.softmax import exp_shifted_by_row_max
from tinytrain.nn.dropout import Dropout, dropout
from tinytrain.nn.layers import Linear
from tinytrain.nn.module import Module
from tinytrain.tensor import Tensor


class MaskedSoftmax(Function):
    """Softmax along the last axis over the allowed entries, 0 elsewhere.

    ``allowed``: a boolean array that broadcasts against ``scores`` (True where
    allowed), or None (all allowed). Row ``i`` is ``exp(s_ij - m_i) / sum of the allowed
    exp(s_ij' - m_i)`` with ``m_i`` the row's largest allowed score; entries that are
    not allowed, or whose score is -inf, get 0 (the mask is added as 0 and -inf, as
    PyTorch adds it: a masked score of +inf or nan still gives nan). A row with nothing allowed is all
    0 (not nan) and passes back a zero gradient. Forward saves its result as ``self.out``,
    a new array of the scores' dtype, and leaves ``scores`` as it was.
    """

    def forward(self, scores: Any, *, allowed: Any) -> Any:
        ### BEGIN SOLUTION
        xp = self.xp
        # one new array, then every step in place on it: scores stays as it was. Adding 0 or -inf (a mask
        # the size of `allowed`, broadcast) makes it in one cheap pass, where `where` takes three times as long.
        out = scores.copy() if allowed is None else scores + xp.where(allowed, 0, -xp.inf).astype(scores.dtype)
        # steps 2 and 3's exp(out - m) and row sums, m 0 for a row with nothing allowed; the kernel
        # may use one m for all rows, which is faster and gives the same weights (kernels/softmax.py)
        out, total = exp_shifted_by_row_max(xp, out)
        out /= xp.where(total == 0, 1, total)
        self.out = out
        return out
        ### END SOLUTION

    def backward(self, grad: Any) -> tuple:
        out = self.out
        grad_scores = grad - trailing_sum(self.xp, grad * out, (-1,))
        grad_scores *= out  # in place: one new array fewer
        return (grad_scores,)


# %% check=2
scores = tt.tensor([[1.0, 2.0, 3.0], [1000.0, 0.0, -1000.0], [5.0, 6.0, 7.0]], requires_grad=True)
allowed = np.array([[True, True, False], [True, True, True], [False, False, False]])
weights = MaskedSoftmax.apply(scores, allowed=allowed)
e = np.exp([-1.0, 0.0])
assert np.allclose(weights.numpy()[0], [e[0] / e.sum(), e[1] / e.sum(), 0.0]) and weights.numpy()[0, 2] == 0
assert np.allclose(weights.numpy()[1], [1.0, 0.0, 0.0]), "subtract the largest allowed score first"
assert weights.numpy()[2].tolist() == [0.0, 0.0, 0.0], "nothing allowed: all 0, not nan"
weights.backward(tt.tensor(np.arange(9.0).reshape(3, 3)))
assert np.isfinite(scores.grad.numpy()).all() and scores.grad.numpy()[2].tolist() == [0.0, 0.0, 0.0]
unmasked = MaskedSoftmax.apply(tt.tensor([[0.0, -np.inf, 1.0]]), allowed=None).numpy()
assert np.allclose(unmasked, [[1 / (1 + math.e), 0.0, math.e / (1 + math.e)]]), unmasked
print("MaskedSoftmax OK")

# %% [markdown]
# ### Scaled dot-product attention
#
# Now the whole function, with PyTorch's name and arguments:
# `scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None)`.
#
# * `query` $(\dots, L, E)$, `key` $(\dots, S, E)$, `value` $(\dots, S, E_v)$;
#   the leading axes (a batch, heads) broadcast, and the result is
#   $(\dots, L, E_v)$. Transpose the last two axes of `key` with
#   `key.transpose(*range(key.ndim - 2), -1, -2)`.
# * `scale=None` (the default) means $1/\sqrt{E}$; a number given is used as
#   it is, 0 included (every score 0: uniform weights, as in PyTorch), so test
#   `scale is None`, not `not scale`. Multiplying the queries by it before the
#   product touches $L \cdot E$ numbers instead of the $L \cdot S$ scores:
#   cheaper whenever $E < S$ (and the same, up to rounding).
# * `attn_mask`: a boolean mask, `True` where a query may attend a key
#   (PyTorch's convention), broadcasting to $(\dots, L, S)$. The given first
#   line checks the shapes and hands it to you as `allowed`, a boolean array
#   (or `None`).
# * `is_causal=True`: build the causal `allowed` array of shape $(L, S)$ —
#   `True` where $j \le i + (S - L)$ — from `xp.arange` (the tensors' `xp`
#   is `query._backend.xp`). With more queries than keys ($L > S$) the first
#   $L - S$ queries may attend nothing: their rows are all 0, as in the masked
#   softmax. `is_causal` cannot be combined with `attn_mask` (the
#   given line raises, as PyTorch does).
# * `dropout_p`: dropout (Module 05's `dropout(x, p)`) on the attention
#   weights, whenever it is above 0 — the caller passes 0 in evaluation mode.
#   It zeroes some weights of each row, so each output uses a random subset of
#   the values.
# * `flash`: the given first lines hand the call to FlashAttention, which
#   Module 17 builds, when it asks for it (`flash=True`, or inside
#   `with use_flash_attention():`); you write the plain computation.

# %% export="nn/attention"
def _attention_mask(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any, is_causal: bool) -> Any:
    """The boolean array of ``attn_mask`` (or None), after checking every shape against the others."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.ndim < 2:
            raise ValueError(f"scaled_dot_product_attention: {name} needs shape (..., length, features), got {t.shape}")
    for other in (key, value):
        query._operand(other)  # raises RuntimeError for a tensor on another device
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: query {query.shape}, key {key.shape} and value {value.shape} "
                         "must be (..., L, E), (..., S, E) and (..., S, Ev)")
    try:
        leading = np.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except ValueError:
        raise ValueError(f"scaled_dot_product_attention: the leading axes of query {query.shape}, key {key.shape} "
                         f"and value {value.shape} do not broadcast") from None
    if attn_mask is None:
        return None
    if is_causal:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal=True, not both (as in PyTorch)")
    mask = query._operand(attn_mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"scaled_dot_product_attention: attn_mask must be boolean (True where attention is "
                        f"allowed), got dtype {mask.dtype}")
    scores_shape = (*leading, query.shape[-2], key.shape[-2])
    try:
        fits = np.broadcast_shapes(mask.shape, scores_shape) == scores_shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"scaled_dot_product_attention: attn_mask of shape {mask.shape} does not broadcast to the "
                         f"scores' shape {scores_shape}")
    return mask.data


_flash_by_default = False  # what flash=None means: use_flash_attention() sets it


@contextlib.contextmanager
def use_flash_attention(enabled: bool = True) -> Iterator[None]:
    """Inside, ``scaled_dot_product_attention(..., flash=None)`` -- every call that does not
    say -- runs as ``flash=enabled`` (Module 17), as ``torch.nn.attention.sdpa_kernel``
    picks PyTorch's kernel for the calls inside it. Restores the previous setting on exit."""
    global _flash_by_default
    previous, _flash_by_default = _flash_by_default, bool(enabled)
    try:
        yield
    finally:
        _flash_by_default = previous


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 flash: bool | None = None) -> Tensor:
    """``softmax(query @ key^T * scale) @ value`` over the last two axes, with masked scores left out.

    ``query`` (..., L, E), ``key`` (..., S, E), ``value`` (..., S, Ev) -> (..., L, Ev); the
    leading axes broadcast. ``scale=None`` means ``1 / sqrt(E)``; a number, 0 included, is
    used as it is. ``attn_mask``: boolean,
    True where a query may attend a key, broadcasting to (..., L, S). ``is_causal``:
    query ``i`` may attend key ``j`` only when ``j <= i + (S - L)`` (the queries are the
    last L of S positions; the lower triangle when L == S); not with ``attn_mask``.
    The weights go through ``MaskedSoftmax`` (a query that may attend nothing gets
    an output of 0), then, when ``dropout_p > 0``, through ``dropout(weights, dropout_p)``.
    ``flash=True`` hands the call to Module 17's FlashAttention (same result, memory
    linear in L and S); ``None`` means False, except inside ``use_flash_attention()``.
    """
    if _flash_by_default if flash is None else flash:
        # Module 17's file imports this one, so it is loaded by name when first asked for (as backends are)
        flash_attention = importlib.import_module("tinytrain.nn.flash_attention").flash_attention
        return flash_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)
    allowed = _attention_mask(query, key, value, attn_mask, is_causal)
    if scale is not None:
        scale = check_number("scale", scale)
    ### BEGIN SOLUTION
    if is_causal:
        xp = query._backend.xp
        length, source = query.shape[-2], key.shape[-2]
        allowed = xp.arange(source) <= xp.arange(length)[:, None] + (source - length)
    if scale is None:
        scale = 1 / math.sqrt(query.shape[-1])
    scores = (query * scale) @ key.transpose(*range(key.ndim - 2), -1, -2)
    weights = dropout(MaskedSoftmax.apply(scores, allowed=allowed), dropout_p)
    return weights @ value
    ### END SOLUTION


# %% check=2
rng = np.random.default_rng(1)
q, k, v = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 4, 5))
s = q @ k.transpose(0, 2, 1) / math.sqrt(3)
w = np.exp(s - s.max(axis=-1, keepdims=True))
w /= w.sum(axis=-1, keepdims=True)
t64 = lambda a: tt.tensor(a, dtype="float64", requires_grad=True)  # noqa: E731
out = scaled_dot_product_attention(t64(q), t64(k), t64(v))
assert out.shape == (2, 4, 5) and np.allclose(out.numpy(), w @ v), "softmax(q k^T / sqrt(E)) v"
causal = scaled_dot_product_attention(t64(q), t64(k), t64(v), is_causal=True).numpy()
assert np.allclose(causal[:, 0], v[:, 0]), "the first query may attend only the first key"
changed = v.copy()
changed[:, 3] += 100.0
assert np.allclose(scaled_dot_product_attention(t64(q), t64(k), t64(changed), is_causal=True).numpy()[:, :3],
                   causal[:, :3]), "earlier queries must not see a later value"
last = scaled_dot_product_attention(t64(q[:, 3:]), t64(k), t64(v), is_causal=True).numpy()
assert np.allclose(last, causal[:, 3:]), "one query and four keys: the query is the last position"
mask = np.array([[True, False, True, True]] * 4)
masked = scaled_dot_product_attention(t64(q), t64(k), t64(v), attn_mask=mask).numpy()
assert np.allclose(scaled_dot_product_attention(t64(q), t64(k[:, [0, 2, 3]]), t64(v[:, [0, 2, 3]])).numpy(), masked)
assert tt.gradcheck(lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True), [t64(q), t64(k), t64(v)])
print("scaled_dot_product_attention OK")

# %% [markdown]
# When PyTorch is installed, compare with its function on the same numbers:

# %%
if torch is not None:
    q, k, v = (tt.randn(2, 3, 6, 8) for _ in range(3))
    ours = scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
    theirs = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(t.numpy()) for t in (q, k, v)),
                                                              is_causal=True).numpy()
    print(f"largest difference from PyTorch: {np.abs(ours - theirs).max():.1e}")
else:
    print("PyTorch is not installed: skipping the comparison")

# %% [markdown]
# ## 6. Multi-head attention
#
# One attention computes one set of weights per query: one notion of "which
# positions matter". A model wants several at once — the previous word, the
# subject of the sentence, the matching quote mark. **Multi-head attention**
# (Vaswani et al., 2017) splits the $C$ channels of each position into $H$
# **heads** of $D = C/H$ channels, and runs attention in each head separately,
# at the cost of one attention of width $C$.
#
# GPT-2's layer (the names are nanoGPT's, which GPT-2's checkpoints use too):
#
# 1. `c_attn`, one `Linear(C, 3C)`, computes the queries, keys and values of
#    all heads at once: channels $0..C-1$ of its output are $Q$, $C..2C-1$ are
#    $K$, $2C..3C-1$ are $V$;
# 2. head $h$ owns channels $hD .. (h+1)D - 1$ of each: reshape $(B, T, C)$ to
#    $(B, T, H, D)$ and transpose to $(B, H, T, D)$, so the heads become a
#    leading axis that attention broadcasts over;
# 3. causal attention in every head, with dropout on the weights in training;
# 4. back: transpose to $(B, T, H, D)$ and reshape to $(B, T, C)$ — head $h$'s
#    output lands in channels $hD .. (h+1)D - 1$;
# 5. `c_proj`, a `Linear(C, C)`, mixes the heads, followed by dropout
#    (`resid_dropout`) in training.
#
# **The trap in step 2.** `x.reshape(B, H, T, D)` also has the right shape, and
# the code runs — but it cuts the *sequence* into heads: "head" 0 gets the
# first $T/H$ tokens' channels, spread over $T$ fake positions. Reshape to
# $(B, T, H, D)$ first (splitting only the channel axis), then move the head
# axis with `transpose(0, 2, 1, 3)`; undo it in the same two steps.
#
# Dropout: the layer's `dropout` is the probability of both dropouts, the one on
# the attention weights (`dropout_p` of `scaled_dot_product_attention`: the
# layer's `dropout` in training mode — `self.training`, Module 05 — and 0 in
# evaluation mode) and then
# `resid_dropout` on the output — in that order: the graded checks compare
# outputs drawn from the same seed, so the random numbers must be drawn in it.
#
# `forward(x)` returns the output tensor, $(B, T, C)$. (Module 15 adds an
# optional key/value cache as a keyword argument; without it, the call and its
# result stay exactly these.)

# %% export="nn/attention"
class CausalSelfAttention(Module):
    """Multi-head causal self-attention (GPT-2; nanoGPT's names): ``x`` (B, T, C) -> (B, T, C).

    ``c_attn = Linear(C, 3C)`` gives the queries, keys and values (channels ``[0, C)``,
    ``[C, 2C)``, ``[2C, 3C)``); head ``h`` owns channels ``[hD, (h+1)D)`` of each, ``D = C / H``
    (reshape to (B, T, H, D), then transpose to (B, H, T, D)). Each head runs
    ``scaled_dot_product_attention(..., is_causal=True)``, with ``dropout_p`` the layer's
    ``dropout`` in training mode and 0 in evaluation mode; head ``h``'s output goes back to
    channels ``[hD, (h+1)D)``, then ``c_proj = Linear(C, C)`` and ``resid_dropout``.
    ``bias=False`` leaves out both layers' biases. ``forward(x)`` returns the output tensor.
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed_dim = check_int("embed_dim", embed_dim, minimum=1)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        if embed_dim % num_heads:
            raise ValueError(f"CausalSelfAttention: embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        self.head_dim = embed_dim // num_heads
        self.dropout = check_number("dropout", dropout, minimum=0, below=1)
        self.c_attn = Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.c_proj = Linear(embed_dim, embed_dim, bias=bias)
        self.resid_dropout = Dropout(self.dropout)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{type(self).__name__} expects input of shape (B, T, {self.embed_dim}), got {x.shape}")
        ### BEGIN SOLUTION
        batch, length, channels = x.shape
        qkv = self.c_attn(x)
        q, k, v = (qkv[..., i * channels:(i + 1) * channels].reshape(batch, length, self.num_heads, self.head_dim)
                   .transpose(0, 2, 1, 3) for i in range(3))
        y = scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(0, 2, 1, 3).reshape(batch, length, channels)
        return self.resid_dropout(self.c_proj(y))
        ### END SOLUTION

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"


# %% check=3
tt.manual_seed(0)
attention = CausalSelfAttention(6, num_heads=2).to(dtype="float64")
assert [name for name, _ in attention.named_parameters()] == ["c_attn.weight", "c_attn.bias", "c_proj.weight",
                                                              "c_proj.bias"]
x = tt.randn(2, 5, 6, dtype="float64", requires_grad=True)
out = attention(x)
qkv = x.numpy() @ attention.c_attn.weight.numpy().T + attention.c_attn.bias.numpy()
heads = []
for h in range(2):
    q, k, v = (qkv[..., part * 6 + h * 3: part * 6 + h * 3 + 3] for part in range(3))
    s = q @ k.transpose(0, 2, 1) / math.sqrt(3) + np.triu(np.full((5, 5), -np.inf), 1)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    heads.append(w / w.sum(axis=-1, keepdims=True) @ v)
expected = np.concatenate(heads, axis=-1) @ attention.c_proj.weight.numpy().T + attention.c_proj.bias.numpy()
assert out.shape == (2, 5, 6) and np.allclose(out.numpy(), expected), "compare with the per-head computation above"
assert tt.gradcheck(lambda x, w: attention(x), [x, attention.c_attn.weight])
assert len(CausalSelfAttention(8, 4, bias=False).parameters()) == 2
print(attention, "OK")

# %% [markdown]
# The layer has $4C^2 + 4C$ parameters ($3C^2 + 3C$ in `c_attn`, $C^2 + C$ in
# `c_proj`), independent of the number of heads and of the sequence length: the
# same weights serve every position. What does depend on the length is the
# work, which the next section measures.
#
# ### What the heads do with positions
#
# A small experiment shows attention using position information. The task:
# at every position, output the token that came **two positions earlier**.
# The model is an embedding, a positional encoding, one `CausalSelfAttention`
# and a `Linear` that reads out the token — trained once with learned
# positional encodings and once without any. (No transformer yet: that is
# Module 15.)

# %%
class CopyBack(tt.nn.Module):
    def __init__(self, vocab: int, width: int, length: int, positions: bool) -> None:
        super().__init__()
        self.tokens = Embedding(vocab, width)
        self.positions = LearnedPositionalEncoding(length, width) if positions else None
        self.attention = CausalSelfAttention(width, num_heads=2)
        self.head = tt.nn.Linear(width, vocab)

    def forward(self, ids):
        x = self.tokens(ids)
        if self.positions is not None:
            x = self.positions(x)
        return self.head(self.attention(x))


def copy_back_accuracy(positions: bool, steps: int = 300, vocab: int = 8, length: int = 12) -> float:
    tt.manual_seed(0)
    model = CopyBack(vocab, 32, length, positions)
    optimizer = tt.optim.Adam(model.parameters(), lr=0.01)
    data = np.random.default_rng(0)
    for step in range(steps + 1):
        ids = data.integers(0, vocab, (32, length))
        logits = model(tt.tensor(ids))[:, 2:]  # positions 2.. have a token two back
        targets = tt.tensor(ids[:, :-2])
        if step == steps:
            return float((logits.numpy().argmax(-1) == ids[:, :-2]).mean())
        optimizer.zero_grad()
        tt.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1)).backward()
        optimizer.step()


for positions in (True, False):
    print(f"positional encoding {'yes' if positions else 'no ':3s}: accuracy {copy_back_accuracy(positions):.2f} "
          f"(chance: {1 / 8:.2f})")

# %% [markdown]
# With positions the layer learns the task; without them it cannot say which
# earlier token is two back. (It does better than chance: the causal mask
# itself leaks a little position information — the first positions see fewer
# tokens — but not enough for this task.)
#
# ## 7. Systems: attention grows with the square of the context
#
# For a sequence of $T$ tokens and width $C$, count the multiply-adds of one
# `CausalSelfAttention`:
#
# * the projections, `c_attn` and `c_proj`: $T \cdot C \cdot 3C + T \cdot C \cdot C = 4TC^2$;
# * the scores $QK^\top$ and the weighted values: $2 \cdot T^2 C$ (over all heads),
#   and a softmax over $T^2$ scores per head.
#
# The projections grow linearly with $T$, attention with $T^2$: attention is
# the larger part once $T > 2C$. Memory is worse. The score matrix has
# $B \cdot H \cdot T^2$ numbers, and the weights are *kept* for the backward
# pass; at $T = 8192$ that is 256 MiB per head per sequence in float32.
#
# Measure one layer: the time of forward + backward, the bytes of the
# $(T, T)$ arrays that the graph keeps for backward (found by walking the
# graph), and the peak memory of the whole step (Python's `tracemalloc`, which
# NumPy reports its arrays to).

# %%
def kept_square_bytes(out: Tensor, shape: tuple) -> int:
    """Bytes of the distinct arrays of ``shape`` (here the (B, H, T, T) of attention) that out's graph keeps."""
    seen, found, stack = set(), {}, [out._ctx]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        for value in vars(fn).values():
            if hasattr(value, "nbytes") and value.shape == shape:
                found[id(value)] = value.nbytes
        stack.extend(t._ctx for t in getattr(fn, "inputs", ()))
    return sum(found.values())


def attention_step(length: int, width: int = 64, heads: int = 4, batch: int = 4, repeats: int = 3):
    """(seconds per forward + backward, kept (T, T) bytes, peak bytes) of one layer at sequence length ``length``."""
    tt.manual_seed(0)
    layer = CausalSelfAttention(width, heads)
    x = tt.randn(batch, length, width, requires_grad=True)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        layer(x).sum().backward()
        best = min(best, time.perf_counter() - start)
    kept = kept_square_bytes(layer(x), (batch, heads, length, length))
    tracemalloc.start()
    layer(x).sum().backward()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return best, kept, peak


lengths = [32, 64, 128, 256, 512, 1024]
results = [attention_step(length) for length in lengths]
print(f"{'T':>5s} {'fwd+bwd ms':>11s} {'(T,T) kept MiB':>15s} {'peak MiB':>9s}")
for length, (seconds, kept, peak) in zip(lengths, results):
    print(f"{length:5d} {seconds * 1e3:11.2f} {kept / 2**20:15.2f} {peak / 2**20:9.1f}")
growth = results[-1][0] / results[-2][0]
print(f"doubling T from {lengths[-2]} to {lengths[-1]}: time x{growth:.1f}, kept (T, T) bytes "
      f"x{results[-1][1] / results[-2][1]:.1f}")

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
left.loglog(lengths, [r[0] * 1e3 for r in results], "o-", label="measured")
left.loglog(lengths, [results[-1][0] * 1e3 * (t / lengths[-1]) ** 2 for t in lengths], "--", label="~ T²")
left.set_title("forward + backward time (ms)")
right.loglog(lengths, [r[2] / 2**20 for r in results], "o-", label="peak")
right.loglog(lengths, [r[1] / 2**20 for r in results], "s-", label="(T, T) arrays kept")
right.set_title("memory (MiB)")
for ax in (left, right):
    ax.set_xlabel("sequence length T")
    ax.legend()
plt.show()

# %% [markdown]
# Read the table from the bottom. At the long end the time grows by 4× or more
# per doubling of $T$ (more once the arrays outgrow the processor's caches), and
# the $(T, T)$ arrays kept for backward by exactly 4×: with $B = 4$ sequences and $H = 4$ heads that is $16 T^2$ floats — the
# weights saved by the softmax, which the product with $V$ keeps too (the same
# array, counted once) — 64 MiB at $T = 1024$.
# The peak is larger, because the forward pass also makes the scores, an
# array of that size, before the softmax turns its one copy of them into the
# weights in place (with a new array at every step, as in a first version of
# `MaskedSoftmax`, the peak would hold three or four of them).
# At the short end the linear-in-$T$ projections and Python's fixed costs per
# operation dominate, and the curve is flatter.
#
# This quadratic wall is why context lengths were long stuck at a few
# thousand tokens. **FlashAttention** (Dao et al., 2022) computes exactly the
# same result without ever storing the $(T, T)$ matrix: it walks the keys in
# tiles that fit in the GPU's fast on-chip memory, keeps a running maximum and
# running sum per query (an *online softmax*), and recomputes the tiles in the
# backward pass — memory linear in $T$, and faster, because memory traffic,
# not arithmetic, was the bottleneck. The arithmetic is still $O(T^2)$.
#
# ## How PyTorch does it
#
# * `torch.nn.Embedding(num_embeddings, embedding_dim)` and
#   `F.embedding(input, weight)`: the same layout and N(0, 1) initialisation;
#   they also offer `padding_idx` (a row that gets no gradient) and
#   `sparse=True` (a gradient that stores only the rows used, instead of our
#   dense $(V, D)$ array of mostly zeros). The CUDA backward sorts the ids and
#   adds each run of equal ids, which is deterministic, unlike atomic adds.
# * `F.scaled_dot_product_attention(query, key, value, attn_mask=None,
#   dropout_p=0.0, is_causal=False, scale=None)` — our signature — picks among
#   FlashAttention, a memory-efficient kernel and the plain "math" version like
#   ours. Its `is_causal` aligns the triangle to the top-left corner when
#   $L \ne S$ (query $i$ sees keys $0..i$); ours aligns it to the bottom-right,
#   which is what a KV cache needs. A boolean `attn_mask` means the same as
#   ours; PyTorch also takes a float mask that is added to the scores.
# * `torch.nn.MultiheadAttention(embed_dim, num_heads, dropout, bias,
#   batch_first=False)` keeps one fused `in_proj_weight` of shape $(3C, C)$ like
#   our `c_attn`, but expects `(T, B, C)` inputs unless `batch_first=True`, and
#   returns `(output, averaged weights)`. GPT-style code (nanoGPT, Hugging Face's
#   GPT-2) writes its own `CausalSelfAttention`, as we did.
# * Tokenizers live outside PyTorch: OpenAI's `tiktoken` (GPT-2's byte-level BPE
#   with its regular expression that splits words first), Hugging Face's
#   `tokenizers`, Google's `sentencepiece` (BPE and the unigram model, on
#   raw text). Sinusoidal encodings are rarely used today; GPT-2 learned its
#   positions, and most recent models rotate the queries and keys instead
#   (RoPE, Su et al., 2021), which makes the scores depend on relative positions.
#
# ## Summary
#
# * A tokenizer maps text to ids and back without loss. Characters: tiny
#   vocabulary, long sequences. Byte-level BPE: merge the most frequent pair
#   (first occurrence breaks ties) into a new id, again and again; encode by
#   applying the merges in the order learned.
# * An embedding is a row lookup; its backward pass is a **scatter-add**,
#   which adds up the gradients of repeated ids (`grad[ids] += g` would not).
# * Attention is permutation-blind, so positions are added: learned, or
#   $\sin/\cos(p / 10000^{2i/D})$ interleaved.
# * $\operatorname{softmax}(QK^\top/\sqrt d + M)\,V$: scale by $1/\sqrt d$
#   to keep the softmax from saturating; mask the future with $-\infty$; take
#   the row maximum over the allowed scores, and give a fully masked row zeros,
#   never `nan`.
# * Multi-head: split channels into heads with reshape $(B, T, H, D)$ then
#   transpose — never reshape straight to $(B, H, T, D)$.
# * Time and memory of attention grow as $T^2$: the $(T, T)$ weights are kept
#   for backward. FlashAttention avoids storing them; nothing avoids computing them.
