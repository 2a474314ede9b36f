// Prefill (grouped) routed experts, SIMT form for every adapter (the cooperative-matrix twin
// is moe_coop.wgsl). Same contract as expert_up_grouped / expert_down_grouped in moe.wgsl:
//   stage 1 (UP):  h[pair, r]  = act(w1_e z_t, w3_e z_t)[r]   for the pairs of one tile
//   stage 2:       yk[pair, r] = (w2_e h[pair])[r]
// then moe_combine (moe.wgsl) sums yk per token in a fixed order.
//
// moe_tiles: tiles[] from count[] (lib/moe_tiles.wgsl), one workgroup.
// expert_tiled: grid (row tiles, tile bound); one workgroup = BM routed pairs x BR weight rows,
//   K in steps of KS: the weight rows' MXFP4 group (or 32 bf16) is decoded once per step
//   into workgroup memory and used by all BM pairs; each thread keeps 4 pairs x 8 rows in
//   registers (vec4 accumulators, no indexed private arrays). The next step's global loads
//   (16 bytes each) are issued before the current step's products.
// Preconditions as moe.wgsl (widths multiples of 32 for MXFP4, 8 for bf16).

#include "lib/experts.wgsl"
#include "lib/moe_tiles.wgsl"

// true: stage 1 (w1/w3, GLU); false: stage 2 (w2).
override UP: bool = true;
// false: bf16 experts (Kimi Linear).
override MXFP4: bool = true;

const WG: u32 = 256u;
const XS4: u32 = 9u; // vec4 stride of one pair's activations in xt (KS / 4 + 1: banks)

var<workgroup> wt: array<vec4<f32>, 1024>; // [KS][BR] decoded weights, k-major: 16 KiB
var<workgroup> xt: array<vec4<f32>, 576>;  // [BM][XS4] activations, pair-major: 9 KiB
var<workgroup> lut: array<f32, 16>;
var<workgroup> scan: array<u32, WG>;       // moe_tiles only

// Global loads of the next K step, held in registers: threads < BR one weight row (MXFP4:
// ld0 and the scale byte lds; bf16: ld0..ld3), the others four activation vec4s.
var<private> ld0: vec4<u32>;
var<private> ld1: vec4<u32>;
var<private> ld2: vec4<u32>;
var<private> ld3: vec4<u32>;
var<private> lds: u32;
// Accumulators: pair i of the thread's 4, weight rows ri*4..+3 (a) and 64 + ri*4..+3 (b).
var<private> a0: vec4<f32>;
var<private> a1: vec4<f32>;
var<private> a2: vec4<f32>;
var<private> a3: vec4<f32>;
var<private> b0: vec4<f32>;
var<private> b1: vec4<f32>;
var<private> b2: vec4<f32>;
var<private> b3: vec4<f32>;

// tiles[] from the per-expert counts: an exclusive scan of ceil(count / BM) over experts.
@compute @workgroup_size(256)
fn moe_tiles(@builtin(local_invocation_index) lid: u32) {
    let per = (p.num_experts + WG - 1u) / WG;
    var mine = 0u;
    for (var i = 0u; i < per; i++) {
        let e = lid * per + i;
        if (e < p.num_experts) {
            mine += (count[e] + BM - 1u) / BM;
        }
    }
    scan[lid] = mine;
    workgroupBarrier();
    for (var s = 1u; s < WG; s = s << 1u) {
        let v = select(0u, scan[max(lid, s) - s], lid >= s);
        workgroupBarrier();
        scan[lid] += v;
        workgroupBarrier();
    }
    var at = scan[lid] - mine;
    for (var i = 0u; i < per; i++) {
        let e = lid * per + i;
        if (e < p.num_experts) {
            for (var n0 = 0u; n0 < count[e]; n0 += BM) {
                tiles[1u + 2u * at] = e;
                tiles[2u + 2u * at] = n0;
                at++;
            }
        }
    }
    if (lid == WG - 1u) {
        tiles[0] = scan[WG - 1u];
    }
}

