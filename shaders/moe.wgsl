// Routed experts of one MoE layer. Expert weights live in fixed-size slots of one pool
// buffer; `table[table_base + e]` names the slot of expert e of this layer, so a pager can
// refill slots without any change here. Routing (idx, wts) is read from GPU memory.
//
// Slot layout (offsets in the params, set by the host from the expert store):
//   MXFP4: w1, w3 packed [n_mid, n_in/2] u8, w2 packed [n_in, n_mid/2] u8 (offsets in
//          16-byte units); w1, w3 scales [n_mid, n_in/32] u8, w2 scales [n_in, n_mid/32] u8
//          (offsets in bytes). Element (r, c) = E2M1(nibble c of row r; even c = low nibble)
//          * 2^(scale[r, c/32] - 127).
//   bf16:  w1, w3 [n_mid, n_in], w2 [n_in, n_mid], two per u32 (offsets in 16-byte units).
// Preconditions (host-checked): n_in and n_mid are multiples of 32 (MXFP4) or 8 (bf16);
// idx holds expert ids < num_experts; every table entry used names a filled slot.
//
// Kernels:
//   expert_up       h[pair, r]   = act(w1_e z_t, w3_e z_t)[r]        pair = t * top_k + j
//   expert_down     y[t, r]      = sum_j wts[pair] (w2_e h[pair])[r]  (decode: fixed j order)
//   moe_group       list[e, n]   = pairs routed to e, in pair order; count[e]
//   expert_up_grouped / expert_down_grouped: the same products tiled over the tokens routed
//                   to one expert (prefill: each expert's weights stream once per chunk)
//   moe_combine     y[t, r]      = sum_j wts[pair] yk[pair, r]
//   mxfp4_dequant   bits of the dequantised matrix (integer-only decode, bit-exact)

#include "lib/experts.wgsl"
@group(0) @binding(7) var<storage, read_write> list: array<u32>;
@group(0) @binding(8) var<storage, read_write> count: array<u32>;

const WG: u32 = 128u;
const MAX_ROWS: u32 = 4u;
// Rows of the weight matrix per workgroup in the decode kernels.
override ROWS: u32 = 2u;
// false: bf16 experts (Kimi Linear).
override MXFP4: bool = true;

var<workgroup> lut: array<f32, 16>;
var<workgroup> red: array<f32, 1024>; // [2 * MAX_ROWS, WG]

// E2M1 value of a nibble, in workgroup memory: 16 entries in 16 banks, no conflicts.
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
    workgroupBarrier();
}

fn pool_byte(base4: u32, byte: u32) -> u32 {
    let v = pool[base4 + (byte >> 4u)];
    return (v[(byte >> 2u) & 3u] >> (8u * (byte & 3u))) & 0xffu;
}

fn nib8(word: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let lo = vec4<f32>(lut[word & 15u], lut[(word >> 4u) & 15u], lut[(word >> 8u) & 15u], lut[(word >> 12u) & 15u]);
    let hi = vec4<f32>(lut[(word >> 16u) & 15u], lut[(word >> 20u) & 15u], lut[(word >> 24u) & 15u], lut[word >> 28u]);
    return dot(lo, a) + dot(hi, b);
}

// One MXFP4 group: 32 weights (4 words) times 32 activations (8 vec4).
fn group_dot(q: vec4<u32>, xo: u32) -> f32 {
    return nib8(q.x, x[xo], x[xo + 1u]) + nib8(q.y, x[xo + 2u], x[xo + 3u])
        + nib8(q.z, x[xo + 4u], x[xo + 5u]) + nib8(q.w, x[xo + 6u], x[xo + 7u]);
}

