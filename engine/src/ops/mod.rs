//! Host side of the kernels: one module per shader file (pipelines, bind groups,
//! dispatch sizes, host-checked preconditions). Each op has a CPU twin in `reference`.

pub mod copy;
pub mod dsa;
pub mod embed;
pub mod gemv;
pub mod attn_res;
pub mod kda;
pub mod linear;
pub mod moe;
pub mod norm;
pub mod router;

use crate::gpu::{Gpu, Kernel};

/// A kernel parameter struct defined once in Rust and mirrored by a WGSL struct of the same
/// name; a test compares size and field offsets through naga.
pub trait ShaderParams: bytemuck::Pod {
    const SHADER: &'static str;
    const NAME: &'static str;
    fn fields() -> Vec<(&'static str, usize)>;
}

/// Layout of one parameter struct, for the layout test.
#[derive(Debug, Clone)]
pub struct ParamsLayout {
    pub shader: &'static str,
    pub name: &'static str,
    pub size: usize,
    pub fields: Vec<(&'static str, usize)>,
}

/// An experiment switch read once per process through `cell`: on unless the environment
/// variable `name` is "0".
pub(crate) fn switch_on(cell: &std::sync::OnceLock<bool>, name: &str) -> bool {
    *cell.get_or_init(|| std::env::var(name).map_or(true, |v| v != "0"))
}

pub(crate) fn layout_of<T: ShaderParams>() -> ParamsLayout {
    ParamsLayout { shader: T::SHADER, name: T::NAME, size: std::mem::size_of::<T>(), fields: T::fields() }
}

/// Declares a `#[repr(C)]` parameter struct and its [`ShaderParams`] impl.
macro_rules! shader_params {
    ($(#[$m:meta])* $name:ident in $shader:literal { $($field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name { $(pub $field: $ty),* }
        impl $crate::ops::ShaderParams for $name {
            const SHADER: &'static str = $shader;
            const NAME: &'static str = stringify!($name);
            fn fields() -> Vec<(&'static str, usize)> {
                vec![$((stringify!($field), std::mem::offset_of!($name, $field))),*]
            }
        }
    };
}
pub(crate) use shader_params;

/// Every parameter struct shared with a shader.
pub fn all_params() -> Vec<ParamsLayout> {
    let mut v = vec![
        layout_of::<copy::CopyParams>(),
        layout_of::<copy::SpinParams>(),
        layout_of::<copy::TouchParams>(),
        layout_of::<copy::PageTouchParams>(),
        layout_of::<gemv::GemvParams>(),
        layout_of::<gemv::MultiParams>(),
        layout_of::<gemv::NormGemvParams>(),
        layout_of::<embed::EmbedParams>(),
    ];
    v.extend(kda::params());
    v.extend(dsa::params());
    v.extend(moe::params());
    v
}

/// Every kernel variant the engine can build: the table the portability test expands.
pub fn all_kernels() -> Vec<Kernel> {
    [copy::KERNELS, gemv::KERNELS, embed::KERNELS, kda::KERNELS, dsa::KERNELS, moe::KERNELS, router::KERNELS, norm::KERNELS, attn_res::KERNELS, linear::KERNELS]
        .concat()
}

/// Builds every kernel variant this adapter runs, on all cores but one, so that the first prompt
/// of a process does not wait for the driver to compile them one by one: run it beside the
/// weight upload. A no-op on software adapters (lavapipe), where the compiles would take the
/// CPU from everything else. Returns how many pipelines were built.
pub fn prewarm(gpu: &Gpu) -> usize {
    if gpu.info.device_type == wgpu::DeviceType::Cpu {
        return 0;
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).saturating_sub(1).max(1);
    gpu.pipelines.prewarm(gpu, &all_kernels(), threads)
}

/// Runs `work` (a weight upload) while [`prewarm`] builds the kernels on other threads. Returns
/// its result with the pipelines built and the prewarm's seconds, or None where the prewarm
/// thread panicked: that only leaves kernels to be built on first use, so it cannot take
/// `work` down with it.
pub fn beside_prewarm<R>(gpu: &Gpu, work: impl FnOnce() -> R) -> (R, Option<(usize, f64)>) {
    std::thread::scope(|scope| {
        let warm = scope.spawn(|| {
            let t = std::time::Instant::now();
            (prewarm(gpu), t.elapsed().as_secs_f64())
        });
        let out = work();
        (out, warm.join().ok())
    })
}
