//! Data-parallel training: the processes of one run ([`ProcessGroup`]) and
//! what they exchange. Each process runs its slice ([`shard`]) of every
//! micro-batch; the loss of each slice is weighted by its share of the
//! whole micro-batch's targets, so the summed gradients ([`GradientReducer`])
//! are those of one process running the whole batch, and every process
//! then takes the same optimiser step.
//!
//! The MPI implementation is [`super::mpi::MpiGroup`] (feature `mpi`);
//! [`SingleProcess`] is the one-process group every run has otherwise.

use std::ops::Range;

use super::optim::GradAccumulator;
use super::params::ParamStore;
use crate::error::{Error, Result};

/// The processes of one training run, and the collectives the trainer
/// needs from them. Every call is collective: every process makes it, in
/// the same order, with buffers of the same length.
pub trait ProcessGroup {
    /// This process's number, 0 to `size() - 1`; 0 writes the run's files.
    fn rank(&self) -> usize;

    fn size(&self) -> usize;

    /// Replaces `values` by their element-wise sum over every process.
    fn sum_f64(&self, values: &mut [f64]) -> Result<()>;

    /// `recv` = the element-wise sum of every process's `send`.
    fn sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<()>;

    /// Replaces `values` by process 0's.
    fn broadcast_f32(&self, values: &mut [f32]) -> Result<()>;

    /// Every process's `values`, rank after rank.
    fn gather_u64(&self, values: &[u64]) -> Result<Vec<u64>>;

    /// Every process's `values` (their lengths may differ), rank after
    /// rank: e.g. the embeddings of each process's rows of a batch.
    fn gather_f32(&self, values: &[f32]) -> Result<Vec<Vec<f32>>>;

    /// Sends `send` to process `to` while receiving `recv` from process
    /// `from` (one step of a ring).
    fn exchange_u16(&self, send: &[u16], to: usize, recv: &mut [u16], from: usize) -> Result<()>;

    /// The transport, e.g. `MPICH 4.0.2`, for logs.
    fn describe(&self) -> String;
}

/// A run of one process: every collective is the identity.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleProcess;

impl ProcessGroup for SingleProcess {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn sum_f64(&self, _: &mut [f64]) -> Result<()> {
        Ok(())
    }

    fn sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        recv.copy_from_slice(send);
        Ok(())
    }

    fn broadcast_f32(&self, _: &mut [f32]) -> Result<()> {
        Ok(())
    }

    fn gather_u64(&self, values: &[u64]) -> Result<Vec<u64>> {
        Ok(values.to_vec())
    }

    fn gather_f32(&self, values: &[f32]) -> Result<Vec<Vec<f32>>> {
        Ok(vec![values.to_vec()])
    }

    fn exchange_u16(&self, send: &[u16], _to: usize, recv: &mut [u16], _from: usize) -> Result<()> {
        recv.copy_from_slice(send);
        Ok(())
    }

    fn describe(&self) -> String {
        "one process".into()
    }
}

/// The rows `rank` of `size` processes runs of a micro-batch of `n`:
/// contiguous, the first `n % size` processes one row more.
pub fn shard(n: usize, rank: usize, size: usize) -> Range<usize> {
    let size = size.max(1);
    let (base, extra) = (n / size, n % size);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// Whether process `rank` of `size` evaluates chunk `c` of a held-out set
/// (chunks dealt round-robin: held-out sets are sorted by length, so every
/// process gets long and short ones).
pub fn deals(c: usize, rank: usize, size: usize) -> bool {
    c % size.max(1) == rank
}

/// How gradient buckets travel between processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// fp32, summed by the MPI library's own all-reduce (exact up to
    /// summation order).
    #[default]
    None,
    /// bf16 on the wire, half the bytes: a ring reduce-scatter and
    /// all-gather over point-to-point exchanges, each hop's partial sum
    /// rounded to bf16 and added in fp32; every process ends with the same
    /// bf16-rounded sums (as PyTorch DDP's `bf16_compress_hook`).
    Bf16,
}

