//! `protoprompt._core`: PyO3 bindings over `protoprompt-core`.
//!
//! Each call extracts Python input into owned Rust values, releases the GIL, runs the core and
//! converts the result back, mapping errors to the exception classes of `protoprompt.errors`;
//! rules about items, positions and budgets are the core's. Item contents are read lazily:
//! only items whose cost the packer needs are converted. Test hooks (`hooks`) are built with
//! the cargo feature `test-hooks` only.
//!
//! A pack (`HistoryIndex.pack`) runs in the core without the GIL and takes it back for
//! three calls only: item reads (`costs::PyItems`, the core's `ItemSource`: the items whose
//! cost it needs, read and converted a batch at a time), the count store
//! (`costs::PyCountStore::get_many`, a batch of long texts' keys at a time) and the context
//! callable (`pack::run_pack`, once the mandatory part is counted, if there is one). With the
//! GIL held around it: the new items are classified (the fresh history in chunks,
//! `IndexedHistory::append_fresh` appending the previous chunk without the GIL), and the
//! request list is built with its masked and id-stripped copies (`index::apply_edits`).

use protoprompt_core::calibration;
use protoprompt_core::graph::{build_graph, UnitTuple};
use protoprompt_core::tokens::{self, Encoding};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

mod alloc;
mod convert;
mod costs;
mod decisions;
mod digest;
mod errors;
#[cfg(feature = "test-hooks")]
mod hooks;
mod index;
mod mask;
mod pack;
mod prefix;
mod truncate;

use crate::alloc::configure_allocator;
use crate::convert::{classify_all, encoding_of, item_value, opaque_scale, to_value};
use crate::decisions::DecisionTable;
use crate::errors::{field_error, token_error};
use crate::index::PyHistoryIndex;

/// A pyfunction run with the encoding `$enc` its keyword-only `model` and `encoding` name
/// ([`encoding_of`]; default o200k_base), with keyword-only `$opt` after them.
macro_rules! encoding_fn {
    ($(#[$doc:meta])* fn $name:ident($py:ident $(, $arg:ident: $ty:ty)*
        $(; $opt:ident: $oty:ty = $default:tt)?) -> $ret:ty, |$enc:ident| $body:expr) => {
        $(#[$doc])*
        #[pyfunction]
        #[pyo3(signature = ($($arg,)* *, model=None, encoding=None $(, $opt=$default)?))]
        fn $name(
            $py: Python<'_>,
            $($arg: $ty,)*
            model: Option<&str>,
            encoding: Option<&str>,
            $($opt: $oty)?
        ) -> PyResult<$ret> {
            let $enc = encoding_of($py, model, encoding)?;
            $body
        }
    };
}

encoding_fn! {
    /// Count the tokens of `text` with an encoding (by name or model; default o200k_base).
    fn count_tokens(py, text: &str) -> u64, |enc| {
        if text.len() < 4096 {
            if !enc.is_loaded() {
                py.detach(|| enc.load()); // the first build takes ~0.1 s: not under the GIL
            }
            return enc.count(text).map_err(|e| token_error(py, e));
        }
        let owned = text.to_string();
        py.detach(move || enc.count(&owned)).map_err(|e| token_error(py, e))
    }
}

encoding_fn! {
    /// Count many texts at once (one GIL release).
    fn count_tokens_batch(py, texts: Vec<String>) -> Vec<u64>, |enc| {
        let counts: Result<_, _> = py.detach(move || texts.iter().map(|t| enc.count(t)).collect());
        counts.map_err(|e| token_error(py, e))
    }
}

encoding_fn! {
    /// The text of the first `head` and the last `tail` tokens of `text`, its token count,
    /// and whether anything was cut between them (see `protoprompt_core::truncate`).
    fn split_tokens(py, text: &str, head: u64, tail: u64) -> (String, String, u64, bool), |enc| {
        let owned = text.to_string();
        py.detach(move || {
            protoprompt_core::truncate::split_tokens(enc, &owned, head, tail)
                .map(|s| (s.head.to_string(), s.tail.to_string(), s.total, s.cut))
        })
        .map_err(|e| token_error(py, e))
    }
}

/// The encoding name used for `model`.
#[pyfunction]
fn encoding_for_model(py: Python<'_>, model: &str) -> PyResult<&'static str> {
    Encoding::for_model(model)
        .map(Encoding::name)
        .map_err(|e| token_error(py, e))
}

/// Names of the encodings this build ships.
#[pyfunction]
fn available_encodings() -> Vec<&'static str> {
    Encoding::ALL.iter().map(|e| e.name()).collect()
}

encoding_fn! {
    /// Build an encoding's tokenizer now (once per process), so that the first count or pack
    /// does not pay for it. With `wait=False` the build runs on a background thread (a `fork`
    /// meanwhile waits for it to finish, see `protoprompt_core::fork_guard`). Returns the
    /// encoding name.
    fn preload(py; wait: bool = true) -> &'static str, |enc| {
        if wait {
            py.detach(|| enc.load());
        } else {
            enc.preload_detached().map_err(PyValueError::new_err)?;
        }
        Ok(enc.name())
    }
}

