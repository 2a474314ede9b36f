// Lightning indexer scores (spec 5.3) on cooperative matrices (16x16x16 f16 -> f32), K3.1 shape
// only (32 heads x 128): the same contract as index_scores in indexer.wgsl (its SIMT twin),
//   I[t, s] = w_scale * sum_j w[t, j] * relu(q[t, j] . k[s])      for s <= q_pos0 + t, else -inf.
//
// Workgroups of 4 subgroups of 32 (the host runs this only where the subgroup size is 32) per
// query t (workgroup_id.y), grid-strided over tiles of TILE = 64 positions:
//   C[32 heads, 64 positions] = Q[32, 128] K^T[128, 64]
// Subgroup w owns positions 16 w .. +15 of the tile and all 32 heads: two accumulator chains (heads
// 0-15 and 16-31) share each key fragment, and its 32 A fragments (q for both head halves, hi and
// lo) stay in registers for the whole kernel (~250 registers: two such 128-thread workgroups fit
// an H200 SM and hide each other's barriers and load waits, 8-12 % faster than one of 256
// threads on 128-position tiles). Keys are loaded as bf16 (the next tile's eight
// loads per thread issued under one branch before this tile is multiplied; one branch per load
// made each wait for the one before), converted to f16
// into workgroup memory (rows padded to 272 bytes: conflict-free fragment loads), one key per
// column of B. The accumulators go through the subgroup's own slice of workgroup memory (ordered by
// subgroup barriers), one head half at a time, to the ReLU and head-weight sum (two lanes per
// position, joined by a shuffle).
// QSPLIT: q = hi + lo with both parts f16, two products per fragment; without it q is rounded to
// f16 (about 5e-4 relative per head dot), or with EXACT masked to its top 11 significant bits,
// which is exact for q read in bf16 (p.q_bf16: the host's bf16 precision variant).
// EXACT (with QSPLIT): f32 agreement (5e-7 of the largest score on the H200): q scaled per head by
// a power of two and split by masking (lo = f16(x - f32(f16(x))) would be folded to zero by the
// driver), keys scaled by KEY_SCALE into the exact f16 range, positions with a key beyond it
// recomputed in f32.

enable f16;
enable wgpu_cooperative_matrix;

#include "lib/index_params.wgsl"

override QSPLIT: bool = true;
override EXACT: bool = true;
override KEY_SCALE: f32 = 1024.0;
const IH: u32 = 32u;
const ID: u32 = 128u;
const TILE: u32 = 64u;
const WG: u32 = 128u;
const KV4: u32 = 32u;   // vec4<f16> per key row
const KS4: u32 = 34u;   // row stride of staged keys and q in workgroup memory (vec4<f16>)
const CS4: u32 = 5u;    // vec4 stride between positions of a stored accumulator tile (conflict-free vec4 reads)
const LOADS: u32 = 8u;  // vec4<u32> (8 bf16) key loads per thread per tile: TILE * 16 / WG
const ROWS: u32 = 8u;  // tile rows one load step covers: WG / 16

@group(0) @binding(0) var<uniform> p: IndexParams;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
#include "lib/index_keys.wgsl"
#include "lib/index_query.wgsl"

var<workgroup> kt: array<vec4<f16>, 2176>;  // TILE keys x KS4 (also q's staging before the loop)
var<workgroup> cs: array<vec4<f32>, 320>;   // per subgroup a 16 x 16 tile, positions CS4 apart
var<workgroup> ws: array<f32, 32>;
var<workgroup> wh: array<f32, 32>;          // weights with the q and key scales undone
var<workgroup> qs: array<f32, 32>;          // per-head power-of-two scale of q (EXACT)
var<workgroup> qmb: array<atomic<u32>, 32>; // per head: max |q| as f32 bits
var<workgroup> bad: array<u32, 64>;        // per tile position: key beyond the exact range

#include "lib/page_locate.wgsl"
#include "lib/index_coop_keys.wgsl"

// This thread's loads of the tile at s0: 16-byte chunk lid % 16 of rows s0 + lid / 16 + 16 j.
// One branch when they share a page (always, for pages of 128 rows or more), else one by one.
fn load_tile(s0: u32, lid: u32) -> array<vec4<u32>, LOADS> {
    let pos = s0 + lid / 16u;
    let at = locate(pos);
    if (pos + (LOADS - 1u) * ROWS < p.n_pos && locate(pos + (LOADS - 1u) * ROWS).x == at.x) {
        return key_vec8(at.x, at.y * 16u + lid % 16u, ROWS * 16u);
    }
    // (Spelled out: a dynamically indexed private array goes to local memory on this driver.)
    return array<vec4<u32>, LOADS>(
        key_row(pos, lid), key_row(pos + ROWS, lid), key_row(pos + 2u * ROWS, lid), key_row(pos + 3u * ROWS, lid),
        key_row(pos + 4u * ROWS, lid), key_row(pos + 5u * ROWS, lid), key_row(pos + 6u * ROWS, lid), key_row(pos + 7u * ROWS, lid),
    );
}

