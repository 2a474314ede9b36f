// Lightning indexer scores (spec 5.3) on cooperative matrices (16x16x16 f16 -> f32), K3.1 shape
// only (32 heads x 128): the same contract as index_scores in indexer.wgsl (its SIMT twin),
//   I[t, s] = w_scale * sum_j w[t, j] * relu(q[t, j] . k[s])      for s <= q_pos0 + t, else -inf.
//
// Per workgroup (8 subgroups of 32; the host runs this only where the subgroup size is 32; needs
// the subgroup feature for subgroup_id) and
// query t (workgroup_id.y), tiles of TILE = 64 positions, grid-strided over the row:
//   C[32 heads, 64 positions] = Q[32, 128] K^T[128, 64]
// subgroup w owns heads 16 (w / 4) .. +15 and positions 16 (w % 4) .. +15 of the tile: its 8
// A fragments (Q rows, f16) stay in registers for the whole kernel; keys are loaded as bf16,
// converted to f16 (exact for the LayerNorm'd key range) into workgroup memory (B fragments,
// column-major = one key per column), and the next tile's keys are already in flight while the
// current tile is multiplied. The accumulators go to workgroup memory (no per-element coop
// access), then 4 threads per position apply ReLU and the head weights and sum.
// QSPLIT: q = hi + lo with both parts f16, two products per fragment; without it q is rounded to
// f16 (about 5e-4 relative per head dot).
// EXACT (with QSPLIT): the precision scheme of dsa_index_coop2.wgsl, which the H200 measured at
// f32 agreement (5e-7 of the largest score, every top-2048 equal): q scaled per head by a power
// of two and split by masking (the earlier lo = f16(x - f32(f16(x))) measured no better than q
// in f16 alone: the driver folds f32(f16(x)) to x), keys scaled by KEY_SCALE into the exact f16
// range, positions with a key beyond it recomputed in f32. Without EXACT: the original kernel.

enable f16;
enable wgpu_cooperative_matrix;

struct IndexParams {
    n_queries: u32,
    row_stride: u32,
    q_pos0: u32,
    n_pos: u32,
    page0: u32,
    shift_max: u32,
    w_scale: f32,
    _pad: u32,
}

override QSPLIT: bool = true;
override EXACT: bool = true;
override KEY_SCALE: f32 = 1024.0;
const IH: u32 = 32u;
const ID: u32 = 128u;
const TILE: u32 = 64u;
const WG: u32 = 256u;
const KV4: u32 = 32u; // vec4<f16> per key row
const CS: u32 = 20u;  // f32 stride between positions of a staged accumulator tile (16 + 4: banks)
const LOADS: u32 = 4u; // vec4<u32> (8 bf16) key loads per thread per tile: TILE * 16 / WG

@group(0) @binding(0) var<uniform> p: IndexParams;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
#include "lib/index_keys.wgsl"

var<workgroup> kt: array<vec4<f16>, 2048>; // TILE keys x 32 vec4<f16>
var<workgroup> qh: array<vec4<f16>, 1024>; // [32 heads, 128] f16(q)
var<workgroup> ql: array<vec4<f16>, 1024>; // [32 heads, 128] f16(q - f16(q))
var<workgroup> cs: array<f32, 2560>;       // 8 tiles x 16 positions x CS
var<workgroup> ws: array<f32, 32>;
var<workgroup> red: array<f32, 256>;
var<workgroup> hs: array<f32, 32>;          // undoes the q and key scales (EXACT)
var<workgroup> qs: array<f32, 32>;          // per-head power-of-two scale of q (EXACT)
var<workgroup> qmb: array<atomic<u32>, 32>; // per head: max |q| as f32 bits
var<workgroup> bad: array<u32, 64>;         // per tile position: key beyond the exact range


#include "lib/page_locate.wgsl"

fn bf_lo(x: u32) -> f32 {
    return bitcast<f32>(x << 16u);
}

fn bf_hi(x: u32) -> f32 {
    return bitcast<f32>(x & 0xffff0000u);
}

