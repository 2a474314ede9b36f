// RMSNorm over rows (spec 2.1): out[r, i] = x[r, i] * rsqrt(mean_i(x[r]^2) + eps) * w[i],
// all in f32 with one rounding; w is bf16 (two per u32). One workgroup per row.
// Preconditions (host-checked): x, out hold rows * n f32; w holds n bf16.

struct NormParams {
    rows: u32,
    n: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: NormParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WG: u32 = 256u;
var<workgroup> partial: array<f32, WG>;

fn bf16_at(i: u32) -> f32 {
    let word = w[i >> 1u];
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

// Grid (column chunks, rows): every workgroup of a row sums the row's squares (UNROLL loads
// per thread in flight: a d-strided loop of dependent steps was latency-bound at ~20 us for
// one 7168-wide row on an H200), then scales its share of the columns. Decode spreads a row
// over several workgroups; prefill uses one per row (no redundant reads).
const UNROLL: u32 = 8u;

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wg.y;
    if (r >= p.rows) {
        return;
    }
    let base = r * p.n;
    var ss = 0.0;
    for (var i0 = 0u; i0 < p.n; i0 += WG * UNROLL) {
        var v: array<f32, UNROLL>;
        // Unconditional loads (clamped index, zero selected in): guarded ones waited one by one.
        for (var k = 0u; k < UNROLL; k++) {
            let i = i0 + k * WG + lid;
            v[k] = select(0.0, x[base + min(i, p.n - 1u)], i < p.n);
        }
        for (var k = 0u; k < UNROLL; k++) {
            ss += v[k] * v[k];
        }
    }
    partial[lid] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(partial[0] / f32(p.n) + p.eps);
    let per = (p.n + nwg.x - 1u) / nwg.x;
    let end = min(p.n, (wg.x + 1u) * per);
    for (var i = wg.x * per + lid; i < end; i += WG) {
        out[base + i] = x[base + i] * inv * bf16_at(i);
    }
}
