// Lightning indexer scores (spec 5.3) of `n_queries` queries over the paged index-key cache:
//   I[t, s] = w_scale * sum_j w[t, j] * relu(q[t, j] . k[s])      for s <= q_pos0 + t, else -inf
//
// Preconditions (checked on the host): q is [n_queries, IH, ID] f32, w is [n_queries, IH] f32
// (raw weights_proj output; w_scale = IH^-1/2 * ID^-1/2 is applied here); the key cache is a
// list of pages (bindings k0..k15), page i holding page0 << min(i, shift_max) rows of ID bf16
// values packed two per u32 (even element in the low half), ID % 8 == 0, ID <= 128,
// IH % 4 == 0, IH <= 32; scores is [n_queries, row_stride] f32 and n_pos <= row_stride.
// index_scores: one workgroup scores TILE = 64 positions for one query (workgroup_id.y): thread
// (g, p) takes position p and heads 8g..8g+7 (zero-padded past IH) in two vec4 accumulators, so
// no private array is indexed dynamically (that spilled to local memory: 5 ms at 1M on the H200).
// TILE = 32 (a pipeline constant; IH % 8 == 0): 8 groups of 4 heads, one accumulator, twice the
// workgroups for short rows.
// index_scores_tiled (below): the same contract and preconditions, register-tiled.

#include "lib/index_params.wgsl"

override IH: u32 = 32u;
override ID: u32 = 128u;
override TILE: u32 = 64u;
const WG: u32 = 256u;
// Head groups and q slots per group of index_scores (4 x 8 or 8 x 4).
override GROUPS: u32 = WG / TILE;
override SLOTS: u32 = 32u / GROUPS;

@group(0) @binding(0) var<uniform> p: IndexParams;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
#include "lib/index_keys.wgsl"
#include "lib/index_query.wgsl"

// q as [4 groups][8 heads][ID/4] vec4 (heads past IH zero), head weights likewise.
var<workgroup> qs: array<vec4<f32>, 1024>;
var<workgroup> ws: array<f32, 32>;
var<workgroup> part: array<f32, 256>;


#include "lib/page_locate.wgsl"

fn lo(x: u32) -> f32 {
    return bitcast<f32>(x << 16u);
}

fn hi(x: u32) -> f32 {
    return bitcast<f32>(x & 0xffff0000u);
}

fn hdot(h: u32, c: u32, ka: vec4<f32>, kb: vec4<f32>) -> f32 {
    let i = h * (ID / 4u) + 2u * c;
    return dot(qs[i], ka) + dot(qs[i + 1u], kb);
}

@compute @workgroup_size(256)
fn index_scores(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y;
    let hp = IH / GROUPS; // heads per group
    for (var i = lid; i < 32u * (ID / 4u); i += WG) {
        let slot = i / (ID / 4u);
        let g = slot / SLOTS;
        let hh = slot % SLOTS;
        var v = vec4<f32>(0.0);
        if (hh < hp) {
            v = query4(t * (IH * ID / 4u) + (g * hp + hh) * (ID / 4u) + i % (ID / 4u));
        }
        qs[i] = v;
    }
    if (lid < 32u) {
        let g = lid / SLOTS;
        let hh = lid % SLOTS;
        ws[lid] = select(0.0, raw_weight(t * IH + g * hp + hh) * p.w_scale, hh < hp);
    }
    workgroupBarrier();
    let g = lid / TILE;
    let pl = lid % TILE;
    let pos = wg.x * TILE + pl;
    var score = 0.0;
    if (pos < p.n_pos && pos <= p.q_pos0 + t) {
        let at = locate(pos);
        let base = at.y * (ID / 8u);
        let h0 = g * SLOTS;
        var a0 = vec4<f32>(0.0);
        var a1 = vec4<f32>(0.0);
        for (var c = 0u; c < ID / 8u; c++) {
            let kw = key_vec(at.x, base + c);
            let ka = vec4<f32>(lo(kw.x), hi(kw.x), lo(kw.y), hi(kw.y));
            let kb = vec4<f32>(lo(kw.z), hi(kw.z), lo(kw.w), hi(kw.w));
            a0 += vec4<f32>(hdot(h0, c, ka, kb), hdot(h0 + 1u, c, ka, kb), hdot(h0 + 2u, c, ka, kb), hdot(h0 + 3u, c, ka, kb));
            if (SLOTS == 8u) {
                a1 += vec4<f32>(hdot(h0 + 4u, c, ka, kb), hdot(h0 + 5u, c, ka, kb), hdot(h0 + 6u, c, ka, kb), hdot(h0 + 7u, c, ka, kb));
            }
        }
        let w0 = vec4<f32>(ws[h0], ws[h0 + 1u], ws[h0 + 2u], ws[h0 + 3u]);
        score = dot(w0, max(a0, vec4<f32>(0.0)));
        if (SLOTS == 8u) {
            let w1 = vec4<f32>(ws[h0 + 4u], ws[h0 + 5u], ws[h0 + 6u], ws[h0 + 7u]);
            score += dot(w1, max(a1, vec4<f32>(0.0)));
        }
    }
    part[lid] = score;
    workgroupBarrier();
    if (g == 0u) {
        var total = 0.0;
        for (var k = 0u; k < GROUPS; k++) {
            total += part[pl + k * TILE];
        }
        put_score(t, pos, total);
    }
}