impl std::str::FromStr for Compression {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" | "fp32" => Ok(Self::None),
            "bf16" => Ok(Self::Bf16),
            _ => Err(Error::option(
                "grad_compression",
                format!("`{s}` is unknown (expected none or bf16)"),
            )),
        }
    }
}

/// Sums `values` over every process in place with bf16 on the wire (see
/// [`Compression::Bf16`]): N − 1 reduce-scatter steps, then N − 1
/// all-gather steps, each moving one of N slices to the next process.
pub fn ring_sum_bf16(group: &dyn ProcessGroup, values: &mut [f32]) -> Result<()> {
    use half::bf16;
    let (n, rank) = (group.size(), group.rank());
    if n == 1 {
        return Ok(());
    }
    let len = values.len();
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let mut send: Vec<u16> = Vec::new();
    let mut recv: Vec<u16> = Vec::new();
    let mut step = |values: &mut [f32], out: usize, into: usize, add: bool| -> Result<()> {
        send.clear();
        send.extend(
            values[shard(len, out, n)]
                .iter()
                .map(|&v| bf16::from_f32(v).to_bits()),
        );
        let target = shard(len, into, n);
        recv.resize(target.len(), 0);
        group.exchange_u16(&send, next, &mut recv, prev)?;
        for (v, &b) in values[target].iter_mut().zip(&recv) {
            let x = bf16::from_bits(b).to_f32();
            *v = if add { *v + x } else { x };
        }
        Ok(())
    };
    // Reduce-scatter: after it, this process holds the whole sum of slice
    // rank + 1.
    for s in 0..n - 1 {
        step(values, (rank + n - s) % n, (rank + 2 * n - s - 1) % n, true)?;
    }
    // Its own slice as the others will receive it: rounded to bf16.
    for v in &mut values[shard(len, (rank + 1) % n, n)] {
        *v = bf16::from_f32(*v).to_f32();
    }
    for s in 0..n - 1 {
        step(values, (rank + 1 + n - s) % n, (rank + n - s) % n, false)?;
    }
    Ok(())
}

/// Default all-reduce bucket: 4 MiB of fp32 gradients (large enough for
/// the link's bandwidth, small enough to bound the copy buffer).
pub const DEFAULT_BUCKET_BYTES: usize = 4 << 20;

/// Sums the gradients of every process in buckets, walking the parameters
/// in name order (the same on every process). A parameter with a gradient
/// on any process gets the sum (zeros where a process had none); one with a
/// gradient nowhere stays without. Keeps its two flat buffers from step to
/// step.
#[derive(Debug)]
pub struct GradientReducer {
    bucket_values: usize,
    compression: Compression,
    send: Vec<f32>,
    recv: Vec<f32>,
}

impl GradientReducer {
    pub fn new(bucket_bytes: usize) -> Self {
        Self {
            bucket_values: (bucket_bytes / std::mem::size_of::<f32>()).max(1),
            compression: Compression::None,
            send: Vec::new(),
            recv: Vec::new(),
        }
    }

    /// Sends buckets as `compression` says (fp32 unless set).
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    pub fn all_reduce(
        &mut self,
        group: &dyn ProcessGroup,
        params: &ParamStore,
        acc: &mut GradAccumulator,
    ) -> Result<()> {
        if group.size() == 1 {
            return Ok(());
        }
        let names: Vec<(&str, usize)> = params.vars().map(|(n, v)| (n, v.elem_count())).collect();
        let mut present: Vec<f64> = names
            .iter()
            .map(|(n, _)| f64::from(u8::from(acc.get(n).is_some())))
            .collect();
        group.sum_f64(&mut present)?;
        self.send.clear();
        for ((name, len), &p) in names.iter().zip(&present) {
            if p > 0.0 {
                match acc.get(name) {
                    Some(g) => self.send.extend_from_slice(&g),
                    None => self.send.resize(self.send.len() + len, 0.0),
                }
            }
        }
        self.recv.resize(self.send.len(), 0.0);
        match self.compression {
            Compression::None => {
                for (send, recv) in self
                    .send
                    .chunks(self.bucket_values)
                    .zip(self.recv.chunks_mut(self.bucket_values))
                {
                    group.sum_f32(send, recv)?;
                }
            }
            Compression::Bf16 => {
                self.recv.copy_from_slice(&self.send);
                for bucket in self.recv.chunks_mut(self.bucket_values) {
                    ring_sum_bf16(group, bucket)?;
                }
            }
        }
        let mut at = 0;
        for ((name, len), &p) in names.iter().zip(&present) {
            if p > 0.0 {
                acc.set_from(name, &self.recv[at..at + len])?;
                at += len;
            }
        }
        Ok(())
    }
}

