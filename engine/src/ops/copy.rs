//! Buffer copy through a compute shader: the bandwidth ceiling of memory-bound kernels; and
//! a clock probe (an fma spin) with which benches bring the GPU to its steady clock.

use super::shader_params;
use crate::gpu::{Gpu, GpuError, GpuTensor, Kernel, Profiler};

shader_params!(
    /// Mirrors `CopyParams` in shaders/copy.wgsl.
    CopyParams in "copy" { words4: u32, _pad0: u32, _pad1: u32, _pad2: u32 }
);

shader_params!(
    /// Mirrors `SpinParams` in shaders/copy.wgsl.
    SpinParams in "copy" { iters: u32, _pad0: u32, _pad1: u32, _pad2: u32 }
);

shader_params!(
    /// Mirrors `TouchParams` in shaders/copy.wgsl.
    TouchParams in "copy" { never: u32, _pad0: u32, _pad1: u32, _pad2: u32 }
);

shader_params!(
    /// Mirrors `PageTouchParams` in shaders/copy.wgsl.
    PageTouchParams in "copy" { words: u32, stride: u32, _pad0: u32, _pad1: u32 }
);

pub const COPY_VEC4: Kernel = Kernel::new("copy_vec4", "copy", "copy_vec4");
pub const SPIN_FMA: Kernel = Kernel::new("spin_fma", "copy", "spin_fma");
pub const TOUCH: Kernel = Kernel::new("touch", "copy", "touch");
pub const PAGE_TOUCH: Kernel = Kernel::new("page_touch", "copy", "page_touch");
pub const READ_VEC4: Kernel = Kernel::new("read_vec4", "copy", "read_vec4");
pub const KERNELS: &[Kernel] = &[COPY_VEC4, SPIN_FMA, TOUCH, PAGE_TOUCH, READ_VEC4];

/// Records a read of one word per 64 KiB (NVIDIA's smaller page size) of `buf`, bound whole,
/// so that its pages' address translations are warm when a kernel streams it next (the KDA
/// layer's o_proj in decode; the GEMV benchmark's probe of what a cold matrix costs,
/// docs/perf.md). Read-only bindings only, so it adds no barrier and runs beside other work.
pub fn page_touch(gpu: &Gpu, enc: &mut wgpu::CommandEncoder, buf: &wgpu::Buffer, prof: Option<&mut Profiler>) -> Result<(), GpuError> {
    let words = buf.size() / 4;
    let stride = (64u64 << 10) / 4;
    if buf.size() > gpu.caps.max_binding || words > u32::MAX as u64 {
        return Err(GpuError::Shape(format!("page_touch: a buffer of {} bytes exceeds one binding ({})", buf.size(), gpu.caps.max_binding)));
    }
    let reads = words.div_ceil(stride) as u32;
    let params = PageTouchParams { words: words as u32, stride: stride as u32, ..Default::default() };
    gpu.dispatch_grid(enc, &PAGE_TOUCH, &params, &[(11, buf)], [reads.div_ceil(64).max(1), 1, 1], prof)
}

/// [`page_touch`] of every chunk of `w`.
pub fn page_touch_tensor(gpu: &Gpu, enc: &mut wgpu::CommandEncoder, w: &GpuTensor, mut prof: Option<&mut Profiler>) -> Result<(), GpuError> {
    for c in &w.chunks {
        page_touch(gpu, enc, &c.buffer, prof.as_deref_mut())?;
    }
    Ok(())
}

/// Records one empty invocation that names `bufs` (one to four) read-only: their move to the
/// read state happens at the barrier before it, so the dispatches after it that only read
/// them (and write buffers new to the encoder) have no barrier between them. `sink` is a 16-byte
/// storage buffer it never writes.
pub fn touch(gpu: &Gpu, enc: &mut wgpu::CommandEncoder, bufs: &[&wgpu::Buffer], sink: &wgpu::Buffer) -> Result<(), GpuError> {
    let Some(&first) = bufs.first() else { return Ok(()) };
    if bufs.len() > 4 {
        return Err(GpuError::Shape(format!("touch: {} buffers, at most 4", bufs.len())));
    }
    let b = |i: usize| bufs.get(i).copied().unwrap_or(first);
    let entries = [(6, b(0)), (7, b(1)), (8, b(2)), (9, b(3)), (10, sink)];
    gpu.dispatch_grid(enc, &TOUCH, &TouchParams::default(), &entries, [1, 1, 1], None)
}