// q (scaled per head) into kt rows 0..31: its hi part, or with lo its residual.
fn stage_q(t: u32, lid: u32, lo: bool) {
    for (var i = lid; i < IH * ID / 4u; i += WG) {
        let x = query4(t * (IH * ID / 4u) + i) * qs[i / KV4];
        var h: vec4<f32>;
        if (EXACT) {
            // hi = top 11 significant bits (exact in f16, not foldable), lo = x - hi exact in f32.
            h = bitcast<vec4<f32>>(bitcast<vec4<u32>>(x) & vec4<u32>(0xffffe000u));
        } else {
            h = vec4<f32>(vec4<f16>(x));
        }
        kt[(i / KV4) * KS4 + i % KV4] = vec4<f16>(select(h, x - h, lo));
    }
}

// A fragment of q staged in kt: heads 16 mt .. +15, dims 16 kk .. +15.
fn a_frag(mt: u32, kk: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&kt[mt * 16u * KS4 + kk * 4u], KS4);
}

// B fragment: dims 16 kk .. +15 (rows) of the subgroup's 16 positions (columns).
fn b_frag(sg: u32, kk: u32) -> coop_mat16x16<f16, B> {
    return coopLoad<coop_mat16x16<f16, B>>(&kt[sg * 16u * KS4 + kk * 4u], KS4);
}

// ReLU and head weights of one head half (16 heads) of this lane's position, from cs: eight
// heads per lane (the scales are powers of two, so weight x scale x ReLU(c) is weight x ReLU(c x
// scale) exactly).
fn head_half(sg: u32, lane: u32, mt: u32) -> f32 {
    let at = sg * 16u * CS4 + (lane % 16u) * CS4 + (lane / 16u) * 2u;
    let h0 = mt * 16u + (lane / 16u) * 8u;
    let x0 = max(cs[at], vec4<f32>(0.0)) * vec4<f32>(wh[h0], wh[h0 + 1u], wh[h0 + 2u], wh[h0 + 3u]);
    let x1 = max(cs[at + 1u], vec4<f32>(0.0)) * vec4<f32>(wh[h0 + 4u], wh[h0 + 5u], wh[h0 + 6u], wh[h0 + 7u]);
    return ((x0.x + x0.y) + (x0.z + x0.w)) + ((x1.x + x1.y) + (x1.z + x1.w));
}

