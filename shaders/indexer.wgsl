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
@group(0) @binding(4) var<storage, read> k0: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> k1: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> k2: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> k3: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read> k4: array<vec4<u32>>;
@group(0) @binding(9) var<storage, read> k5: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read> k6: array<vec4<u32>>;
@group(0) @binding(11) var<storage, read> k7: array<vec4<u32>>;
@group(0) @binding(12) var<storage, read> k8: array<vec4<u32>>;
@group(0) @binding(13) var<storage, read> k9: array<vec4<u32>>;
@group(0) @binding(14) var<storage, read> k10: array<vec4<u32>>;
@group(0) @binding(15) var<storage, read> k11: array<vec4<u32>>;
@group(0) @binding(16) var<storage, read> k12: array<vec4<u32>>;
@group(0) @binding(17) var<storage, read> k13: array<vec4<u32>>;
@group(0) @binding(18) var<storage, read> k14: array<vec4<u32>>;
@group(0) @binding(19) var<storage, read> k15: array<vec4<u32>>;

// q as [4 groups][8 heads][ID/4] vec4 (heads past IH zero), head weights likewise.
var<workgroup> qs: array<vec4<f32>, 1024>;
var<workgroup> ws: array<f32, 32>;
var<workgroup> part: array<f32, 256>;

fn key_vec(page: u32, i: u32) -> vec4<u32> {
    switch page {
        case 0u: { return k0[i]; }
        case 1u: { return k1[i]; }
        case 2u: { return k2[i]; }
        case 3u: { return k3[i]; }
        case 4u: { return k4[i]; }
        case 5u: { return k5[i]; }
        case 6u: { return k6[i]; }
        case 7u: { return k7[i]; }
        case 8u: { return k8[i]; }
        case 9u: { return k9[i]; }
        case 10u: { return k10[i]; }
        case 11u: { return k11[i]; }
        case 12u: { return k12[i]; }
        case 13u: { return k13[i]; }
        case 14u: { return k14[i]; }
        default: { return k15[i]; }
    }
}

// Page geometry: page i holds page0 << min(i, shift_max) rows; returns (page, row in page).
fn locate(pos: u32) -> vec2<u32> {
    let doubling_end = p.page0 * ((2u << p.shift_max) - 1u);
    if (pos < doubling_end) {
        let i = firstLeadingBit(pos / p.page0 + 1u);
        return vec2<u32>(i, pos - p.page0 * ((1u << i) - 1u));
    }
    let big = p.page0 << p.shift_max;
    let j = (pos - doubling_end) / big;
    return vec2<u32>(p.shift_max + 1u + j, pos - doubling_end - j * big);
}

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

// One position's key row (ID / 8 <= 16 units of 16 bytes; units past the row repeat its last
// one and are not used): ONE page switch with every load of the row inside its arm, so the
// loads go out together. A switch per load (key_vec) made each load wait for the one before.
struct KeyRow {
    u0: vec4<u32>,
    u1: vec4<u32>,
    u2: vec4<u32>,
    u3: vec4<u32>,
    u4: vec4<u32>,
    u5: vec4<u32>,
    u6: vec4<u32>,
    u7: vec4<u32>,
    u8: vec4<u32>,
    u9: vec4<u32>,
    u10: vec4<u32>,
    u11: vec4<u32>,
    u12: vec4<u32>,
    u13: vec4<u32>,
    u14: vec4<u32>,
    u15: vec4<u32>,
}

