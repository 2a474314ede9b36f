//! Benchmark of the moe kernels on the benchmark GPU (being written: see the open issue).

fn main() {
    eprintln!("no moe benchmark yet");
}