// Load j of this thread for the tile at s0: key row s0 + (j * WG + lid) / 16, 8 values.
fn load_keys(s0: u32, j: u32, lid: u32) -> vec4<u32> {
    let e = j * WG + lid;
    let pos = s0 + e / 16u;
    if (pos >= p.n_pos) {
        return vec4<u32>(0u);
    }
    let at = locate(pos);
    return key_vec(at.x, at.y * 16u + e % 16u);
}

fn stage_keys(v: vec4<u32>, j: u32, lid: u32) {
    let e = j * WG + lid;
    let at = (e / 16u) * KV4 + (e % 16u) * 2u;
    let f0 = vec4<f32>(bf_lo(v.x), bf_hi(v.x), bf_lo(v.y), bf_hi(v.y));
    let f1 = vec4<f32>(bf_lo(v.z), bf_hi(v.z), bf_lo(v.w), bf_hi(v.w));
    var ks = 1.0;
    if (EXACT) {
        ks = KEY_SCALE;
        let m4 = max(abs(f0), abs(f1));
        if (!(max(max(m4.x, m4.y), max(m4.z, m4.w)) * KEY_SCALE <= 65504.0)) {
            bad[e / 16u] = 1u;
        }
    }
    kt[at] = vec4<f16>(f0 * ks);
    kt[at + 1u] = vec4<f16>(f1 * ks);
}

// f32 score of one position straight from the bf16 key (the out-of-range fallback).
fn exact_score(t: u32, pos: u32) -> f32 {
    let at = locate(pos);
    var s = 0.0;
    for (var h = 0u; h < IH; h++) {
        var d = 0.0;
        for (var c = 0u; c < ID / 8u; c++) {
            let kw = key_vec(at.x, at.y * (ID / 8u) + c);
            let ka = vec4<f32>(bf_lo(kw.x), bf_hi(kw.x), bf_lo(kw.y), bf_hi(kw.y));
            let kb = vec4<f32>(bf_lo(kw.z), bf_hi(kw.z), bf_lo(kw.w), bf_hi(kw.w));
            let qi = t * (IH * ID / 4u) + h * (ID / 4u) + 2u * c;
            d += dot(q[qi], ka) + dot(q[qi + 1u], kb);
        }
        s += ws[h] * max(d, 0.0);
    }
    return s;
}

fn a_hi(mt: u32, kk: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&qh[mt * 16u * KV4 + kk * 4u], KV4);
}

fn a_lo(mt: u32, kk: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&ql[mt * 16u * KV4 + kk * 4u], KV4);
}

// One k-step (dims 16 kk .. +15) of the subgroup's tile: B = 16 keys (columns) x 16 dims.
fn kstep(acc: coop_mat16x16<f32, C>, ah: coop_mat16x16<f16, A>, al: coop_mat16x16<f16, A>, nt: u32, kk: u32) -> coop_mat16x16<f32, C> {
    let b = coopLoad<coop_mat16x16<f16, B>>(&kt[nt * 16u * KV4 + kk * 4u], KV4);
    var r = coopMultiplyAdd(ah, b, acc);
    if (QSPLIT) {
        r = coopMultiplyAdd(al, b, r);
    }
    return r;
}