fn key_row(page: u32, base: u32) -> KeyRow {
    var r: KeyRow;
    let last = ID / 8u - 1u;
    switch page {
        case 0u: {
            r.u0 = k0[base];
            r.u1 = k0[base + min(1u, last)];
            r.u2 = k0[base + min(2u, last)];
            r.u3 = k0[base + min(3u, last)];
            r.u4 = k0[base + min(4u, last)];
            r.u5 = k0[base + min(5u, last)];
            r.u6 = k0[base + min(6u, last)];
            r.u7 = k0[base + min(7u, last)];
            r.u8 = k0[base + min(8u, last)];
            r.u9 = k0[base + min(9u, last)];
            r.u10 = k0[base + min(10u, last)];
            r.u11 = k0[base + min(11u, last)];
            r.u12 = k0[base + min(12u, last)];
            r.u13 = k0[base + min(13u, last)];
            r.u14 = k0[base + min(14u, last)];
            r.u15 = k0[base + min(15u, last)];
        }
        case 1u: {
            r.u0 = k1[base];
            r.u1 = k1[base + min(1u, last)];
            r.u2 = k1[base + min(2u, last)];
            r.u3 = k1[base + min(3u, last)];
            r.u4 = k1[base + min(4u, last)];
            r.u5 = k1[base + min(5u, last)];
            r.u6 = k1[base + min(6u, last)];
            r.u7 = k1[base + min(7u, last)];
            r.u8 = k1[base + min(8u, last)];
            r.u9 = k1[base + min(9u, last)];
            r.u10 = k1[base + min(10u, last)];
            r.u11 = k1[base + min(11u, last)];
            r.u12 = k1[base + min(12u, last)];
            r.u13 = k1[base + min(13u, last)];
            r.u14 = k1[base + min(14u, last)];
            r.u15 = k1[base + min(15u, last)];
        }
        case 2u: {
            r.u0 = k2[base];
            r.u1 = k2[base + min(1u, last)];
            r.u2 = k2[base + min(2u, last)];
            r.u3 = k2[base + min(3u, last)];
            r.u4 = k2[base + min(4u, last)];
            r.u5 = k2[base + min(5u, last)];
            r.u6 = k2[base + min(6u, last)];
            r.u7 = k2[base + min(7u, last)];
            r.u8 = k2[base + min(8u, last)];
            r.u9 = k2[base + min(9u, last)];
            r.u10 = k2[base + min(10u, last)];
            r.u11 = k2[base + min(11u, last)];
            r.u12 = k2[base + min(12u, last)];
            r.u13 = k2[base + min(13u, last)];
            r.u14 = k2[base + min(14u, last)];
            r.u15 = k2[base + min(15u, last)];
        }
        case 3u: {
            r.u0 = k3[base];
            r.u1 = k3[base + min(1u, last)];
            r.u2 = k3[base + min(2u, last)];
            r.u3 = k3[base + min(3u, last)];
            r.u4 = k3[base + min(4u, last)];
            r.u5 = k3[base + min(5u, last)];
            r.u6 = k3[base + min(6u, last)];
            r.u7 = k3[base + min(7u, last)];
            r.u8 = k3[base + min(8u, last)];
            r.u9 = k3[base + min(9u, last)];
            r.u10 = k3[base + min(10u, last)];
            r.u11 = k3[base + min(11u, last)];
            r.u12 = k3[base + min(12u, last)];
            r.u13 = k3[base + min(13u, last)];
            r.u14 = k3[base + min(14u, last)];
            r.u15 = k3[base + min(15u, last)];
        }
        case 4u: {
            r.u0 = k4[base];
            r.u1 = k4[base + min(1u, last)];
            r.u2 = k4[base + min(2u, last)];
            r.u3 = k4[base + min(3u, last)];
            r.u4 = k4[base + min(4u, last)];
            r.u5 = k4[base + min(5u, last)];
            r.u6 = k4[base + min(6u, last)];
            r.u7 = k4[base + min(7u, last)];
            r.u8 = k4[base + min(8u, last)];
            r.u9 = k4[base + min(9u, last)];
            r.u10 = k4[base + min(10u, last)];
            r.u11 = k4[base + min(11u, last)];
            r.u12 = k4[base + min(12u, last)];
            r.u13 = k4[base + min(13u, last)];
            r.u14 = k4[base + min(14u, last)];
            r.u15 = k4[base + min(15u, last)];
        }
        case 5u: {
            r.u0 = k5[base];
            r.u1 = k5[base + min(1u, last)];
            r.u2 = k5[base + min(2u, last)];
            r.u3 = k5[base + min(3u, last)];
            r.u4 = k5[base + min(4u, last)];
            r.u5 = k5[base + min(5u, last)];
            r.u6 = k5[base + min(6u, last)];
            r.u7 = k5[base + min(7u, last)];
            r.u8 = k5[base + min(8u, last)];
            r.u9 = k5[base + min(9u, last)];
            r.u10 = k5[base + min(10u, last)];
            r.u11 = k5[base + min(11u, last)];
            r.u12 = k5[base + min(12u, last)];
            r.u13 = k5[base + min(13u, last)];
            r.u14 = k5[base + min(14u, last)];
            r.u15 = k5[base + min(15u, last)];
        }
        case 6u: {
            r.u0 = k6[base];
            r.u1 = k6[base + min(1u, last)];
            r.u2 = k6[base + min(2u, last)];
            r.u3 = k6[base + min(3u, last)];
            r.u4 = k6[base + min(4u, last)];
            r.u5 = k6[base + min(5u, last)];
            r.u6 = k6[base + min(6u, last)];
            r.u7 = k6[base + min(7u, last)];
            r.u8 = k6[base + min(8u, last)];
            r.u9 = k6[base + min(9u, last)];
            r.u10 = k6[base + min(10u, last)];
            r.u11 = k6[base + min(11u, last)];
            r.u12 = k6[base + min(12u, last)];
            r.u13 = k6[base + min(13u, last)];
            r.u14 = k6[base + min(14u, last)];
            r.u15 = k6[base + min(15u, last)];
        }
        case 7u: {
            r.u0 = k7[base];
            r.u1 = k7[base + min(1u, last)];
            r.u2 = k7[base + min(2u, last)];
            r.u3 = k7[base + min(3u, last)];
            r.u4 = k7[base + min(4u, last)];
            r.u5 = k7[base + min(5u, last)];
            r.u6 = k7[base + min(6u, last)];
            r.u7 = k7[base + min(7u, last)];
            r.u8 = k7[base + min(8u, last)];
            r.u9 = k7[base + min(9u, last)];
            r.u10 = k7[base + min(10u, last)];
            r.u11 = k7[base + min(11u, last)];
            r.u12 = k7[base + min(12u, last)];
            r.u13 = k7[base + min(13u, last)];
            r.u14 = k7[base + min(14u, last)];
            r.u15 = k7[base + min(15u, last)];
        }
        case 8u: {
            r.u0 = k8[base];
            r.u1 = k8[base + min(1u, last)];
            r.u2 = k8[base + min(2u, last)];
            r.u3 = k8[base + min(3u, last)];
            r.u4 = k8[base + min(4u, last)];
            r.u5 = k8[base + min(5u, last)];
            r.u6 = k8[base + min(6u, last)];
            r.u7 = k8[base + min(7u, last)];
            r.u8 = k8[base + min(8u, last)];
            r.u9 = k8[base + min(9u, last)];
            r.u10 = k8[base + min(10u, last)];
            r.u11 = k8[base + min(11u, last)];
            r.u12 = k8[base + min(12u, last)];
            r.u13 = k8[base + min(13u, last)];
            r.u14 = k8[base + min(14u, last)];
            r.u15 = k8[base + min(15u, last)];
        }
        case 9u: {
            r.u0 = k9[base];
            r.u1 = k9[base + min(1u, last)];
            r.u2 = k9[base + min(2u, last)];
            r.u3 = k9[base + min(3u, last)];
            r.u4 = k9[base + min(4u, last)];
            r.u5 = k9[base + min(5u, last)];
            r.u6 = k9[base + min(6u, last)];
            r.u7 = k9[base + min(7u, last)];
            r.u8 = k9[base + min(8u, last)];
            r.u9 = k9[base + min(9u, last)];
            r.u10 = k9[base + min(10u, last)];
            r.u11 = k9[base + min(11u, last)];
            r.u12 = k9[base + min(12u, last)];
            r.u13 = k9[base + min(13u, last)];
            r.u14 = k9[base + min(14u, last)];
            r.u15 = k9[base + min(15u, last)];
        }
        case 10u: {
            r.u0 = k10[base];
            r.u1 = k10[base + min(1u, last)];
            r.u2 = k10[base + min(2u, last)];
            r.u3 = k10[base + min(3u, last)];
            r.u4 = k10[base + min(4u, last)];
            r.u5 = k10[base + min(5u, last)];
            r.u6 = k10[base + min(6u, last)];
            r.u7 = k10[base + min(7u, last)];
            r.u8 = k10[base + min(8u, last)];
            r.u9 = k10[base + min(9u, last)];
            r.u10 = k10[base + min(10u, last)];
            r.u11 = k10[base + min(11u, last)];
            r.u12 = k10[base + min(12u, last)];
            r.u13 = k10[base + min(13u, last)];
            r.u14 = k10[base + min(14u, last)];
            r.u15 = k10[base + min(15u, last)];
        }
        case 11u: {
            r.u0 = k11[base];
            r.u1 = k11[base + min(1u, last)];
            r.u2 = k11[base + min(2u, last)];
            r.u3 = k11[base + min(3u, last)];
            r.u4 = k11[base + min(4u, last)];
            r.u5 = k11[base + min(5u, last)];
            r.u6 = k11[base + min(6u, last)];
            r.u7 = k11[base + min(7u, last)];
            r.u8 = k11[base + min(8u, last)];
            r.u9 = k11[base + min(9u, last)];
            r.u10 = k11[base + min(10u, last)];
            r.u11 = k11[base + min(11u, last)];
            r.u12 = k11[base + min(12u, last)];
            r.u13 = k11[base + min(13u, last)];
            r.u14 = k11[base + min(14u, last)];
            r.u15 = k11[base + min(15u, last)];
        }
        case 12u: {
            r.u0 = k12[base];
            r.u1 = k12[base + min(1u, last)];
            r.u2 = k12[base + min(2u, last)];
            r.u3 = k12[base + min(3u, last)];
            r.u4 = k12[base + min(4u, last)];
            r.u5 = k12[base + min(5u, last)];
            r.u6 = k12[base + min(6u, last)];
            r.u7 = k12[base + min(7u, last)];
            r.u8 = k12[base + min(8u, last)];
            r.u9 = k12[base + min(9u, last)];
            r.u10 = k12[base + min(10u, last)];
            r.u11 = k12[base + min(11u, last)];
            r.u12 = k12[base + min(12u, last)];
            r.u13 = k12[base + min(13u, last)];
            r.u14 = k12[base + min(14u, last)];
            r.u15 = k12[base + min(15u, last)];
        }
        case 13u: {
            r.u0 = k13[base];
            r.u1 = k13[base + min(1u, last)];
            r.u2 = k13[base + min(2u, last)];
            r.u3 = k13[base + min(3u, last)];
            r.u4 = k13[base + min(4u, last)];
            r.u5 = k13[base + min(5u, last)];
            r.u6 = k13[base + min(6u, last)];
            r.u7 = k13[base + min(7u, last)];
            r.u8 = k13[base + min(8u, last)];
            r.u9 = k13[base + min(9u, last)];
            r.u10 = k13[base + min(10u, last)];
            r.u11 = k13[base + min(11u, last)];
            r.u12 = k13[base + min(12u, last)];
            r.u13 = k13[base + min(13u, last)];
            r.u14 = k13[base + min(14u, last)];
            r.u15 = k13[base + min(15u, last)];
        }
        case 14u: {
            r.u0 = k14[base];
            r.u1 = k14[base + min(1u, last)];
            r.u2 = k14[base + min(2u, last)];
            r.u3 = k14[base + min(3u, last)];
            r.u4 = k14[base + min(4u, last)];
            r.u5 = k14[base + min(5u, last)];
            r.u6 = k14[base + min(6u, last)];
            r.u7 = k14[base + min(7u, last)];
            r.u8 = k14[base + min(8u, last)];
            r.u9 = k14[base + min(9u, last)];
            r.u10 = k14[base + min(10u, last)];
            r.u11 = k14[base + min(11u, last)];
            r.u12 = k14[base + min(12u, last)];
            r.u13 = k14[base + min(13u, last)];
            r.u14 = k14[base + min(14u, last)];
            r.u15 = k14[base + min(15u, last)];
        }
        default: {
            r.u0 = k15[base];
            r.u1 = k15[base + min(1u, last)];
            r.u2 = k15[base + min(2u, last)];
            r.u3 = k15[base + min(3u, last)];
            r.u4 = k15[base + min(4u, last)];
            r.u5 = k15[base + min(5u, last)];
            r.u6 = k15[base + min(6u, last)];
            r.u7 = k15[base + min(7u, last)];
            r.u8 = k15[base + min(8u, last)];
            r.u9 = k15[base + min(9u, last)];
            r.u10 = k15[base + min(10u, last)];
            r.u11 = k15[base + min(11u, last)];
            r.u12 = k15[base + min(12u, last)];
            r.u13 = k15[base + min(13u, last)];
            r.u14 = k15[base + min(14u, last)];
            r.u15 = k15[base + min(15u, last)];
        }
    }
    return r;
}

