//! Benchmark of the kda kernels on the benchmark GPU (being written: see the open issue).

fn main() {
    eprintln!("no kda benchmark yet");
}
