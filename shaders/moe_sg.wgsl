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

// ---- Paired-f16 decode (the *_sg2 entries). -------------------------------------------
// The E2M1 kernels above spend ~15 integer ops per weight; at 3.2 TB/s of MXFP4 the H200
// has ~4 issue slots per weight. Shifting a nibble's 3 magnitude bits to f16 bits 9-11 and
// its sign to bit 15 gives an f16 equal to the E2M1 value times 2^-14 (e = 0 lands on the
// f16 subnormal 2^-15, which is exactly 0.5 * 2^-14), so one shift-and-mask pair decodes two
// weights (one per 16-bit half) and unpack2x16float widens them; the 2^14 goes into the
// group scale. Word nibbles n0..n7 come out as pairs (n0,n4) (n1,n5) (n2,n6) (n3,n7), so the
// activations are read in that order.

@group(0) @binding(7) var<storage, read> pool_w: array<u32>;

// The group's E8M0 scale times 2^14 (exact: E8M0 0..240 stays a normal f32).
fn scale14(base4: u32, byte: u32) -> f32 {
    let b = base4 * 16u + byte;
    let s = (pool_w[b >> 2u] >> (8u * (b & 3u))) & 0xffu;
    return select(bitcast<f32>((s + 14u) << 23u), e8m0(s) * 16384.0, s > 240u);
}

// Activations of one group in pair order: xa[j] = (x0, x4, x1, x5), xb[j] = (x2, x6, x3, x7)
// of word j.
struct Xg {
    a: array<vec4<f32>, 4>,
    b: array<vec4<f32>, 4>,
}

fn load_xg(xo: u32) -> Xg {
    let l0 = x[xo];
    let h0 = x[xo + 1u];
    let l1 = x[xo + 2u];
    let h1 = x[xo + 3u];
    let l2 = x[xo + 4u];
    let h2 = x[xo + 5u];
    let l3 = x[xo + 6u];
    let h3 = x[xo + 7u];
    return Xg(
        array<vec4<f32>, 4>(vec4<f32>(l0.x, h0.x, l0.y, h0.y), vec4<f32>(l1.x, h1.x, l1.y, h1.y), vec4<f32>(l2.x, h2.x, l2.y, h2.y), vec4<f32>(l3.x, h3.x, l3.y, h3.y)),
        array<vec4<f32>, 4>(vec4<f32>(l0.z, h0.z, l0.w, h0.w), vec4<f32>(l1.z, h1.z, l1.w, h1.w), vec4<f32>(l2.z, h2.z, l2.w, h2.w), vec4<f32>(l3.z, h3.z, l3.w, h3.w)),
    );
}

fn word_dot(w: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let m = 0x0e000e00u;
    let s = 0x80008000u;
    let p0 = ((w << 9u) & m) | ((w << 12u) & s);
    let p1 = ((w << 5u) & m) | ((w << 8u) & s);
    let p2 = ((w << 1u) & m) | ((w << 4u) & s);
    let p3 = ((w >> 3u) & m) | (w & s);
    return dot(vec4<f32>(unpack2x16float(p0), unpack2x16float(p1)), a) + dot(vec4<f32>(unpack2x16float(p2), unpack2x16float(p3)), b);
}

// One MXFP4 group (4 words) times its activations, before the scale.
fn group_dot2(q: vec4<u32>, xg: Xg) -> f32 {
    return word_dot(q.x, xg.a[0], xg.b[0]) + word_dot(q.y, xg.a[1], xg.b[1]) + word_dot(q.z, xg.a[2], xg.b[2]) + word_dot(q.w, xg.a[3], xg.b[3]);
}

// Rows per subgroup pass of the sg2 kernels (activation reuse); RPW2 rows per workgroup.
override RS2: u32 = 2u;
override RPW2: u32 = 16u;
const MAX_RS2: u32 = 4u;

// Stage 1, as expert_up_sg: grid (ceil(n_mid / RPW2), tokens * top_k).
@compute @workgroup_size(256)
fn expert_up_sg2(
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
    for (var r0 = sg * RS2; r0 < RPW2; r0 += nsg * RS2) {
        let row0 = wg.x * RPW2 + r0;
        if (row0 >= p.n_mid) {
            break;
        }
        var ga: array<f32, MAX_RS2>;
        var ua: array<f32, MAX_RS2>;
        for (var g = lane; g < groups; g += sgs) {
            let xg = load_xg(xb + g * 8u);
            for (var i = 0u; i < RS2; i++) {
                let o = min(row0 + i, p.n_mid - 1u) * groups + g;
                let q1 = pool[base + p.off_w1 + o];
                let q3 = pool[base + p.off_w3 + o];
                ga[i] += scale14(base, p.off_s1 + o) * group_dot2(q1, xg);
                ua[i] += scale14(base, p.off_s3 + o) * group_dot2(q3, xg);
            }
        }
        for (var i = 0u; i < RS2; i++) {
            let gs = subgroupAdd(ga[i]);
            let us = subgroupAdd(ua[i]);
            if (lane == 0u && row0 + i < p.n_mid) {
                out[pair * p.n_mid + row0 + i] = glu(gs, us);
            }
        }
    }
}

