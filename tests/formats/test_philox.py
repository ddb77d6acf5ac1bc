"""Philox4x32-10 and the stochastic-rounding bit stream (NUMERICS §2.4)."""

from __future__ import annotations

import numpy as np
import pytest

from lowprec_moe.backends.numpy.philox import philox4x32_10, sr_random_bits

M32 = 0xFFFFFFFF


# Random123 known-answer vectors (kat_vectors, philox4x32 with 10 rounds).
@pytest.mark.parametrize("ctr, key, expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32, M32, M32, M32), (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(ctr, key, expected):
    out = philox4x32_10(ctr, key)
    assert all(o.dtype == np.uint32 for o in out)
    assert tuple(int(o) for o in out) == expected


def test_philox_vectorized_equals_scalar():
    rng = np.random.default_rng(0)
    ctr = [rng.integers(0, 2**32, 50, dtype=np.uint64).astype(np.uint32) for _ in range(4)]
    key = (np.uint32(0x12345678), np.uint32(0x9ABCDEF0))
    vec = philox4x32_10(ctr, key)
    for i in range(50):
        one = philox4x32_10([c[i] for c in ctr], key)
        assert tuple(int(o) for o in one) == tuple(int(v[i]) for v in vec)


def _bits_by_hand(seed, member, direction, i, j, cols):
    idx = i * cols + j
    return int(philox4x32_10((idx & M32, idx >> 32, direction, member),
                             (seed & M32, seed >> 32))[0])


def test_sr_random_bits_is_first_word_of_the_documented_counter():
    seed = 0x0123456789ABCDEF
    bits = sr_random_bits(seed, 3, 1, (4, 6))
    assert bits.shape == (4, 6) and bits.dtype == np.uint32
    for i in range(4):
        for j in range(6):
            assert int(bits[i, j]) == _bits_by_hand(seed, 3, 1, i, j, 6)


def test_sr_random_bits_depends_on_seed_member_direction_and_index():
    base = sr_random_bits(7, 0, 0, (8, 32))
    # index: all elements differ from each other (a collision of 32-bit words is ~1e-7 likely)
    assert np.unique(base).size == base.size
    for other in (sr_random_bits(8, 0, 0, (8, 32)),          # seed
                  sr_random_bits(7 + 2**32, 0, 0, (8, 32)),  # high word of the seed
                  sr_random_bits(7, 1, 0, (8, 32)),          # member
                  sr_random_bits(7, 0, 1, (8, 32))):         # direction
        assert (other != base).mean() > 0.99


def test_sr_random_bits_index_is_linear_in_the_stored_matrix():
    a = sr_random_bits(5, 2, 0, (4, 16))
    b = sr_random_bits(5, 2, 0, (8, 8))
    np.testing.assert_array_equal(a.reshape(-1), b.reshape(-1))
    # same seed, same everything: reproducible
    np.testing.assert_array_equal(a, sr_random_bits(5, 2, 0, (4, 16)))


def test_sr_random_bits_64bit_seed():
    s = 2**64 - 1
    bits = sr_random_bits(s, 0, 0, (1, 3))
    assert [int(b) for b in bits[0]] == [_bits_by_hand(s, 0, 0, 0, j, 3) for j in range(3)]
