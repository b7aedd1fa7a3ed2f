"""numba kernels for the work of a CPU decode step between its matrix multiplies (fp32).

A decode step of a small model on a CPU is mostly per-op overhead: ~50 torch ops per layer, each a few
microseconds of dispatch for a few microseconds of work. KVDecoder's CPU fp32 path keeps the projections in
oneDNN (prepacked GEMMs) and does the rest of a layer in two calls: `add_rms_norm` (residual add + RMSNorm)
and `attend` (q/k norm, rotary embedding, cache write and attention for every row and head, rows in
parallel). Measured on the rollout benchmark's workload (benchmarks/README.md, "Generation").

`exp` is written out (a Cody-Waite reduction and a degree-7 polynomial, 6e-8 relative error measured)
because numba's math.exp is a scalar libm call per element, 12x slower than this loop, which vectorizes.
Compiled on first use (~7 s) and cached on disk (`cache=True`) afterwards.
"""

from __future__ import annotations

import math

import numba
import numpy as np


def use_threads(count: int) -> None:
    """Run `attend`'s rows on `count` threads (as many as torch uses), within numba's own limit. Loading numba's
    OpenMP threading layer (on the first call) sets the process's OpenMP thread count to every core, torch's
    included: torch's own count is put back, or a run set to fewer threads (OMP_NUM_THREADS, an engine process
    of rollout.placement=separate) would compute on more from its first decode on."""
    import torch

    torch_threads = torch.get_num_threads()
    numba.set_num_threads(max(1, min(count, numba.config.NUMBA_NUM_THREADS)))
    # only then: setting it to the count it already has still changed the trainer's rounding (seen in the k = 0
    # against k = 1 equality of tests/cli/test_overlap.py), so it is left alone where numba changed nothing
    if torch.get_num_threads() != torch_threads:
        torch.set_num_threads(torch_threads)


# fastmath without the no-inf/no-NaN assumptions: masked positions score -inf. The attention kernel may
# reassociate (its sums vectorize); `exp` may not (x - k ln2_hi - k ln2_lo must not fold into x - k ln2).
_EXP_FLAGS = {"nsz", "arcp", "contract", "afn"}
_FLAGS = _EXP_FLAGS | {"reassoc"}


@numba.njit(fastmath=_EXP_FLAGS, cache=True, nogil=True, inline="always")
def _exp_inplace(x: np.ndarray, n: int, scratch: np.ndarray) -> None:
    """x[:n] = exp(x[:n]) for x <= 0 (softmax inputs less their max); below -87, exactly 0."""
    for i in range(n):
        v = x[i]
        k = np.rint(v * np.float32(1.4426950408889634))  # v = k ln2 + f, |f| <= ln2 / 2
        f = v - k * np.float32(0.693145751953125) - k * np.float32(1.428606765330187e-06)
        p = np.float32(1.0) + f * (
            np.float32(1.0)
            + f
            * (
                np.float32(1 / 2)
                + f
                * (
                    np.float32(1 / 6)
                    + f
                    * (
                        np.float32(1 / 24)
                        + f * (np.float32(1 / 120) + f * (np.float32(1 / 720) + f * np.float32(1 / 5040)))
                    )
                )
            )
        )
        tiny = v < np.float32(-87.0)
        x[i] = np.float32(0.0) if tiny else p
        scratch[i] = 0 if tiny else np.int32(k) << 23
    bits = x[:n].view(np.int32)
    for i in range(n):
        bits[i] += scratch[i]  # p * 2**k: k added to the exponent field


