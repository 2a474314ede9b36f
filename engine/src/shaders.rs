//! The WGSL sources, embedded at compile time. Every file in `shaders/` is listed here
//! (a test checks that none is missing) and validated for SPIR-V, MSL and HLSL in CI.

pub const SHADERS: &[(&str, &str)] = &[("gemv", include_str!("../../shaders/gemv.wgsl"))];

pub fn source(name: &str) -> Option<&'static str> {
    SHADERS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}
