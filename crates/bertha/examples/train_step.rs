//! Times pre-training steps (forward, masked-LM loss, backward) of a
//! preset on random token ids, as the pre-training loop runs them: only the
//! masked rows go through the vocabulary-sized decoder.
//!
//! ```sh
//! cargo run -p bertha --example train_step --profile dev -- [preset] [steps] [batch] [seq]
//! cargo run -p bertha --example train_step --profile dev -- ops [reps]
//! ```
//! (defaults: `mini 5 8 128`). Dropout is on, as in training. `ops` times
//! forward + backward of each fused op (`bertha::model::ops`) against its
//! composite candle form at the `mini` preset's shapes, alternating the
//! two so that a busy machine slows both alike.

use std::time::Instant;

use bertha::config::Activation;
use bertha::model::{
    cross_entropy_with_ignore, ops, seed_dropout, BertForMaskedLM, BertHead, BertInput,
    ForwardOptions,
};
use bertha::rng::rng_for;
use bertha::training::{ParamStore, Preset};
use bertha::{Device, Error, Result, Tensor};
use candle_core::Var;
use rand::Rng;

type Op = fn(&[Tensor]) -> candle_core::Result<Tensor>;

/// Seconds for the forward pass of `op`, and for it plus the backward of
/// `Σ op(inputs)·w` (the weighted sum gives the op a random output
/// gradient, and costs the same for every op).
fn time_op(op: Op, inputs: &[Var], w: &Tensor) -> Result<[f64; 2]> {
    let ts: Vec<Tensor> = inputs.iter().map(|v| v.as_tensor().clone()).collect();
    let t0 = Instant::now();
    let y = op(&ts)?;
    let fwd = t0.elapsed().as_secs_f64();
    let grads = (y * w)?.sum_all()?.backward()?;
    let total = t0.elapsed().as_secs_f64();
    if grads.get(&ts[0]).is_none() {
        return Err(Error::Input("no gradient reached the input".into()));
    }
    Ok([fwd, total])
}

fn min2(a: [f64; 2], b: [f64; 2]) -> [f64; 2] {
    [a[0].min(b[0]), a[1].min(b[1])]
}

