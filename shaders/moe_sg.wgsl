// Subgroup variants of the MXFP4 decode expert kernels of moe.wgsl (same slot layout,
// params and results; see its header). One subgroup per weight row: lanes stride over the
// row's 32-weight groups and the row total comes from subgroupAdd, so a workgroup needs no
// barrier and no shared memory; E2M1 is decoded arithmetically. A separate file because
// a module that uses subgroup operations needs the SUBGROUP feature as a whole; adapters
// without it keep moe.wgsl.
// Preconditions (host-checked): as moe.wgsl; MXFP4 experts.

struct ExpertParams {
    tokens: u32,
    top_k: u32,
    n_in: u32,
    n_mid: u32,
    table_base: u32,
    num_experts: u32,
    slot_words4: u32,
    act: u32,
    off_w1: u32,
    off_w3: u32,
    off_w2: u32,
    off_s1: u32,
    off_s3: u32,
    off_s2: u32,
    beta: f32,
    linear_beta: f32,
}

@group(0) @binding(0) var<uniform> p: ExpertParams;
@group(0) @binding(1) var<storage, read> pool: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read> idx: array<u32>;
@group(0) @binding(4) var<storage, read> wts: array<f32>;
@group(0) @binding(5) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

// Weight rows per workgroup; the workgroup's subgroups share them out.
override RPW: u32 = 16u;

fn e8m0(s: u32) -> f32 {
    return select(bitcast<f32>(s << 23u), bitcast<f32>(0x00400000u), s == 0u);
}

fn pool_byte(base4: u32, byte: u32) -> u32 {
    let v = pool[base4 + (byte >> 4u)];
    return (v[(byte >> 2u) & 3u] >> (8u * (byte & 3u))) & 0xffu;
}

// E2M1 nibbles (low 4 bits of each lane) to f32 by building the float's bits: exponent
// e + 126 and mantissa bit m for e > 0, 0.5 or 0 for e = 0, sign from bit 3. Arithmetic
// instead of a table lookup per nibble (the lookups bound the table version).
fn e2m1x4(n: vec4<u32>) -> vec4<f32> {
    let e = (n >> vec4<u32>(1u)) & vec4<u32>(3u);
    let m = n & vec4<u32>(1u);
    let normal = ((e + vec4<u32>(126u)) << vec4<u32>(23u)) | (m << vec4<u32>(22u));
    let small = m * vec4<u32>(126u << 23u);
    let bits = select(normal, small, e == vec4<u32>(0u)) | ((n & vec4<u32>(8u)) << vec4<u32>(28u));
    return bitcast<vec4<f32>>(bits);
}

fn nib8(word: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let lo = e2m1x4((vec4<u32>(word) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));
    let hi = e2m1x4((vec4<u32>(word) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u));
    return dot(lo, a) + dot(hi, b);
}

// One MXFP4 group (4 words = 32 weights) times 32 activations held in registers.
fn group_dot_v(q: vec4<u32>, xv: array<vec4<f32>, 8>) -> f32 {
    return nib8(q.x, xv[0], xv[1]) + nib8(q.y, xv[2], xv[3]) + nib8(q.z, xv[4], xv[5]) + nib8(q.w, xv[6], xv[7]);
}

fn tanh_f(v: f32) -> f32 {
    let e = exp(-2.0 * abs(v));
    return sign(v) * (1.0 - e) / (1.0 + e);
}

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

fn glu(g: f32, u: f32) -> f32 {
    if (p.act == 1u) {
        return g * sigmoid(g) * u;
    }
    var up = u;
    if (p.linear_beta > 0.0) {
        up = p.linear_beta * tanh_f(u / p.linear_beta);
    }
    return p.beta * tanh_f(g / p.beta) * sigmoid(g) * up;
}

fn slot_base(e: u32) -> u32 {
    return table[p.table_base + e] * p.slot_words4;
}

// Rows one subgroup works on together: each lane loads a group of activations once and
// uses it for RS rows (activation reads were 8x the weight bytes with one row at a time).
const RS: u32 = 4u;

// Stage 1: grid (ceil(n_mid / RPW), tokens * top_k); h[pair, r] = act(w1 z, w3 z)[r].
@compute @workgroup_size(128)
fn expert_up_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let pair = wg.y;
    if (pair >= p.tokens * p.top_k) {
        return;
    }
    let base = slot_base(idx[pair]);
    let xb = (pair / p.top_k) * (p.n_in / 4u);
    let groups = p.n_in / 32u;
    for (var r0 = sg * RS; r0 < RPW; r0 += nsg * RS) {
        let row0 = wg.x * RPW + r0;
        if (row0 >= p.n_mid) {
            break;
        }
        var ga: array<f32, RS>;
        var ua: array<f32, RS>;
        for (var g = lane; g < groups; g += sgs) {
            let xo = xb + g * 8u;
            let xv = array<vec4<f32>, 8>(x[xo], x[xo + 1u], x[xo + 2u], x[xo + 3u], x[xo + 4u], x[xo + 5u], x[xo + 6u], x[xo + 7u]);
            for (var i = 0u; i < RS; i++) {
                let row = min(row0 + i, p.n_mid - 1u);
                let q1 = pool[base + p.off_w1 + row * groups + g];
                let q3 = pool[base + p.off_w3 + row * groups + g];
                ga[i] += e8m0(pool_byte(base, p.off_s1 + row * groups + g)) * group_dot_v(q1, xv);
                ua[i] += e8m0(pool_byte(base, p.off_s3 + row * groups + g)) * group_dot_v(q3, xv);
            }
        }
        for (var i = 0u; i < RS; i++) {
            let gs = subgroupAdd(ga[i]);
            let us = subgroupAdd(ua[i]);
            if (lane == 0u && row0 + i < p.n_mid) {
                out[pair * p.n_mid + row0 + i] = glu(gs, us);
            }
        }
    }
}

// Stage 2: grid (ceil(n_in / RPW), tokens); y[t, r] = sum_j wts[pair] (w2_e h[pair])[r],
// experts in the fixed j order.
@compute @workgroup_size(128)
fn expert_down_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let t = wg.y;
    if (t >= p.tokens) {
        return;
    }
    let groups = p.n_mid / 32u;
    for (var r0 = sg * RS; r0 < RPW; r0 += nsg * RS) {
        let row0 = wg.x * RPW + r0;
        if (row0 >= p.n_in) {
            break;
        }
        var acc: array<f32, RS>;
        for (var j = 0u; j < p.top_k; j++) {
            let pair = t * p.top_k + j;
            let base = slot_base(idx[pair]);
            let xb = pair * (p.n_mid / 4u);
            let wt = wts[pair];
            for (var g = lane; g < groups; g += sgs) {
                let xo = xb + g * 8u;
                let xv = array<vec4<f32>, 8>(x[xo], x[xo + 1u], x[xo + 2u], x[xo + 3u], x[xo + 4u], x[xo + 5u], x[xo + 6u], x[xo + 7u]);
                for (var i = 0u; i < RS; i++) {
                    let row = min(row0 + i, p.n_in - 1u);
                    let q = pool[base + p.off_w2 + row * groups + g];
                    acc[i] += wt * e8m0(pool_byte(base, p.off_s2 + row * groups + g)) * group_dot_v(q, xv);
                }
            }
        }
        for (var i = 0u; i < RS; i++) {
            let total = subgroupAdd(acc[i]);
            if (lane == 0u && row0 + i < p.n_in) {
                out[t * p.n_in + row0 + i] = total;
            }
        }
    }
}
