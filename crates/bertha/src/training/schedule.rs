//! Learning-rate schedules as transformers' `get_*_schedule_with_warmup`:
//! linear warmup from 0, then linear decay to 0, cosine, or constant.

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    Linear,
    Cosine,
    Constant,
}

impl ScheduleKind {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "linear" => Ok(Self::Linear),
            "cosine" => Ok(Self::Cosine),
            "constant" => Ok(Self::Constant),
            other => Err(Error::option(
                "schedule",
                format!("`{other}`: expected linear, cosine or constant"),
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    pub peak: f64,
    pub warmup: u64,
    pub total: u64,
    pub kind: ScheduleKind,
}

impl LrSchedule {
    /// The rate for optimiser step `step` (0-based, as PyTorch's
    /// `LambdaLR` sees it before its first `step()`).
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.peak * step as f64 / self.warmup.max(1) as f64;
        }
        let decay_steps = self.total.saturating_sub(self.warmup).max(1) as f64;
        let progress = (step - self.warmup) as f64 / decay_steps;
        match self.kind {
            ScheduleKind::Constant => self.peak,
            ScheduleKind::Linear => self.peak * (1.0 - progress).max(0.0),
            ScheduleKind::Cosine => {
                self.peak * 0.5 * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos())
            }
        }
    }
}