// Stage 2 with the experts spread over the workgroup's subgroups (the serial loop over 16
// experts starved the GPU: n_in / rows workgroups only): work item (expert j, row block)
// -> partial sums in workgroup memory, then one thread per row adds the experts in the
// fixed j order. Grid (ceil(n_in / RPW2), tokens). Host-checked: top_k * RPW2 <= 2048.
var<workgroup> down_part: array<f32, 2048>;

@compute @workgroup_size(256)
fn expert_down_sg2(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
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
    let blocks = RPW2 / RS2;
    for (var item = sg; item < p.top_k * blocks; item += nsg) {
        let j = item / blocks;
        let r0 = (item % blocks) * RS2;
        let row0 = wg.x * RPW2 + r0;
        let pair = t * p.top_k + j;
        let base = slot_base(idx[pair]);
        let xb = pair * (p.n_mid / 4u);
        var acc: array<f32, MAX_RS2>;
        if (row0 < p.n_in) {
            for (var g = lane; g < groups; g += sgs) {
                let xg = load_xg(xb + g * 8u);
                for (var i = 0u; i < RS2; i++) {
                    let o = min(row0 + i, p.n_in - 1u) * groups + g;
                    acc[i] += scale14(base, p.off_s2 + o) * group_dot2(pool[base + p.off_w2 + o], xg);
                }
            }
        }
        for (var i = 0u; i < RS2; i++) {
            let total = subgroupAdd(acc[i]);
            if (lane == 0u) {
                down_part[j * RPW2 + r0 + i] = total;
            }
        }
    }
    workgroupBarrier();
    let row = wg.x * RPW2 + lid;
    if (lid < RPW2 && row < p.n_in) {
        var y = 0.0;
        for (var j = 0u; j < p.top_k; j++) {
            y += wts[t * p.top_k + j] * down_part[j * RPW2 + lid];
        }
        out[t * p.n_in + row] = y;
    }
}

// ---- sg4: four weight rows per subgroup pass in plain vector registers. sg2's per-row
// accumulators are private arrays indexed in loops, which drivers may keep in local
// memory; here every value is a named register (vec4 over the four rows).

fn rows4_dot(base: u32, off_w: u32, off_s: u32, o: vec4<u32>, xg: Xg) -> vec4<f32> {
    let q0 = pool[base + off_w + o.x];
    let q1 = pool[base + off_w + o.y];
    let q2 = pool[base + off_w + o.z];
    let q3 = pool[base + off_w + o.w];
    let s = vec4<f32>(scale14(base, off_s + o.x), scale14(base, off_s + o.y), scale14(base, off_s + o.z), scale14(base, off_s + o.w));
    return s * vec4<f32>(group_dot2(q0, xg), group_dot2(q1, xg), group_dot2(q2, xg), group_dot2(q3, xg));
}

// Stage 1, grid (ceil(n_mid / RPW2), tokens * top_k), RPW2 a multiple of 4.
@compute @workgroup_size(256)
fn expert_up_sg4(
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
    let last = vec4<u32>(p.n_mid - 1u);
    for (var r0 = sg * 4u; r0 < RPW2; r0 += nsg * 4u) {
        let row0 = wg.x * RPW2 + r0;
        if (row0 >= p.n_mid) {
            break;
        }
        let rows = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), last) * groups;
        var ga = vec4<f32>(0.0);
        var ua = vec4<f32>(0.0);
        for (var g = lane; g < groups; g += sgs) {
            let xg = load_xg(xb + g * 8u);
            let o = rows + vec4<u32>(g);
            ga += rows4_dot(base, p.off_w1, p.off_s1, o, xg);
            ua += rows4_dot(base, p.off_w3, p.off_s3, o, xg);
        }
        let gs = subgroupAdd(ga);
        let us = subgroupAdd(ua);
        if (lane < 4u && row0 + lane < p.n_mid) {
            out[pair * p.n_mid + row0 + lane] = glu(gs[lane], us[lane]);
        }
    }
}

// Stage 2 as expert_down_sg2 with items of four rows; RPW2 a multiple of 4.
@compute @workgroup_size(256)
fn expert_down_sg4(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
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
    let blocks = RPW2 / 4u;
    let last = vec4<u32>(p.n_in - 1u);
    for (var item = sg; item < p.top_k * blocks; item += nsg) {
        let j = item / blocks;
        let r0 = (item % blocks) * 4u;
        let row0 = wg.x * RPW2 + r0;
        let pair = t * p.top_k + j;
        let base = slot_base(idx[pair]);
        let xb = pair * (p.n_mid / 4u);
        let rows = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), last) * groups;
        var acc = vec4<f32>(0.0);
        for (var g = lane; g < groups; g += sgs) {
            acc += rows4_dot(base, p.off_w2, p.off_s2, rows + vec4<u32>(g), load_xg(xb + g * 8u));
        }
        let total = subgroupAdd(acc);
        if (lane < 4u) {
            down_part[j * RPW2 + r0 + lane] = total[lane];
        }
    }
    workgroupBarrier();
    let row = wg.x * RPW2 + lid;
    if (lid < RPW2 && row < p.n_in) {
        var y = 0.0;
        for (var j = 0u; j < p.top_k; j++) {
            y += wts[t * p.top_k + j] * down_part[j * RPW2 + lid];
        }
        out[t * p.n_in + row] = y;
    }
}
