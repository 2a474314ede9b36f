// The index-key cache pages (bindings 4-19, page i holding page0 << min(i, shift_max)
// rows) and a 16-byte load from one of them.

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

// Eight 16-byte loads from one page, `stride` apart, under one branch: all in flight together
// (a load per branch waits for each before the next).
fn key_vec8(page: u32, i: u32, stride: u32) -> array<vec4<u32>, 8> {
    switch page {
        case 0u: { return array<vec4<u32>, 8>(k0[i], k0[i + 1u * stride], k0[i + 2u * stride], k0[i + 3u * stride], k0[i + 4u * stride], k0[i + 5u * stride], k0[i + 6u * stride], k0[i + 7u * stride]); }
        case 1u: { return array<vec4<u32>, 8>(k1[i], k1[i + 1u * stride], k1[i + 2u * stride], k1[i + 3u * stride], k1[i + 4u * stride], k1[i + 5u * stride], k1[i + 6u * stride], k1[i + 7u * stride]); }
        case 2u: { return array<vec4<u32>, 8>(k2[i], k2[i + 1u * stride], k2[i + 2u * stride], k2[i + 3u * stride], k2[i + 4u * stride], k2[i + 5u * stride], k2[i + 6u * stride], k2[i + 7u * stride]); }
        case 3u: { return array<vec4<u32>, 8>(k3[i], k3[i + 1u * stride], k3[i + 2u * stride], k3[i + 3u * stride], k3[i + 4u * stride], k3[i + 5u * stride], k3[i + 6u * stride], k3[i + 7u * stride]); }
        case 4u: { return array<vec4<u32>, 8>(k4[i], k4[i + 1u * stride], k4[i + 2u * stride], k4[i + 3u * stride], k4[i + 4u * stride], k4[i + 5u * stride], k4[i + 6u * stride], k4[i + 7u * stride]); }
        case 5u: { return array<vec4<u32>, 8>(k5[i], k5[i + 1u * stride], k5[i + 2u * stride], k5[i + 3u * stride], k5[i + 4u * stride], k5[i + 5u * stride], k5[i + 6u * stride], k5[i + 7u * stride]); }
        case 6u: { return array<vec4<u32>, 8>(k6[i], k6[i + 1u * stride], k6[i + 2u * stride], k6[i + 3u * stride], k6[i + 4u * stride], k6[i + 5u * stride], k6[i + 6u * stride], k6[i + 7u * stride]); }
        case 7u: { return array<vec4<u32>, 8>(k7[i], k7[i + 1u * stride], k7[i + 2u * stride], k7[i + 3u * stride], k7[i + 4u * stride], k7[i + 5u * stride], k7[i + 6u * stride], k7[i + 7u * stride]); }
        case 8u: { return array<vec4<u32>, 8>(k8[i], k8[i + 1u * stride], k8[i + 2u * stride], k8[i + 3u * stride], k8[i + 4u * stride], k8[i + 5u * stride], k8[i + 6u * stride], k8[i + 7u * stride]); }
        case 9u: { return array<vec4<u32>, 8>(k9[i], k9[i + 1u * stride], k9[i + 2u * stride], k9[i + 3u * stride], k9[i + 4u * stride], k9[i + 5u * stride], k9[i + 6u * stride], k9[i + 7u * stride]); }
        case 10u: { return array<vec4<u32>, 8>(k10[i], k10[i + 1u * stride], k10[i + 2u * stride], k10[i + 3u * stride], k10[i + 4u * stride], k10[i + 5u * stride], k10[i + 6u * stride], k10[i + 7u * stride]); }
        case 11u: { return array<vec4<u32>, 8>(k11[i], k11[i + 1u * stride], k11[i + 2u * stride], k11[i + 3u * stride], k11[i + 4u * stride], k11[i + 5u * stride], k11[i + 6u * stride], k11[i + 7u * stride]); }
        case 12u: { return array<vec4<u32>, 8>(k12[i], k12[i + 1u * stride], k12[i + 2u * stride], k12[i + 3u * stride], k12[i + 4u * stride], k12[i + 5u * stride], k12[i + 6u * stride], k12[i + 7u * stride]); }
        case 13u: { return array<vec4<u32>, 8>(k13[i], k13[i + 1u * stride], k13[i + 2u * stride], k13[i + 3u * stride], k13[i + 4u * stride], k13[i + 5u * stride], k13[i + 6u * stride], k13[i + 7u * stride]); }
        case 14u: { return array<vec4<u32>, 8>(k14[i], k14[i + 1u * stride], k14[i + 2u * stride], k14[i + 3u * stride], k14[i + 4u * stride], k14[i + 5u * stride], k14[i + 6u * stride], k14[i + 7u * stride]); }
        default: { return array<vec4<u32>, 8>(k15[i], k15[i + 1u * stride], k15[i + 2u * stride], k15[i + 3u * stride], k15[i + 4u * stride], k15[i + 5u * stride], k15[i + 6u * stride], k15[i + 7u * stride]); }
    }
}

// Four 16-byte loads from one page, `stride` apart, under one branch (key_vec8's half).
fn key_vec4n(page: u32, i: u32, stride: u32) -> array<vec4<u32>, 4> {
    switch page {
        case 0u: { return array<vec4<u32>, 4>(k0[i], k0[i + stride], k0[i + 2u * stride], k0[i + 3u * stride]); }
        case 1u: { return array<vec4<u32>, 4>(k1[i], k1[i + stride], k1[i + 2u * stride], k1[i + 3u * stride]); }
        case 2u: { return array<vec4<u32>, 4>(k2[i], k2[i + stride], k2[i + 2u * stride], k2[i + 3u * stride]); }
        case 3u: { return array<vec4<u32>, 4>(k3[i], k3[i + stride], k3[i + 2u * stride], k3[i + 3u * stride]); }
        case 4u: { return array<vec4<u32>, 4>(k4[i], k4[i + stride], k4[i + 2u * stride], k4[i + 3u * stride]); }
        case 5u: { return array<vec4<u32>, 4>(k5[i], k5[i + stride], k5[i + 2u * stride], k5[i + 3u * stride]); }
        case 6u: { return array<vec4<u32>, 4>(k6[i], k6[i + stride], k6[i + 2u * stride], k6[i + 3u * stride]); }
        case 7u: { return array<vec4<u32>, 4>(k7[i], k7[i + stride], k7[i + 2u * stride], k7[i + 3u * stride]); }
        case 8u: { return array<vec4<u32>, 4>(k8[i], k8[i + stride], k8[i + 2u * stride], k8[i + 3u * stride]); }
        case 9u: { return array<vec4<u32>, 4>(k9[i], k9[i + stride], k9[i + 2u * stride], k9[i + 3u * stride]); }
        case 10u: { return array<vec4<u32>, 4>(k10[i], k10[i + stride], k10[i + 2u * stride], k10[i + 3u * stride]); }
        case 11u: { return array<vec4<u32>, 4>(k11[i], k11[i + stride], k11[i + 2u * stride], k11[i + 3u * stride]); }
        case 12u: { return array<vec4<u32>, 4>(k12[i], k12[i + stride], k12[i + 2u * stride], k12[i + 3u * stride]); }
        case 13u: { return array<vec4<u32>, 4>(k13[i], k13[i + stride], k13[i + 2u * stride], k13[i + 3u * stride]); }
        case 14u: { return array<vec4<u32>, 4>(k14[i], k14[i + stride], k14[i + 2u * stride], k14[i + 3u * stride]); }
        default: { return array<vec4<u32>, 4>(k15[i], k15[i + stride], k15[i + 2u * stride], k15[i + 3u * stride]); }
    }
}