fn bench_ops(reps: usize) -> Result<()> {
    let dev = Device::Cpu;
    let randn = |dims: &[usize]| -> Result<Var> { Ok(Var::randn(0f32, 1f32, dims, &dev)?) };
    let (b, t, h, heads, inter) = (8, 128, 256, 4, 1024);
    let cases: [(&str, Vec<Var>, Op, Op, usize); 3] = [
        (
            "layer_norm [8,128,256]",
            vec![randn(&[b, t, h])?, randn(&[h])?, randn(&[h])?],
            |x| ops::layer_norm(&x[0], &x[1], &x[2], 1e-12),
            |x| ops::composite::layer_norm(&x[0], &x[1], &x[2], 1e-12),
            2 * 4 + 2,
        ),
        (
            "softmax [8,4,128,128]",
            vec![randn(&[b, heads, t, t])?],
            |x| ops::softmax_last_dim(&x[0]),
            |x| ops::composite::softmax_last_dim(&x[0]),
            4,
        ),
        (
            "bias+gelu [8,128,1024]",
            vec![randn(&[b, t, inter])?, randn(&[inter])?],
            |x| ops::bias_act(&x[0], &x[1], Activation::Gelu),
            |x| ops::composite::bias_act(&x[0], &x[1], Activation::Gelu),
            4,
        ),
    ];
    println!(
        "best of {reps} ({} threads), fused vs composite; `loss` is Σ y·w and its backward alone",
        rayon::current_num_threads()
    );
    let (mut total_fused, mut total_composite) = ([0.0; 2], [0.0; 2]);
    for (name, inputs, fused, composite, calls) in &cases {
        let w = Tensor::randn(0f32, 1f32, inputs[0].shape(), &dev)?;
        let mut f = [f64::INFINITY; 2];
        let (mut c, mut id) = (f, f);
        for _ in 0..reps {
            f = min2(f, time_op(*fused, inputs, &w)?);
            c = min2(c, time_op(*composite, inputs, &w)?);
            id = min2(id, time_op(|x| Ok(x[0].clone()), inputs, &w)?);
        }
        for k in 0..2 {
            total_fused[k] += f[k] * *calls as f64;
            total_composite[k] += c[k] * *calls as f64;
        }
        println!(
            "{name:24} forward {:6.2} vs {:6.2} ms, forward + backward {:6.2} vs {:6.2} ms \
             (loss {:5.2} ms), {calls} per step",
            f[0] * 1e3,
            c[0] * 1e3,
            f[1] * 1e3,
            c[1] * 1e3,
            id[1] * 1e3
        );
    }
    println!(
        "per mini step (batch 8 × 128): forward {:.1} vs {:.1} ms, forward + backward {:.1} vs {:.1} ms",
        total_fused[0] * 1e3,
        total_composite[0] * 1e3,
        total_fused[1] * 1e3,
        total_composite[1] * 1e3
    );
    Ok(())
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> Result<T> {
    match args.get(i) {
        Some(s) => s
            .parse()
            .map_err(|_| Error::Input(format!("argument {i}: cannot parse `{s}`"))),
        None => Ok(default),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "ops") {
        return bench_ops(arg(&args, 1, 10)?);
    }
    let name = args.first().map_or("mini", String::as_str);
    let preset = Preset::parse(name)
        .ok_or_else(|| Error::Input(format!("unknown preset `{name}` ({})", Preset::NAMES)))?;
    let steps: usize = arg(&args, 1, 5)?;
    let batch: usize = arg(&args, 2, 8)?;
    let seq: usize = arg(&args, 3, 128)?;
    let vocab = 30522;
    let device = Device::Cpu;
    let config = preset.config(vocab, seq);
    let prefix = format!("{}.", config.family.prefix());
    let (mut params, vb) = ParamStore::builder(None, &prefix, 0, &device);
    let model = BertForMaskedLM::load(vb, config.clone())?;
    params.freeze()?;

    let mut rng = rng_for(0, 0, 0);
    let ids: Vec<Vec<u32>> = (0..batch)
        .map(|_| (0..seq).map(|_| rng.random_range(1000..30000)).collect())
        .collect();
    let types = vec![vec![0u32; seq]; batch];
    let input = BertInput::from_ids(&ids, &types, 0, &device)?;
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    for (b, s) in ids.iter().enumerate() {
        for (j, &id) in s.iter().enumerate() {
            if rng.random::<f64>() < 0.15 {
                rows.push((b * seq + j) as u32);
                targets.push(i64::from(id));
            }
        }
    }
    let idx = Tensor::from_vec(rows, targets.len(), &device)?;
    println!(
        "{name}: {} layers, hidden {}, batch {batch} × {seq} tokens, {} masked, {} threads",
        config.num_hidden_layers,
        config.hidden_size,
        targets.len(),
        rayon::current_num_threads()
    );

    let mut times = Vec::new();
    // One untimed step first: page faults and lazy initialisation.
    for step in 0..=steps {
        seed_dropout(step as u64, 0);
        let t0 = Instant::now();
        let out = model.bert().forward(
            &input,
            ForwardOptions {
                train: true,
                ..ForwardOptions::default()
            },
        )?;
        let hidden = out
            .last_hidden_state
            .reshape((batch * seq, config.hidden_size))?;
        let logits = model
            .predictions()
            .forward(&hidden.index_select(&idx, 0)?)?;
        let loss = cross_entropy_with_ignore(&logits, &targets, -100, "labels")?;
        let value = loss.to_scalar::<f32>()?;
        let t1 = Instant::now();
        let grads = loss.backward()?;
        let t2 = Instant::now();
        let n = params
            .vars()
            .filter(|(_, v)| grads.get(v.as_tensor()).is_some())
            .count();
        let (fwd, bwd) = (t1 - t0, t2 - t1);
        println!(
            "step {step}: loss {value:.4}, forward {:.1} ms, backward {:.1} ms, total {:.1} ms ({n}/{} parameters with gradients){}",
            fwd.as_secs_f64() * 1e3,
            bwd.as_secs_f64() * 1e3,
            (fwd + bwd).as_secs_f64() * 1e3,
            params.len(),
            if step == 0 { " [warm-up]" } else { "" }
        );
        if step > 0 {
            times.push((fwd.as_secs_f64(), bwd.as_secs_f64()));
        }
    }
    let mean = |f: fn(&(f64, f64)) -> f64| times.iter().map(f).sum::<f64>() / times.len() as f64;
    let best = times
        .iter()
        .map(|t| t.0 + t.1)
        .fold(f64::INFINITY, f64::min);
    println!(
        "mean over {} steps: forward {:.1} ms, backward {:.1} ms, step {:.1} ms (best {:.1} ms)",
        times.len(),
        mean(|t| t.0) * 1e3,
        mean(|t| t.1) * 1e3,
        mean(|t| t.0 + t.1) * 1e3,
        best * 1e3
    );
    Ok(())
}