// Writes score v of query t at pos (nothing past n_pos; -inf past the causal limit).
fn put_score(t: u32, pos: u32, v: f32) {
    if (pos < p.n_pos) {
        scores[t * p.row_stride + pos] = select(v, bitcast<f32>(0xff800000u), pos > p.q_pos0 + t);
    }
}

// ---- index_scores_tiled: the same scores as a register-tiled GEMM ----
// Per workgroup of TW threads (128 or 256) and query t (workgroup_id.y), a tile of TW / 2
// positions: S[pos, h] = K[pos, :] . Q[h, :]. Thread (pg, g) = (lid / 8, lid % 8) accumulates
// positions pg + i TW / 8 and heads g + 8 j (i, j < 4) in four vec4 accumulators (one per
// position, lanes = heads), named so that nothing spills. Per 4 dims it reads 4 key and 4 q vec4
// from workgroup memory for 64 FMAs: 2 FMAs per float read (index_scores: 1); a 32-wide
// subgroup's q reads are 8 distinct vec4 and its key reads 4, both conflict-free. Keys (bf16 ->
// f32, [position][dim]) and q (transposed to [dim][head group]) are staged KC dims at a time
// (12.1 KiB of workgroup memory in all), the next chunk's global loads issued before the current
// chunk's arithmetic (NVIDIA's compiler does not move loads across the loop by itself).

override TW: u32 = 256u;
const KC: u32 = 16u;          // dims per staged chunk
const KR: u32 = KC / 4u + 1u; // vec4 per staged key row (+1: the 4 rows a warp reads in distinct banks)
const TMAX: u32 = 128u;       // positions of the largest tile

var<workgroup> tk: array<vec4<f32>, TMAX * KR>; // keys [position][KR]; then the head-group sums
var<workgroup> tq: array<vec4<f32>, KC * 8u>;   // q [dim][head group g]: heads g, g+8, g+16, g+24
var<workgroup> tw: array<vec4<f32>, 8>;         // w_scale * w of the same heads

// w_scale * w of head h of query t (0 past IH).
fn head_weight(t: u32, h: u32) -> f32 {
    return select(0.0, raw_weight(t * IH + min(h, IH - 1u)) * p.w_scale, h < IH);
}

// Where this thread's key loads come from: (page, vec4 index of dims 8 (lid % 2).. of tile
// position lid / 2, 1), or zero past n_pos and the causal limit `last` (nothing to load).
fn tiled_key_src(s0: u32, lid: u32, last: u32) -> vec3<u32> {
    let pos = s0 + lid / 2u;
    if (pos >= p.n_pos || pos > last) {
        return vec3<u32>(0u);
    }
    let at = locate(pos);
    return vec3<u32>(at.x, at.y * (ID / 8u) + lid % 2u, 1u);
}

// This thread's 8 key dims (bf16 pairs) of the chunk at dim c (zero without a source or past ID).
fn tiled_keys(src: vec3<u32>, c: u32, lid: u32) -> vec4<u32> {
    if (src.z == 0u || c + 8u * (lid % 2u) >= ID) {
        return vec4<u32>(0u);
    }
    return key_vec(src.x, src.y + c / 8u);
}

// This thread's q of the chunk at dim c: head lid % 32, dims c + 4 (lid / 32) ..+3 (zero past IH
// and ID, and for threads from 8 KC on, which stage no q).
fn tiled_q(t: u32, c: u32, lid: u32) -> vec4<f32> {
    let h = lid % 32u;
    let d = c + 4u * (lid / 32u);
    if (lid >= 8u * KC || h >= IH || d >= ID) {
        return vec4<f32>(0.0);
    }
    return query4(t * (IH * ID / 4u) + h * (ID / 4u) + d / 4u);
}

// Stores this thread's loads of a chunk: keys as f32 rows, q transposed to [dim][head group].
fn tiled_stage(kv: vec4<u32>, qv: vec4<f32>, lid: u32) {
    let row = (lid / 2u) * KR + 2u * (lid % 2u);
    tk[row] = vec4<f32>(lo(kv.x), hi(kv.x), lo(kv.y), hi(kv.y));
    tk[row + 1u] = vec4<f32>(lo(kv.z), hi(kv.z), lo(kv.w), hi(kv.w));
    if (lid < 8u * KC) {
        let h = lid % 32u;
        let at = 32u * (lid / 32u) + h % 8u;
        let lane = h / 8u;
        tq[at][lane] = qv.x;
        tq[at + 8u][lane] = qv.y;
        tq[at + 16u][lane] = qv.z;
        tq[at + 24u][lane] = qv.w;
    }
}

