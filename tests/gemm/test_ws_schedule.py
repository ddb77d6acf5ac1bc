"""The copy schedule of the warp-specialised TMA kernels (raw_kernels/gemm/grouped_gemm_ws.cuh,
``_kk_y`` NVFP4; raw_kernels/gemm/grouped_gemm_ws_mx.cuh, ``_kk_y`` / ``_kn_y`` MXFP8), emulated on
the CPU for every contraction length up to 40 scale groups.

One producer thread refills raw stages (data of one k-tile) and scale slots (block scales of
SGT k-tiles) at the top of each k-tile iteration, after the EMPTY barrier that says the
consumers retired tile kt - NCB. The emulation checks, for the constants the kernels use (read
from the Python mirrors, which tests/gemm/test_gemm_plan.py checks against the sources) and for the
issue rules written in the sources:

* a refill never overwrites a stage or slot whose tiles are not all retired;
* every tile's data and every scale group is requested exactly once, before any producer or
  consumer reads it, and stays until the consumers retired it;
* MXFP8, whose B tiles have a ring of their own (kWmxBStages = kWmxAhead + 1, refilled once
  every producer has widened the stage's tile, iteration kt - 1): a B stage holds its tile
  while the producers widen it. Also with the persistent MXFP8 kernels' constants
  (raw_kernels/gemm/grouped_gemm_ws_mx_persist.cuh: copies kWmxPAhead ahead, B's ring one stage
  more, A's ring of kWmxAStages).
"""

from __future__ import annotations

import pytest

from conftest import assert_source_has

from conftest import gemm_internals
C = gemm_internals()


def _nvfp4_group(kt, sgt, nsg, ncb, ng):
    """grouped_gemm_ws_fp4.cuh (ws_fp4_produce): group (kt + 6) / SGT when kt % SGT == 2."""
    if kt % sgt == 2 and (kt + 6) // sgt < ng:
        return (kt + 6) // sgt
    return None


def _mxfp8_group(kt, sgt, nsg, ncb, ng):
    """grouped_gemm_ws_mx.cuh: q = kt - NCB + 1; group q / SGT + NSG - 1 when SGT divides q > 0."""
    q = kt - ncb + 1
    if q > 0 and q % sgt == 0 and q // sgt + nsg - 1 < ng:
        return q // sgt + nsg - 1
    return None


