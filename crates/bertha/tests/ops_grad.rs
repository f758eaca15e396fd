//! The fused training ops (`bertha::model::ops`): forward values and
//! gradients against candle's composite formulation (`ops::composite`,
//! the form the encoder used before, every step a candle op) on random inputs,
//! against central finite differences on small cases, the fallback path
//! for other dtypes, determinism across thread counts, and errors.

use bertha::config::Activation;
use bertha::model::ops;
use candle_core::{DType, Device, Tensor, Var};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ACTS: [Activation; 4] = [
    Activation::Gelu,
    Activation::GeluTanh,
    Activation::Relu,
    Activation::Tanh,
];

fn rand_tensor(rng: &mut StdRng, dims: &[usize], scale: f32, shift: f32) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| shift + scale * (rng.random::<f32>() * 2.0 - 1.0))
        .collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// max |got - want| / max |want|, asserted below `tol`.
fn assert_close(got: &Tensor, want: &Tensor, tol: f32, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}: shapes");
    let (g, w) = (values(got), values(want));
    let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let err = g
        .iter()
        .zip(&w)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        err / scale <= tol,
        "{what}: max error {err:e} relative to max |value| {scale:e} is {:e} > {tol:e}",
        err / scale
    );
}

/// Σ y·w: a loss whose gradient with respect to y is the random `w`.
fn weighted_sum(y: &Tensor, w: &Tensor) -> Tensor {
    (y * w).unwrap().sum_all().unwrap()
}

/// `inputs` as variables, so that gradients reach them.
fn variables(inputs: &[Tensor]) -> Vec<Tensor> {
    inputs
        .iter()
        .map(|t| Var::from_tensor(t).unwrap().as_tensor().clone())
        .collect()
}

/// Random weights `w` of `y`'s shape for the loss `Σ y·w`, from `seed`.
fn loss_weights(y: &Tensor, seed: u64) -> Tensor {
    let mut rng = StdRng::seed_from_u64(seed);
    rand_tensor(&mut rng, y.dims(), 1.0, 0.0)
}

/// Forward values and the gradients of `Σ f(inputs)·w` for the fused op
/// and for its composite reference, compared at `tol`.
fn check_against(
    inputs: &[Tensor],
    fused: impl Fn(&[Tensor]) -> Tensor,
    reference: impl Fn(&[Tensor]) -> Tensor,
    seed: u64,
    tol: f32,
    what: &str,
) {
    let ts = variables(inputs);
    let y = fused(&ts);
    let y_ref = reference(&ts);
    assert_close(&y, &y_ref, tol, &format!("{what}: forward"));
    let w = loss_weights(&y, seed);
    let grads = weighted_sum(&y, &w).backward().unwrap();
    let grads_ref = weighted_sum(&y_ref, &w).backward().unwrap();
    for (i, t) in ts.iter().enumerate() {
        let g = grads.get(t).expect("fused gradient");
        let g_ref = grads_ref.get(t).expect("reference gradient");
        assert_close(g, g_ref, tol, &format!("{what}: gradient of input {i}"));
    }
}

/// Shapes with rows and widths on and off the 16-lane and 16-row blocks.
const SHAPES: [&[usize]; 6] = [
    &[3, 5],
    &[37, 19],
    &[16, 32],
    &[2, 33, 64],
    &[70, 256],
    &[2, 4, 7, 7],
];

#[test]
fn layer_norm_matches_the_composite_form() {
    let mut rng = StdRng::seed_from_u64(1);
    for (k, dims) in SHAPES.iter().enumerate() {
        let d = *dims.last().unwrap();
        // An offset mean, as residual streams have.
        let x = rand_tensor(&mut rng, dims, 2.0, 0.5);
        let gamma = rand_tensor(&mut rng, &[d], 0.5, 1.0);
        let beta = rand_tensor(&mut rng, &[d], 0.5, 0.0);
        for eps in [1e-12, 1e-5] {
            check_against(
                &[x.clone(), gamma.clone(), beta.clone()],
                |t| ops::layer_norm(&t[0], &t[1], &t[2], eps).unwrap(),
                |t| ops::composite::layer_norm(&t[0], &t[1], &t[2], eps).unwrap(),
                k as u64,
                1e-5,
                &format!("layer_norm {dims:?} eps {eps}"),
            );
        }
    }
}

#[test]
fn softmax_matches_the_composite_form() {
    let mut rng = StdRng::seed_from_u64(2);
    for (k, dims) in SHAPES.iter().enumerate() {
        let x = rand_tensor(&mut rng, dims, 4.0, 1.0);
        check_against(
            &[x],
            |t| ops::softmax_last_dim(&t[0]).unwrap(),
            |t| ops::composite::softmax_last_dim(&t[0]).unwrap(),
            k as u64,
            1e-5,
            &format!("softmax {dims:?}"),
        );
    }
}

