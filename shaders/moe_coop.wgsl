// Prefill (grouped) MXFP4 routed experts on cooperative matrices (16x16x16 f16 x f16 -> f32):
// the same contract and tiling as expert_tiled in moe_grouped.wgsl (its SIMT twin), exact to
// f32 rounding:
//   weights: E2M1 is exact in f16. Each weight row gets a reference exponent ref (its largest
//     scale byte); a group with scale s decodes to E2M1 * 2^(s - ref + 13) (<= 6 * 2^13, exact
//     in f16 down to s - ref = -36, i.e. weights 2^-33 below the row's largest) and the
//     epilogue multiplies by 2^(ref - 127 - 13) in f32.
//   activations: each row (a token's z, a pair's h) is scaled by a power of two s that puts
//     its largest |x| in [2^13, 2^14) (moe_row_scale), then split x s = hi + lo with hi the
//     top 11 significant bits (masked, so the driver cannot fold it away) and lo the f32
//     remainder rounded to f16: two products per fragment, about 2^-22 relative.
//   accumulation: the tensor cores' f32 accumulation truncates (measured 1.4e-5 relative over
//     K = 3584 on the H200, vs 2.3e-6 for the SIMT kernel), so each accumulator covers FLUSH
//     steps of KS and is then added into f32 registers (round to nearest) and restarted.
// Per workgroup (8 subgroups of 32; the host runs this only where subgroups are 32 wide):
// one tile of BM = 64 routed pairs x BR = 128 weight rows; subgroup sg owns pairs
// 16 (sg / 2) .. +15 and four 16-row fragments (stage 1: two of w1 and the same two of w3).
// The accumulators leave through a per-subgroup 16x16 staging tile for the epilogue.

enable f16;
enable wgpu_cooperative_matrix;

#include "lib/experts.wgsl"
#include "lib/moe_tiles.wgsl"
// Power-of-two scale per activation row (moe_row_scale writes it; expert_coop reads it).
@group(0) @binding(10) var<storage, read_write> xscale: array<f32>;

// true: stage 1 (w1/w3, GLU; rows of z); false: stage 2 (w2; rows of h).
override UP: bool = true;
// K steps per tensor-core accumulation block (see the header).
override FLUSH: u32 = 8u;

const WG: u32 = 256u;
const AS: u32 = 10u; // vec4<f16> stride of a tile row: KS + 8 halves (80 bytes: banks, 16-byte aligned)

var<workgroup> ah: array<vec4<f16>, 640>;  // [BM][AS] hi parts of the scaled activations
var<workgroup> al: array<vec4<f16>, 640>;  // [BM][AS] lo parts
var<workgroup> bt: array<vec4<f16>, 1280>; // [BR][AS] weights relative to their row's reference
var<workgroup> cs: array<f32, 2048>;       // 8 subgroups x one 16x16 accumulator (column-major), drained through
var<workgroup> bref: array<u32, BR>;       // per weight row: reference exponent (max scale byte)
var<workgroup> bmul: array<f32, BR>;       // per weight row: 2^(ref - 127 - 13)
var<workgroup> tsc: array<f32, BM>;        // per tile pair: its activation scale
var<workgroup> rmax: array<f32, 128>;      // moe_row_scale only

// Loads of the next K step in registers: threads < BR one weight group (ld0, scale lds),
// the others four activation vec4s.
var<private> ld0: vec4<u32>;
var<private> ld1: vec4<u32>;
var<private> ld2: vec4<u32>;
var<private> ld3: vec4<u32>;
var<private> lds: u32;

