"""tt.data.transforms: Compose, RandomCrop, RandomHorizontalFlip, Normalize, and Transformed, whose per-sample
generators make augmentation reproducible and independent of the number of workers."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tinytrain as tt
from tinytrain.data import DataLoader, TensorDataset

T = tt.data.transforms


def image(channels: int = 2, height: int = 5, width: int = 6) -> np.ndarray:
    return np.arange(1, channels * height * width + 1, dtype=np.float32).reshape(channels, height, width)


def test_the_transforms_are_reached_from_tt_data():
    from tinytrain.data import transforms

    assert transforms is T and T.Compose.__module__ == "tinytrain.datasets.transforms"


def test_random_crop_shifts_the_image_by_every_offset_within_the_padding_with_zeros_around():
    crop, picture = T.RandomCrop((5, 6), padding=1), image()
    generator = np.random.default_rng(0)
    padded = np.pad(picture, ((0, 0), (1, 1), (1, 1)))
    windows = {(top, left): padded[:, top:top + 5, left:left + 6] for top in range(3) for left in range(3)}
    seen = set()
    for _ in range(200):
        out = crop(picture, generator)
        assert out.shape == picture.shape and out.dtype == picture.dtype
        [offset] = [offset for offset, window in windows.items() if np.array_equal(out, window)]
        seen.add(offset)
    assert seen == set(windows)  # all nine shifts, the centre included


def test_random_crop_smaller_than_the_image_and_square_size():
    out = T.RandomCrop(3)(image(), np.random.default_rng(1))
    assert out.shape == (2, 3, 3)
    big = image(1, 5, 6)[0]
    assert any(np.array_equal(out[0], big[i:i + 3, j:j + 3]) for i in range(3) for j in range(4))


@pytest.mark.parametrize("size, padding, message", [
    (7, 0, "7x7 does not fit in the image of 5x6 padded by 0"),
    (3, -1, "padding >= 0, got -1"),
    (0, 0, "size of at least 1, got 0"),
])
def test_random_crop_refuses_what_cannot_be_cut(size, padding, message):
    with pytest.raises(ValueError, match=message):
        T.RandomCrop(size, padding)(image())


def test_horizontal_flip_mirrors_the_last_axis_with_probability_p():
    picture, generator = image(), np.random.default_rng(0)
    np.testing.assert_array_equal(T.RandomHorizontalFlip(1.0)(picture, generator), picture[:, :, ::-1])
    np.testing.assert_array_equal(T.RandomHorizontalFlip(0.0)(picture, generator), picture)
    flips = [np.array_equal(T.RandomHorizontalFlip(0.3)(picture, generator), picture[:, :, ::-1])
             for _ in range(2000)]
    assert abs(np.mean(flips) - 0.3) < 0.04
    with pytest.raises(ValueError, match="got 1.5"):
        T.RandomHorizontalFlip(1.5)


def test_normalize_shifts_and_scales_each_channel():
    out = T.Normalize(mean=[1.0, 2.0], std=[2.0, 4.0])(image())
    expected = (image() - np.array([1.0, 2.0])[:, None, None]) / np.array([2.0, 4.0])[:, None, None]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    np.testing.assert_allclose(T.Normalize(0.5, 0.25)(image()), (image() - 0.5) / 0.25, rtol=1e-6)
    with pytest.raises(ValueError, match="3 channels of mean and std, the image has 2"):
        T.Normalize([0, 0, 0], [1, 1, 1])(image())
    with pytest.raises(ValueError, match="std > 0"):
        T.Normalize([0, 0], [1, 0])
    with pytest.raises(ValueError, match="one mean and one std per channel"):
        T.Normalize([0, 0, 0], [1, 1])


def test_transforms_refuse_an_image_that_is_not_channels_height_width():
    with pytest.raises(ValueError, match=r"shape \(5, 6\)"):
        T.RandomHorizontalFlip()(np.zeros((5, 6)))


def test_compose_applies_in_order_from_one_generator():
    chain = T.Compose([T.RandomCrop(5, padding=2), T.RandomHorizontalFlip(), T.Normalize(1.0, 2.0)])
    out = chain(image(), np.random.default_rng(4))
    generator = np.random.default_rng(4)
    step = T.RandomCrop(5, padding=2)(image(), generator)
    step = T.RandomHorizontalFlip()(step, generator)
    np.testing.assert_array_equal(out, T.Normalize(1.0, 2.0)(step))
    with pytest.raises(TypeError, match="transform 1 is not callable"):
        T.Compose([T.RandomHorizontalFlip(), "flip"])


def test_without_a_generator_transforms_follow_tt_manual_seed():
    crop = T.RandomCrop(5, padding=3)
    tt.manual_seed(2)
    first = [crop(image()) for _ in range(5)]
    tt.manual_seed(2)
    assert all(np.array_equal(a, crop(image())) for a in first)


def augmented(seed: int = 0) -> T.Transformed:
    pictures = np.random.default_rng(0).random((40, 3, 8, 8), dtype=np.float32)
    chain = T.Compose([T.RandomCrop(8, padding=2), T.RandomHorizontalFlip()])
    return T.Transformed(TensorDataset(pictures, np.arange(40)), chain, seed=seed)


def test_transformed_draws_per_sample_epoch_and_seed():
    data = augmented()
    picture, label = data[3]
    assert label == 3
    np.testing.assert_array_equal(data[3][0], picture)  # the same sample twice in an epoch: the same image
    np.testing.assert_array_equal(data[-37][0], picture)  # counted from the end: the same sample
    data.set_epoch(1, 0)
    assert not np.array_equal(data[3][0], picture)  # a new epoch, a new augmentation
    data.set_epoch(0, 1)
    assert not np.array_equal(data[3][0], picture)  # another seed, another run
    data.set_epoch(0, 0)
    np.testing.assert_array_equal(data[3][0], picture)
    with pytest.raises(IndexError, match="sample 40 is out of range for 40"):
        data[40]


def epochs(loader: DataLoader, count: int = 2) -> list[np.ndarray]:
    return [np.concatenate([xb.numpy() for xb, _ in loader]) for _ in range(count)]


def test_a_loader_seeds_the_augmentation_new_each_epoch_and_reproducibly():
    first, second = epochs(DataLoader(augmented(), batch_size=8, shuffle=True, seed=5))
    assert not np.array_equal(first, second)
    again = epochs(DataLoader(augmented(), batch_size=8, shuffle=True, seed=5))
    np.testing.assert_array_equal(again[0], first)
    np.testing.assert_array_equal(again[1], second)
    assert not np.array_equal(epochs(DataLoader(augmented(), batch_size=8, shuffle=True, seed=6), 1)[0], first)


def test_an_unshuffled_loader_draws_an_augmentation_seed_from_tt_manual_seed():
    tt.manual_seed(1)
    first = epochs(DataLoader(augmented(), batch_size=8), 1)[0]
    tt.manual_seed(1)
    np.testing.assert_array_equal(epochs(DataLoader(augmented(), batch_size=8), 1)[0], first)


@pytest.mark.skipif(os.name == "nt", reason="workers fork")
@pytest.mark.parametrize("persistent", [False, True])
def test_augmentation_is_the_same_whatever_the_number_of_workers(persistent):
    expected = epochs(DataLoader(augmented(), batch_size=8, shuffle=True, seed=5), 3)
    for num_workers in (1, 3):
        loader = DataLoader(augmented(), batch_size=8, shuffle=True, seed=5, num_workers=num_workers,
                            persistent_workers=persistent)
        for got, want in zip(epochs(loader, 3), expected):
            np.testing.assert_array_equal(got, want)


def test_a_resumed_loader_augments_the_rest_of_the_epoch_alike():
    straight = DataLoader(augmented(), batch_size=8, shuffle=True, seed=5)
    expected = epochs(straight, 2)
    first = DataLoader(augmented(), batch_size=8, shuffle=True, seed=5)
    epochs(first, 1)
    iterator = iter(first)
    served = [next(iterator)[0].numpy() for _ in range(2)]
    resumed = DataLoader(augmented(), batch_size=8, shuffle=True, seed=5, num_workers=2)
    resumed.load_state_dict(first.state_dict())
    rest = [xb.numpy() for xb, _ in resumed]
    np.testing.assert_array_equal(np.concatenate(served + rest), expected[1])