@numba.njit(fastmath=True, cache=True, nogil=True)
def add_rms_norm(hidden: np.ndarray, delta: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
    """hidden += delta (skipped when delta has no rows), then out = RMSNorm(hidden) * weight; (B, C) each."""
    rows, width = hidden.shape
    for b in range(rows):
        total = np.float32(0.0)
        for c in range(width):
            v = hidden[b, c] + delta[b, c] if delta.shape[0] else hidden[b, c]
            hidden[b, c] = v
            total += v * v
        scale = np.float32(1.0 / math.sqrt(total / width + eps))
        for c in range(width):
            out[b, c] = hidden[b, c] * scale * weight[c]


@numba.njit(fastmath=_FLAGS, cache=True, nogil=True, inline="always")
def _rotated_head(src, offset, cos, sin, pos, norm, eps, scale, dst) -> None:
    """dst (D,) = rotary embedding at `pos` of src[offset : offset + D], RMS-normalised first when `norm` is
    a weight (Qwen3's per-head q/k norm), times `scale` (transformers' rotate_half convention)."""
    dim = dst.shape[0]
    half = dim // 2
    factor = np.float32(1.0)
    if norm.shape[0]:
        total = np.float32(0.0)
        for i in range(dim):
            total += src[offset + i] * src[offset + i]
        factor = np.float32(1.0 / math.sqrt(total / dim + eps))
    for i in range(half):
        a, b = src[offset + i] * factor, src[offset + half + i] * factor
        if norm.shape[0]:
            a, b = a * norm[i], b * norm[half + i]
        dst[i] = (a * cos[pos, i] - b * sin[pos, i]) * scale
        dst[half + i] = (b * cos[pos, half + i] + a * sin[pos, half + i]) * scale


@numba.njit(fastmath=_FLAGS, cache=True, parallel=True)
def attend(
    qkv,
    cos,
    sin,
    positions,
    keys,
    values,
    key_bias,
    length,
    prefix_k,
    prefix_v,
    prefix_bias,
    group,
    q_norm,
    k_norm,
    eps,
    scale,
    out,
) -> None:
    """One new token per row: its k and v into the cache at `length`, then its attention over the cache.

    qkv (B, (H + 2 Hkv) D): the fused projection's output; cos, sin (positions, D); positions (B,);
    keys, values (B, Hkv, capacity, D); key_bias (B, capacity): 0 or -inf per cached position, position
    `length` already 0. prefix_k, prefix_v (U, Hkv, W, D), prefix_bias (B, W): the shared prompt of rows
    u*group .. u*group+group-1 (W = 0 when not shared). q_norm, k_norm (D,) or empty. out (B, H D)."""
    rows, kv_heads, dim = keys.shape[0], keys.shape[1], keys.shape[3]
    heads = qkv.shape[1] // dim - 2 * kv_heads
    width = prefix_k.shape[2]
    n = width + length + 1  # keys each query sees
    for b in numba.prange(rows):
        pos, u = positions[b], b // group
        k_new = np.empty(dim, dtype=np.float32)
        for h in range(kv_heads):
            _rotated_head(qkv[b], (heads + h) * dim, cos, sin, pos, k_norm, eps, np.float32(1.0), k_new)
            keys[b, h, length, :] = k_new
            values[b, h, length, :] = qkv[b, (heads + kv_heads + h) * dim : (heads + kv_heads + h + 1) * dim]
        q = np.empty(dim, dtype=np.float32)
        acc = np.empty(dim, dtype=np.float32)
        scores = np.empty(n, dtype=np.float32)
        scratch = np.empty(n, dtype=np.int32)
        for h in range(heads):
            kv = h // (heads // kv_heads)
            _rotated_head(qkv[b], h * dim, cos, sin, pos, q_norm, eps, scale, q)
            top = np.float32(-np.inf)
            for j in range(width):  # the shared prompt's keys, then the row's own
                s = np.float32(0.0)
                for i in range(dim):
                    s += q[i] * prefix_k[u, kv, j, i]
                scores[j] = s + prefix_bias[b, j]
            for j in range(length + 1):
                s = np.float32(0.0)
                for i in range(dim):
                    s += q[i] * keys[b, kv, j, i]
                scores[width + j] = s + key_bias[b, j]
            for j in range(n):
                top = max(top, scores[j])
            for j in range(n):
                scores[j] -= top
            _exp_inplace(scores, n, scratch)
            total = np.float32(0.0)
            for j in range(n):
                total += scores[j]
            acc[:] = 0.0
            for j in range(width):
                p = scores[j]
                for i in range(dim):
                    acc[i] += p * prefix_v[u, kv, j, i]
            for j in range(length + 1):
                p = scores[width + j]
                for i in range(dim):
                    acc[i] += p * values[b, kv, j, i]
            inverse = np.float32(1.0) / total
            for i in range(dim):
                out[b, h * dim + i] = acc[i] * inverse