// Adds unit c of a key row to the 8 head dots (h0..h0+7).
fn add_unit(a: ptr<function, array<vec4<f32>, 2>>, h0: u32, c: u32, kw: vec4<u32>) {
    if (c >= ID / 8u) {
        return;
    }
    let ka = vec4<f32>(lo(kw.x), hi(kw.x), lo(kw.y), hi(kw.y));
    let kb = vec4<f32>(lo(kw.z), hi(kw.z), lo(kw.w), hi(kw.w));
    (*a)[0] += vec4<f32>(hdot(h0, c, ka, kb), hdot(h0 + 1u, c, ka, kb), hdot(h0 + 2u, c, ka, kb), hdot(h0 + 3u, c, ka, kb));
    (*a)[1] += vec4<f32>(hdot(h0 + 4u, c, ka, kb), hdot(h0 + 5u, c, ka, kb), hdot(h0 + 6u, c, ka, kb), hdot(h0 + 7u, c, ka, kb));
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
    // Every thread loads a row (a clamped position past the end; its score is dropped below).
    let valid = pos < p.n_pos && pos <= p.q_pos0 + t;
    let at = locate(min(pos, p.n_pos - 1u));
    let k = key_row(at.x, at.y * (ID / 8u));
    let h0 = g * 8u;
    var a: array<vec4<f32>, 2>;
    add_unit(&a, h0, 0u, k.u0);
    add_unit(&a, h0, 1u, k.u1);
    add_unit(&a, h0, 2u, k.u2);
    add_unit(&a, h0, 3u, k.u3);
    add_unit(&a, h0, 4u, k.u4);
    add_unit(&a, h0, 5u, k.u5);
    add_unit(&a, h0, 6u, k.u6);
    add_unit(&a, h0, 7u, k.u7);
    add_unit(&a, h0, 8u, k.u8);
    add_unit(&a, h0, 9u, k.u9);
    add_unit(&a, h0, 10u, k.u10);
    add_unit(&a, h0, 11u, k.u11);
    add_unit(&a, h0, 12u, k.u12);
    add_unit(&a, h0, 13u, k.u13);
    add_unit(&a, h0, 14u, k.u14);
    add_unit(&a, h0, 15u, k.u15);
    let w0 = vec4<f32>(ws[h0], ws[h0 + 1u], ws[h0 + 2u], ws[h0 + 3u]);
    let w1 = vec4<f32>(ws[h0 + 4u], ws[h0 + 5u], ws[h0 + 6u], ws[h0 + 7u]);
    let score = select(0.0, dot(w0, max(a[0], vec4<f32>(0.0))) + dot(w1, max(a[1], vec4<f32>(0.0))), valid);
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
