// Scalar activations shared by the MLP, expert and KDA kernels.

fn sigmoid(z: f32) -> f32 {
    return 1.0 / (1.0 + exp(-z));
}

// tanh through exp of a non-positive argument (no overflow for large |v|); below |v| = 1/8
// its Taylor series instead, where 1 - exp(-2|v|) cancels (SiTU of inputs near 2^-12 was off
// by ~1e-3 relative). Series truncated after v^7: relative error < 2e-9 there.
fn tanh_f(v: f32) -> f32 {
    let a = abs(v);
    let e = exp(-2.0 * a);
    let v2 = v * v;
    let series = v * (1.0 + v2 * (-1.0 / 3.0 + v2 * (2.0 / 15.0 - v2 * (17.0 / 315.0))));
    return select(sign(v) * (1.0 - e) / (1.0 + e), series, a < 0.125);
}
