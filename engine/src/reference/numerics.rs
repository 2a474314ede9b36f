//! Number formats of the checkpoint: bf16 and MXFP4 (E2M1 nibbles with E8M0 scales).

/// E2M1 magnitudes by the low three bits of a nibble.
pub const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Decodes one nibble (bit 3 = sign).
pub fn e2m1(nibble: u8) -> f32 {
    let m = E2M1[(nibble & 7) as usize];
    if nibble & 8 != 0 { -m } else { m }
}

/// Dequantises an MXFP4 matrix: `packed` [rows, cols/2] (even column = low nibble),
/// `scales` [rows, cols/32] (E8M0: 2^(s-127)).
pub fn dequant_mxfp4(packed: &[u8], scales: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    assert!(cols.is_multiple_of(32) && packed.len() == rows * cols / 2 && scales.len() == rows * cols / 32);
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let byte = packed[r * cols / 2 + c / 2];
            let nib = (byte >> (4 * (c % 2))) & 0xF;
            let s = scales[r * cols / 32 + c / 32];
            out.push(e2m1(nib) * 2f32.powi(s as i32 - 127));
        }
    }
    out
}
