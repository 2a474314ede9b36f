// Lightning indexer scores for a block of queries (prefill) on cooperative matrices: the
// contract of index_scores (indexer.wgsl) and the f32-exact scheme of dsa_index_coop.wgsl (q
// scaled per head by a power of two and split hi + lo by masking, keys scaled by KEY_SCALE into
// f16's exact range, positions with a key beyond it recomputed in f32), K3.1 shape only (32
// heads x 128), 32-wide subgroups. The one-query kernel stages and converts every key tile once
// per query; here one workgroup serves QB = 8 queries, subgroup i query 8 wg.y + i with all its
// heads, so each staged tile feeds eight queries' products.
//
// Per workgroup, grid-strided over tiles of TILE = 64 positions: each subgroup's q fragments (two
// head halves x eight 16-dim slices, hi and lo) stay in registers; a tile's keys are loaded as
// bf16 (the next tile's four loads per thread issued before this tile is multiplied) and
// converted to f16 into workgroup memory; per 16-position block each subgroup multiplies both
// head halves of its query and stores the two accumulators to its own slice of workgroup memory,
// where its lanes take the ReLU and head-weight sum (two lanes per position, joined by a
// shuffle). Between key tiles only subgroup barriers order those stores and reads, so the
// subgroups' products and epilogues overlap (workgroup barriers there: 16-19 % slower on the H200).
// QSPLIT off: one product per fragment, exact for q read in bf16 (p.q_bf16).

enable f16;
enable wgpu_cooperative_matrix;

#include "lib/index_params.wgsl"

override QSPLIT: bool = true;
override KEY_SCALE: f32 = 1024.0;
const EXACT: bool = true;
const IH: u32 = 32u;
const ID: u32 = 128u;
const QB: u32 = 8u;     // queries per workgroup: one per subgroup
const TILE: u32 = 64u;  // positions per staged tile
const WG: u32 = 256u;
const KV4: u32 = 32u;   // vec4 per key row or q head
const KS4: u32 = 34u;   // row stride of staged keys (vec4<f16>): conflict-free fragment loads
const CS4: u32 = 5u;    // vec4 stride between positions of a stored accumulator tile (conflict-free vec4 reads)
const LOADS: u32 = 4u;  // vec4<u32> (8 bf16) key loads per thread per tile: TILE * 16 / WG
const ROWS: u32 = 16u;  // tile rows one load step covers: WG / 16

@group(0) @binding(0) var<uniform> p: IndexParams;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
#include "lib/index_keys.wgsl"
#include "lib/index_query.wgsl"

// TILE keys x KS4; before the loop, one 16-dim slice of every query's q: [query, hi/lo, head] x 4.
var<workgroup> kt: array<vec4<f16>, 2176>;
var<workgroup> cs: array<vec4<f32>, 1280>;  // per subgroup two 16 x 16 tiles (head halves), positions CS4 apart
var<workgroup> ws: array<f32, 256>;         // [query, head]: weight x w_scale
var<workgroup> wh: array<f32, 256>;         // [query, head]: weight with the q and key scales undone
var<workgroup> qs: array<f32, 256>;         // [query, head]: q's power-of-two scale
var<workgroup> qmb: array<atomic<u32>, 256>; // [query, head]: max |q| as f32 bits
var<workgroup> bad: array<u32, 64>;          // per tile position: key beyond the exact range

#include "lib/page_locate.wgsl"
#include "lib/index_coop_keys.wgsl"

// This thread's loads of the tile at s0: chunk lid % 16 of rows s0 + lid / 16 + 16 j.
fn load_tile(s0: u32, lid: u32) -> array<vec4<u32>, LOADS> {
    let pos = s0 + lid / 16u;
    let at = locate(pos);
    if (pos + (LOADS - 1u) * ROWS < p.n_pos && locate(pos + (LOADS - 1u) * ROWS).x == at.x) {
        return key_vec4n(at.x, at.y * 16u + lid % 16u, ROWS * 16u);
    }
    return array<vec4<u32>, LOADS>(key_row(pos, lid), key_row(pos + ROWS, lid), key_row(pos + 2u * ROWS, lid), key_row(pos + 3u * ROWS, lid));
}