/// Records a copy of `bytes` (a multiple of 16) from `src` to `dst`.
pub fn copy(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    src: &wgpu::Buffer,
    dst: &wgpu::Buffer,
    bytes: u64,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if !bytes.is_multiple_of(16) || src.size() < bytes || dst.size() < bytes || bytes > gpu.caps.max_binding {
        return Err(GpuError::Shape(format!("copy of {bytes} bytes: needs a multiple of 16 within both buffers and one binding")));
    }
    if bytes == 0 {
        return Ok(());
    }
    let pipeline = gpu.pipelines.get(gpu, &COPY_VEC4)?;
    let uniform = gpu.uniform("copy params", &CopyParams { words4: (bytes / 16) as u32, ..Default::default() });
    // Only the copied range is bound: the buffers themselves may exceed one binding.
    fn range(b: &wgpu::Buffer, bytes: u64) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: b, offset: 0, size: std::num::NonZeroU64::new(bytes) })
    }
    let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(COPY_VEC4.name),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: range(src, bytes) },
            wgpu::BindGroupEntry { binding: 2, resource: range(dst, bytes) },
        ],
    });
    let timestamp_writes = profiler.and_then(|p| p.pass(COPY_VEC4.name));
    let mut pass = gpu.begin_pass(enc, &wgpu::ComputePassDescriptor { label: Some(COPY_VEC4.name), timestamp_writes });
    pass.set_pipeline(&pipeline);
    pass.set_bind_group(0, &bind, &[]);
    // Enough workgroups to saturate memory; each thread strides over the rest.
    let groups = ((bytes / 16).div_ceil(256) as u32).min(65535 * 4);
    let (gx, gy) = gpu.grid(groups);
    pass.dispatch_workgroups(gx, gy, 1);
    Ok(())
}

/// Records a read of `src` (its whole 16-byte units) that writes nothing (`sink`, at least 16
/// bytes, is bound but never written): the ceiling of a kernel that reads those bytes once,
/// for benches.
pub fn read_all(gpu: &Gpu, enc: &mut wgpu::CommandEncoder, src: &wgpu::Buffer, sink: &wgpu::Buffer, profiler: Option<&mut Profiler>) -> Result<(), GpuError> {
    if src.size() > gpu.caps.max_binding || sink.size() < 16 {
        return Err(GpuError::Shape(format!(
            "read of a {}-byte buffer into a {}-byte sink: needs one binding ({}) and a 16-byte sink",
            src.size(),
            sink.size(),
            gpu.caps.max_binding
        )));
    }
    let words4 = src.size() / 16;
    let params = CopyParams { words4: words4 as u32, ..Default::default() };
    let (gx, gy) = gpu.grid((words4.div_ceil(256) as u32).min(65535 * 4));
    gpu.dispatch_grid(enc, &READ_VEC4, &params, &[(1, src), (12, sink)], [gx, gy, 1], profiler)
}

/// Records `groups` workgroups of 256 threads, each running `iters` rounds of four
/// independent fma chains: issue-bound work whose time follows the shader clock.
pub fn spin(gpu: &Gpu, enc: &mut wgpu::CommandEncoder, sink: &wgpu::Buffer, groups: u32, iters: u32) -> Result<(), GpuError> {
    if sink.size() < 256 * 4 {
        return Err(GpuError::Shape("spin: the sink buffer needs 256 f32".into()));
    }
    let pipeline = gpu.pipelines.get(gpu, &SPIN_FMA)?;
    let uniform = gpu.uniform("spin params", &SpinParams { iters, ..Default::default() });
    let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(SPIN_FMA.name),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: sink.as_entire_binding() },
        ],
    });
    let mut pass = gpu.begin_pass(enc, &wgpu::ComputePassDescriptor { label: Some(SPIN_FMA.name), timestamp_writes: None });
    pass.set_pipeline(&pipeline);
    pass.set_bind_group(0, &bind, &[]);
    let (gx, gy) = gpu.grid(groups);
    pass.dispatch_workgroups(gx, gy, 1);
    Ok(())
}
