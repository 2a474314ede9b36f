// Lightning indexer scores (spec 5.3) of `n_queries` queries over the paged index-key cache:
//   I[t, s] = w_scale * sum_j w[t, j] * relu(q[t, j] . k[s])      for s <= q_pos0 + t, else -inf
//
// Preconditions (checked on the host): q is [n_queries, IH, ID] f32, w is [n_queries, IH] f32
// (raw weights_proj output; w_scale = IH^-1/2 * ID^-1/2 is applied here); the key cache is a
// list of pages (bindings k0..k15), page i holding page0 << min(i, shift_max) rows of ID bf16
// values packed two per u32 (even element in the low half), ID % 8 == 0, ID <= 128,
// IH % 4 == 0, IH <= 32; scores is [n_queries, row_stride] f32 and n_pos <= row_stride.
// One workgroup scores TILE = 64 positions for one query (workgroup_id.y): thread (g, p) takes
// position p and heads 8g..8g+7 (zero-padded past IH) in two vec4 accumulators, so no
// private array is indexed dynamically (that spilled to local memory: 5 ms at 1M on the H200).

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

override IH: u32 = 32u;
override ID: u32 = 128u;
const TILE: u32 = 64u;
const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: IndexParams;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
#include "lib/index_keys.wgsl"

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
    let hp = IH / 4u; // heads per group
    for (var i = lid; i < 32u * (ID / 4u); i += WG) {
        let slot = i / (ID / 4u);
        let g = slot / 8u;
        let hh = slot % 8u;
        var v = vec4<f32>(0.0);
        if (hh < hp) {
            v = q[t * (IH * ID / 4u) + (g * hp + hh) * (ID / 4u) + i % (ID / 4u)];
        }
        qs[i] = v;
    }
    if (lid < 32u) {
        let g = lid / 8u;
        let hh = lid % 8u;
        ws[lid] = select(0.0, w[t * IH + g * hp + hh] * p.w_scale, hh < hp);
    }
    workgroupBarrier();
    let g = lid / TILE;
    let pl = lid % TILE;
    let pos = wg.x * TILE + pl;
    var score = 0.0;
    if (pos < p.n_pos && pos <= p.q_pos0 + t) {
        let at = locate(pos);
        let base = at.y * (ID / 8u);
        let h0 = g * 8u;
        var a0 = vec4<f32>(0.0);
        var a1 = vec4<f32>(0.0);
        for (var c = 0u; c < ID / 8u; c++) {
            let kw = key_vec(at.x, base + c);
            let ka = vec4<f32>(lo(kw.x), hi(kw.x), lo(kw.y), hi(kw.y));
            let kb = vec4<f32>(lo(kw.z), hi(kw.z), lo(kw.w), hi(kw.w));
            a0 += vec4<f32>(hdot(h0, c, ka, kb), hdot(h0 + 1u, c, ka, kb), hdot(h0 + 2u, c, ka, kb), hdot(h0 + 3u, c, ka, kb));
            a1 += vec4<f32>(hdot(h0 + 4u, c, ka, kb), hdot(h0 + 5u, c, ka, kb), hdot(h0 + 6u, c, ka, kb), hdot(h0 + 7u, c, ka, kb));
        }
        let w0 = vec4<f32>(ws[h0], ws[h0 + 1u], ws[h0 + 2u], ws[h0 + 3u]);
        let w1 = vec4<f32>(ws[h0 + 4u], ws[h0 + 5u], ws[h0 + 6u], ws[h0 + 7u]);
        score = dot(w0, max(a0, vec4<f32>(0.0))) + dot(w1, max(a1, vec4<f32>(0.0)));
    }
    part[lid] = score;
    workgroupBarrier();
    if (g == 0u && pos < p.n_pos) {
        let out = t * p.row_stride + pos;
        if (pos > p.q_pos0 + t) {
            scores[out] = bitcast<f32>(0xff800000u);
        } else {
            scores[out] = part[pl] + part[pl + TILE] + part[pl + 2u * TILE] + part[pl + 3u * TILE];
        }
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
