// Subgroup MXFP4 decode expert kernels (same slot layout, params and results as moe.wgsl;
// see its header): one subgroup per RS2 weight rows, lanes over the rows' 32-weight groups,
// row totals by subgroupAdd (no barrier, no shared-memory tree). A separate file because a
// module that uses subgroup operations needs the SUBGROUP feature as a whole; adapters
// without it keep moe.wgsl.
// Preconditions (host-checked): as moe.wgsl; MXFP4 experts; top_k * RPW2 <= 2048 (stage 2).
//
// E2M1 decode: shifting a nibble's 3 magnitude bits to f16 bits 9-11 and its sign to bit 15
// gives an f16 equal to the E2M1 value times 2^-14 (e = 0 lands on the f16 subnormal 2^-15,
// exactly 0.5 * 2^-14), so one shift-and-mask pair decodes two weights (one per 16-bit half)
// and unpack2x16float widens them; the 2^14 goes into the group scale. Word nibbles n0..n7
// come out as pairs (n0,n4) (n1,n5) (n2,n6) (n3,n7), so activations are read in that order.
// (Arithmetic decode to f32 cost ~15 integer ops per weight and ran at 614 GB/s on the H200;
// this runs at 1.1 TB/s.)

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
fn e8m0(s: u32) -> f32 {
    return select(bitcast<f32>(s << 23u), bitcast<f32>(0x00400000u), s == 0u);
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

// Rows per subgroup pass (each lane's activation group is reused for all of them); RPW2 rows
// per workgroup. RS2 = 2 measured best on the H200 (1 and 4 were slower).
override RS2: u32 = 2u;
override RPW2: u32 = 16u;
const MAX_RS2: u32 = 4u;

// Stage 1: grid (ceil(n_mid / RPW2), tokens * top_k); h[pair, r] = act(w1 z, w3 z)[r].
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