encoding_fn! {
    /// Whether an encoding's tokenizer has been built in this process.
    fn is_preloaded(py) -> bool, |enc| Ok(enc.is_loaded())
}

encoding_fn! {
    /// Token cost of one item under the documented cost model: text, media, overhead, opaque
    /// (unscaled) and the field of an opaque payload counted as text because it is not base64.
    fn item_tokens(py, item: &Bound<'_, PyAny>)
        -> (u64, u64, u64, u64, Option<&'static str>), |enc| {
        let value = item_value(py, item, "item")?;
        let cost = py.detach(move || tokens::item_cost(&value, enc));
        let c = cost.map_err(|e| token_error(py, e))?;
        Ok((c.text, c.media, c.overhead, c.opaque, c.fallback))
    }
}

/// `tokens` of opaque payloads under the calibration `factor` (rounded up, as packing does).
#[pyfunction]
fn scale_opaque(tokens: u64, factor: f64) -> PyResult<u64> {
    Ok(opaque_scale(factor)?.apply(tokens))
}

/// One model call's calibration sample (`protoprompt_core::calibration::implied_factor`;
/// with `whole`, `implied_estimate_factor`, `opaque` then being the items' tokens by the
/// estimate): `(sample, None)`, `(None, None)` when it carried too few tokens to tell, or
/// `(None, wild)` for an estimate's sample above the cap (not learned).
#[pyfunction]
#[pyo3(signature = (estimate, opaque, factor, reported, *, whole=false))]
fn calibration_sample(
    estimate: u64,
    opaque: u64,
    factor: f64,
    reported: u64,
    whole: bool,
) -> PyResult<(Option<f64>, Option<f64>)> {
    let obs = calibration::Observation::checked(estimate, opaque, factor, reported);
    Ok(calibration::sample(
        obs.map_err(PyValueError::new_err)?,
        whole,
    ))
}

/// The calibration learned from `samples` (oldest first), as a factor of the rule (with
/// `whole`, of an estimate's whole cost).
#[pyfunction]
#[pyo3(signature = (samples, *, whole=false))]
fn learned_scale(samples: Vec<f64>, whole: bool) -> f64 {
    calibration::learned(&samples, whole).factor()
}

/// The canonical text of an item (what its text cost is counted on).
#[pyfunction]
fn canonical_text(py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<String> {
    let value = to_value(item).map_err(|e| field_error(py, "item", e))?;
    tokens::canonical(&value, Encoding::O200kBase)
        .map(|c| c.text)
        .map_err(|e| token_error(py, e))
}

/// Split `history ++ new_input` into atomic units (no counting): `(units, n_history,
/// mandatory_history)`, each unit as `Graph::report_parts` hands it out.
#[pyfunction]
fn analyze<'py>(
    py: Python<'py>,
    history: &Bound<'py, PyAny>,
    new_input: &Bound<'py, PyAny>,
) -> PyResult<(Vec<UnitTuple>, usize, Vec<usize>)> {
    let (_items, metas, n_history) = classify_all(py, history, new_input)?;
    let graph = py.detach(|| build_graph(&metas[..n_history], &metas[n_history..]));
    Ok(graph.report_parts(&metas))
}

#[pymodule]
mod _core {
    #[cfg(all(unix, feature = "test-hooks"))]
    #[pymodule_export]
    use super::hooks::{_build_is_held, _hold_next_build_until_fork};
    #[cfg(feature = "test-hooks")]
    #[pymodule_export]
    use super::hooks::{_clear_count_cache, _fail_next_counts, _lazy_commit_allocator};
    #[pymodule_export]
    use super::{
        analyze, available_encodings, calibration_sample, canonical_text, count_tokens,
        count_tokens_batch, digest::digests, encoding_for_model, is_preloaded, item_tokens,
        learned_scale, pack::PyPackOptions, prefix::plan_prefix, preload, scale_opaque,
        split_tokens, truncate::cut_text, truncate::fit_output, DecisionTable, PyHistoryIndex,
    };
    use super::{calibration, configure_allocator, tokens, Encoding};
    use pyo3::prelude::*;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        configure_allocator();
        #[cfg(unix)]
        protoprompt_core::fork_guard::install();
        // The exception classes `errors` imports: there from the start, or no module at all.
        m.py().import("protoprompt.errors")?;
        m.add("DEFAULT_ENCODING", Encoding::O200kBase.name())?;
        m.add("ITEM_OVERHEAD", tokens::ITEM_OVERHEAD)?;
        m.add("COST_RULE", tokens::COST_RULE)?;
        m.add("OPAQUE_SCALE_MIN", tokens::OpaqueScale::MIN.factor())?;
        m.add("OPAQUE_SCALE_MAX", tokens::OpaqueScale::MAX.factor())?;
        let estimate_min = tokens::CostBasis::MIN_ESTIMATE_SCALE.factor();
        m.add("ESTIMATE_SCALE_MIN", estimate_min)?;
        m.add("ESTIMATE_SAMPLE_CAP", calibration::ESTIMATE_SAMPLE_CAP)?;
        m.add("CALIBRATION_MAX_SAMPLES", calibration::MAX_SAMPLES)
    }
}