fn bf2(word: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

// 8 bf16 weights times 8 activations (2 vec4).
fn bf16_dot8(q: vec4<u32>, a: vec4<f32>, b: vec4<f32>) -> f32 {
    return dot(vec4<f32>(bf2(q.x), bf2(q.y)), a) + dot(vec4<f32>(bf2(q.z), bf2(q.w)), b);
}

// Sums `n` vectors of WG partials in `red`; the totals land in red[v * WG].
fn reduce(lid: u32, n: u32) {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            for (var v = 0u; v < n; v++) {
                red[v * WG + lid] += red[v * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
}

// Decode, stage 1: grid (ceil(n_mid / ROWS), tokens * top_k).
@compute @workgroup_size(128)
fn expert_up(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    init_lut(lid);
    let pair = wg.y;
    let row0 = wg.x * ROWS;
    if (pair >= p.tokens * p.top_k || row0 >= p.n_mid) {
        return;
    }
    let base = slot_base(idx[pair]);
    let xb = (pair / p.top_k) * (p.n_in / 4u);
    var ga: array<f32, MAX_ROWS>;
    var ua: array<f32, MAX_ROWS>;
    if (MXFP4) {
        let groups = p.n_in / 32u;
        for (var g = lid; g < groups; g += WG) {
            let xo = xb + g * 8u;
            for (var r = 0u; r < ROWS; r++) {
                let row = min(row0 + r, p.n_mid - 1u);
                let q1 = pool[base + p.off_w1 + row * groups + g];
                let q3 = pool[base + p.off_w3 + row * groups + g];
                let s1 = e8m0(pool_byte(base, p.off_s1 + row * groups + g));
                let s3 = e8m0(pool_byte(base, p.off_s3 + row * groups + g));
                ga[r] += s1 * group_dot(q1, xo);
                ua[r] += s3 * group_dot(q3, xo);
            }
        }
    } else {
        let units = p.n_in / 8u;
        for (var u = lid; u < units; u += WG) {
            let a = x[xb + 2u * u];
            let b = x[xb + 2u * u + 1u];
            for (var r = 0u; r < ROWS; r++) {
                let row = min(row0 + r, p.n_mid - 1u);
                ga[r] += bf16_dot8(pool[base + p.off_w1 + row * units + u], a, b);
                ua[r] += bf16_dot8(pool[base + p.off_w3 + row * units + u], a, b);
            }
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        red[(2u * r) * WG + lid] = ga[r];
        red[(2u * r + 1u) * WG + lid] = ua[r];
    }
    reduce(lid, 2u * ROWS);
    if (lid < ROWS && row0 + lid < p.n_mid) {
        out[pair * p.n_mid + row0 + lid] = glu(red[(2u * lid) * WG], red[(2u * lid + 1u) * WG]);
    }
}

// Decode, stage 2: grid (ceil(n_in / ROWS), tokens); x = h [tokens * top_k, n_mid].
@compute @workgroup_size(128)
fn expert_down(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    init_lut(lid);
    let t = wg.y;
    let row0 = wg.x * ROWS;
    if (t >= p.tokens || row0 >= p.n_in) {
        return;
    }
    var acc: array<f32, MAX_ROWS>;
    for (var j = 0u; j < p.top_k; j++) {
        let pair = t * p.top_k + j;
        let base = slot_base(idx[pair]);
        let wt = wts[pair];
        let xb = pair * (p.n_mid / 4u);
        if (MXFP4) {
            let groups = p.n_mid / 32u;
            for (var g = lid; g < groups; g += WG) {
                let xo = xb + g * 8u;
                for (var r = 0u; r < ROWS; r++) {
                    let row = min(row0 + r, p.n_in - 1u);
                    let q = pool[base + p.off_w2 + row * groups + g];
                    let s = e8m0(pool_byte(base, p.off_s2 + row * groups + g));
                    acc[r] += wt * s * group_dot(q, xo);
                }
            }
        } else {
            let units = p.n_mid / 8u;
            for (var u = lid; u < units; u += WG) {
                let a = x[xb + 2u * u];
                let b = x[xb + 2u * u + 1u];
                for (var r = 0u; r < ROWS; r++) {
                    let row = min(row0 + r, p.n_in - 1u);
                    acc[r] += wt * bf16_dot8(pool[base + p.off_w2 + row * units + u], a, b);
                }
            }
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        red[r * WG + lid] = acc[r];
    }
    reduce(lid, ROWS);
    if (lid < ROWS && row0 + lid < p.n_in) {
        store_out(t * p.n_in + row0 + lid, red[lid * WG]);
    }
}

// Prefill grouping: one workgroup per expert scans the routing in pair order and writes
// the pairs routed to it into list[e * tokens ..] (each token picks an expert at most once).
var<workgroup> scan: array<u32, WG>;
var<workgroup> running: u32;

@compute @workgroup_size(128)
fn moe_group(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = wg.x + wg.y * nwg.x;
    if (e >= p.num_experts) {
        return;
    }
    if (lid == 0u) {
        running = 0u;
    }
    let pairs = p.tokens * p.top_k;
    for (var start = 0u; start < pairs; start += WG) {
        let i = start + lid;
        let hit = select(0u, 1u, i < pairs && idx[min(i, pairs - 1u)] == e);
        scan[lid] = hit;
        workgroupBarrier();
        // Inclusive Hillis-Steele scan over the chunk.
        for (var s = 1u; s < WG; s = s << 1u) {
            let v = select(0u, scan[max(lid, s) - s], lid >= s);
            workgroupBarrier();
            scan[lid] += v;
            workgroupBarrier();
        }
        if (hit == 1u) {
            list[e * p.tokens + running + scan[lid] - 1u] = i;
        }
        workgroupBarrier();
        if (lid == WG - 1u) {
            running += scan[WG - 1u];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        count[e] = running;
    }
}

// Tiled grouped products: TM weight rows x TN routed tokens per step, K in steps of 32.
const TM: u32 = 64u;
const TN: u32 = 16u;
var<workgroup> wt1: array<f32, 2112>; // [32, TM + 2] weight tile (k-major), w1 or w2
var<workgroup> wt3: array<f32, 2112>; // same for w3
var<workgroup> xt: array<f32, 544>;   // [32, TN + 1] activation tile (k-major)
var<workgroup> tile_pairs: array<u32, TN>;
var<workgroup> n_routed: u32;

const WS: u32 = 66u; // TM + 2
const XS: u32 = 17u; // TN + 1

// Decodes 32 weights of `row` (columns k0..k0+31) of the matrix at (off4, offs) into a tile column.
fn load_weight_row(dst_w3: bool, base: u32, off4: u32, offs: u32, row: u32, k0: u32, cols: u32, r: u32, valid: bool) {
    var v: array<f32, 32>;
    if (valid) {
        if (MXFP4) {
            let groups = cols / 32u;
            let g = k0 / 32u;
            let q = pool[base + off4 + row * groups + g];
            let s = e8m0(pool_byte(base, offs + row * groups + g));
            for (var w = 0u; w < 4u; w++) {
                for (var i = 0u; i < 8u; i++) {
                    v[w * 8u + i] = s * lut[(q[w] >> (4u * i)) & 15u];
                }
            }
        } else {
            let units = cols / 8u;
            // bf16 widths are multiples of 8, not 32: units past the row end read as zero.
            for (var u = 0u; u < 4u; u++) {
                var q = vec4<u32>(0u);
                if (k0 / 8u + u < units) {
                    q = pool[base + off4 + row * units + k0 / 8u + u];
                }
                for (var w = 0u; w < 4u; w++) {
                    let f = bf2(q[w]);
                    v[u * 8u + 2u * w] = f.x;
                    v[u * 8u + 2u * w + 1u] = f.y;
                }
            }
        }
    }
    for (var k = 0u; k < 32u; k++) {
        if (dst_w3) {
            wt3[k * WS + r] = v[k];
        } else {
            wt1[k * WS + r] = v[k];
        }
    }
}

fn routed_count(e: u32, lid: u32) -> u32 {
    if (lid == 0u) {
        n_routed = count[e];
    }
    return workgroupUniformLoad(&n_routed);
}

// Loads the activation rows of routed tokens n0..n0+TN (x row = pair / top_k when `by_token`).
fn load_x_tile(e: u32, n0: u32, n: u32, k0: u32, width: u32, by_token: bool, lid: u32) {
    if (lid < TN) {
        tile_pairs[lid] = select(0u, list[e * p.tokens + n0 + lid], n0 + lid < n);
    }
    workgroupBarrier();
    // TN rows x 8 vec4: one vec4 per thread.
    let tt = lid / 8u;
    let part = lid % 8u;
    var v = vec4<f32>(0.0);
    if (n0 + tt < n && k0 + part * 4u < width) {
        let pr = tile_pairs[tt];
        let row = select(pr, pr / p.top_k, by_token);
        v = x[(row * width + k0) / 4u + part];
    }
    xt[(part * 4u) * XS + tt] = v.x;
    xt[(part * 4u + 1u) * XS + tt] = v.y;
    xt[(part * 4u + 2u) * XS + tt] = v.z;
    xt[(part * 4u + 3u) * XS + tt] = v.w;
}

// Prefill stage 1: grid (ceil(n_mid / TM), num_experts); h[pair, r] for all pairs routed to e.
@compute @workgroup_size(128)
fn expert_up_grouped(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    init_lut(lid);
    let e = wg.y;
    let n = routed_count(e, lid);
    let row0 = wg.x * TM;
    let base = slot_base(min(e, p.num_experts - 1u));
    let rr = (lid % 16u) * 4u; // this thread's 4 rows
    let tc = (lid / 16u) * 2u; // and 2 tokens
    for (var n0 = 0u; n0 < n; n0 += TN) {
        var g: array<f32, 8>;
        var u: array<f32, 8>;
        for (var k0 = 0u; k0 < p.n_in; k0 += 32u) {
            workgroupBarrier();
            let r = lid % TM;
            let row = row0 + r;
            load_weight_row(lid >= TM, base, select(p.off_w1, p.off_w3, lid >= TM), select(p.off_s1, p.off_s3, lid >= TM), min(row, p.n_mid - 1u), k0, p.n_in, r, row < p.n_mid);
            load_x_tile(e, n0, n, k0, p.n_in, true, lid);
            workgroupBarrier();
            for (var k = 0u; k < 32u; k++) {
                let x0 = xt[k * XS + tc];
                let x1 = xt[k * XS + tc + 1u];
                for (var i = 0u; i < 4u; i++) {
                    let a = wt1[k * WS + rr + i];
                    let b = wt3[k * WS + rr + i];
                    g[i * 2u] += a * x0;
                    g[i * 2u + 1u] += a * x1;
                    u[i * 2u] += b * x0;
                    u[i * 2u + 1u] += b * x1;
                }
            }
        }
        for (var i = 0u; i < 4u; i++) {
            for (var c = 0u; c < 2u; c++) {
                let row = row0 + rr + i;
                if (row < p.n_mid && n0 + tc + c < n) {
                    out[tile_pairs[tc + c] * p.n_mid + row] = glu(g[i * 2u + c], u[i * 2u + c]);
                }
            }
        }
    }
}

// Prefill stage 2: grid (ceil(n_in / TM), num_experts); yk[pair, r] = (w2_e h[pair])[r].
@compute @workgroup_size(128)
fn expert_down_grouped(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    init_lut(lid);
    let e = wg.y;
    let n = routed_count(e, lid);
    let row0 = wg.x * TM;
    let base = slot_base(min(e, p.num_experts - 1u));
    let rr = (lid % 16u) * 4u;
    let tc = (lid / 16u) * 2u;
    for (var n0 = 0u; n0 < n; n0 += TN) {
        var acc: array<f32, 8>;
        for (var k0 = 0u; k0 < p.n_mid; k0 += 32u) {
            workgroupBarrier();
            if (lid < TM) {
                let row = row0 + lid;
                load_weight_row(false, base, p.off_w2, p.off_s2, min(row, p.n_in - 1u), k0, p.n_mid, lid, row < p.n_in);
            }
            load_x_tile(e, n0, n, k0, p.n_mid, false, lid);
            workgroupBarrier();
            for (var k = 0u; k < 32u; k++) {
                let x0 = xt[k * XS + tc];
                let x1 = xt[k * XS + tc + 1u];
                for (var i = 0u; i < 4u; i++) {
                    let a = wt1[k * WS + rr + i];
                    acc[i * 2u] += a * x0;
                    acc[i * 2u + 1u] += a * x1;
                }
            }
        }
        for (var i = 0u; i < 4u; i++) {
            for (var c = 0u; c < 2u; c++) {
                let row = row0 + rr + i;
                if (row < p.n_in && n0 + tc + c < n) {
                    out[tile_pairs[tc + c] * p.n_in + row] = acc[i * 2u + c];
                }
            }
        }
    }
}

// y[t, r] = sum_j wts[t, j] yk[t * top_k + j, r] (yk in x), j in order: one thread per output.
@compute @workgroup_size(128)
fn moe_combine(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= p.tokens * p.n_in) {
        return;
    }
    let t = i / p.n_in;
    let r = i % p.n_in;
    var acc = 0.0;
    for (var j = 0u; j < p.top_k; j++) {
        let pair = t * p.top_k + j;
        let k = pair * p.n_in + r;
        acc += wts[pair] * x[k / 4u][k % 4u];
    }
    store_out(i, acc);
}

// Bit pattern of E2M1 nibble * 2^(s - 127), integer-only (subnormals and overflow exact).
fn mxfp4_bits(nib: u32, s: u32) -> u32 {
    let sgn = (nib & 8u) << 28u;
    let c = nib & 7u;
    if (c == 0u) {
        return sgn;
    }
    if (s == 255u) {
        return 0x7fc00000u;
    }
    let e = c >> 1u;
    // magnitude = (1 + mant/2) * 2^ex
    var ex = i32(e) - 1;
    var mant = c & 1u;
    if (e == 0u) {
        ex = -1;
        mant = 0u;
    }
    let be = i32(s) + ex;
    if (be >= 255) {
        return sgn | 0x7f800000u;
    }
    if (be >= 1) {
        return sgn | (u32(be) << 23u) | (mant << 22u);
    }
    return sgn | ((2u + mant) << u32(be + 21));
}

// Dequantises the w1 matrix of slot `table[table_base]` ([n_mid, n_in]) to f32 bits in out.
@compute @workgroup_size(128)
fn mxfp4_dequant(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= p.n_mid * p.n_in) {
        return;
    }
    let base = table[p.table_base] * p.slot_words4;
    let r = i / p.n_in;
    let c = i % p.n_in;
    let byte = (p.off_w1 * 16u) + r * (p.n_in / 2u) + c / 2u;
    let nib = (pool_byte(base, byte) >> (4u * (c & 1u))) & 15u;
    let s = pool_byte(base, p.off_s1 + r * (p.n_in / 32u) + c / 32u);
    out[i] = bitcast<f32>(mxfp4_bits(nib, s));
}