// xscale[row] = 2^(13 - floor(log2 max|x[row]|)) (1 for an all-zero row); rows of z (UP) or h.
@compute @workgroup_size(128)
fn moe_row_scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * nwg.x;
    let rows = select(p.tokens * p.top_k, p.tokens, UP);
    if (row >= rows) {
        return;
    }
    let w4 = k_width() / 4u;
    var m = 0.0;
    for (var i = lid; i < w4; i += 128u) {
        let v = abs(x[row * w4 + i]);
        m = max(m, max(max(v.x, v.y), max(v.z, v.w)));
    }
    rmax[lid] = m;
    workgroupBarrier();
    for (var s = 64u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            rmax[lid] = max(rmax[lid], rmax[lid + s]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        let mm = rmax[0];
        var sc = 1.0;
        if (mm > 0.0 && mm <= 3.4e38) {
            let ex = i32((bitcast<u32>(mm) >> 23u) & 0xffu) - 127;
            sc = ldexp(1.0, clamp(13 - ex, -100, 100));
        }
        xscale[row] = sc;
    }
}

fn scale_byte(base4: u32, byte: u32) -> u32 {
    let v = pool[base4 + (byte >> 4u)];
    return (v[(byte >> 2u) & 3u] >> (8u * (byte & 3u))) & 0xffu;
}

fn x_load(j: u32, a: u32, k0: u32, head: vec4<u32>) -> vec4<u32> {
    let tt = j * (BR / 8u) + a / 8u;
    let part = a % 8u;
    let width = k_width();
    if (tt >= head.z) {
        return vec4<u32>(0u);
    }
    return bitcast<vec4<u32>>(x[(x_row(tile_pairs[tt]) * width + k0) / 4u + part]);
}

fn fetch(k0: u32, lid: u32, base: u32, r0: u32, head: vec4<u32>) {
    if (lid < BR) {
        ld0 = vec4<u32>(0u);
        lds = 0u;
        let row = b_row(lid, r0);
        if (row < b_rows()) {
            let off = b_offsets(lid);
            let groups = k_width() / 32u;
            let g = k0 / 32u;
            ld0 = pool[base + off.x + row * groups + g];
            lds = scale_byte(base, off.y + row * groups + g);
        }
    } else {
        let a = lid - BR;
        ld0 = x_load(0u, a, k0, head);
        ld1 = x_load(1u, a, k0, head);
        ld2 = x_load(2u, a, k0, head);
        ld3 = x_load(3u, a, k0, head);
    }
}

// 8 E2M1 nibbles of one word (even k = low nibble) times f, as 8 f16 at bt[at], bt[at + 1].
// f16 bits (sign, e, m) = nibble bits (3, 2..1, 0) give E2M1 * 2^-14 exactly (e = 0: subnormal).
fn put_word(at: u32, q: u32, f: f32) {
    let v = vec4<u32>(q, q >> 8u, q >> 16u, q >> 24u);
    let bits = ((v & vec4<u32>(7u)) << vec4<u32>(9u)) | ((v & vec4<u32>(8u)) << vec4<u32>(12u))
        | ((v & vec4<u32>(0x70u)) << vec4<u32>(21u)) | ((v & vec4<u32>(0x80u)) << vec4<u32>(24u));
    let e0 = unpack2x16float(bits.x) * f;
    let e1 = unpack2x16float(bits.y) * f;
    let e2 = unpack2x16float(bits.z) * f;
    let e3 = unpack2x16float(bits.w) * f;
    bt[at] = vec4<f16>(vec4<f32>(e0, e1));
    bt[at + 1u] = vec4<f16>(vec4<f32>(e2, e3));
}

fn put_x(j: u32, a: u32, v: vec4<u32>) {
    let tt = j * (BR / 8u) + a / 8u;
    let xs = bitcast<vec4<f32>>(v) * tsc[tt];
    let hi = bitcast<vec4<f32>>(bitcast<vec4<u32>>(xs) & vec4<u32>(0xffffe000u));
    let at = tt * AS + a % 8u;
    ah[at] = vec4<f16>(hi);
    al[at] = vec4<f16>(xs - hi);
}

