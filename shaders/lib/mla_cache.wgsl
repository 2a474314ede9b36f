// Included by the MLA kernels (mla.wgsl, mla_coop.wgsl): their parameters, the selection and
// the paged latent cache (spec 5.4).

struct MlaParams {
    n_heads: u32,
    latent: u32,
    rope: u32,
    nope: u32,
    v_dim: u32,
    n_queries: u32,
    q_pos0: u32,
    k: u32,
    splits: u32,
    dense: u32,
    has_gate: u32,
    q_stride: u32,
    page0: u32,
    shift_max: u32,
    scale: f32,
    logit_stride: u32,
}

@group(0) @binding(0) var<uniform> p: MlaParams;
@group(0) @binding(4) var<storage, read> sel: array<i32>;
@group(0) @binding(6) var<storage, read> c0: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> c1: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read> c2: array<vec4<u32>>;
@group(0) @binding(9) var<storage, read> c3: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read> c4: array<vec4<u32>>;
@group(0) @binding(11) var<storage, read> c5: array<vec4<u32>>;
@group(0) @binding(12) var<storage, read> c6: array<vec4<u32>>;
@group(0) @binding(13) var<storage, read> c7: array<vec4<u32>>;
@group(0) @binding(14) var<storage, read> c8: array<vec4<u32>>;
@group(0) @binding(15) var<storage, read> c9: array<vec4<u32>>;
@group(0) @binding(16) var<storage, read> c10: array<vec4<u32>>;
@group(0) @binding(17) var<storage, read> c11: array<vec4<u32>>;
@group(0) @binding(18) var<storage, read> c12: array<vec4<u32>>;
@group(0) @binding(19) var<storage, read> c13: array<vec4<u32>>;
@group(0) @binding(20) var<storage, read> c14: array<vec4<u32>>;
@group(0) @binding(21) var<storage, read> c15: array<vec4<u32>>;

// 16-byte unit i of page `page` (rows are (R + E) / 8 units; R + E is a multiple of 8).
fn page_unit(page: u32, i: u32) -> vec4<u32> {
    switch page {
        case 0u: { return c0[i]; }
        case 1u: { return c1[i]; }
        case 2u: { return c2[i]; }
        case 3u: { return c3[i]; }
        case 4u: { return c4[i]; }
        case 5u: { return c5[i]; }
        case 6u: { return c6[i]; }
        case 7u: { return c7[i]; }
        case 8u: { return c8[i]; }
        case 9u: { return c9[i]; }
        case 10u: { return c10[i]; }
        case 11u: { return c11[i]; }
        case 12u: { return c12[i]; }
        case 13u: { return c13[i]; }
        case 14u: { return c14[i]; }
        default: { return c15[i]; }
    }
}

fn page_word(page: u32, i: u32) -> u32 {
    return page_unit(page, i >> 2u)[i & 3u];
}

#include "lib/page_locate.wgsl"

const NONE: u32 = 0xffffffffu;

// Position of selection entry idx of query t (every position when dense); NONE past r1 or
// for a -1 padding entry.
fn selected_pos(t: u32, idx: u32, r1: u32) -> u32 {
    if (idx >= r1) {
        return NONE;
    }
    if (p.dense != 0u) {
        return idx;
    }
    let s = sel[t * p.k + idx];
    // Clamped to the causal limit: a bad entry reads a valid row, never past the pages.
    return select(NONE, min(u32(s), p.q_pos0 + t), s >= 0);
}

fn n_selected(t: u32) -> u32 {
    let n_valid = p.q_pos0 + t + 1u;
    return select(min(p.k, n_valid), n_valid, p.dense != 0u);
}

// bf16 halves of a cache or weight word.
fn lo(x: u32) -> f32 {
    return bitcast<f32>(x << 16u);
}

fn hi(x: u32) -> f32 {
    return bitcast<f32>(x & 0xffff0000u);
}

// Elements 0-3 and 4-7 of a 16-byte unit of eight bf16 (element 2i is the low half of word i).
fn first4(x: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(lo(x.x), hi(x.x), lo(x.y), hi(x.y));
}

fn last4(x: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(lo(x.z), hi(x.z), lo(x.w), hi(x.w));
}