// Dims 16 kk .. + 15 of every query's q (scaled per head) into kt: hi = the top 11 significant
// bits (exact in f16), lo = the exact f32 residual.
fn stage_q_slice(t0: u32, kk: u32, lid: u32) {
    for (var i = lid; i < QB * IH * 4u; i += WG) {
        let qi = i / (IH * 4u);
        let head = (i / 4u) % IH;
        let c = i % 4u;
        var x = vec4<f32>(0.0);
        if (t0 + qi < p.n_queries) {
            x = query4((t0 + qi) * (IH * KV4) + head * KV4 + kk * 4u + c) * qs[qi * IH + head];
        }
        let h = bitcast<vec4<f32>>(bitcast<vec4<u32>>(x) & vec4<u32>(0xffffe000u));
        kt[(2u * qi * IH + head) * 4u + c] = vec4<f16>(h);
        kt[((2u * qi + 1u) * IH + head) * 4u + c] = vec4<f16>(x - h);
    }
}

// A fragment of this subgroup's query from the staged slice: part 0 hi, 1 lo; heads 16 half ..
fn q_frag(sg: u32, part: u32, half: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&kt[((2u * sg + part) * IH + 16u * half) * 4u], 4u);
}

// B fragment: dims 16 kk .. +15 (rows) of tile positions 16 pb .. +15 (columns).
fn b_frag(pb: u32, kk: u32) -> coop_mat16x16<f16, B> {
    return coopLoad<coop_mat16x16<f16, B>>(&kt[pb * 16u * KS4 + kk * 4u], KS4);
}

