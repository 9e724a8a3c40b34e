//! protoprompt-core: the Responses item graph, token counting and budget packing
//! behind the `protoprompt` Python package. This crate has no Python types; the
//! `protoprompt-python` crate converts Python values to and from it (PyO3).

pub mod calibration;
pub mod costs;
pub mod decisions;
pub mod digest;
pub mod facade;
#[cfg(unix)]
pub mod fork_guard;
pub mod graph;
pub mod incremental;
pub mod indexed;
pub mod items;
pub mod json;
pub mod mask;
pub mod mask_cache;
pub mod masked_field;
pub mod options;
pub mod pack;
pub mod pipeline;
pub mod prefix;
pub mod reads;
pub mod span;
pub mod tokens;
pub mod truncate;

pub use graph::{build_graph, Graph, InvalidReason, Problem, Unit};
pub use items::{classify, ItemError, ItemKind, ItemMeta, RawCaller, RawItem};
