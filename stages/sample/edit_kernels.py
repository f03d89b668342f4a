"""Compiled edit-distance kernels over integer sequences (numba), scoring pairs given by index.

The fast path of ``edits.code_distances``: sequences are encoded once into one flat ``int32`` array
with ``int64`` offsets (``edits.EditCodes``), and a pair is two row numbers, so scoring touches
no Python object per pair. Each pair strips its common prefix and suffix (they change neither
metric), then runs a bit-parallel kernel with the longer side as the pattern:

- **Levenshtein**: Hyyrö's bit-vector formulation of Myers' algorithm (Hyyrö 2003, "A bit-vector
  algorithm for computing Levenshtein and Damerau edit distances"), one 64-bit word for patterns
  up to 64 symbols, the blockwise variant (carries between words) above;
- **Indel**: the bit-parallel LCS of Allison-Dix / Hyyrö (``S = (S + u) | (S - u)``), blockwise
  with an add-with-carry above 64 symbols; distance = ``len_a + len_b - 2 * LCS``;
- patterns longer than ``BLOCK_MAX`` symbols use the plain O(n*m) dynamic programme over one
  row (such sentences are rare; the match-mask table would otherwise grow as m^2 / 8 bytes).

Match masks are built per pair over local symbol ids, found in a direct table for symbols
below ``DIRECT`` and in a small open-addressing table for the others (any int32 symbol: word
codes or Unicode code points), with generation stamps so that nothing is cleared between pairs.
The per-symbol loops are written out inside ``pair_kernel`` on purpose: a numba call that takes
arrays costs reference-count updates (measured ~25 ns per call here, ten times a bit-parallel
step), and ``inline="always"`` did not remove that cost. The results equal rapidfuzz's ``Levenshtein``/``Indel`` ``distance`` and
``normalized_distance`` exactly (property-tested in tests/stages/sample/test_edit_kernels.py);
normalised values are computed in float64 as rapidfuzz does, then stored as float32.

This module imports numba at import time; ``edits`` imports it lazily and falls back to rapidfuzz
with a warning when numba is missing or fails to compile.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

BLOCK_MAX = 4096  # longest pattern (after affix stripping) scored bit-parallel
DIRECT = 1 << 16  # symbols below this skip the hash table (the BMP; the 65,536 most frequent words)
PREFETCH = 6  # pairs ahead whose candidate sequence is prefetched
_LOCAL_BITS = 13  # a direct-table entry packs (generation << 13) | local id; ids < BLOCK_MAX

_ZERO = np.uint64(0)
_ONE = np.uint64(1)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing multiplier
_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)


@intrinsic
def _prefetch(typingctx, array, index):
    """Hint the CPU to fetch ``array[index]`` into cache (LLVM's prefetch; never faults)."""

    def codegen(context, builder, sig, args):
        array_type = sig.args[0]
        ary = context.make_array(array_type)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(
            context, builder, array_type, ary, [args[1]], wraparound=False
        )
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # read, high temporal locality, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen


@njit(cache=True, nogil=True)
def _popcount(x):
    x = x - ((x >> _ONE) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return np.int64((x * _H01) >> np.uint64(56))


@njit(cache=True, nogil=True)
def _dp(a, a0, m, b, b0, n, indel, row):
    """Plain dynamic programme over one row (patterns beyond BLOCK_MAX)."""
    sub = 2 if indel else 1
    for i in range(m + 1):
        row[i] = i
    for j in range(1, n + 1):
        diag = row[0]
        row[0] = j
        bj = b[b0 + j - 1]
        for i in range(1, m + 1):
            up = row[i]
            best = min(up, row[i - 1]) + 1
            cand = diag + (0 if a[a0 + i - 1] == bj else sub)
            row[i] = min(best, cand)
            diag = up
    return np.int64(row[m])


# One explicit signature: the kernel compiles once, when this module is imported (or loads from
# numba's cache), never inside a scoring call. Inputs are typed read-only, which accepts writable
# arrays too (a safe conversion), whereas a lazily typed kernel would compile a second
# specialisation the first time the sample stage passes read-only row indices from Arrow.
_CODES = types.Array(types.int32, 1, "C", readonly=True)
_ROWS = types.Array(types.int64, 1, "C", readonly=True)
PAIR_KERNEL_SIGNATURE = types.void(
    _CODES,  # codes_a
    _ROWS,  # off_a
    _ROWS,  # idx_a
    _CODES,  # codes_b
    _ROWS,  # off_b
    _ROWS,  # idx_b
    types.boolean,  # indel
    types.boolean,  # normalized
    types.int64,  # max_len
    types.int64,  # threads
    types.Array(types.int32, 1, "C"),  # out_int
    types.Array(types.float32, 1, "C"),  # out_float
)


@njit(PAIR_KERNEL_SIGNATURE, parallel=True, nogil=True, cache=True, error_model="numpy")
def pair_kernel(
    codes_a,
    off_a,
    idx_a,
    codes_b,
    off_b,
    idx_b,
    indel,
    normalized,
    max_len,
    threads,
    out_int,
    out_float,
):
    """Distance of sequence ``idx_a[p]`` of ``(codes_a, off_a)`` to sequence ``idx_b[p]`` of
    ``(codes_b, off_b)`` for every p, written to ``out_float`` (normalised) or ``out_int``.

    ``max_len`` bounds every sequence length (it sizes the per-thread scratch); ``threads`` is
    numba's thread count (the work is cut into up to 2 chunks per thread). Levenshtein
    normalises by ``max(len_a, len_b)``, Indel by ``len_a + len_b``; 0 when that is 0.
    """
    n_pairs = idx_a.size
    # Few chunks: each allocates ~1 MiB of zeroed tables, which small calls would feel.
    n_chunks = min(max(n_pairs // 4096, 1), 2 * threads)
    bound = max(min(max_len, BLOCK_MAX), 1)
    bits = 7
    while (1 << bits) < 2 * bound:
        bits += 1
    words_max = (bound + 63) // 64
    top_bit = np.uint64(63)
    local_mask = (np.int64(1) << _LOCAL_BITS) - 1
    for c in prange(n_chunks):
        lo = c * n_pairs // n_chunks
        hi = (c + 1) * n_pairs // n_chunks
        direct = np.zeros(DIRECT, np.int64)  # packed (generation, local id) per symbol
        maskd = np.zeros(2 * DIRECT, np.uint64)  # match masks by symbol, patterns of <= 2 words
        keys = np.empty(1 << bits, np.int32)  # the hash table: keys, stamps, local ids
        stamp = np.zeros(1 << bits, np.int64)
        local = np.empty(1 << bits, np.int64)
        pm = np.empty(bound * words_max, np.uint64)  # match masks: pm[local id * words + w]
        vp = np.empty(words_max, np.uint64)  # Levenshtein: vertical deltas; Indel: S
        vn = np.empty(words_max, np.uint64)
        row = np.empty(max_len + 1 if max_len > BLOCK_MAX else 1, np.int64)
        gen = np.int64(0)
        for p in range(lo, hi):
            # The candidate side is a random row (pairs come grouped by anchor): ask for it a
            # few pairs ahead, so that its cache miss overlaps this pair's work.
            if p + PREFETCH < hi:
                ahead = off_b[idx_b[p + PREFETCH]]
                _prefetch(codes_b, ahead)
                _prefetch(codes_b, ahead + 16)
            ra = idx_a[p]
            rb = idx_b[p]
            a0 = off_a[ra]
            la = off_a[ra + 1] - a0
            b0 = off_b[rb]
            lb = off_b[rb + 1] - b0
            full_a = la
            full_b = lb
            while la > 0 and lb > 0 and codes_a[a0] == codes_b[b0]:
                a0 += 1
                b0 += 1
                la -= 1
                lb -= 1
            while la > 0 and lb > 0 and codes_a[a0 + la - 1] == codes_b[b0 + lb - 1]:
                la -= 1
                lb -= 1
            # The longer side is the pattern: fewer text steps, as few or fewer words.
            if la >= lb:
                pat, p0, m, txt, t0, n = codes_a, a0, la, codes_b, b0, lb
            else:
                pat, p0, m, txt, t0, n = codes_b, b0, lb, codes_a, a0, la
            if n == 0:
                dist = np.int64(m)
            elif m > BLOCK_MAX:
                dist = _dp(pat, p0, m, txt, t0, n, indel, row)
            else:
                gen += 1
                tbits = 7
                while (1 << tbits) < 2 * m:
                    tbits += 1
                tmask = (np.int64(1) << tbits) - 1
                shift = np.uint64(64 - tbits)
                words = (m + 63) // 64

                # Match masks of the pattern. Up to two words: straight into ``maskd`` by
                # symbol (``maskd[2 * sym + w]``, kept all-zero between pairs) for symbols below
                # DIRECT, over local ids in ``pm`` for the others. More words: over local ids
                # for every symbol (inserted on first sight).
                k = np.int64(0)
                for i in range(m):
                    sym = pat[p0 + i]
                    if words <= 2 and sym < DIRECT:
                        maskd[2 * sym + (i >> 6)] |= _ONE << np.uint64(i & 63)
                        continue
                    if sym < DIRECT:
                        entry = direct[sym]
                        if (entry >> _LOCAL_BITS) == gen:
                            lid = entry & local_mask
                        else:
                            direct[sym] = (gen << _LOCAL_BITS) | k
                            lid = -1
                    else:
                        s = np.int64((np.uint64(sym) * _GOLDEN) >> shift)
                        while stamp[s] == gen and keys[s] != sym:
                            s = (s + 1) & tmask
                        if stamp[s] == gen:
                            lid = local[s]
                        else:
                            stamp[s] = gen
                            keys[s] = sym
                            local[s] = k
                            lid = -1
                    if lid < 0:
                        lid = k
                        for w in range(words):
                            pm[k * words + w] = _ZERO
                        k += 1
                    pm[lid * words + (i >> 6)] |= _ONE << np.uint64(i & 63)

                if words == 1 and not indel:
                    # Hyyrö 2003, one word.
                    vp0 = _ALL
                    vn0 = _ZERO
                    dist = np.int64(m)
                    last = _ONE << np.uint64(m - 1)
                    for j in range(n):
                        sym = txt[t0 + j]
                        x = _ZERO
                        if sym < DIRECT:
                            x = maskd[2 * sym]
                        else:
                            s = np.int64((np.uint64(sym) * _GOLDEN) >> shift)
                            while stamp[s] == gen:
                                if keys[s] == sym:
                                    x = pm[local[s]]
                                    break
                                s = (s + 1) & tmask
                        d0 = (((x & vp0) + vp0) ^ vp0) | x | vn0
                        hp = vn0 | ~(d0 | vp0)
                        hn = d0 & vp0
                        if hp & last:
                            dist += 1
                        if hn & last:
                            dist -= 1
                        hp = (hp << _ONE) | _ONE
                        hn = hn << _ONE
                        vp0 = hn | ~(d0 | hp)
                        vn0 = hp & d0
                elif words == 2 and not indel:
                    # Hyyrö 2003 over two words held in registers (65-128 symbols: most
                    # sentences at character level); the same steps as the blockwise loop below.
                    vp0 = _ALL
                    vn0 = _ZERO
                    vp1 = _ALL
                    vn1 = _ZERO
                    dist = np.int64(m)
                    last = _ONE << np.uint64((m - 1) & 63)
                    for j in range(n):
                        sym = txt[t0 + j]
                        x0 = _ZERO
                        x1 = _ZERO
                        if sym < DIRECT:
                            x0 = maskd[2 * sym]
                            x1 = maskd[2 * sym + 1]
                        else:
                            s = np.int64((np.uint64(sym) * _GOLDEN) >> shift)
                            while stamp[s] == gen:
                                if keys[s] == sym:
                                    x0 = pm[2 * local[s]]
                                    x1 = pm[2 * local[s] + 1]
                                    break
                                s = (s + 1) & tmask
                        d0 = (((x0 & vp0) + vp0) ^ vp0) | x0 | vn0
                        hp = vn0 | ~(d0 | vp0)
                        hn = d0 & vp0
                        hp_carry = hp >> top_bit
                        hn_carry = hn >> top_bit
                        hp = (hp << _ONE) | _ONE
                        hn = hn << _ONE
                        vp0 = hn | ~(d0 | hp)
                        vn0 = hp & d0
                        x1 = x1 | hn_carry
                        d0 = (((x1 & vp1) + vp1) ^ vp1) | x1 | vn1
                        hp = vn1 | ~(d0 | vp1)
                        hn = d0 & vp1
                        if hp & last:
                            dist += 1
                        if hn & last:
                            dist -= 1
                        hp = (hp << _ONE) | hp_carry
                        hn = (hn << _ONE) | hn_carry
                        vp1 = hn | ~(d0 | hp)
                        vn1 = hp & d0
                elif words == 1:
                    # Indel through the bit-parallel LCS, one word.
                    s0 = _ALL
                    for j in range(n):
                        sym = txt[t0 + j]
                        x = _ZERO
                        if sym < DIRECT:
                            x = maskd[2 * sym]
                        else:
                            s = np.int64((np.uint64(sym) * _GOLDEN) >> shift)
                            while stamp[s] == gen:
                                if keys[s] == sym:
                                    x = pm[local[s]]
                                    break
                                s = (s + 1) & tmask
                        u = s0 & x
                        s0 = (s0 + u) | (s0 - u)
                    dist = m + n - 2 * _popcount(~s0)
                elif words == 2:
                    # Indel through the bit-parallel LCS, two words in registers.
                    s0 = _ALL
                    s1 = _ALL
                    for j in range(n):
                        sym = txt[t0 + j]
                        x0 = _ZERO
                        x1 = _ZERO
                        if sym < DIRECT:
                            x0 = maskd[2 * sym]
                            x1 = maskd[2 * sym + 1]
                        else:
                            s = np.int64((np.uint64(sym) * _GOLDEN) >> shift)
                            while stamp[s] == gen:
                                if keys[s] == sym:
                                    x0 = pm[2 * local[s]]
                                    x1 = pm[2 * local[s] + 1]
                                    break
                                s = (s + 1) & tmask
                        u = s0 & x0
                        x = s0 + u
                        carry = _ONE if x < s0 else _ZERO
                        s0 = x | (s0 - u)
                        u = s1 & x1
                        s1 = (s1 + u + carry) | (s1 - u)
                    lcs = _popcount(~s0) + _popcount(~s1)
                    dist = m + n - 2 * lcs
                else:
                    for w in range(words):
                        vp[w] = _ALL
                        vn[w] = _ZERO
                    dist = np.int64(m)
                    last = _ONE << np.uint64((m - 1) & 63)
                    for j in range(n):
                        sym = txt[t0 + j]
                        lid = -1
                        if sym < DIRECT:
                            entry = direct[sym]
                            if (entry >> _LOCAL_BITS) == gen:
                                lid = entry & local_mask
                        else:
                            s = np.int64((np.uint64(sym) * _GOLDEN) >> shift)
                            while stamp[s] == gen:
                                if keys[s] == sym:
                                    lid = local[s]
                                    break
                                s = (s + 1) & tmask
                        base = lid * words
                        if indel:
                            # Bit-parallel LCS, an add-with-carry between words.
                            if lid < 0:
                                continue  # no match: S is unchanged
                            carry = _ZERO
                            for w in range(words):
                                sw = vp[w]
                                u = sw & pm[base + w]
                                t = sw + u
                                c1 = _ONE if t < sw else _ZERO
                                x = t + carry
                                c2 = _ONE if x < t else _ZERO
                                carry = c1 | c2
                                vp[w] = x | (sw - u)
                        else:
                            # Hyyrö 2003, blockwise: horizontal deltas carry between words.
                            hp_carry = _ONE
                            hn_carry = _ZERO
                            for w in range(words):
                                x = (pm[base + w] if lid >= 0 else _ZERO) | hn_carry
                                vpw = vp[w]
                                vnw = vn[w]
                                d0 = (((x & vpw) + vpw) ^ vpw) | x | vnw
                                hp = vnw | ~(d0 | vpw)
                                hn = d0 & vpw
                                if w < words - 1:
                                    hp_out = hp >> top_bit
                                    hn_out = hn >> top_bit
                                else:
                                    hp_out = _ONE if hp & last else _ZERO
                                    hn_out = _ONE if hn & last else _ZERO
                                hp = (hp << _ONE) | hp_carry
                                hn = (hn << _ONE) | hn_carry
                                hp_carry = hp_out
                                hn_carry = hn_out
                                vp[w] = hn | ~(d0 | hp)
                                vn[w] = hp & d0
                            dist += np.int64(hp_carry) - np.int64(hn_carry)
                    if indel:
                        lcs = np.int64(0)
                        for w in range(words):
                            lcs += _popcount(~vp[w])
                        dist = m + n - 2 * lcs
                if words <= 2:
                    for i in range(m):  # back to all-zero for the next pair
                        sym = pat[p0 + i]
                        if sym < DIRECT:
                            maskd[2 * sym] = _ZERO
                            maskd[2 * sym + 1] = _ZERO
            if normalized:
                top = full_a + full_b if indel else max(full_a, full_b)
                out_float[p] = np.float32(dist / top) if top > 0 else np.float32(0.0)
            else:
                out_int[p] = np.int32(dist)
