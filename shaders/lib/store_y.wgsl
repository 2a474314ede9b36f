// Included by shaders with a params uniform `p` (field `accumulate`) and an f32 output `y`.

// Writes an output, or adds it to what y holds (accumulate: a residual or a second branch
// summed in place instead of by a separate add pass).
fn store_y(i: u32, v: f32) {
    if (p.accumulate != 0u) {
        y[i] += v;
    } else {
        y[i] = v;
    }
}
