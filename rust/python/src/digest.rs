//! Content digests of Python values (`protoprompt._core.digests`): the binding walks the
//! value and feeds the core's [`Digester`] (`protoprompt_core::digest` defines the digest).
//!
//! Nothing is converted or copied. A string is digested by its length and the interpreter's
//! own string hash (keyed per process and cached in the string object, so a string seen
//! before costs nothing, whatever its size); dicts, lists and tuples are walked through
//! borrowed references, which is safe because nothing in the walk runs Python code (only
//! exact `str`s are hashed by the interpreter; a mapping of another type is first copied
//! into a dict, and the copy is walked).

use protoprompt_core::digest::{common_prefix, Digester, DIGEST_BYTES};
use protoprompt_core::tokens::MAX_DEPTH;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use crate::convert::{as_dict, item_seq};

/// Feed the object at `ptr` into `d`; anything without a JSON form is opaque (never equal).
///
/// # Safety
/// `ptr` is a live object and the GIL is held; nothing called here runs Python code except
/// the copy of a non-dict mapping, whose result is owned while it is walked.
unsafe fn feed(py: Python<'_>, d: &mut Digester, ptr: *mut ffi::PyObject, depth: usize) {
    if depth > MAX_DEPTH {
        return d.opaque();
    }
    if ptr == ffi::Py_None() {
        return d.null();
    }
    if ffi::PyUnicode_CheckExact(ptr) != 0 {
        let chars = ffi::PyUnicode_GetLength(ptr);
        let hash = ffi::PyObject_Hash(ptr);
        if chars < 0 || hash == -1 {
            ffi::PyErr_Clear();
            return d.opaque();
        }
        return d.hashed_text(chars as u64, hash as u64);
    }
    if ffi::PyBool_Check(ptr) != 0 {
        return d.bool(ptr == ffi::Py_True());
    }
    if ffi::PyLong_Check(ptr) != 0 {
        let mut overflow = 0;
        let value = ffi::PyLong_AsLongLongAndOverflow(ptr, &mut overflow);
        if overflow != 0 || (value == -1 && !ffi::PyErr_Occurred().is_null()) {
            ffi::PyErr_Clear();
            return d.opaque();
        }
        return d.int(value);
    }
    if ffi::PyFloat_Check(ptr) != 0 {
        return d.float(ffi::PyFloat_AsDouble(ptr));
    }
    if ffi::PyDict_Check(ptr) != 0 {
        d.map(ffi::PyDict_Size(ptr).max(0) as usize);
        let mut pos: ffi::Py_ssize_t = 0;
        let mut key: *mut ffi::PyObject = std::ptr::null_mut();
        let mut value: *mut ffi::PyObject = std::ptr::null_mut();
        while ffi::PyDict_Next(ptr, &mut pos, &mut key, &mut value) != 0 {
            if ffi::PyUnicode_CheckExact(key) == 0 {
                return d.opaque();
            }
            match Borrowed::from_ptr(py, key).cast::<PyString>() {
                Ok(name) => match name.to_str() {
                    Ok(name) => d.key(name),
                    Err(_) => return d.opaque(),
                },
                Err(_) => return d.opaque(),
            }
            feed(py, d, value, depth + 1);
        }
        return;
    }
    if ffi::PyList_Check(ptr) != 0 {
        let n = ffi::PyList_Size(ptr).max(0);
        d.list(n as usize);
        for i in 0..n {
            feed(py, d, ffi::PyList_GetItem(ptr, i), depth + 1);
        }
        return;
    }
    if ffi::PyTuple_Check(ptr) != 0 {
        let n = ffi::PyTuple_Size(ptr).max(0);
        d.list(n as usize);
        for i in 0..n {
            feed(py, d, ffi::PyTuple_GetItem(ptr, i), depth + 1);
        }
        return;
    }
    if ffi::PyUnicode_Check(ptr) != 0 {
        // A str subclass: its own __hash__ could run Python code; hash the text itself.
        return match Borrowed::from_ptr(py, ptr).cast::<PyString>() {
            Ok(s) => match s.to_str() {
                Ok(text) => d.text(text),
                Err(_) => d.opaque(),
            },
            Err(_) => d.opaque(),
        };
    }
    let obj = Borrowed::from_ptr(py, ptr).to_owned();
    match as_dict(&obj, "(value)") {
        Ok(Some(dict)) => feed(py, d, dict.as_ptr(), depth),
        _ => d.opaque(),
    }
}

/// The digest of one Python value.
fn digest_of(obj: &Bound<'_, PyAny>) -> [u8; DIGEST_BYTES] {
    let mut d = Digester::new();
    // SAFETY: `obj` is alive for the call and the GIL is held (see `feed`).
    unsafe { feed(obj.py(), &mut d, obj.as_ptr(), 0) };
    d.finish()
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