@compute @workgroup_size(256)
fn index_scores_coop(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
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
            let a = abs(q[t * (IH * ID / 4u) + i]);
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
        ws[lid] = w[t * IH + lid] * p.w_scale;
        qs[lid] = ldexp(1.0, e);
        hs[lid] = select(1.0, ldexp(1.0, -e) / KEY_SCALE, EXACT);
    }
    workgroupBarrier();
    for (var i = lid; i < IH * ID / 4u; i += WG) {
        let x = q[t * (IH * ID / 4u) + i] * qs[i / KV4];
        if (EXACT) {
            // hi = top 11 significant bits (exact in f16, not foldable), lo = x - hi exact in f32.
            let h = bitcast<vec4<f32>>(bitcast<vec4<u32>>(x) & vec4<u32>(0xffffe000u));
            qh[i] = vec4<f16>(h);
            ql[i] = vec4<f16>(x - h);
        } else {
            let h = vec4<f16>(x);
            qh[i] = h;
            ql[i] = vec4<f16>(x - vec4<f32>(h));
        }
    }
    workgroupBarrier();
    // Subgroup sg (of 8: the host runs this kernel only where subgroups are 32 wide) owns one
    // 16 x 16 output tile; coop operands are addressed by sg alone (subgroup-uniform).
    let mt = sg / 4u;
    let nt = sg % 4u;
    let ah0 = a_hi(mt, 0u);
    let ah1 = a_hi(mt, 1u);
    let ah2 = a_hi(mt, 2u);
    let ah3 = a_hi(mt, 3u);
    let ah4 = a_hi(mt, 4u);
    let ah5 = a_hi(mt, 5u);
    let ah6 = a_hi(mt, 6u);
    let ah7 = a_hi(mt, 7u);
    let al0 = a_lo(mt, 0u);
    let al1 = a_lo(mt, 1u);
    let al2 = a_lo(mt, 2u);
    let al3 = a_lo(mt, 3u);
    let al4 = a_lo(mt, 4u);
    let al5 = a_lo(mt, 5u);
    let al6 = a_lo(mt, 6u);
    let al7 = a_lo(mt, 7u);
    let tiles = (p.n_pos + TILE - 1u) / TILE;
    let last = p.q_pos0 + t;
    // Epilogue mapping: 4 threads per position, 8 heads each.
    let ep = lid / 4u;
    let eq = lid % 4u;
    let e_tile = (eq / 2u) * 4u + ep / 16u;
    let e_at = e_tile * 16u * CS + (ep % 16u) * CS + (eq % 2u) * 8u;
    var tile = wg.x;
    var kv: array<vec4<u32>, LOADS>;
    for (var j = 0u; j < LOADS; j++) {
        kv[j] = select(vec4<u32>(0u), load_keys(tile * TILE, j, lid), tile < tiles);
    }
    while (tile < tiles) {
        let s0 = tile * TILE;
        workgroupBarrier();
        for (var j = 0u; j < LOADS; j++) {
            stage_keys(kv[j], j, lid);
        }
        let next = tile + nwg.x;
        if (next < tiles) {
            for (var j = 0u; j < LOADS; j++) {
                kv[j] = load_keys(next * TILE, j, lid);
            }
        }
        workgroupBarrier();
        var acc = coop_mat16x16<f32, C>();
        acc = kstep(acc, ah0, al0, nt, 0u);
        acc = kstep(acc, ah1, al1, nt, 1u);
        acc = kstep(acc, ah2, al2, nt, 2u);
        acc = kstep(acc, ah3, al3, nt, 3u);
        acc = kstep(acc, ah4, al4, nt, 4u);
        acc = kstep(acc, ah5, al5, nt, 5u);
        acc = kstep(acc, ah6, al6, nt, 6u);
        acc = kstep(acc, ah7, al7, nt, 7u);
        coopStore(acc, &cs[sg * 16u * CS], CS);
        workgroupBarrier();
        let h0 = eq * 8u;
        var sum = 0.0;
        for (var j = 0u; j < 8u; j++) {
            sum += ws[h0 + j] * max(cs[e_at + j] * hs[h0 + j], 0.0);
        }
        red[lid] = sum;
        workgroupBarrier();
        if (lid < TILE) {
            let pos = s0 + lid;
            if (pos < p.n_pos) {
                var v = red[4u * lid] + red[4u * lid + 1u] + red[4u * lid + 2u] + red[4u * lid + 3u];
                if (pos > last) {
                    v = bitcast<f32>(0xff800000u);
                } else if (EXACT && bad[lid] != 0u) {
                    v = exact_score(t, pos);
                }
                scores[t * p.row_stride + pos] = v;
            }
            bad[lid] = 0u;
        }
        tile = next;
    }
}
