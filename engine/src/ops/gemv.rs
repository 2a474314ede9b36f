//! Matrix-vector products (decode projections): `y = W x` with W in its checkpoint dtype.

use super::shader_params;
use crate::gpu::{Gpu, GpuError, GpuTensor, Kernel, Profiler};
use crate::layout::DType;

shader_params!(
    /// Mirrors `GemvParams` in shaders/gemv.wgsl.
    GemvParams in "gemv" { rows: u32, cols: u32, row_offset: u32, _pad: u32 }
);

pub const GEMV_BF16: Kernel = Kernel::new("gemv_bf16", "gemv", "gemv_bf16");
pub const GEMV_F32: Kernel = Kernel::new("gemv_f32", "gemv", "gemv_f32");
pub const KERNELS: &[Kernel] = &[GEMV_BF16, GEMV_F32];

/// Records `y[0..rows] = W x` into `enc`, one dispatch per chunk of W.
/// W: [rows, cols] (bf16 or f32); x: [cols] f32; y: [rows] f32.
pub fn gemv(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let (kernel, binding) = match w.dtype {
        DType::BF16 => (GEMV_BF16, 1),
        DType::F32 => (GEMV_F32, 4),
        d => return Err(GpuError::Shape(format!("gemv: {} has dtype {}, expected bf16 or f32", w.label, d.name()))),
    };
    if w.shape.len() != 2 {
        return Err(GpuError::Shape(format!("gemv: {} has shape {:?}, expected [rows, cols]", w.label, w.shape)));
    }
    let cols = w.shape[1];
    if x.size() < (cols * 4) as u64 || y.size() < (w.rows() * 4) as u64 {
        return Err(GpuError::Shape(format!(
            "gemv: {} [{}, {cols}] needs x of {cols} and y of {} f32 values",
            w.label,
            w.rows(),
            w.rows()
        )));
    }
    let pipeline = gpu.pipelines.get(gpu, &kernel)?;
    for chunk in &w.chunks {
        if chunk.rows == 0 {
            continue;
        }
        let params = GemvParams { rows: chunk.rows as u32, cols: cols as u32, row_offset: chunk.first_row as u32, _pad: 0 };
        let uniform = gpu.uniform("gemv params", &params);
        let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel.name),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() },
                wgpu::BindGroupEntry { binding, resource: chunk.buffer.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: x.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 3, resource: y.as_entire_binding() },
            ],
        });
        let timestamp_writes = profiler.as_deref_mut().and_then(|p| p.pass(kernel.name));
        let mut pass =
            enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(kernel.name), timestamp_writes });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        let (gx, gy) = gpu.grid(chunk.rows as u32);
        pass.dispatch_workgroups(gx, gy, 1);
    }
    Ok(())
}
