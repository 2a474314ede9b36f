// Sum of one value per thread over a workgroup of WG threads (a tree in workgroup memory; every
// thread gets the total). Call from uniform control flow.

var<workgroup> red: array<f32, WG>;

fn wg_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}