fn init_lut(lid: u32) {
    if (lid < 16u) {
        let c = lid & 7u;
        let e = c >> 1u;
        let m = f32(c & 1u);
        var mag = 0.5 * m;
        if (e > 0u) {
            mag = f32(1u << (e - 1u)) * (1.0 + 0.5 * m);
        }
        lut[lid] = select(mag, -mag, (lid & 8u) != 0u);
    }
}

fn scale_byte(base4: u32, byte: u32) -> u32 {
    let v = pool[base4 + (byte >> 4u)];
    return (v[(byte >> 2u) & 3u] >> (8u * (byte & 3u))) & 0xffu;
}

// Activation vec4 j of this thread (j * 128 + a over BM pairs x KS / 4), or zero.
fn x_load(j: u32, a: u32, k0: u32, head: vec4<u32>) -> vec4<u32> {
    let tt = j * (BR / 8u) + a / 8u;
    let part = a % 8u;
    let width = k_width();
    if (tt >= head.z || k0 + part * 4u >= width) {
        return vec4<u32>(0u);
    }
    return bitcast<vec4<u32>>(x[(x_row(tile_pairs[tt]) * width + k0) / 4u + part]);
}

fn fetch(k0: u32, lid: u32, base: u32, r0: u32, head: vec4<u32>) {
    ld0 = vec4<u32>(0u);
    ld1 = vec4<u32>(0u);
    ld2 = vec4<u32>(0u);
    ld3 = vec4<u32>(0u);
    lds = 0u;
    if (lid < BR) {
        let row = b_row(lid, r0);
        if (row < b_rows()) {
            let off = b_offsets(lid);
            let width = k_width();
            if (MXFP4) {
                let groups = width / 32u;
                let g = k0 / 32u;
                ld0 = pool[base + off.x + row * groups + g];
                lds = scale_byte(base, off.y + row * groups + g);
            } else {
                // bf16 widths are multiples of 8: units past the row end stay zero.
                let units = width / 8u;
                let u0 = k0 / 8u;
                let at = base + off.x + row * units + u0;
                if (u0 < units) {
                    ld0 = pool[at];
                }
                if (u0 + 1u < units) {
                    ld1 = pool[at + 1u];
                }
                if (u0 + 2u < units) {
                    ld2 = pool[at + 2u];
                }
                if (u0 + 3u < units) {
                    ld3 = pool[at + 3u];
                }
            }
        }
    } else {
        let a = lid - BR;
        ld0 = x_load(0u, a, k0, head);
        ld1 = x_load(1u, a, k0, head);
        ld2 = x_load(2u, a, k0, head);
        ld3 = x_load(3u, a, k0, head);
    }
}

fn put_w(k: u32, b: u32, v: f32) {
    wt[k * (BR / 4u) + b / 4u][b % 4u] = v;
}

fn bf_lo(w: u32) -> f32 {
    return bitcast<f32>(w << 16u);
}

fn bf_hi(w: u32) -> f32 {
    return bitcast<f32>(w & 0xffff0000u);
}

// 8 bf16 weights (one 16-byte unit) at k = 8u .. 8u + 7 of B row b.
fn put_bf16_unit(b: u32, u: u32, q: vec4<u32>) {
    for (var w = 0u; w < 4u; w++) {
        put_w(u * 8u + 2u * w, b, bf_lo(q[w]));
        put_w(u * 8u + 2u * w + 1u, b, bf_hi(q[w]));
    }
}

fn put_x(j: u32, a: u32, v: vec4<u32>) {
    xt[(j * (BR / 8u) + a / 8u) * XS4 + a % 8u] = bitcast<vec4<f32>>(v);
}

