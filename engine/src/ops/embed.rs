//! Host side of shaders/embed.wgsl: token embedding rows gathered into f32 activations.

use super::shader_params;
use crate::gpu::{Gpu, GpuError, GpuTensor, Kernel, Profiler};
use crate::layout::DType;

shader_params!(
    /// Mirrors `EmbedParams` in shaders/embed.wgsl.
    EmbedParams in "embed" { tokens: u32, d: u32, first_row: u32, rows: u32 }
);

pub const EMBED_BF16: Kernel = Kernel::new("embed_bf16", "embed", "embed_bf16");
pub const EMBED_F32: Kernel = Kernel::new("embed_f32", "embed", "embed_f32");
pub const KERNELS: &[Kernel] = &[EMBED_BF16, EMBED_F32];

/// out [T, d] = table [vocab, d] rows `ids` [T] (u32, each < vocab: checked by the caller,
/// which holds them on the host). One pass per table chunk.
pub fn embed(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    table: &GpuTensor,
    tokens: usize,
    ids: &wgpu::Buffer,
    out: &wgpu::Buffer,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let d = table.row_len();
    let (kernel, binding) = match table.dtype {
        DType::BF16 if d.is_multiple_of(2) => (EMBED_BF16, 2),
        DType::F32 => (EMBED_F32, 4),
        dt => return Err(GpuError::Shape(format!("embed: {} is {} with width {d}; bf16 (even width) or f32 only", table.label, dt.name()))),
    };
    if ids.size() < (tokens * 4) as u64 || out.size() < (tokens * d * 4) as u64 {
        return Err(GpuError::Shape(format!("embed: buffers too small for {tokens} tokens of width {d}")));
    }
    for c in table.chunks.iter().filter(|c| c.rows > 0) {
        let p = EmbedParams { tokens: tokens as u32, d: d as u32, first_row: c.first_row as u32, rows: c.rows as u32 };
        gpu.dispatch(enc, &kernel, &p, &[(1, ids), (binding, &c.buffer), (3, out)], (tokens as u32, 1), profiler.as_deref_mut())?;
    }
    Ok(())
}
