//! Saving and resuming a run: exact resume from a checkpoint (with the
//! check that it is the same run), atomic checkpoints, the final folder
//! (`best/` with early stopping, `eval_results.json`) and the loss and
//! metric pictures.

use super::*;

impl<O: Objective> Trainer<O> {
    /// Continues from a checkpoint written by this loop: weights,
    /// optimiser moments and step; the metrics after it are dropped and
    /// the early-stopping state is rebuilt from those before it.
    pub fn resume(&mut self, dir: &Path) -> Result<()> {
        let ck = Checkpoint::load(dir)?;
        self.check_same_run(&ck)?;
        let writer = self.is_writer();
        if writer {
            run_dir::remove_stale_temporaries(&self.opts.out)?;
        }
        self.params.load(&ck.model, &ck.dir.join(MODEL_FILE))?;
        self.optim.load_state(ck.state.step, &ck.optimizer)?;
        self.step = ck.state.step;
        self.synced = false;
        (self.history, self.evals) =
            rewind_metrics(&self.opts.out.join("metrics.jsonl"), self.step, writer)?;
        self.metrics_owned = true;
        self.best = None;
        self.patience_used = 0;
        for e in self.evals.clone() {
            self.track_best(&e);
        }
        // A best model saved by the abandoned steps is not this run's.
        let best_dir = self.opts.out.join("best");
        if let Ok(text) = std::fs::read_to_string(best_dir.join(EVAL_RESULTS_FILE)) {
            let step = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("step")?.as_u64());
            if writer && step.is_some_and(|s| s > self.step) {
                tracing::warn!(
                    "{}: written after step {}, by the steps this resume repeats; removing it",
                    best_dir.display(),
                    self.step
                );
                std::fs::remove_dir_all(&best_dir).map_err(|e| Error::io(&best_dir, e))?;
            }
        }
        Ok(())
    }

    /// Refuses a checkpoint whose run had other options, data or model
    /// config than this one, but for the changes `allow_changes` accepts.
    fn check_same_run(&self, ck: &Checkpoint) -> Result<()> {
        let mut was = run_dir::fields(&ck.state.options);
        let mut now = run_dir::fields(&self.objective.options_json());
        if let Some(data) = &ck.state.data {
            was.insert("data".into(), data.clone().into());
            now.insert(
                "data".into(),
                self.objective.data_fingerprint().hex().into(),
            );
        }
        let config_path = ck.dir.join("config.json");
        if config_path.is_file() {
            let config = |c: &BertConfig| serde_json::json!({ "config": c.to_json() });
            was.extend(run_dir::fields(&config(&BertConfig::from_file(
                &config_path,
            )?)));
            now.extend(run_dir::fields(&config(&self.config)));
        }
        run_dir::check_unchanged(&ck.dir, &was, &now, &self.opts.allow_changes)
    }

    /// The final model in `out`: the best one with early stopping, else
    /// the last; its held-out scores in `eval_results.json`.
    pub(super) fn finish(&self, out: &Path) -> Result<()> {
        let best_dir = out.join("best");
        if self.opts.early_stop.is_some() && best_dir.join(MODEL_FILE).is_file() {
            for entry in std::fs::read_dir(&best_dir).map_err(|e| Error::io(&best_dir, e))? {
                let p = entry.map_err(|e| Error::io(&best_dir, e))?.path();
                if p.is_file() {
                    let bytes = std::fs::read(&p).map_err(|e| Error::io(&p, e))?;
                    if let Some(name) = p.file_name() {
                        write_atomic(&out.join(name), &bytes)?;
                    }
                }
            }
            // What the objective writes beside the model (a generator, a
            // sentence-transformers layout), from the copied files.
            self.objective.write_extras(out)?;
        } else {
            self.save_model(out, false)?;
            if let Some(e) = self.evals.last() {
                write_json(&out.join(EVAL_RESULTS_FILE), e)?;
            }
        }
        if self.opts.early_stop.is_some() {
            let best = self
                .best
                .and_then(|(s, _)| self.evals.iter().find(|e| e.step == s));
            if let Some(e) = best {
                write_json(&out.join(EVAL_RESULTS_FILE), e)?;
            }
        }
        self.plot(out)
    }

    fn parts<'a>(&'a self, state: Option<&'a TrainerState>) -> CheckpointParts<'a> {
        CheckpointParts {
            config: &self.config,
            params: &self.params,
            optimizer: state.map(|_| &self.optim),
            state,
            tokenizer_source: &self.tokenizer_source,
        }
    }

    /// Writes the model files (config, weights, tokenizer, the objective's
    /// extras) into `dir`: as a new folder renamed into place (`whole`), or
    /// file by file into an existing one (the run's output folder).
    pub(super) fn save_model(&self, dir: &Path, whole: bool) -> Result<()> {
        if whole {
            Checkpoint::save(dir, &self.parts(None))?;
        } else {
            Checkpoint::save_model_files(dir, &self.parts(None))?;
        }
        self.objective.write_extras(dir)
    }

    /// Writes a resumable checkpoint of the current state (refused when a
    /// weight is not finite: a checkpoint is always one to resume from).
    pub fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        if let Some(value) = self.params.first_non_finite()? {
            return Err(Error::Diverged {
                what: "a weight",
                value,
                step: self.step,
                last_good: newest_checkpoint(&self.opts.out, self.step.saturating_sub(1)),
            });
        }
        let state = TrainerState {
            step: self.step,
            total_steps: self.plan.total_steps,
            seed: self.opts.seed,
            options: self.objective.options_json(),
            last_loss: self.history.last().map(|m| m.loss),
            data: Some(self.objective.data_fingerprint().hex()),
        };
        Checkpoint::save(dir, &self.parts(Some(&state)))?;
        self.objective.write_extras(dir)
    }

    /// `loss.png` (training loss per step, held-out loss) and, where the
    /// objective names one, `metric.png` (the held-out scores).
    #[cfg(feature = "show")]
    pub(super) fn plot(&self, out: &Path) -> Result<()> {
        let chart = self.objective.chart();
        let train: Vec<(f64, f64)> = self
            .history
            .iter()
            .map(|m| {
                let y = match chart.train_figure {
                    Some(k) => m.figures.get(k).copied().unwrap_or(f64::NAN),
                    None => m.loss,
                };
                (m.step as f64, y)
            })
            .collect();
        let eval: Vec<(f64, f64)> = self
            .evals
            .iter()
            .map(|e| (e.step as f64, e.eval_loss))
            .collect();
        crate::show::curve::plot_loss(
            &out.join("loss.png"),
            &chart.title,
            &chart.train_label,
            train,
            &chart.eval_label,
            eval,
        )?;
        if let (Some(title), Some(first)) = (&chart.scores_title, self.evals.first()) {
            let series: Vec<(&str, Vec<(f64, f64)>)> = first
                .scores
                .keys()
                .map(|n| {
                    let points = self
                        .evals
                        .iter()
                        .filter_map(|e| Some((e.step as f64, *e.scores.get(n)?)))
                        .collect();
                    (n.as_str(), points)
                })
                .collect();
            crate::show::curve::plot_curves(&out.join("metric.png"), title, "step", &series)?;
        }
        Ok(())
    }

    #[cfg(not(feature = "show"))]
    pub(super) fn plot(&self, _: &Path) -> Result<()> {
        Ok(())
    }
}