fn stage(lid: u32) {
    if (lid < BR) {
        // 2^(s - ref + 27) (the 2^-14 of the f16 decode undone, + 13); 0 where it underflows.
        let be = i32(lds) - i32(bref[lid]) + 154;
        let f = select(0.0, bitcast<f32>(u32(max(be, 1)) << 23u), be >= 1);
        put_word(lid * AS, ld0.x, f);
        put_word(lid * AS + 2u, ld0.y, f);
        put_word(lid * AS + 4u, ld0.z, f);
        put_word(lid * AS + 6u, ld0.w, f);
    } else {
        let a = lid - BR;
        put_x(0u, a, ld0);
        put_x(1u, a, ld1);
        put_x(2u, a, ld2);
        put_x(3u, a, ld3);
    }
}

// One 16-wide k slice (kk = 0 or 1 of the step) of fragment (mt, f) into acc.
fn mma(acc: coop_mat16x16<f32, C>, ahi: coop_mat16x16<f16, A>, alo: coop_mat16x16<f16, A>, f: u32, kk: u32) -> coop_mat16x16<f32, C> {
    let b = coopLoad<coop_mat16x16<f16, B>>(&bt[f * 16u * AS + kk * 4u], AS);
    return coopMultiplyAdd(alo, b, coopMultiplyAdd(ahi, b, acc));
}

// A lane's share of an accumulator, through the subgroup's staging tile: weight row
// lane % 16 of the fragment, tile pairs (lane / 16) * 8 .. +7.
fn drain(c: coop_mat16x16<f32, C>, sg: u32, lane: u32) -> array<vec4<f32>, 2> {
    coopStore(c, &cs[sg * 256u], 16u);
    workgroupBarrier();
    let at = sg * 256u + (lane % 16u) * 16u + (lane / 16u) * 8u;
    let v = array<vec4<f32>, 2>(
        vec4<f32>(cs[at], cs[at + 1u], cs[at + 2u], cs[at + 3u]),
        vec4<f32>(cs[at + 4u], cs[at + 5u], cs[at + 6u], cs[at + 7u]),
    );
    workgroupBarrier();
    return v;
}

// Lane sums of fragment f scaled back (activation and weight scales).
fn unscale(v: array<vec4<f32>, 2>, lane: u32, mt: u32, f: u32) -> array<f32, 8> {
    var r: array<f32, 8>;
    let wm = bmul[f * 16u + lane % 16u];
    let i0 = mt * 16u + (lane / 16u) * 8u;
    for (var t = 0u; t < 8u; t++) {
        r[t] = v[t / 4u][t % 4u] * wm / tsc[i0 + t];
    }
    return r;
}

// Stage 2 epilogue of fragment f: yk[pair, row].
fn emit_down(s: array<vec4<f32>, 2>, lane: u32, mt: u32, f: u32, r0: u32, n: u32) {
    let v = unscale(s, lane, mt, f);
    let row = r0 + f * 16u + lane % 16u;
    let i0 = mt * 16u + (lane / 16u) * 8u;
    for (var t = 0u; t < 8u; t++) {
        if (i0 + t < n && row < p.n_in) {
            out[tile_pairs[i0 + t] * p.n_in + row] = v[t];
        }
    }
}

// Stage 1 epilogue of w1 fragment f and its w3 twin f + 4: h[pair, row] = GLU.
fn emit_up(gs: array<vec4<f32>, 2>, su: array<vec4<f32>, 2>, lane: u32, mt: u32, f: u32, r0: u32, n: u32) {
    let g = unscale(gs, lane, mt, f);
    let u = unscale(su, lane, mt, f + 4u);
    let row = r0 + f * 16u + lane % 16u;
    let i0 = mt * 16u + (lane / 16u) * 8u;
    for (var t = 0u; t < 8u; t++) {
        if (i0 + t < n && row < p.n_mid) {
            out[tile_pairs[i0 + t] * p.n_mid + row] = glu(g[t], u[t]);
        }
    }
}

fn add2(a: array<vec4<f32>, 2>, b: array<vec4<f32>, 2>) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(a[0] + b[0], a[1] + b[1]);
}