def _emulate(kt_count, ahead, ncb, sgt, nsg, prologue_groups, rule, b_stages=None,
             a_stages=None):
    nst = ahead + ncb if a_stages is None else a_stages
    ng = -(-kt_count // sgt)
    stage, slot, issued, b_stage = {}, {}, set(), {}

    def issue_data(t, retired):
        st = t % nst
        prev = stage.get(st)
        assert prev is None or prev <= retired, (kt_count, t, prev, retired)
        stage[st] = t
        if b_stages is not None:  # B's ring: free once its tile is widened (iteration t-ahead-1)
            prev = b_stage.get(t % b_stages)
            assert prev is None or prev <= t - ahead - 1, (kt_count, t, prev)
            b_stage[t % b_stages] = t

    def issue_group(g, retired, when):
        assert g not in issued, (kt_count, g)
        sl = g % nsg
        prev = slot.get(sl)
        assert prev is None or sgt * (prev + 1) - 1 <= retired, (kt_count, g, prev, retired)
        slot[sl] = g
        issued.add(g)

    for s in range(min(ahead, kt_count)):
        issue_data(s, -1)
    for g in range(min(prologue_groups, ng)):
        issue_group(g, -1, -1)
    for kt in range(kt_count):
        retired = kt - ncb  # the EMPTY barrier of this iteration (tiles retire in order)
        if kt + ahead < kt_count:
            issue_data(kt + ahead, retired)
        g = rule(kt, sgt, nsg, ncb, ng)
        if g is not None:
            issue_group(g, retired, kt)
        # tiles the consumers may still read (not retired), and the one the producers widen now
        for t in range(max(0, retired + 1), kt + 1):
            assert stage[t % nst] == t, (kt_count, kt, t)
            assert slot.get((t // sgt) % nsg) == t // sgt, (kt_count, kt, t)
        if b_stages is not None:
            assert b_stage[kt % b_stages] == kt, (kt_count, kt)
    assert issued == set(range(ng)), (kt_count, issued)


@pytest.mark.parametrize("kernel", ["nvfp4", "mxfp8", "mxfp8-persistent"])
def test_ws_tma_copy_schedule(kernel):
    if kernel == "nvfp4":
        # the rule of ws_fp4_produce, whose k-tile index runs over one tile (gemm_ws) or over
        # all of a persistent CTA's tiles (gemm_ws_p): the same schedule, a longer sequence
        assert_source_has("grouped_gemm_ws_fp4.cuh",
                           "if (j % SGT == 2 && (j + 6) / SGT < NG) issue_scales((j + 6) / SGT);")
        assert_source_has("grouped_gemm_ws_fp4.cuh",
                           "for (int g = 0; g < 2 && g < NG; ++g) issue_scales(g);")
        # ... which gemm_ws_n256's producers run too, on its 384-thread barriers
        assert_source_has("grouped_gemm_ws_fp4.cuh",
                           "if (j >= NCB) named_sync(WS_BAR_EMPTY + cb, NT);",
                           "named_arrive(WS_BAR_FULL + cb, NT);")
        assert_source_has("grouped_gemm_ws_n256.cuh", "ws_fp4_produce<kWnThreads>(")
        params = (C.WS_AHEAD, C.WS_CANON_BUFFERS, C.WS_SCALE_TILES, C.WS_SCALE_SLOTS, 2,
                  _nvfp4_group, None)
    else:
        assert_source_has("grouped_gemm_ws_mx_produce.cuh",
                           "if (q > 0 && q % SGT == 0 && q / SGT + NSG - 1 < NG)")
        assert_source_has("grouped_gemm_ws_mx.cuh",
                           "for (int g = 0; g < NSG && g < NG; ++g) issue_scales(g);")
        # B's stage for tile kt + AHEAD is refilled after a barrier of every producer (EMPTY,
        # or before the first EMPTY their own): they have all widened tile kt - 1
        assert_source_has("grouped_gemm_ws_mx_produce.cuh", "} else if (j + AHEAD >= NSB) {")
        params = (C.WMX_AHEAD, C.WMX_CANON_BUFFERS, C.WMX_SCALE_TILES, C.WMX_SCALE_SLOTS,
                  C.WMX_SCALE_SLOTS, _mxfp8_group, C.WMX_B_STAGES)
        if kernel == "mxfp8-persistent":
            # gemm_ws_mx_p / _g (its k-tile sequence runs over the CTA's tiles): copies
            # WMX_P_AHEAD ahead, B's ring one stage more, A's ring as the per-tile kernel's
            assert_source_has("grouped_gemm_ws_mx_persist.cuh",
                               "using L = WmxLayout<AMN, BMN, kWmxPAhead>;")
            assert_source_has("grouped_gemm_ws_mx_produce.cuh",
                               "static constexpr int AHEAD = AHEAD_, NSA = kWmxAStages, "
                               "NSB = AHEAD_ + 1;")
            params = (C.WMX_P_AHEAD,) + params[1:-1] + (C.WMX_P_AHEAD + 1,)
    ahead, ncb, sgt, nsg, pro, rule, b_stages = params
    a_stages = C.WMX_A_STAGES if kernel.startswith("mxfp8") else None
    for kt_count in range(1, 40 * sgt + 1):
        _emulate(kt_count, ahead, ncb, sgt, nsg, pro, rule, b_stages=b_stages,
                 a_stages=a_stages)


def test_emulation_catches_a_late_slot():
    """The emulation fails a schedule that refills a scale slot one tile too early."""
    def early(kt, sgt, nsg, ncb, ng):
        return _mxfp8_group(kt + 1, sgt, nsg, ncb, ng)

    with pytest.raises(AssertionError):
        for kt_count in range(1, 10 * C.WMX_SCALE_TILES):
            _emulate(kt_count, C.WMX_AHEAD, C.WMX_CANON_BUFFERS, C.WMX_SCALE_TILES,
                     C.WMX_SCALE_SLOTS, C.WMX_SCALE_SLOTS, early)


def test_emulation_catches_a_short_b_ring():
    """The emulation fails a B ring of kWmxAhead stages (the refill of tile kt + AHEAD would
    overwrite tile kt, which the producers widen in this iteration)."""
    with pytest.raises(AssertionError):
        for kt_count in range(1, 4 * C.WMX_SCALE_TILES):
            _emulate(kt_count, C.WMX_AHEAD, C.WMX_CANON_BUFFERS, C.WMX_SCALE_TILES,
                     C.WMX_SCALE_SLOTS, C.WMX_SCALE_SLOTS, _mxfp8_group, b_stages=C.WMX_AHEAD)


def test_ws_ring_period_constants():
    """ws_fp4_consume_period (grouped_gemm_ws_fp4.cuh) replaces the ring indices of k-tile
    j = k0 + u (k0 a multiple of kWsRingPeriod) by constants of u and one phase bit of k0: they
    must equal the divided-out indices of ws_fp4_consume_ktile for every k-tile."""
    assert_source_has("grouped_gemm_ws_fp4.cuh",
                      "constexpr int kWsRingPeriod = 12;",
                      "const unsigned ph_s = static_cast<unsigned>(k0 / P) & 1u;",
                      "const int cb = u % NCB, st = u % NST, sl = u / SGT;",
                      "mbar_wait(dbar + 8 * st, static_cast<unsigned>((u / NST) & 1));",
                      "sl * L::T_SLOT + (u % SGT) * 4 + me.s_off,",
                      "kt > kfirst && kt - 1 + NCB < J, (u + NCB - 1) % NCB,",
                      "ws_fp4_consume_span<NACC, NT, N256>(accf, k0, k0, 0, KT, KT, s0, dbar,")
    ncb, nst, nsg, sgt, period = 3, 6, 3, 4, 12
    assert (C.WS_CANON_BUFFERS, C.WS_SCALE_SLOTS, C.WS_SCALE_TILES) == (ncb, nsg, sgt)
    assert C.WS_AHEAD + C.WS_CANON_BUFFERS == nst
    for j in range(10 * period):
        k0, u = j - j % period, j % period
        g = j // sgt
        assert u % ncb == j % ncb
        assert u % nst == j % nst and (u // nst) & 1 == (j // nst) & 1
        assert u // sgt == g % nsg and (k0 // period) & 1 == (g // nsg) & 1
        assert u % sgt == j % sgt
        assert (u + ncb - 1) % ncb == (j + ncb - 1) % ncb


@pytest.mark.parametrize("kt_per_tile", [4, 8, 12, 16, 20, 32])
def test_ws_n256_persistent_spans(kt_per_tile):
    """The persistent 384-thread form (gemm_ws_p, grouped_gemm_ws_persist.cuh) runs
    each tile's k-tiles kfirst .. kend - 1 of the flattened sequence in spans of the ring
    period (k0 = j - j % P; the span's k-tiles kbeg = j <= kt < min(k0 + P, kend), bounds
    checked once per scale group of 4 k-tiles, which the tiles' whole scale groups allow):
    emulated here, every k-tile comes once and in order, and the span's release rule
    (kt > kfirst and kt - 1 + NCB < J) equals the per-k-tile rule of the one-tile-per-CTA form
    (k-tile kt_in_tile >= 1 and j - 1 + NCB < J)."""
    assert_source_has("grouped_gemm_ws_persist.cuh",
                      "const int kfirst = j, kend = j + KT;",
                      "const int k0 = j - j % P;",
                      "ph_s = static_cast<unsigned>(k0 / P) & 1u;",
                      "ws_fp4_consume_span<NI * 4, kWnThreads, true, true>(",
                      "accf, k0, j, kfirst, kend, J, s0, dbar, sbar, me, aq, next_unit);",
                      "j = k0 + P < kend ? k0 + P : kend;",
                      "if (s == 1 && kt + 1 < J) "
                      "ws_n256_consumer_unit(u + 1, ph_s, dbar, sbar, nu);",
                      "if (j - 1 + NCB < J) named_arrive(WS_BAR_EMPTY + (j - 1) % NCB, NT);")
    assert_source_has("grouped_gemm_ws_fp4.cuh",
                      "if (k0 + q * SGT < kbeg) continue;",
                      "if (k0 + q * SGT >= kend) break;",
                      "for (int v = 0; v < SGT; ++v) ktile(q * SGT + v);")
    ncb, sgt, period, tiles = 3, 4, 12, 7
    # (the parametrized lengths are whole scale groups: _persist's condition)
    total = tiles * kt_per_tile
    seen, released = [], []
    j = 0
    for _ in range(tiles):
        kfirst, kend = j, j + kt_per_tile
        while j < kend:
            k0 = j - j % period
            for q in range(period // sgt):
                if k0 + q * sgt < j:
                    continue
                if k0 + q * sgt >= kend:
                    break
                for v in range(sgt):
                    kt = k0 + q * sgt + v
                    seen.append(kt)
                    released.append(kt > kfirst and kt - 1 + ncb < total)
            j = min(k0 + period, kend)
    assert seen == list(range(total))
    assert released == [(jj % kt_per_tile) >= 1 and jj - 1 + ncb < total for jj in range(total)]


def test_ws_a_row_matches_consumer_rows():
    """Consumer thread c reads its A row from one WsARow, whose row formula is the consumers'
    rows (the epilogue's too); over the 256 consumer threads each (ar, quad) pair comes once,
    and rows ar and ar + 8 together cover the 128-row tile exactly."""
    assert_source_has("grouped_gemm_ws_fp4.cuh",
                      "const unsigned ar = 64 * (warp >> 2) + 16 * (warp & 3) + (lane >> 2);",
                      "[&](int s) { khook(u, kt, s); });")
    assert_source_has("grouped_gemm_ws_n256.cuh",
                      "const int wm0 = 64 * (warp >> 2) + 16 * (warp & 3);",
                      "const WsARow me(threadIdx.x);")
    assert_source_has("grouped_gemm_ws_persist.cuh",
                      "const int wm0 = 64 * (warp >> 2) + 16 * (warp & 3);",
                      "const WsARow me(threadIdx.x);")
    pairs, covered = set(), set()
    for c in range(256):
        warp, lane = c >> 5, c & 31
        ar = 64 * (warp >> 2) + 16 * (warp & 3) + (lane >> 2)
        pairs.add((ar, lane & 3))
        covered |= {ar, ar + 8}
    assert len(pairs) == 256
    assert covered == set(range(128))


def test_ws_n256_b_units_cover_the_tile_once():
    """gemm_ws_n256 splits each k-tile's 512 B units (256 rows x 2 contraction halves) between
    its 128 producer threads (WsFp4Units: rows t / 2 and t / 2 + 128, half t % 2) and its 256
    consumer threads (WsNextUnit: one unit of rows 64-127 and 192-255): every unit exactly
    once, so no canonical chunk is left stale or written twice."""
    assert_source_has("grouped_gemm_ws_n256.cuh",
                      "constexpr int kWnProducers = 128;",
                      "row = 64 + static_cast<int>(c >> 1) + (c >= 128 ? 64 : 0);",
                      "const int h = static_cast<int>(c) & 1;",
                      "s0 + L::T_DA + static_cast<unsigned>(row * (kBK / 2) + h * 16),",
                      "s0 + L::T_SC + L::T_SB + static_cast<unsigned>(row * L::T_SLD + h * 2),",
                      "s0 + L::T_CANON + static_cast<unsigned>(k_canon_off(row, 4 * h)), 0u);",
                      "ws_fp4_produce<kWnThreads>(")
    # the producers' units (ws_fp4_produce: rows ur, ur + 128) and offsets, the same formulas
    # for row ur and half uh
    assert_source_has("grouped_gemm_ws_fp4.cuh",
                      "u.ur < cols, u.ur + 128 < cols);",
                      "o_raw = static_cast<unsigned>(ur * (kBK / 2) + uh * 16);",
                      "o_sc = static_cast<unsigned>(ur * WsTmaLayout::T_SLD + uh * 2);",
                      "o_cn[jc] = static_cast<unsigned>(k_canon_off(ur, 4 * uh + jc));")
    assert_source_has("grouped_gemm_ws_fp4.cuh",
                      "ur = static_cast<int>(t) >> 1;",
                      "const int uh = static_cast<int>(t) & 1;")
    units = []
    for t in range(128):
        units += [(t >> 1, t & 1), ((t >> 1) + 128, t & 1)]
    for c in range(256):
        units.append((64 + (c >> 1) + (64 if c >= 128 else 0), c & 1))
    assert sorted(units) == [(r, h) for r in range(256) for h in range(2)]
