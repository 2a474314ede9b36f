/// `y = W x` with W row-major [rows, cols].
pub fn gemv(w: &[f32], rows: usize, cols: usize, x: &[f32]) -> Vec<f32> {
    assert_eq!(w.len(), rows * cols, "reference gemv: W is not [rows, cols]");
    (0..rows)
        .map(|r| w[r * cols..(r + 1) * cols].iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32)
        .collect()
}