// a + k.x q0 + k.y q1 + k.z q2 + k.w q3: one position's 4 dims (k) against 4 heads (q_j: dim j).
fn outer4(a: vec4<f32>, k: vec4<f32>, q0: vec4<f32>, q1: vec4<f32>, q2: vec4<f32>, q3: vec4<f32>) -> vec4<f32> {
    return fma(vec4<f32>(k.w), q3, fma(vec4<f32>(k.z), q2, fma(vec4<f32>(k.y), q1, fma(vec4<f32>(k.x), q0, a))));
}

// The head-group partial sums, as floats in tk (after the last chunk).
fn sum_put(i: u32, x: f32) {
    tk[i / 4u][i % 4u] = x;
}

fn sum_get(i: u32) -> f32 {
    return tk[i / 4u][i % 4u];
}

@compute @workgroup_size(TW)
fn index_scores_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y;
    let pgs = TW / 8u; // position groups
    let tile = TW / 2u;
    let s0 = wg.x * tile;
    let last = p.q_pos0 + t;
    if (s0 > last) {
        // Every position is masked (prefill): no loads, no arithmetic.
        if (lid < tile) {
            put_score(t, s0 + lid, 0.0);
        }
        return;
    }
    if (lid < 8u) {
        tw[lid] = vec4<f32>(head_weight(t, lid), head_weight(t, lid + 8u), head_weight(t, lid + 16u), head_weight(t, lid + 24u));
    }
    let src = tiled_key_src(s0, lid, last);
    var kv = tiled_keys(src, 0u, lid);
    var qv = tiled_q(t, 0u, lid);
    let g = lid % 8u;
    let pg = lid / 8u;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    for (var c = 0u; c < ID; c += KC) {
        workgroupBarrier(); // the previous chunk is consumed
        tiled_stage(kv, qv, lid);
        workgroupBarrier();
        if (c + KC < ID) {
            kv = tiled_keys(src, c + KC, lid);
            qv = tiled_q(t, c + KC, lid);
        }
        for (var d = 0u; d < KC / 4u; d++) {
            let q0 = tq[32u * d + g];
            let q1 = tq[32u * d + 8u + g];
            let q2 = tq[32u * d + 16u + g];
            let q3 = tq[32u * d + 24u + g];
            a0 = outer4(a0, tk[pg * KR + d], q0, q1, q2, q3);
            a1 = outer4(a1, tk[(pg + pgs) * KR + d], q0, q1, q2, q3);
            a2 = outer4(a2, tk[(pg + 2u * pgs) * KR + d], q0, q1, q2, q3);
            a3 = outer4(a3, tk[(pg + 3u * pgs) * KR + d], q0, q1, q2, q3);
        }
    }
    let wv = tw[g];
    let z = vec4<f32>(0.0);
    // Sums of head group g at [g][position], rows of tile + 4 floats: conflict-free both ways.
    let at = g * (tile + 4u) + pg;
    workgroupBarrier(); // every thread is done with the keys in tk
    sum_put(at, dot(wv, max(a0, z)));
    sum_put(at + pgs, dot(wv, max(a1, z)));
    sum_put(at + 2u * pgs, dot(wv, max(a2, z)));
    sum_put(at + 3u * pgs, dot(wv, max(a3, z)));
    workgroupBarrier();
    if (lid < tile) {
        var s = 0.0;
        for (var k = 0u; k < 8u; k++) {
            s += sum_get(k * (tile + 4u) + lid);
        }
        put_score(t, s0 + lid, s);
    }
}

// Bench diagnostic (not scores): the key reads of the scan alone, with the same bindings, paging
// and per-load page switch, coalesced like the coop kernels' loads (16-byte chunk lid % 16 of
// position lid / 16, four per thread per 64-position tile); each position's chunks are xor-ed
// and the bits written, so no load can be dropped. Its time is the floor of this access pattern.
// K3.1 rows only (ID = 128: 16 chunks per row); the host builds it with those constants.
var<workgroup> probe: array<u32, 1024>; // [position in tile][chunk]

@compute @workgroup_size(256)
fn index_keys_probe(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y;
    var v: array<vec4<u32>, 4>;
    for (var j = 0u; j < 4u; j++) {
        let e = j * WG + lid;
        let pos = wg.x * TILE + e / 16u;
        if (pos < p.n_pos) {
            let at = locate(pos);
            v[j] = key_vec(at.x, at.y * 16u + e % 16u);
        }
    }
    for (var j = 0u; j < 4u; j++) {
        probe[j * WG + lid] = v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    workgroupBarrier();
    let pos = wg.x * TILE + lid;
    if (lid < TILE && pos < p.n_pos) {
        // q and w are read so that the binding layout matches index_scores.
        var x = bitcast<u32>(q[t].x * 0.0 + w[t]);
        for (var c = 0u; c < 16u; c++) {
            x ^= probe[lid * 16u + c];
        }
        scores[t * p.row_stride + pos] = bitcast<f32>(x & 0x3fffffffu);
    }
}