#[test]
fn masked_attention_softmax_matches_the_composite_form() {
    // Scores [B, H, T, T] plus an additive padding mask [B, 1, 1, T] of 0
    // and f32::MIN, as the encoder builds them.
    let mut rng = StdRng::seed_from_u64(3);
    let scores = rand_tensor(&mut rng, &[2, 4, 7, 7], 3.0, 0.0);
    let mut mask = vec![0f32; 2 * 7];
    mask[5] = f32::MIN;
    mask[6] = f32::MIN;
    mask[7 + 6] = f32::MIN;
    let mask = Tensor::from_vec(mask, (2, 1, 1, 7), &Device::Cpu).unwrap();
    let add_mask = |t: &Tensor| t.broadcast_add(&mask).unwrap();
    check_against(
        &[scores],
        |t| ops::softmax_last_dim(&add_mask(&t[0])).unwrap(),
        |t| ops::composite::softmax_last_dim(&add_mask(&t[0])).unwrap(),
        9,
        1e-5,
        "masked softmax",
    );
    let p =
        ops::softmax_last_dim(&add_mask(&rand_tensor(&mut rng, &[2, 4, 7, 7], 3.0, 0.0))).unwrap();
    let rows = p.flatten_to(2).unwrap().to_vec2::<f32>().unwrap();
    for (i, row) in rows.iter().enumerate() {
        let sum: f32 = row.iter().sum();
        assert!((sum - 1.0).abs() < 1e-6, "row {i} sums to {sum}");
        let masked = if i < 4 * 7 { &row[5..] } else { &row[6..] };
        assert!(
            masked.iter().all(|&v| v < 1e-30),
            "row {i}: padding gets {masked:?}"
        );
    }
}

#[test]
fn bias_activation_matches_the_composite_form() {
    let mut rng = StdRng::seed_from_u64(4);
    for act in ACTS {
        for (k, dims) in SHAPES.iter().enumerate() {
            let d = *dims.last().unwrap();
            let x = rand_tensor(&mut rng, dims, 3.0, 0.0);
            let bias = rand_tensor(&mut rng, &[d], 1.0, 0.0);
            check_against(
                &[x, bias],
                |t| ops::bias_act(&t[0], &t[1], act).unwrap(),
                |t| ops::composite::bias_act(&t[0], &t[1], act).unwrap(),
                k as u64,
                1e-5,
                &format!("bias + {act:?} {dims:?}"),
            );
        }
    }
}

/// Central differences of `Σ f(inputs)·w` in f64 sums of f32 values,
/// against the gradients `backward` gives.
fn check_finite_differences(
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Tensor,
    h: f32,
    tol: f64,
    what: &str,
) {
    let ts = variables(inputs);
    let y = f(&ts);
    let w = loss_weights(&y, 5);
    let wv = values(&w);
    let grads = weighted_sum(&y, &w).backward().unwrap();
    let loss = |args: &[Tensor]| -> f64 {
        values(&f(args))
            .iter()
            .zip(&wv)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum()
    };
    for (i, t) in inputs.iter().enumerate() {
        let analytic = values(grads.get(&ts[i]).expect("gradient"));
        let base = values(t);
        for (j, &g) in analytic.iter().enumerate() {
            let at = |delta: f32| {
                let mut v = base.clone();
                v[j] += delta;
                let mut args = inputs.to_vec();
                args[i] = Tensor::from_vec(v, t.dims(), &Device::Cpu).unwrap();
                loss(&args)
            };
            let numeric = (at(h) - at(-h)) / (2.0 * f64::from(h));
            let err = (numeric - f64::from(g)).abs();
            assert!(
                err <= tol * (1.0 + numeric.abs()),
                "{what}: d/d input {i}[{j}]: backward {g}, finite differences {numeric}"
            );
        }
    }
}

#[test]
fn gradients_match_finite_differences() {
    let mut rng = StdRng::seed_from_u64(6);
    let (h, tol) = (1e-2, 2e-3);
    let x = rand_tensor(&mut rng, &[3, 5], 1.5, 0.3);
    let gamma = rand_tensor(&mut rng, &[5], 0.5, 1.0);
    let beta = rand_tensor(&mut rng, &[5], 0.5, 0.0);
    check_finite_differences(
        &[x.clone(), gamma, beta],
        |t| ops::layer_norm(&t[0], &t[1], &t[2], 1e-5).unwrap(),
        h,
        tol,
        "layer_norm",
    );
    check_finite_differences(
        std::slice::from_ref(&x),
        |t| ops::softmax_last_dim(&t[0]).unwrap(),
        h,
        tol,
        "softmax",
    );
    // Away from ReLU's kink at 0, where differences straddle it.
    let away: Vec<f32> = values(&x)
        .iter()
        .map(|v| if v.abs() < 0.1 { v + 0.3 } else { *v })
        .collect();
    let x = Tensor::from_vec(away, (3, 5), &Device::Cpu).unwrap();
    let bias = Tensor::zeros(5, DType::F32, &Device::Cpu).unwrap();
    for act in ACTS {
        check_finite_differences(
            &[x.clone(), bias.clone()],
            |t| ops::bias_act(&t[0], &t[1], act).unwrap(),
            h,
            tol,
            &format!("bias + {act:?}"),
        );
    }
}