/// What a run's processes must agree on, each part hashed.
pub struct RunIdentity {
    pub parts: Vec<(&'static str, u64)>,
}

/// Refuses to start unless every process has the same config, tokenizer,
/// data and options as process 0; names the first process and part that
/// differ.
pub fn check_same_run(group: &dyn ProcessGroup, identity: &RunIdentity) -> Result<()> {
    let mine: Vec<u64> = identity.parts.iter().map(|(_, h)| *h).collect();
    let all = group.gather_u64(&mine)?;
    let k = mine.len();
    for rank in 1..group.size() {
        let theirs = &all[rank * k..(rank + 1) * k];
        for ((what, _), (a, b)) in identity.parts.iter().zip(all[..k].iter().zip(theirs)) {
            if a != b {
                return Err(Error::Distributed(format!(
                    "process {rank} differs from process 0 in its {what} ({b:016x} vs {a:016x}); \
                     every process must run the same command on the same files"
                )));
            }
        }
    }
    Ok(())
}

/// Replaces every parameter by process 0's (the initial or resumed
/// weights every process starts from).
pub fn broadcast_params(group: &dyn ProcessGroup, params: &ParamStore) -> Result<()> {
    if group.size() == 1 {
        return Ok(());
    }
    for (_, var) in params.vars() {
        let mut values = var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
        group.broadcast_f32(&mut values)?;
        let t = candle_core::Tensor::from_vec(values, var.shape(), var.device())?;
        super::optim::weight_written(var.as_tensor());
        var.set(&t)?;
    }
    Ok(())
}

/// Refuses to go on when the processes' weights differ (they take the
/// same steps from the same start, so they never should).
pub fn check_same_weights(group: &dyn ProcessGroup, params: &ParamStore, step: u64) -> Result<()> {
    if group.size() == 1 {
        return Ok(());
    }
    let mut h = Hash64::default();
    for (name, var) in params.vars() {
        h.bytes(name.as_bytes());
        for v in var.as_tensor().flatten_all()?.to_vec1::<f32>()? {
            h.word(u64::from(v.to_bits()));
        }
    }
    let all = group.gather_u64(&[h.finish()])?;
    if let Some(rank) = (1..all.len()).find(|&r| all[r] != all[0]) {
        return Err(Error::Distributed(format!(
            "after step {step}, process {rank}'s weights differ from process 0's"
        )));
    }
    Ok(())
}

/// A 64-bit running hash (splitmix64 mixing; not cryptographic).
#[derive(Debug, Clone, Copy)]
pub struct Hash64(u64);

impl Default for Hash64 {
    fn default() -> Self {
        Self(0x243f_6a88_85a3_08d3)
    }
}

impl Hash64 {
    pub fn word(&mut self, w: u64) {
        let mut x = (self.0 ^ w).wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.0 = x ^ (x >> 31);
    }

    pub fn bytes(&mut self, b: &[u8]) {
        for chunk in b.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.word(u64::from_le_bytes(w));
        }
        self.word(b.len() as u64);
    }

    pub fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Processes as threads joined in a ring by channels: enough for the
    /// ring exchange (the only collective it offers).
    struct Ring {
        rank: usize,
        size: usize,
        to_next: std::sync::mpsc::Sender<Vec<u16>>,
        from_prev: std::sync::mpsc::Receiver<Vec<u16>>,
    }

    fn ring_only() -> Error {
        Error::Distributed("a ring of threads offers the ring exchange only".into())
    }