@compute @workgroup_size(128)
fn index_scores_coop(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let t = wg.y;
    if (lid < IH) {
        atomicStore(&qmb[lid], 0u);
    }
    if (lid < TILE) {
        bad[lid] = 0u;
    }
    workgroupBarrier();
    if (EXACT) {
        for (var i = lid; i < IH * ID / 4u; i += WG) {
            let a = abs(query4(t * (IH * ID / 4u) + i));
            atomicMax(&qmb[i / KV4], bitcast<u32>(max(max(a.x, a.y), max(a.z, a.w))));
        }
    }
    workgroupBarrier();
    if (lid < IH) {
        // Largest |q| of the head into [2^13, 2^14); undone (with the key scale) before the ReLU.
        let m = bitcast<f32>(atomicLoad(&qmb[lid]));
        var e = 0i;
        if (EXACT && m > 0.0) {
            e = clamp(13i - (i32((bitcast<u32>(m) >> 23u) & 0xffu) - 127i), -100i, 100i);
        }
        let wt = raw_weight(t * IH + lid) * p.w_scale;
        ws[lid] = wt;
        qs[lid] = ldexp(1.0, e);
        wh[lid] = wt * select(1.0, ldexp(1.0, -e) / KEY_SCALE, EXACT);
    }
    workgroupBarrier();
    stage_q(t, lid, false);
    workgroupBarrier();
    let h00 = a_frag(0u, 0u);
    let h01 = a_frag(0u, 1u);
    let h02 = a_frag(0u, 2u);
    let h03 = a_frag(0u, 3u);
    let h04 = a_frag(0u, 4u);
    let h05 = a_frag(0u, 5u);
    let h06 = a_frag(0u, 6u);
    let h07 = a_frag(0u, 7u);
    let h10 = a_frag(1u, 0u);
    let h11 = a_frag(1u, 1u);
    let h12 = a_frag(1u, 2u);
    let h13 = a_frag(1u, 3u);
    let h14 = a_frag(1u, 4u);
    let h15 = a_frag(1u, 5u);
    let h16 = a_frag(1u, 6u);
    let h17 = a_frag(1u, 7u);
    workgroupBarrier();
    stage_q(t, lid, true);
    workgroupBarrier();
    let l00 = a_frag(0u, 0u);
    let l01 = a_frag(0u, 1u);
    let l02 = a_frag(0u, 2u);
    let l03 = a_frag(0u, 3u);
    let l04 = a_frag(0u, 4u);
    let l05 = a_frag(0u, 5u);
    let l06 = a_frag(0u, 6u);
    let l07 = a_frag(0u, 7u);
    let l10 = a_frag(1u, 0u);
    let l11 = a_frag(1u, 1u);
    let l12 = a_frag(1u, 2u);
    let l13 = a_frag(1u, 3u);
    let l14 = a_frag(1u, 4u);
    let l15 = a_frag(1u, 5u);
    let l16 = a_frag(1u, 6u);
    let l17 = a_frag(1u, 7u);
    let tiles = (p.n_pos + TILE - 1u) / TILE;
    let last = p.q_pos0 + t;
    var tile = wg.x;
    var kv: array<vec4<u32>, LOADS>;
    if (tile < tiles) {
        kv = load_tile(tile * TILE, lid);
    }
    while (tile < tiles) {
        let s0 = tile * TILE;
        workgroupBarrier(); // the previous tile's keys and accumulators are consumed
        stage_keys(kv[0], 0u, lid);
        stage_keys(kv[1], 1u, lid);
        stage_keys(kv[2], 2u, lid);
        stage_keys(kv[3], 3u, lid);
        stage_keys(kv[4], 4u, lid);
        stage_keys(kv[5], 5u, lid);
        stage_keys(kv[6], 6u, lid);
        stage_keys(kv[7], 7u, lid);
        let next = tile + nwg.x;
        if (next < tiles) {
            kv = load_tile(next * TILE, lid);
        }
        workgroupBarrier();
        var c0 = coop_mat16x16<f32, C>();
        var c1 = coop_mat16x16<f32, C>();
        var b = b_frag(sg, 0u);
        c0 = coopMultiplyAdd(h00, b, c0);
        c1 = coopMultiplyAdd(h10, b, c1);
        if (QSPLIT) { c0 = coopMultiplyAdd(l00, b, c0); c1 = coopMultiplyAdd(l10, b, c1); }
        b = b_frag(sg, 1u);
        c0 = coopMultiplyAdd(h01, b, c0);
        c1 = coopMultiplyAdd(h11, b, c1);
        if (QSPLIT) { c0 = coopMultiplyAdd(l01, b, c0); c1 = coopMultiplyAdd(l11, b, c1); }
        b = b_frag(sg, 2u);
        c0 = coopMultiplyAdd(h02, b, c0);
        c1 = coopMultiplyAdd(h12, b, c1);
        if (QSPLIT) { c0 = coopMultiplyAdd(l02, b, c0); c1 = coopMultiplyAdd(l12, b, c1); }
        b = b_frag(sg, 3u);
        c0 = coopMultiplyAdd(h03, b, c0);
        c1 = coopMultiplyAdd(h13, b, c1);
        if (QSPLIT) { c0 = coopMultiplyAdd(l03, b, c0); c1 = coopMultiplyAdd(l13, b, c1); }
        b = b_frag(sg, 4u);
        c0 = coopMultiplyAdd(h04, b, c0);
        c1 = coopMultiplyAdd(h14, b, c1);
        if (QSPLIT) { c0 = coopMultiplyAdd(l04, b, c0); c1 = coopMultiplyAdd(l14, b, c1); }
        b = b_frag(sg, 5u);
        c0 = coopMultiplyAdd(h05, b, c0);
        c1 = coopMultiplyAdd(h15, b, c1);
        if (QSPLIT) { c0 = coopMultiplyAdd(l05, b, c0); c1 = coopMultiplyAdd(l15, b, c1); }
        b = b_frag(sg, 6u);
        c0 = coopMultiplyAdd(h06, b, c0);
        c1 = coopMultiplyAdd(h16, b, c1);
        if (QSPLIT) { c0 = coopMultiplyAdd(l06, b, c0); c1 = coopMultiplyAdd(l16, b, c1); }
        b = b_frag(sg, 7u);
        c0 = coopMultiplyAdd(h07, b, c0);
        c1 = coopMultiplyAdd(h17, b, c1);
        if (QSPLIT) { c0 = coopMultiplyAdd(l07, b, c0); c1 = coopMultiplyAdd(l17, b, c1); }
        // Only this subgroup reads its tile: subgroup barriers order the stores and reads.
        coopStore(c0, &cs[sg * 16u * CS4], CS4);
        subgroupBarrier();
        var sum = head_half(sg, lane, 0u);
        subgroupBarrier();
        coopStore(c1, &cs[sg * 16u * CS4], CS4);
        subgroupBarrier();
        sum += head_half(sg, lane, 1u);
        sum += subgroupShuffleXor(sum, 16u);
        let row = sg * 16u + lane;
        let pos = s0 + row;
        if (lane < 16u && pos < p.n_pos) {
            var v = sum;
            if (pos > last) {
                v = bitcast<f32>(0xff800000u);
            } else if (EXACT && bad[row] != 0u) {
                v = exact_score(0u, t, pos);
            }
            scores[t * p.row_stride + pos] = v;
        }
        if (lane < 16u) {
            bad[row] = 0u;
        }
        tile = next;
    }
}
