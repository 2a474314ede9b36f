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

use crate::gpu::Kernel;

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
