//! bertha's gradient all-reduce (`training::distributed::GradientReducer`:
//! flatten, sum in buckets, copy back, as a training step runs it), timed
//! on one parameter of each size `scripts/mpi/allreduce_bench.c` times
//! MPI_Allreduce at, so the two tables line up (`scripts/bench-dp.sh` runs
//! both).
//!
//!   cargo build --release --features mpi --example allreduce_bench
//!   mpiexec -np 2 target/release/examples/allreduce_bench [BUCKET_MB] [none|bf16]
//!
//! GB/s counts the fp32 gradient bytes reduced, whatever travels.

use std::time::Instant;

use bertha::training::distributed::{Compression, GradientReducer, ProcessGroup};
use bertha::training::mpi::MpiGroup;
use bertha::training::optim::GradAccumulator;
use bertha::training::ParamStore;
use candle_core::{DType, Device};
use candle_nn::Init;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bucket_mb: f64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(4.0);
    let bucket = (bucket_mb * (1u64 << 20) as f64) as usize;
    let compression: Compression = std::env::args()
        .nth(2)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or_default();
    let group = MpiGroup::init(std::time::Duration::from_secs(600))?;
    if group.rank() == 0 {
        println!(
            "# bertha GradientReducer, {} processes, {bucket_mb} MiB buckets, compression {:?}\n# bytes\tmean_us\tGB/s",
            group.size(),
            compression
        );
    }
    let mut bytes = 4096usize;
    while bytes <= 64 << 20 {
        let n = bytes / 4;
        let (mut params, vb) = ParamStore::builder(None, "", 0, &Device::Cpu);
        vb.get_with_hints_dtype(n, "w", Init::Const(0.5), DType::F32)?;
        params.freeze()?;
        // Zeros: the sums stay zeros however often they are taken.
        let mut acc = GradAccumulator::new(&params);
        acc.set_from("w", &vec![0f32; n])?;
        acc.set_micro_batches(1);
        let iters = if bytes >= 4 << 20 { 20 } else { 200 };
        let mut reducer = GradientReducer::new(bucket).with_compression(compression);
        let mut run = || reducer.all_reduce(&group, &params, &mut acc);
        for _ in 0..iters / 10 {
            run()?;
        }
        let mut local = [0f64];
        let t0 = Instant::now();
        for _ in 0..iters {
            run()?;
        }
        local[0] = t0.elapsed().as_secs_f64() / iters as f64;
        group.sum_f64(&mut local)?;
        let mean = local[0] / group.size() as f64;
        if group.rank() == 0 {
            println!(
                "{bytes}\t{:.1}\t{:.3}",
                mean * 1e6,
                bytes as f64 / mean / 1e9
            );
        }
        bytes *= 4;
    }
    Ok(())
}
