//! protoprompt-core: the Responses item graph, token counting and budget packing
//! behind the `protoprompt` Python package. This crate has no Python types; the
//! `protoprompt-python` crate is a thin PyO3 layer over it.

pub mod calibration;
pub mod costs;
pub mod decisions;
pub mod digest;
pub mod graph;
pub mod incremental;
pub mod indexed;
pub mod items;
pub mod mask;
pub mod mask_cache;
pub mod pack;
pub mod tokens;
pub mod truncate;

pub use graph::{build_graph, Graph, InvalidReason, Problem, Unit};
pub use items::{classify, ItemError, ItemKind, ItemMeta, RawCaller, RawItem};
