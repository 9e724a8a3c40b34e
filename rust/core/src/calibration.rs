//! Calibration of the opaque part of item costs from the provider's own input-token counts.
//!
//! The decoded-size rule for opaque payloads ([`crate::tokens::opaque_tokens`]) is an
//! estimate of tokens nobody outside the provider can see; the provider's `usage.input_tokens`
//! for a model call is the truth for that call. A calibration learns, per model, by how much
//! to scale the opaque part so that past requests would have been estimated at or above what
//! the provider counted — and never scales anything else: text, media and overhead stay at
//! the conservative rule.
//!
//! One model call gives one sample ([`implied_factor`]): with `rest` the request's estimate
//! without its opaque tokens (conservative, so at or above what the provider counts for that
//! part), the provider counted `reported`, so the opaque tokens it counted are at most
//! `reported - rest`; as a factor of the rule's `opaque` tokens that is
//! `(reported - rest) / opaque`, clamped to [`OpaqueScale::MIN`]..[`OpaqueScale::MAX`]. Calls
//! with fewer than [`MIN_OPAQUE_TOKENS`] opaque tokens say nothing about them and give none.
//!
//! The learned scale ([`learned_scale`]) is the largest of the [`MAX_SAMPLES`] most recent
//! samples plus [`MARGIN_SIXTY_FOURTHS`], rounded up to a sixteenth (so it moves in steps,
//! rarely: a new scale makes an index count its costs again); the rule itself until
//! [`MIN_SAMPLES`] samples are known. The largest rather than the mean: every recent call,
//! estimated at the learned scale, would have fit what the provider counted.

//!
//! # Estimates
//!
//! Under an estimate encoding (Claude's, [`crate::tokens::Encoding::is_estimate`]) the
//! calibration scales the whole cost of every item ([`crate::tokens::CostBasis::cost`]), and
//! a sample ([`implied_estimate_factor`]) is `(reported - rest) / items` with `items` the
//! request's items by the estimate (unscaled) and `rest` what the request costs besides them
//! (instructions, tools, the context message: counted by the estimate, never scaled). A call
//! with fewer than [`MIN_OPAQUE_TOKENS`] item tokens gives none, nor does a wild one: a
//! sample above [`ESTIMATE_SAMPLE_CAP`] (the provider counted more than twice the estimate,
//! four tokens per `o200k_base` token, which no published measurement comes near) says that
//! the pairing or the request was not what the estimate saw, and is refused rather than
//! clamped. The learned factor ([`learned_estimate_scale`]) is the largest recent sample plus
//! [`MARGIN_SIXTY_FOURTHS`] in steps of [`STEP_SIXTY_FOURTHS`], between
//! [`CostBasis::MIN_ESTIMATE_SCALE`] (the base encoding's own count) and
//! [`OpaqueScale::MAX`]; with fewer than [`MIN_SAMPLES`] samples it only ever raises the
//! estimate (a call the provider counted above it is evidence enough to be more careful, a
//! single call under it is not enough to be less).

use crate::tokens::{CostBasis, OpaqueScale};

/// The largest sample an estimate's calibration accepts (see the module notes).
pub const ESTIMATE_SAMPLE_CAP: f64 = 2.0;

/// Most recent samples a calibration keeps (older ones are forgotten).
pub const MAX_SAMPLES: usize = 32;
/// Samples needed before a calibration changes anything.
pub const MIN_SAMPLES: usize = 3;
/// Opaque tokens a call must carry to give a sample.
pub const MIN_OPAQUE_TOKENS: u64 = 256;
/// Added to the largest sample, in sixty-fourths (1/16).
pub const MARGIN_SIXTY_FOURTHS: u16 = 4;
/// Steps a learned scale moves in, in sixty-fourths (1/16).
pub const STEP_SIXTY_FOURTHS: u16 = 4;

/// One model call as an audit saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// The request's estimate (items, instructions, tools), opaque part at `scale`.
    pub estimate: u64,
    /// Opaque tokens of the request's items by the rule (unscaled).
    pub opaque: u64,
    /// The calibration the estimate was made with.
    pub scale: OpaqueScale,
    /// The input tokens the provider reported for the call.
    pub reported: u64,
}

impl Observation {
    /// An observation of a call estimated with the calibration `factor`
    /// ([`OpaqueScale::checked`]: a factor out of its bounds is refused).
    pub fn checked(estimate: u64, opaque: u64, factor: f64, reported: u64) -> Result<Self, String> {
        Ok(Observation {
            estimate,
            opaque,
            scale: OpaqueScale::checked(factor)?,
            reported,
        })
    }
}

/// The factor of the rule's opaque tokens the provider counted at most in this call (see
/// the module notes), or `None` when the call carried too few opaque tokens to tell.
pub fn implied_factor(obs: Observation) -> Option<f64> {
    if obs.opaque < MIN_OPAQUE_TOKENS {
        return None;
    }
    let rest = obs.estimate.saturating_sub(obs.scale.apply(obs.opaque));
    let factor = (obs.reported as f64 - rest as f64) / obs.opaque as f64;
    Some(factor.clamp(OpaqueScale::MIN.factor(), OpaqueScale::MAX.factor()))
}

