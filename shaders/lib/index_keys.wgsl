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
