//! A gated MLP `down(act(gate x, up x))`: the dense FFN of the first layer(s) and the merged
//! shared experts of an MoE layer (spec 6.1, 6.4).

use crate::checkpoint::TensorView;
use crate::config::Activation;
use crate::gpu::{Gpu, GpuError, GpuTensor, Profiler};
use crate::ops::{linear::{linear_into, linear_many}, norm::glu};

pub struct GluMlp {
    gate: GpuTensor,
    up: GpuTensor,
    down: GpuTensor,
    act: Activation,
}

/// Uploads a float matrix of the expected shape.
pub(crate) fn matrix<'a>(
    gpu: &Gpu,
    lookup: &dyn Fn(&str) -> Option<TensorView<'a>>,
    layer: usize,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<GpuTensor, GpuError> {
    let v = lookup(name).ok_or_else(|| GpuError::Shape(format!("layer {layer}: missing tensor {name}")))?;
    if v.shape != [rows, cols] {
        return Err(GpuError::Shape(format!("layer {layer}: {name} has shape {:?}, expected [{rows}, {cols}]", v.shape)));
    }
    GpuTensor::upload(gpu, &format!("layers.{layer}.{name}"), v.dtype, v.shape, v.data, None)
}

impl GluMlp {
    /// `prefix` is `mlp.` or `block_sparse_moe.shared_experts.`; widths d -> inner -> d.
    pub fn load<'a>(
        gpu: &Gpu,
        lookup: &dyn Fn(&str) -> Option<TensorView<'a>>,
        layer: usize,
        prefix: &str,
        d: usize,
        inner: usize,
        act: Activation,
    ) -> Result<GluMlp, GpuError> {
        // transformers writes Kimi Linear's dense MLP under block_sparse_moe.
        let alias = |n: &str| lookup(n).or_else(|| lookup(&n.replacen("mlp.", "block_sparse_moe.", 1)));
        Ok(GluMlp {
            gate: matrix(gpu, &alias, layer, &format!("{prefix}gate_proj.weight"), inner, d)?,
            up: matrix(gpu, &alias, layer, &format!("{prefix}up_proj.weight"), inner, d)?,
            down: matrix(gpu, &alias, layer, &format!("{prefix}down_proj.weight"), d, inner)?,
            act,
        })
    }

    /// out [T, d] = down(act(gate x, up x)), x [T, d]; or out += it (`accumulate`).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        gpu: &Gpu,
        enc: &mut wgpu::CommandEncoder,
        x: &wgpu::Buffer,
        tokens: usize,
        out: &wgpu::Buffer,
        accumulate: bool,
        mut prof: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        // Internal scratch goes back to the pool when this layer returns.
        let _scratch = gpu.scratch_scope();
        let (g, u) = self.projection_buffers(gpu, tokens);
        linear_many(gpu, enc, &self.projections(&g, &u), tokens, x, prof.as_deref_mut())?;
        self.finish(gpu, enc, &g, &u, tokens, out, accumulate, prof)
    }

    /// Scratch for the gate and up projections of `tokens` tokens.
    pub fn projection_buffers(&self, gpu: &Gpu, tokens: usize) -> (wgpu::Buffer, wgpu::Buffer) {
        let bytes = (tokens * self.gate.rows() * 4) as u64;
        (gpu.scratch("mlp gate", bytes), gpu.scratch("mlp up", bytes))
    }

    /// The (matrix, output) pairs of the gate and up projections, for a caller that runs them
    /// together with other projections of the same x (one GEMV dispatch in decode).
    pub fn projections<'b>(&'b self, g: &'b wgpu::Buffer, u: &'b wgpu::Buffer) -> [(&'b GpuTensor, &'b wgpu::Buffer); 2] {
        [(&self.gate, g), (&self.up, u)]
    }

    /// out = down(act(g, u)) from the projections, or out += it (`accumulate`).
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        &self,
        gpu: &Gpu,
        enc: &mut wgpu::CommandEncoder,
        g: &wgpu::Buffer,
        u: &wgpu::Buffer,
        tokens: usize,
        out: &wgpu::Buffer,
        accumulate: bool,
        mut prof: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        let a = self.act_buffer(gpu, tokens);
        glu(gpu, enc, self.act, tokens * self.inner(), g, u, &a, prof.as_deref_mut())?;
        linear_into(gpu, enc, &self.down, tokens, &a, out, accumulate, prof)
    }

    /// Width of the gated activation.
    pub fn inner(&self) -> usize {
        self.gate.rows()
    }

    pub fn activation(&self) -> Activation {
        self.act
    }

    /// Scratch for the gated activation of `tokens` tokens.
    pub fn act_buffer(&self, gpu: &Gpu, tokens: usize) -> wgpu::Buffer {
        gpu.scratch("mlp act", (tokens * self.inner() * 4) as u64)
    }

    /// The gate and up projections [inner, d].
    pub fn gate_up(&self) -> (&GpuTensor, &GpuTensor) {
        (&self.gate, &self.up)
    }

    /// The down-projection [d, inner].
    pub fn down(&self) -> &GpuTensor {
        &self.down
    }
}
