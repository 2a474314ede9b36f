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

// Gated activation of one (gate, up) pair (spec 2.4): SiTU (act = 0) beta tanh(g / beta)
// sigmoid(g) times linear_beta tanh(u / linear_beta) (u itself when linear_beta <= 0); SiLU
// (act = 1) g sigmoid(g) u.
fn glu_act(g: f32, u: f32, act: u32, beta: f32, linear_beta: f32) -> f32 {
    if (act == 1u) {
        return g * sigmoid(g) * u;
    }
    var up = u;
    if (linear_beta > 0.0) {
        up = linear_beta * tanh_f(u / linear_beta);
    }
    return beta * tanh_f(g / beta) * sigmoid(g) * up;
}