// Registers -> workgroup tiles (weights decoded here, once per step for all pairs).
fn stage(lid: u32) {
    if (lid < BR) {
        if (MXFP4) {
            let s = e8m0(lds);
            for (var w = 0u; w < 4u; w++) {
                let q = ld0[w];
                for (var i = 0u; i < 8u; i++) {
                    put_w(w * 8u + i, lid, s * lut[(q >> (4u * i)) & 15u]);
                }
            }
        } else {
            put_bf16_unit(lid, 0u, ld0);
            put_bf16_unit(lid, 1u, ld1);
            put_bf16_unit(lid, 2u, ld2);
            put_bf16_unit(lid, 3u, ld3);
        }
    } else {
        let a = lid - BR;
        put_x(0u, a, ld0);
        put_x(1u, a, ld1);
        put_x(2u, a, ld2);
        put_x(3u, a, ld3);
    }
}

// One k of the step: this thread's 4 pairs (activations x0..x3) times its 8 weight rows.
fn kstep(k: u32, ri: u32, x0: f32, x1: f32, x2: f32, x3: f32) {
    let wa = wt[k * (BR / 4u) + ri];
    let wb = wt[k * (BR / 4u) + BR / 8u + ri];
    a0 += x0 * wa;
    a1 += x1 * wa;
    a2 += x2 * wa;
    a3 += x3 * wa;
    b0 += x0 * wb;
    b1 += x1 * wb;
    b2 += x2 * wb;
    b3 += x3 * wb;
}

// Results of tile pair i (this thread's pair ti): GLU of (a, b) in stage 1, both in stage 2.
fn emit(i: u32, av: vec4<f32>, bv: vec4<f32>, r0: u32, ri: u32, n: u32) {
    if (i >= n) {
        return;
    }
    let pair = tile_pairs[i];
    for (var c = 0u; c < 4u; c++) {
        let row = r0 + ri * 4u + c;
        if (UP) {
            if (row < p.n_mid) {
                out[pair * p.n_mid + row] = glu(av[c], bv[c]);
            }
        } else {
            if (row < p.n_in) {
                out[pair * p.n_in + row] = av[c];
            }
            if (row + BR / 2u < p.n_in) {
                out[pair * p.n_in + row + BR / 2u] = bv[c];
            }
        }
    }
}

@compute @workgroup_size(256)
fn expert_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    init_lut(lid);
    let head = load_tile(wg.y, lid);
    if (head.w == 0u) {
        return;
    }
    let base = slot_base(head.x);
    let r0 = row_base(wg.x);
    let width = k_width();
    let ri = lid % 16u; // weight rows ri*4..+3 and 64 + ri*4..+3
    let tt = lid / 16u; // tile pairs tt*4..+3
    fetch(0u, lid, base, r0, head);
    for (var k0 = 0u; k0 < width; k0 += KS) {
        workgroupBarrier();
        stage(lid);
        if (k0 + KS < width) {
            fetch(k0 + KS, lid, base, r0, head);
        }
        workgroupBarrier();
        if (tt * 4u < head.z) {
            for (var k4 = 0u; k4 < KS / 4u; k4++) {
                let x0 = xt[(tt * 4u) * XS4 + k4];
                let x1 = xt[(tt * 4u + 1u) * XS4 + k4];
                let x2 = xt[(tt * 4u + 2u) * XS4 + k4];
                let x3 = xt[(tt * 4u + 3u) * XS4 + k4];
                kstep(k4 * 4u, ri, x0.x, x1.x, x2.x, x3.x);
                kstep(k4 * 4u + 1u, ri, x0.y, x1.y, x2.y, x3.y);
                kstep(k4 * 4u + 2u, ri, x0.z, x1.z, x2.z, x3.z);
                kstep(k4 * 4u + 3u, ri, x0.w, x1.w, x2.w, x3.w);
            }
        }
    }
    emit(tt * 4u, a0, b0, r0, ri, head.z);
    emit(tt * 4u + 1u, a1, b1, r0, ri, head.z);
    emit(tt * 4u + 2u, a2, b2, r0, ri, head.z);
    emit(tt * 4u + 3u, a3, b3, r0, ri, head.z);
}