@compute @workgroup_size(256)
fn expert_coop(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let head = load_tile(wg.y, lid);
    if (head.w == 0u) {
        return;
    }
    let base = slot_base(head.x);
    let r0 = row_base(wg.x);
    let width = k_width();
    if (lid < BR) {
        let row = b_row(lid, r0);
        var rf = 0u;
        if (row < b_rows()) {
            let off = b_offsets(lid);
            let groups = width / 32u;
            for (var g = 0u; g < groups; g++) {
                rf = max(rf, scale_byte(base, off.y + row * groups + g));
            }
        }
        bref[lid] = rf;
        bmul[lid] = e8m0(rf) * (1.0 / 8192.0);
    } else if (lid < BR + BM) {
        let i = lid - BR;
        tsc[i] = select(1.0, xscale[x_row(tile_pairs[i])], i < head.z);
    }
    workgroupBarrier();
    let mt = sg / 2u;
    var f0 = (sg % 2u) * 4u;
    var f1 = f0 + 1u;
    var f2 = f0 + 2u;
    var f3 = f0 + 3u;
    if (UP) {
        // w1 fragments (sg % 2) * 2 + {0, 1} and their w3 twins 4 above.
        f0 = (sg % 2u) * 2u;
        f1 = f0 + 1u;
        f2 = f0 + 4u;
        f3 = f0 + 5u;
    }
    var c0 = coop_mat16x16<f32, C>();
    var c1 = coop_mat16x16<f32, C>();
    var c2 = coop_mat16x16<f32, C>();
    var c3 = coop_mat16x16<f32, C>();
    // f32 sums of the drained blocks (this lane's 8 values of each fragment).
    var s0 = array<vec4<f32>, 2>();
    var s1 = array<vec4<f32>, 2>();
    var s2 = array<vec4<f32>, 2>();
    var s3 = array<vec4<f32>, 2>();
    fetch(0u, lid, base, r0, head);
    var nstep = 0u;
    for (var k0 = 0u; k0 < width; k0 += KS) {
        workgroupBarrier();
        stage(lid);
        if (k0 + KS < width) {
            fetch(k0 + KS, lid, base, r0, head);
        }
        workgroupBarrier();
        // (naga requires workgroup-uniform control flow here: fragments past the tile's
        // pairs are multiplied too, on zeros.)
        for (var kk = 0u; kk < 2u; kk++) {
            let ahi = coopLoadT<coop_mat16x16<f16, A>>(&ah[mt * 16u * AS + kk * 4u], AS);
            let alo = coopLoadT<coop_mat16x16<f16, A>>(&al[mt * 16u * AS + kk * 4u], AS);
            c0 = mma(c0, ahi, alo, f0, kk);
            c1 = mma(c1, ahi, alo, f1, kk);
            c2 = mma(c2, ahi, alo, f2, kk);
            c3 = mma(c3, ahi, alo, f3, kk);
        }
        nstep++;
        if (nstep % FLUSH == 0u || k0 + KS >= width) {
            s0 = add2(s0, drain(c0, sg, lane));
            s1 = add2(s1, drain(c1, sg, lane));
            s2 = add2(s2, drain(c2, sg, lane));
            s3 = add2(s3, drain(c3, sg, lane));
            c0 = coop_mat16x16<f32, C>();
            c1 = coop_mat16x16<f32, C>();
            c2 = coop_mat16x16<f32, C>();
            c3 = coop_mat16x16<f32, C>();
        }
    }
    if (UP) {
        emit_up(s0, s2, lane, mt, f0, r0, head.z);
        emit_up(s1, s3, lane, mt, f1, r0, head.z);
    } else {
        emit_down(s0, lane, mt, f0, r0, head.z);
        emit_down(s1, lane, mt, f1, r0, head.z);
        emit_down(s2, lane, mt, f2, r0, head.z);
        emit_down(s3, lane, mt, f3, r0, head.z);
    }
}