@compute @workgroup_size(256)
fn index_scores_coop_mq(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let t0 = wg.y * QB;
    atomicStore(&qmb[lid], 0u);
    if (lid < TILE) {
        bad[lid] = 0u;
    }
    workgroupBarrier();
    for (var i = lid; i < QB * IH * KV4; i += WG) {
        if (t0 + i / (IH * KV4) < p.n_queries) {
            let a = abs(query4(t0 * IH * KV4 + i));
            atomicMax(&qmb[i / KV4], bitcast<u32>(max(max(a.x, a.y), max(a.z, a.w))));
        }
    }
    workgroupBarrier();
    {
        // Largest |q| of the head into [2^13, 2^14); undone (with the key scale) before the ReLU.
        let m = bitcast<f32>(atomicLoad(&qmb[lid]));
        var e = 0i;
        if (m > 0.0) {
            e = clamp(13i - (i32((bitcast<u32>(m) >> 23u) & 0xffu) - 127i), -100i, 100i);
        }
        let t = t0 + lid / IH;
        var wt = 0.0;
        if (t < p.n_queries) {
            wt = raw_weight(t * IH + lid % IH) * p.w_scale;
        }
        ws[lid] = wt;
        qs[lid] = ldexp(1.0, e);
        wh[lid] = wt * (ldexp(1.0, -e) / KEY_SCALE);
    }
    workgroupBarrier();
    // (Spelled out: fragments in a private array would go to local memory on this driver.)
    stage_q_slice(t0, 0u, lid);
    workgroupBarrier();
    let h00 = q_frag(sg, 0u, 0u);
    let h10 = q_frag(sg, 0u, 1u);
    let l00 = q_frag(sg, 1u, 0u);
    let l10 = q_frag(sg, 1u, 1u);
    workgroupBarrier();
    stage_q_slice(t0, 1u, lid);
    workgroupBarrier();
    let h01 = q_frag(sg, 0u, 0u);
    let h11 = q_frag(sg, 0u, 1u);
    let l01 = q_frag(sg, 1u, 0u);
    let l11 = q_frag(sg, 1u, 1u);
    workgroupBarrier();
    stage_q_slice(t0, 2u, lid);
    workgroupBarrier();
    let h02 = q_frag(sg, 0u, 0u);
    let h12 = q_frag(sg, 0u, 1u);
    let l02 = q_frag(sg, 1u, 0u);
    let l12 = q_frag(sg, 1u, 1u);
    workgroupBarrier();
    stage_q_slice(t0, 3u, lid);
    workgroupBarrier();
    let h03 = q_frag(sg, 0u, 0u);
    let h13 = q_frag(sg, 0u, 1u);
    let l03 = q_frag(sg, 1u, 0u);
    let l13 = q_frag(sg, 1u, 1u);
    workgroupBarrier();
    stage_q_slice(t0, 4u, lid);
    workgroupBarrier();
    let h04 = q_frag(sg, 0u, 0u);
    let h14 = q_frag(sg, 0u, 1u);
    let l04 = q_frag(sg, 1u, 0u);
    let l14 = q_frag(sg, 1u, 1u);
    workgroupBarrier();
    stage_q_slice(t0, 5u, lid);
    workgroupBarrier();
    let h05 = q_frag(sg, 0u, 0u);
    let h15 = q_frag(sg, 0u, 1u);
    let l05 = q_frag(sg, 1u, 0u);
    let l15 = q_frag(sg, 1u, 1u);
    workgroupBarrier();
    stage_q_slice(t0, 6u, lid);
    workgroupBarrier();
    let h06 = q_frag(sg, 0u, 0u);
    let h16 = q_frag(sg, 0u, 1u);
    let l06 = q_frag(sg, 1u, 0u);
    let l16 = q_frag(sg, 1u, 1u);
    workgroupBarrier();
    stage_q_slice(t0, 7u, lid);
    workgroupBarrier();
    let h07 = q_frag(sg, 0u, 0u);
    let h17 = q_frag(sg, 0u, 1u);
    let l07 = q_frag(sg, 1u, 0u);
    let l17 = q_frag(sg, 1u, 1u);
    // This lane's heads' weights with the scales undone (a power of two: the same products as
    // weight x ReLU(c x scale)): heads 8 (lane / 16) .. + 7 of each half.
    let hw = sg * IH + (lane / 16u) * 8u;
    let wa0 = vec4<f32>(wh[hw], wh[hw + 1u], wh[hw + 2u], wh[hw + 3u]);
    let wa1 = vec4<f32>(wh[hw + 4u], wh[hw + 5u], wh[hw + 6u], wh[hw + 7u]);
    let wb0 = vec4<f32>(wh[hw + 16u], wh[hw + 17u], wh[hw + 18u], wh[hw + 19u]);
    let wb1 = vec4<f32>(wh[hw + 20u], wh[hw + 21u], wh[hw + 22u], wh[hw + 23u]);
    let tiles = (p.n_pos + TILE - 1u) / TILE;
    let t = t0 + sg;
    let live = t < p.n_queries;
    let last = p.q_pos0 + t;
    var tile = wg.x;
    var kv: array<vec4<u32>, LOADS>;
    if (tile < tiles) {
        kv = load_tile(tile * TILE, lid);
    }
    while (tile < tiles) {
        let s0 = tile * TILE;
        workgroupBarrier(); // q's slices, or the previous tile's keys, are consumed
        stage_keys(kv[0], 0u, lid);
        stage_keys(kv[1], 1u, lid);
        stage_keys(kv[2], 2u, lid);
        stage_keys(kv[3], 3u, lid);
        let next = tile + nwg.x;
        if (next < tiles) {
            kv = load_tile(next * TILE, lid);
        }
        workgroupBarrier();
        for (var pb = 0u; pb < TILE / 16u; pb++) {
            var c0 = coop_mat16x16<f32, C>();
            var c1 = coop_mat16x16<f32, C>();
            var b = b_frag(pb, 0u);
            c0 = coopMultiplyAdd(h00, b, c0);
            c1 = coopMultiplyAdd(h10, b, c1);
            if (QSPLIT) { c0 = coopMultiplyAdd(l00, b, c0); c1 = coopMultiplyAdd(l10, b, c1); }
            b = b_frag(pb, 1u);
            c0 = coopMultiplyAdd(h01, b, c0);
            c1 = coopMultiplyAdd(h11, b, c1);
            if (QSPLIT) { c0 = coopMultiplyAdd(l01, b, c0); c1 = coopMultiplyAdd(l11, b, c1); }
            b = b_frag(pb, 2u);
            c0 = coopMultiplyAdd(h02, b, c0);
            c1 = coopMultiplyAdd(h12, b, c1);
            if (QSPLIT) { c0 = coopMultiplyAdd(l02, b, c0); c1 = coopMultiplyAdd(l12, b, c1); }
            b = b_frag(pb, 3u);
            c0 = coopMultiplyAdd(h03, b, c0);
            c1 = coopMultiplyAdd(h13, b, c1);
            if (QSPLIT) { c0 = coopMultiplyAdd(l03, b, c0); c1 = coopMultiplyAdd(l13, b, c1); }
            b = b_frag(pb, 4u);
            c0 = coopMultiplyAdd(h04, b, c0);
            c1 = coopMultiplyAdd(h14, b, c1);
            if (QSPLIT) { c0 = coopMultiplyAdd(l04, b, c0); c1 = coopMultiplyAdd(l14, b, c1); }
            b = b_frag(pb, 5u);
            c0 = coopMultiplyAdd(h05, b, c0);
            c1 = coopMultiplyAdd(h15, b, c1);
            if (QSPLIT) { c0 = coopMultiplyAdd(l05, b, c0); c1 = coopMultiplyAdd(l15, b, c1); }
            b = b_frag(pb, 6u);
            c0 = coopMultiplyAdd(h06, b, c0);
            c1 = coopMultiplyAdd(h16, b, c1);
            if (QSPLIT) { c0 = coopMultiplyAdd(l06, b, c0); c1 = coopMultiplyAdd(l16, b, c1); }
            b = b_frag(pb, 7u);
            c0 = coopMultiplyAdd(h07, b, c0);
            c1 = coopMultiplyAdd(h17, b, c1);
            if (QSPLIT) { c0 = coopMultiplyAdd(l07, b, c0); c1 = coopMultiplyAdd(l17, b, c1); }
            // Only this subgroup reads its tiles: a subgroup barrier orders the stores and reads.
            coopStore(c0, &cs[2u * sg * 16u * CS4], CS4);
            coopStore(c1, &cs[(2u * sg + 1u) * 16u * CS4], CS4);
            subgroupBarrier();
            let at = 2u * sg * 16u * CS4 + (lane % 16u) * CS4 + (lane / 16u) * 2u;
            let x0 = max(cs[at], vec4<f32>(0.0)) * wa0;
            let x1 = max(cs[at + 1u], vec4<f32>(0.0)) * wa1;
            let y0 = max(cs[at + 16u * CS4], vec4<f32>(0.0)) * wb0;
            let y1 = max(cs[at + 16u * CS4 + 1u], vec4<f32>(0.0)) * wb1;
            var sum = (((x0.x + x0.y) + (x0.z + x0.w)) + ((x1.x + x1.y) + (x1.z + x1.w)))
                + (((y0.x + y0.y) + (y0.z + y0.w)) + ((y1.x + y1.y) + (y1.z + y1.w)));
            sum += subgroupShuffleXor(sum, 16u);
            let row = pb * 16u + lane % 16u;
            let pos = s0 + row;
            if (lane < 16u && live && pos < p.n_pos) {
                var v = sum;
                if (pos > last) {
                    v = bitcast<f32>(0xff800000u);
                } else if (bad[row] != 0u) {
                    v = exact_score(sg * IH, t, pos);
                }
                scores[t * p.row_stride + pos] = v;
            }
            subgroupBarrier(); // the next block rewrites this subgroup's tiles
        }
        if (lid < TILE) {
            bad[lid] = 0u;
        }
        tile = next;
    }
}