    impl ProcessGroup for Ring {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn sum_f64(&self, _: &mut [f64]) -> Result<()> {
            Err(ring_only())
        }
        fn sum_f32(&self, _: &[f32], _: &mut [f32]) -> Result<()> {
            Err(ring_only())
        }
        fn broadcast_f32(&self, _: &mut [f32]) -> Result<()> {
            Err(ring_only())
        }
        fn gather_u64(&self, _: &[u64]) -> Result<Vec<u64>> {
            Err(ring_only())
        }
        fn gather_f32(&self, _: &[f32]) -> Result<Vec<Vec<f32>>> {
            Err(ring_only())
        }
        fn exchange_u16(
            &self,
            send: &[u16],
            to: usize,
            recv: &mut [u16],
            from: usize,
        ) -> Result<()> {
            assert_eq!(to, (self.rank + 1) % self.size);
            assert_eq!(from, (self.rank + self.size - 1) % self.size);
            self.to_next.send(send.to_vec()).unwrap();
            let got = self.from_prev.recv().unwrap();
            recv.copy_from_slice(&got);
            Ok(())
        }
        fn describe(&self) -> String {
            "ring of threads".into()
        }
    }

    #[test]
    fn bf16_ring_sum_is_the_same_everywhere_and_close_to_the_sum() {
        for (size, len) in [(2usize, 11usize), (3, 10), (4, 3), (3, 1000)] {
            let inputs: Vec<Vec<f32>> = (0..size)
                .map(|r| {
                    (0..len)
                        .map(|i| ((i * 7 + r * 13) % 17) as f32 * 0.173 - 1.3)
                        .collect()
                })
                .collect();
            let exact: Vec<f64> = (0..len)
                .map(|i| inputs.iter().map(|v| f64::from(v[i])).sum())
                .collect();
            let (senders, receivers): (Vec<_>, Vec<_>) =
                (0..size).map(|_| std::sync::mpsc::channel()).unzip();
            let mut receivers: Vec<_> = receivers.into_iter().map(Some).collect();
            let handles: Vec<_> = (0..size)
                .map(|rank| {
                    // Process `rank` sends into the next one's channel.
                    let to_next = senders[(rank + 1) % size].clone();
                    let from_prev = receivers[rank].take().unwrap();
                    let mut values = inputs[rank].clone();
                    std::thread::spawn(move || {
                        let ring = Ring {
                            rank,
                            size,
                            to_next,
                            from_prev,
                        };
                        ring_sum_bf16(&ring, &mut values).unwrap();
                        values
                    })
                })
                .collect();
            let outs: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            for out in &outs[1..] {
                assert_eq!(out, &outs[0], "{size} processes disagree");
            }
            let scale = exact.iter().fold(0f64, |m, v| m.max(v.abs()));
            for (i, (&got, &want)) in outs[0].iter().zip(&exact).enumerate() {
                // Each hop rounds to bf16 (8 bits of mantissa).
                let err = (f64::from(got) - want).abs();
                assert!(
                    err <= size as f64 * scale / 256.0,
                    "{size}/{len}[{i}]: {got} vs {want}"
                );
                assert_ne!(got, 0.0, "nothing summed at {i}");
            }
            // Not the fp32 sum: the values did go through bf16.
            assert!(outs[0]
                .iter()
                .zip(&exact)
                .any(|(&g, &w)| f64::from(g) != w && (f64::from(g) - w).abs() > 1e-6));
        }
    }

    #[test]
    fn shards_cover_the_batch_in_order() {
        for n in 0..20 {
            for size in 1..6 {
                let parts: Vec<Range<usize>> = (0..size).map(|r| shard(n, r, size)).collect();
                assert_eq!(parts[0].start, 0);
                assert_eq!(parts[size - 1].end, n);
                for w in parts.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let lens: Vec<usize> = parts.iter().map(|r| r.len()).collect();
                assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1);
            }
        }
        assert_eq!(shard(10, 0, 3), 0..4);
        assert_eq!(shard(10, 1, 3), 4..7);
        assert_eq!(shard(10, 2, 3), 7..10);
    }
}