#[test]
fn other_dtypes_take_the_composite_path() {
    let mut rng = StdRng::seed_from_u64(7);
    let x = rand_tensor(&mut rng, &[9, 21], 2.0, 0.0);
    let gamma = rand_tensor(&mut rng, &[21], 0.5, 1.0);
    let beta = rand_tensor(&mut rng, &[21], 0.5, 0.0);
    let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    let back = |t: Tensor| t.to_dtype(DType::F32).unwrap();
    let pairs = [
        (
            ops::layer_norm(&x, &gamma, &beta, 1e-12).unwrap(),
            ops::layer_norm(&f64s(&x), &f64s(&gamma), &f64s(&beta), 1e-12).unwrap(),
        ),
        (
            ops::softmax_last_dim(&x).unwrap(),
            ops::softmax_last_dim(&f64s(&x)).unwrap(),
        ),
        (
            ops::bias_act(&x, &beta, Activation::Gelu).unwrap(),
            ops::bias_act(&f64s(&x), &f64s(&beta), Activation::Gelu).unwrap(),
        ),
    ];
    for (i, (fused, composite)) in pairs.into_iter().enumerate() {
        assert_eq!(composite.dtype(), DType::F64, "op {i} keeps f64");
        assert_close(&fused, &back(composite), 1e-5, &format!("op {i}"));
    }
}

#[test]
fn non_contiguous_inputs_are_accepted() {
    let mut rng = StdRng::seed_from_u64(8);
    let x = rand_tensor(&mut rng, &[13, 6], 2.0, 0.0);
    assert!(!x.t().unwrap().is_contiguous());
    let gamma = rand_tensor(&mut rng, &[13], 0.5, 1.0);
    let beta = rand_tensor(&mut rng, &[13], 0.5, 0.0);
    check_against(
        &[x],
        |t| {
            let xt = t[0].t().unwrap();
            ops::layer_norm(&xt, &gamma, &beta, 1e-5).unwrap()
        },
        |t| ops::composite::layer_norm(&t[0].t().unwrap(), &gamma, &beta, 1e-5).unwrap(),
        1,
        1e-5,
        "layer_norm of a transposed input",
    );
}

#[test]
fn weight_gradients_do_not_depend_on_the_thread_count() {
    let mut rng = StdRng::seed_from_u64(9);
    let x = rand_tensor(&mut rng, &[301, 48], 2.0, 0.1);
    let gamma = Var::from_tensor(&rand_tensor(&mut rng, &[48], 0.5, 1.0)).unwrap();
    let beta = Var::from_tensor(&rand_tensor(&mut rng, &[48], 0.5, 0.0)).unwrap();
    let w = rand_tensor(&mut rng, &[301, 48], 1.0, 0.0);
    let grads = || {
        let y = ops::layer_norm(&x, gamma.as_tensor(), beta.as_tensor(), 1e-12).unwrap();
        let z = ops::bias_act(&y, beta.as_tensor(), Activation::Gelu).unwrap();
        let g = weighted_sum(&z, &w).backward().unwrap();
        (
            values(g.get(gamma.as_tensor()).unwrap()),
            values(g.get(beta.as_tensor()).unwrap()),
        )
    };
    let many = grads();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(grads);
    let three = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap()
        .install(grads);
    assert_eq!(many, one, "1 thread");
    assert_eq!(many, three, "3 threads");
}

#[test]
fn mismatched_shapes_are_errors() {
    let x = Tensor::ones((2, 4), DType::F32, &Device::Cpu).unwrap();
    let three = Tensor::ones(3, DType::F32, &Device::Cpu).unwrap();
    let four = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    let err = ops::layer_norm(&x, &three, &four, 1e-5).unwrap_err();
    assert!(err.to_string().contains("weight"), "{err}");
    let err = ops::bias_act(&x, &three, Activation::Relu).unwrap_err();
    assert!(err.to_string().contains("bias"), "{err}");
    // Empty batches (and empty rows) go through without panicking.
    for dims in [[0usize, 4], [3, 0]] {
        let empty = Var::zeros(&dims, DType::F32, &Device::Cpu).unwrap();
        let e = empty.as_tensor();
        let g = Var::zeros(dims[1], DType::F32, &Device::Cpu).unwrap();
        for (y, weighted) in [
            (ops::softmax_last_dim(e).unwrap(), false),
            (
                ops::layer_norm(e, g.as_tensor(), g.as_tensor(), 1e-5).unwrap(),
                true,
            ),
            (
                ops::bias_act(e, g.as_tensor(), Activation::Gelu).unwrap(),
                true,
            ),
        ] {
            assert_eq!(y.dims(), &dims, "{dims:?}");
            let grads = y.sum_all().unwrap().backward().unwrap();
            assert_eq!(grads.get(e).unwrap().dims(), &dims, "{dims:?}");
            if weighted {
                assert_eq!(grads.get(g.as_tensor()).unwrap().dims(), &[dims[1]]);
            }
        }
    }
}
