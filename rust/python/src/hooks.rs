//! Test hooks (cargo feature `test-hooks`: on in `scripts/dev.sh` and CI's test build, off
//! in release wheels). `HistoryIndex`'s `_costs_counted`, `_masked_counted` and
//! `_graph_copies` are behind the same feature.

use protoprompt_core::tokens;
use pyo3::prelude::*;

/// Whether the allocator commits memory lazily (see `alloc::configure_allocator`).
#[pyfunction]
pub(crate) fn _lazy_commit_allocator() -> bool {
    crate::alloc::configure_allocator()
}

/// The next tokenizer build, once under way (holding the build lock), waits for a `fork` to
/// begin; `_build_is_held()` says when it is there.
#[cfg(unix)]
#[pyfunction]
pub(crate) fn _hold_next_build_until_fork() {
    protoprompt_core::fork_guard::hold_next_build_until_fork();
}

/// Whether a build is waiting for a fork (see `_hold_next_build_until_fork`).
#[cfg(unix)]
#[pyfunction]
pub(crate) fn _build_is_held() -> bool {
    protoprompt_core::fork_guard::build_is_held()
}

/// The next `n` token counts on this thread fail as a tokenizer failure does
/// (`protoprompt_core::tokens::fail_next_counts`).
#[pyfunction]
pub(crate) fn _fail_next_counts(n: usize) {
    tokens::fail_next_counts(n);
}

/// Forget every count in the process-wide caches: the count cache and the masked fields
/// (a process's first count of a text, or first masking of a tool output, without a new
/// process).
#[pyfunction]
pub(crate) fn _clear_count_cache() {
    tokens::COUNT_CACHE.clear();
    protoprompt_core::mask_cache::MASKED_FIELD_CACHE.clear();
}