/// The scale learned from `samples` (oldest first; see the module notes). Samples that are
/// not finite numbers are ignored.
pub fn learned_scale(samples: &[f64]) -> OpaqueScale {
    let recent: Vec<f64> = samples
        .iter()
        .rev()
        .copied()
        .filter(|s| s.is_finite())
        .take(MAX_SAMPLES)
        .collect();
    if recent.len() < MIN_SAMPLES {
        return OpaqueScale::ONE;
    }
    let top = recent.iter().copied().fold(f64::MIN, f64::max);
    let units = (top * f64::from(OpaqueScale::UNIT)).ceil() + f64::from(MARGIN_SIXTY_FOURTHS);
    let step = f64::from(STEP_SIXTY_FOURTHS);
    let stepped = (units / step).ceil() * step;
    OpaqueScale::from_factor(stepped / f64::from(OpaqueScale::UNIT)).unwrap_or(OpaqueScale::ONE)
}

/// The factor of an estimate's whole cost the provider counted in this call (see the module
/// notes: `obs.opaque` is then the request's item tokens by the estimate, unscaled):
/// `Ok(None)` when the call carried too few item tokens to tell, `Err(sample)` for a sample
/// above [`ESTIMATE_SAMPLE_CAP`], which is not learned.
pub fn implied_estimate_factor(obs: Observation) -> Result<Option<f64>, f64> {
    if obs.opaque < MIN_OPAQUE_TOKENS {
        return Ok(None);
    }
    let rest = obs.estimate.saturating_sub(obs.scale.apply(obs.opaque));
    let factor = (obs.reported as f64 - rest as f64) / obs.opaque as f64;
    if !factor.is_finite() || factor > ESTIMATE_SAMPLE_CAP {
        return Err(factor);
    }
    Ok(Some(factor.max(CostBasis::MIN_ESTIMATE_SCALE.factor())))
}

/// One model call's sample as an embedding reports it: [`implied_factor`], or with `whole`
/// [`implied_estimate_factor`] (`obs.opaque` then being the items' tokens by the
/// estimate): `(sample, None)`, `(None, None)` when it carried too few tokens to tell, or
/// `(None, Some(wild))` for an estimate's sample above the cap (not learned).
pub fn sample(obs: Observation, whole: bool) -> (Option<f64>, Option<f64>) {
    if !whole {
        return (implied_factor(obs), None);
    }
    match implied_estimate_factor(obs) {
        Ok(sample) => (sample, None),
        Err(wild) => (None, Some(wild)),
    }
}

/// The calibration learned from `samples` (oldest first): [`learned_scale`], or with
/// `whole` (of an estimate's whole cost) [`learned_estimate_scale`].
pub fn learned(samples: &[f64], whole: bool) -> OpaqueScale {
    if whole {
        learned_estimate_scale(samples)
    } else {
        learned_scale(samples)
    }
}

