"""Interop: safetensors files (bit-identical round trip, PyTorch's reader and writer), ONNX export (checked by
onnx.checker, run by ONNX Runtime: the MLP, the CNN and the GPT), and the GPT as a Hugging Face GPT-2 folder
loaded offline by transformers. Each part is skipped where its package is absent."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tinytrain as tt
from tinytrain import nn

RNG = np.random.default_rng(0)


def mlp() -> nn.Module:
    tt.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def cnn() -> nn.Module:
    """The CNN milestone's layers, small; one training step so BatchNorm's running statistics are not 0 and 1
    (and its 0-d num_batches_tracked is 1)."""
    tt.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AvgPool2d(2),
                          nn.Dropout(0.3), nn.Flatten(), nn.Linear(8 * 2 * 2, 10))
    model(tt.randn(16, 1, 8, 8))
    return model


def gpt(**options) -> nn.Module:
    tt.manual_seed(0)
    return nn.GPT(nn.GPTConfig(vocab_size=65, block_size=16, n_layer=2, n_head=4, n_embd=32, **options))


def token_ids(shape=(3, 16)) -> tt.Tensor:
    return tt.tensor(RNG.integers(0, 65, shape))


# -- safetensors -----------------------------------------------------------------------------------------------------
def test_safetensors_round_trip_is_bit_identical(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    model = cnn()
    path = tt.save_safetensors(model, tmp_path / "cnn.safetensors")
    loaded = tt.load_safetensors(path)
    state = model.state_dict()
    assert sorted(loaded) == sorted(state)  # the names of state_dict(), running statistics included
    for name, value in state.items():
        assert loaded[name].dtype == value.dtype and loaded[name].numpy().tobytes() == value.numpy().tobytes(), name
    other = cnn()
    other.load_state_dict(loaded)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(other.state_dict().values(), state.values()))


def test_safetensors_keeps_every_dtype_and_metadata(tmp_path: Path) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    arrays = {"half": RNG.standard_normal((3, 2)).astype(np.float16), "ids": np.arange(5, dtype=np.int64),
              "column_major": np.asfortranarray(RNG.standard_normal((4, 3)).astype(np.float32)),
              "tensor": tt.tensor([1.5, -2.0])}
    tt.save_safetensors(arrays, tmp_path / "x.safetensors", metadata={"format": "pt"})
    loaded = tt.load_safetensors(tmp_path / "x.safetensors")
    for name in ("half", "ids", "column_major"):
        assert loaded[name].dtype == arrays[name].dtype and np.array_equal(loaded[name].numpy(), arrays[name])
    assert loaded["tensor"].numpy().tolist() == [1.5, -2.0]
    with open(tmp_path / "x.safetensors", "rb") as file:  # the header as the format defines it
        header = json.loads(file.read(int.from_bytes(file.read(8), "little")))
    assert header["__metadata__"] == {"format": "pt"} and header["half"]["dtype"] == "F16"
    assert safetensors_numpy.load_file(str(tmp_path / "x.safetensors"))["column_major"].flags["C_CONTIGUOUS"]


def test_safetensors_errors_name_the_problem(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    with pytest.raises(TypeError, match="'w' is a list, not a tensor"):
        tt.save_safetensors({"w": [1.0]}, tmp_path / "bad.safetensors")
    with pytest.raises(TypeError, match="takes a Module or a dict of name -> tensor, got int"):
        tt.save_safetensors(3, tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()
    with pytest.raises(FileNotFoundError, match="no such file .*absent.safetensors"):
        tt.load_safetensors(tmp_path / "absent.safetensors")
    tt.save_safetensors(mlp(), tmp_path / "good.safetensors")
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "good.safetensors").read_bytes()[:100])
    with pytest.raises(ValueError, match="cut.safetensors is not a valid safetensors file"):
        tt.load_safetensors(tmp_path / "cut.safetensors")


def test_safetensors_files_cross_load_with_pytorch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    ours = mlp()
    theirs = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    tt.save_safetensors(ours, tmp_path / "ours.safetensors")
    theirs.load_state_dict(safetensors_torch.load_file(str(tmp_path / "ours.safetensors")))
    x = RNG.standard_normal((5, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(theirs(torch.from_numpy(x)).numpy(), ours(tt.tensor(x)).numpy(), atol=1e-6)
    torch.nn.init.normal_(theirs[1].weight)
    safetensors_torch.save_file(theirs.state_dict(), str(tmp_path / "theirs.safetensors"))
    ours.load_state_dict(tt.load_safetensors(tmp_path / "theirs.safetensors"))
    assert ours.state_dict()["1.weight"].numpy().tobytes() == theirs[1].weight.detach().numpy().tobytes()


# -- ONNX ------------------------------------------------------------------------------------------------------------
def run_onnx(path: Path, *inputs: tt.Tensor) -> np.ndarray:
    onnx = pytest.importorskip("onnx")
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {spec.name: t.numpy() for spec, t in zip(session.get_inputs(), inputs)})[0]


@pytest.mark.parametrize("name, make, example", [
    ("mlp", mlp, lambda: tt.randn(5, 1, 8, 8)),
    ("cnn", cnn, lambda: tt.randn(5, 1, 8, 8)),
    ("gpt", gpt, token_ids),
])
def test_onnx_runtime_computes_the_models_outputs(tmp_path: Path, name, make, example) -> None:
    pytest.importorskip("onnx")
    model, x = make(), example()
    model.train()
    tt.onnx.export(model, x, tmp_path / f"{name}.onnx")
    assert model.training, "export restores the model's mode"
    model.eval()
    expected = model(x).numpy()
    got = run_onnx(tmp_path / f"{name}.onnx", x)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_onnx_file_names_the_weights_by_state_dict(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    model = mlp()
    tt.onnx.export(model, tt.randn(2, 1, 8, 8), tmp_path / "mlp.onnx", input_names=["pixels"],
                   output_names=["scores"])
    graph = onnx.load(str(tmp_path / "mlp.onnx")).graph
    assert {i.name for i in graph.initializer} >= set(model.state_dict())
    assert [i.name for i in graph.input] == ["pixels"] and [o.name for o in graph.output] == ["scores"]
    assert [n.op_type for n in graph.node] == ["Reshape", "Gemm", "Relu", "Gemm", "Identity"]


def test_onnx_export_indexing_and_reductions(tmp_path: Path) -> None:
    pytest.importorskip("onnx")

    class Picks(nn.Module):
        def forward(self, x):
            scores = x[1:, ..., ::2].sum(axis=1) + x[0, :, -1].mean() - x.max(axis=-1, keepdims=True)[1:, 0]
            return scores.softmax(-1) * x[:0:-1, 2, ::-2]  # negative steps: ONNX's end "past the front"

    x = tt.randn(3, 4, 6)
    tt.onnx.export(Picks(), x, tmp_path / "picks.onnx")
    np.testing.assert_allclose(run_onnx(tmp_path / "picks.onnx", x), Picks()(x).numpy(), rtol=1e-5, atol=1e-6)


def test_onnx_export_names_an_operation_it_cannot_map(tmp_path: Path) -> None:
    pytest.importorskip("onnx")

    class Lossy(nn.Module):
        def forward(self, x):
            return nn.functional.cross_entropy(x, tt.tensor([0, 1]))

    with pytest.raises(NotImplementedError, match=r"the operation CrossEntropy \(inputs of shapes \(2, 3\)\) has no "
                                                  r"ONNX mapping; mapped: Abs, Add"):
        tt.onnx.export(Lossy(), tt.randn(2, 3), tmp_path / "lossy.onnx")
    assert not (tmp_path / "lossy.onnx").exists()


# -- Hugging Face ----------------------------------------------------------------------------------------------------
def test_gpt_exports_as_a_gpt2_folder_that_transformers_loads_offline(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("safetensors")
    for bias in (True, False):
        model = gpt(bias=bias)
        folder = tt.huggingface.export_gpt2(model, tmp_path / f"gpt2-{bias}")
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == "gpt2" and config["activation_function"] == "gelu_new"
        assert (config["n_positions"], config["n_embd"], config["n_layer"], config["n_head"]) == (16, 32, 2, 4)
        weights = tt.load_safetensors(folder / "model.safetensors")
        c_attn = model.h[0].attn.c_attn
        assert np.array_equal(weights["transformer.h.0.attn.c_attn.weight"].numpy(), c_attn.weight.numpy().T)
        assert "lm_head.weight" not in weights  # tied to transformer.wte.weight, as transformers saves it
        expected_bias = c_attn.bias.numpy() if bias else np.zeros(96, np.float32)
        assert np.array_equal(weights["transformer.h.0.attn.c_attn.bias"].numpy(), expected_bias)

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for bias in (True, False):
        model = gpt(bias=bias).eval()
        hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / f"gpt2-{bias}", local_files_only=True).eval()
        idx = token_ids()
        with torch.no_grad():
            logits = hf(torch.from_numpy(idx.numpy())).logits.numpy()
        np.testing.assert_allclose(logits, model(idx).numpy(), rtol=1e-5, atol=1e-5)


def test_gpt2_export_refuses_what_gpt2_cannot_represent(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    with pytest.raises(TypeError, match="export_gpt2 takes a tt.nn.GPT, got Sequential"):
        tt.huggingface.export_gpt2(mlp(), tmp_path)
    model = gpt()
    model.h[1].ln_2.eps = 1e-6
    model.h[0].mlp.gelu = nn.ReLU()
    with pytest.raises(ValueError, match=r"cannot represent h\.1\.ln_2\.eps=1e-06 \(GPT-2 has 1e-05\); h\.0\.mlp\.gelu "
                                         r"is a ReLU"):
        tt.huggingface.export_gpt2(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
