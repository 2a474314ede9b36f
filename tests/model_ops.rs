//! The model graph's own small ops (embedding gather, residual add) against the CPU.

mod support;

use k31_engine::gpu::GpuTensor;
use k31_engine::layout::DType;
use k31_engine::ops::{elementwise, embed};
use support::{gpu, random_vec};

#[test]
fn embedding_gather_across_table_chunks() {
    let Some(g) = gpu() else { return };
    let (vocab, d) = (301, 34);
    let table = random_vec(1, vocab * d);
    let ids: Vec<u32> = vec![0, 300, 17, 17, 150, 299, 1];
    for dtype in [DType::BF16, DType::F32] {
        let (bytes, want_table): (Vec<u8>, Vec<f32>) = match dtype {
            DType::BF16 => {
                let b: Vec<half::bf16> = table.iter().map(|&x| half::bf16::from_f32(x)).collect();
                (bytemuck::cast_slice(&b).to_vec(), b.iter().map(|x| x.to_f32()).collect())
            }
            _ => (bytemuck::cast_slice(&table).to_vec(), table.clone()),
        };
        // Small chunks: ids land in different buffers.
        let t = GpuTensor::upload(&g, "embed", dtype, &[vocab, d], &bytes, Some(4096)).expect("upload");
        assert!(t.chunks.len() > 5);
        let idb = g.storage_from("ids", &ids);
        let out = g.storage("out", (ids.len() * d * 4) as u64);
        let mut enc = g.device.create_command_encoder(&Default::default());
        embed::embed(&g, &mut enc, &t, ids.len(), &idb, &out, None).expect("embed");
        g.queue.submit([enc.finish()]);
        let got: Vec<f32> = g.read(&out, ids.len() * d).expect("read");
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(&got[i * d..(i + 1) * d], &want_table[id as usize * d..(id as usize + 1) * d], "{dtype:?} token {i}");
        }
    }
}

#[test]
fn residual_add() {
    let Some(g) = gpu() else { return };
    let n = 70_001;
    let (a, b) = (random_vec(2, n), random_vec(3, n));
    let (ab, bb, out) = (g.storage_from("a", &a), g.storage_from("b", &b), g.storage("out", (n * 4) as u64));
    let mut enc = g.device.create_command_encoder(&Default::default());
    elementwise::add(&g, &mut enc, n, &ab, &bb, &out, None).expect("add");
    g.queue.submit([enc.finish()]);
    let got: Vec<f32> = g.read(&out, n).expect("read");
    assert!(got.iter().zip(a.iter().zip(&b)).all(|(g, (x, y))| *g == x + y));
}
