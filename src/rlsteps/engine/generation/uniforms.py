"""The uniform numbers sampling draws at: hashed from (row seed, response position) with SplitMix64, counter-based.

SplitMix64 (Steele, Lea and Flood 2014; Vigna's splitmix64.c) advances a 64-bit state by the
constant GAMMA and mixes it into its output. Its output t is mix(seed + (t + 1) * GAMMA mod 2**64),
a function of (seed, t) alone, so the number for any row and position is computed directly,
with no state carried from step to step or shared between rows.
"""

from __future__ import annotations

import torch

GAMMA = 0x9E3779B97F4A7C15
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_MASK64 = 2**64 - 1


def splitmix64(seed: int, index: int) -> int:
    """Output `index` (0-based) of SplitMix64 seeded with `seed`, in Python ints: a 64-bit hash of (seed, index)."""
    z = (seed + (index + 1) * GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX[0]) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX[1]) & _MASK64
    return z ^ (z >> 31)


def splitmix64_stream(seeds: torch.Tensor, length: int) -> torch.Tensor:
    """[B] int64 seeds -> [B, length] int64: outputs 0 .. length-1 of SplitMix64 per seed, on the seeds' device.

    splitmix64 in vectorised int64 arithmetic: each entry holds the unsigned 64-bit output's bits
    (two's complement). Addition and multiplication wrap modulo 2**64 as unsigned arithmetic does;
    right shifts are masked so they fill with zeros (logical) rather than copies of the sign bit.
    """
    counters = torch.arange(1, length + 1, dtype=torch.int64, device=seeds.device)  # [length]
    z = seeds[:, None] + counters * _as_int64(GAMMA)  # [B, length]
    z = (z ^ _shift_right(z, 30)) * _as_int64(_MIX[0])
    z = (z ^ _shift_right(z, 27)) * _as_int64(_MIX[1])
    return z ^ _shift_right(z, 31)


def position_uniforms(seeds: torch.Tensor, length: int) -> torch.Tensor:
    """[B] int64 row seeds -> [B, length] fp64 uniforms; entry [i, t] is for row i's response position t.

    The top 52 bits of the hash, k, become (k + 1/2) / 2**52: exact in fp64 and strictly inside
    (0, 1), from 2**-53 to 1 - 2**-53.
    """
    top_bits = _shift_right(splitmix64_stream(seeds, length), 12)  # [B, length] in [0, 2**52)
    return (top_bits.double() + 0.5) * 2.0**-52


def _as_int64(value: int) -> int:
    """The int64 with the bits of an unsigned 64-bit value."""
    return value - 2**64 if value >= 2**63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits: torch's >> on int64 is arithmetic, so clear the copied sign bits."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)
