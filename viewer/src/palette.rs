//! Colours, in sRGB bytes. The shader (viewer.wgsl) repeats these numbers: keep both equal
//! (tests/viewer.rs checks rendered pixels against these functions).

pub const BACKGROUND: [u8; 3] = [12, 13, 18];
pub const UNSELECTED: [u8; 3] = [32, 35, 46];
/// Positions after the row's query token (not in its cache yet).
pub const FUTURE: [u8; 3] = [18, 18, 22];
/// The current position is mixed half-way towards this.
pub const MARK: [u8; 3] = [0, 230, 255];
pub const TEXT: [u8; 3] = [228, 230, 238];
pub const DIM: [u8; 3] = [150, 156, 172];

const HEAT: [[f32; 3]; 4] = [[70.0, 30.0, 120.0], [190.0, 45.0, 90.0], [245.0, 135.0, 35.0], [252.0, 240.0, 100.0]];
const STRIP: [[f32; 3]; 2] = [[30.0, 70.0, 70.0], [110.0, 240.0, 200.0]];

fn lerp(a: [f32; 3], b: [f32; 3], f: f32) -> [u8; 3] {
    let c = |i: usize| (a[i] + (b[i] - a[i]) * f).round() as u8;
    [c(0), c(1), c(2)]
}

/// Colour of a cell holding value byte `b` (0: unselected).
pub fn heat(b: u8) -> [u8; 3] {
    if b == 0 {
        return UNSELECTED;
    }
    let u = (b - 1) as f32 / 254.0 * 3.0;
    let i = (u as usize).min(2);
    lerp(HEAT[i], HEAT[i + 1], u - i as f32)
}

/// Colour of the frequency strip for value byte `b` (0: never selected).
pub fn strip(b: u8) -> [u8; 3] {
    if b == 0 {
        return UNSELECTED;
    }
    lerp(STRIP[0], STRIP[1], (b - 1) as f32 / 254.0)
}

/// Half-way towards the marker colour (the current position).
pub fn marked(c: [u8; 3]) -> [u8; 3] {
    let m = |i: usize| ((c[i] as f32 + MARK[i] as f32) * 0.5).round() as u8;
    [m(0), m(1), m(2)]
}