/// The calibration of an estimate's whole cost learned from `samples` (oldest first; see
/// the module notes). Samples that are not finite, or above [`ESTIMATE_SAMPLE_CAP`], are
/// ignored.
pub fn learned_estimate_scale(samples: &[f64]) -> OpaqueScale {
    let recent: Vec<f64> = samples
        .iter()
        .rev()
        .copied()
        .filter(|s| s.is_finite() && *s <= ESTIMATE_SAMPLE_CAP)
        .take(MAX_SAMPLES)
        .collect();
    if recent.is_empty() {
        return OpaqueScale::ONE;
    }
    let top = recent.iter().copied().fold(f64::MIN, f64::max);
    let units = (top * f64::from(OpaqueScale::UNIT)).ceil() + f64::from(MARGIN_SIXTY_FOURTHS);
    let step = f64::from(STEP_SIXTY_FOURTHS);
    let stepped = (units / step).ceil() * step;
    let lowest = if recent.len() < MIN_SAMPLES {
        OpaqueScale::ONE
    } else {
        CostBasis::MIN_ESTIMATE_SCALE
    };
    OpaqueScale::from_factor(stepped / f64::from(OpaqueScale::UNIT))
        .map_or(OpaqueScale::ONE, |s| s.max(lowest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(estimate: u64, opaque: u64, scale: u16, reported: u64) -> Observation {
        Observation {
            estimate,
            opaque,
            scale: OpaqueScale::from_sixty_fourths(scale).unwrap(),
            reported,
        }
    }

    #[test]
    fn an_observation_takes_a_checked_factor() {
        assert_eq!(
            Observation::checked(5000, 4000, 0.5, 3000),
            Ok(obs(5000, 4000, 32, 3000))
        );
        let refused = Observation::checked(5000, 4000, 9.0, 3000).unwrap_err();
        assert!(
            refused.starts_with("opaque_scale must be between"),
            "{refused}"
        );
        assert!(Observation::checked(1, 1, f64::NAN, 1).is_err());
    }

    #[test]
    fn samples_in_a_table() {
        for (o, want) in [
            // rest 1000 + opaque 4000 at the rule; the provider counted 3000: half of it.
            (obs(5000, 4000, 64, 3000), Some(0.5)),
            // The same request estimated at scale 1/2 (rest is still 1000).
            (obs(3000, 4000, 32, 3000), Some(0.5)),
            // The provider counted all of it, and more: clamped to the largest scale.
            (obs(5000, 4000, 64, 5000), Some(1.0)),
            (obs(5000, 4000, 64, 20_000), Some(2.0)),
            // The provider counted less than the rest alone: the smallest scale.
            (obs(5000, 4000, 64, 500), Some(0.25)),
            // Too few opaque tokens to tell.
            (obs(5000, 255, 64, 10), None),
        ] {
            assert_eq!(implied_factor(o), want, "{o:?}");
        }
    }

    #[test]
    fn estimate_samples_in_a_table() {
        for (o, want) in [
            // rest 1000 + items 4000 by the estimate; the provider counted 3000: half.
            (obs(5000, 4000, 64, 3000), Ok(Some(0.5))),
            // The same request estimated at x1.5 (items 6000, rest still 1000).
            (obs(7000, 4000, 96, 3000), Ok(Some(0.5))),
            // More than the estimate: x1.25.
            (obs(5000, 4000, 64, 6000), Ok(Some(1.25))),
            // Below the base encoding's own count: the floor.
            (obs(5000, 4000, 64, 1500), Ok(Some(0.5))),
            // Twice the estimate is the cap; above it the sample is refused.
            (obs(5000, 4000, 64, 9000), Ok(Some(2.0))),
            (obs(5000, 4000, 64, 9001), Err(8001.0 / 4000.0)),
            // Too few item tokens to tell.
            (obs(5000, 255, 64, 10), Ok(None)),
        ] {
            assert_eq!(implied_estimate_factor(o), want, "{o:?}");
        }
    }

    #[test]
    fn the_learned_estimate_scale_covers_every_recent_sample() {
        let f = |s: &[f64]| learned_estimate_scale(s).factor();
        assert_eq!(f(&[]), 1.0);
        // Under the estimate: not lowered before three samples.
        assert_eq!(f(&[0.6]), 1.0);
        assert_eq!(f(&[0.6, 0.6]), 1.0);
        // 0.6 -> ceil(38.4) = 39 + 4 = 43 -> 44/64.
        assert_eq!(f(&[0.6, 0.6, 0.6]), 0.6875);
        // Over the estimate: raised from the first sample.
        assert_eq!(f(&[1.3]), 1.375);
        // Never below the base encoding's count, never above twice the estimate.
        assert_eq!(f(&[0.5; 4]), 0.5625);
        assert_eq!(f(&[2.0]), 2.0);
        // A wild sample (above the cap) is ignored, not clamped.
        assert_eq!(f(&[0.6, 0.6, 0.6, 7.5]), 0.6875);
        assert_eq!(f(&[f64::NAN, 1.3]), 1.375);
        for samples in [[0.55, 0.7, 0.9], [1.0, 1.0, 1.0], [1.9, 0.6, 0.6]] {
            let scale = learned_estimate_scale(&samples);
            assert!(samples.iter().all(|&s| scale.factor() > s), "{samples:?}");
        }
    }

    #[test]
    fn the_learned_scale_covers_every_recent_sample() {
        let f = |s: &[f64]| learned_scale(s).factor();
        assert_eq!(f(&[]), 1.0);
        assert_eq!(f(&[0.3, 0.3]), 1.0, "too few samples");
        // 0.3 -> 20/64 (ceil 19.2) + 4 = 24/64 = 0.375, a multiple of 4/64.
        assert_eq!(f(&[0.3, 0.3, 0.3]), 0.375);
        assert_eq!(f(&[0.3, 0.5, 0.3]), 0.5625, "the largest sample wins");
        assert_eq!(f(&[0.25; 5]), 0.3125);
        assert_eq!(f(&[2.0; 5]), 2.0, "bounded");
        assert_eq!(f(&[f64::NAN, 0.3, f64::INFINITY, 0.3, 0.3]), 0.375);
        // Only the most recent MAX_SAMPLES count: an old large sample is forgotten.
        let mut s = vec![1.5];
        s.extend([0.3; MAX_SAMPLES]);
        assert_eq!(f(&s), 0.375);
        s.push(1.5);
        assert!(f(&s) > 1.5);
        for samples in [[0.26, 0.4, 0.77], [1.0, 1.0, 1.0], [0.9, 0.25, 0.31]] {
            let scale = learned_scale(&samples);
            assert_eq!(scale.sixty_fourths() % STEP_SIXTY_FOURTHS, 0);
            assert!(samples.iter().all(|&s| scale.factor() > s), "{samples:?}");
        }
    }
}
