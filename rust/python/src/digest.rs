//! Content digests of Python values (`protoprompt._core.digests`): the binding walks the
//! value and feeds the core's [`Digester`] (`protoprompt_core::digest` defines the digest).
//! Nothing is converted or copied: strings are hashed in place.

use protoprompt_core::digest::{common_prefix, Digester, DIGEST_BYTES};
use protoprompt_core::tokens::{quietly, MAX_DEPTH};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::convert::{as_dict, item_seq};

/// Feed `obj` into `d`; anything without a JSON form is opaque (never equal).
fn feed(d: &mut Digester, obj: &Bound<'_, PyAny>, depth: usize) {
    if depth > MAX_DEPTH {
        return d.opaque();
    }
    if obj.is_none() {
        return d.null();
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return match s.to_str() {
            Ok(text) => d.text(text),
            Err(_) => d.opaque(),
        };
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return d.bool(b.is_true());
    }
    if obj.cast::<PyInt>().is_ok() {
        if let Ok(i) = obj.extract::<i64>() {
            return d.int(i);
        }
        if let Ok(u) = obj.extract::<u64>() {
            return d.uint(u);
        }
        return d.opaque();
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return d.float(f.value());
    }
    if let Ok(dict) = obj.cast::<PyDict>() {
        d.map(dict.len());
        for (k, v) in dict.iter() {
            match k.cast::<PyString>().ok().and_then(|s| s.to_str().ok()) {
                Some(key) => d.key(key),
                None => return d.opaque(),
            }
            feed(d, &v, depth + 1);
        }
        return;
    }
    if let Ok(list) = obj.cast::<PyList>() {
        d.list(list.len());
        for v in list.iter() {
            feed(d, &v, depth + 1);
        }
        return;
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        d.list(tuple.len());
        for v in tuple.iter() {
            feed(d, &v, depth + 1);
        }
        return;
    }
    match as_dict(obj, "(value)") {
        Ok(Some(dict)) => feed(d, dict.as_any(), depth),
        _ => d.opaque(),
    }
}

/// The digest of one Python value (a value changed while it is read is opaque).
fn digest_of(obj: &Bound<'_, PyAny>) -> [u8; DIGEST_BYTES] {
    let caught = quietly(std::panic::AssertUnwindSafe(|| {
        let mut d = Digester::new();
        feed(&mut d, obj, 0);
        d.finish()
    }));
    caught.unwrap_or_else(|_| {
        let mut d = Digester::new();
        d.opaque();
        d.finish()
    })
}

/// The content digests of `values` (16 bytes each, concatenated) and how many leading ones
/// equal those in `previous` (a result of an earlier call).
#[pyfunction]
#[pyo3(signature = (values, previous = None))]
pub(crate) fn digests<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyAny>,
    previous: Option<&[u8]>,
) -> PyResult<(Bound<'py, PyBytes>, usize)> {
    let values = item_seq(values, "values")?;
    let mut out = Vec::with_capacity(values.len() * DIGEST_BYTES);
    for v in &values {
        out.extend_from_slice(&digest_of(v.bind(py)));
    }
    let same = previous.map_or(0, |p| common_prefix(&out, p));
    Ok((PyBytes::new(py, &out), same))
}
