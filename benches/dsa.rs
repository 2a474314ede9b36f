//! Benchmark of the dsa kernels on the benchmark GPU (being written: see the open issue).

fn main() {
    eprintln!("no dsa benchmark yet");
}
