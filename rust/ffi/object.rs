//! Raw object reads that guard accessors need without calling Python: a cell's contents, an
//! instance `__dict__` (no `__getattr__`), and exact-dict reads at a remembered entry position.
#![allow(unsafe_code)]

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::Borrowed;

/// The contents of a cell object, None if empty or not a cell.
pub fn cell_contents<'py>(cell: &Borrowed<'_, 'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let c = cell.as_ptr();
    // SAFETY: c is live; PyCell_Type is CPython's cell type; PyCell_Get returns a new reference
    // (or NULL with an exception set only if c is not a cell, which we ruled out).
    unsafe {
        if ffi::Py_TYPE(c) != std::ptr::addr_of_mut!(ffi::PyCell_Type) {
            return None;
        }
        let v = ffi::PyCell_Get(c);
        Bound::from_owned_ptr_or_opt(cell.py(), v)
    }
}

/// `obj.__dict__` read directly (PyObject_GenericGetDict: no `__getattr__`/`__getattribute__`);
/// None if the object has no instance dict.
pub fn instance_dict<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    // SAFETY: obj is live; the call returns a new reference or NULL with an exception set.
    unsafe {
        let d = ffi::PyObject_GenericGetDict(obj.as_ptr(), std::ptr::null_mut());
        if d.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        Some(Bound::from_owned_ptr(obj.py(), d))
    }
}

/// `d[key]` found at entry position `*hint` of an exact dict, if the key stored there is `key`
/// itself (identity: exactly what a dict lookup accepts first). Guards keep one hint per
/// accessor, so a frame's `f_locals` (built in `co_varnames` order every time) or a module's
/// `_parameters` is read without hashing. None means "look it up normally".
pub fn dict_get_at<'py>(
    d: &Bound<'py, pyo3::types::PyDict>,
    key: *mut ffi::PyObject,
    hint: usize,
) -> Option<Bound<'py, PyAny>> {
    let mut pos = hint as ffi::Py_ssize_t;
    let mut k: *mut ffi::PyObject = std::ptr::null_mut();
    let mut v: *mut ffi::PyObject = std::ptr::null_mut();
    // SAFETY: d is a live dict; PyDict_Next takes any position (it bounds-checks and skips
    // deleted entries) and returns borrowed key/value pointers, the value is increfed at once.
    unsafe {
        if pos < 0 || ffi::PyDict_Next(d.as_ptr(), &mut pos, &mut k, &mut v) == 0 || k != key {
            return None;
        }
        Some(Bound::from_borrowed_ptr(d.py(), v))
    }
}

/// The entry position of the key that is `key` itself in an exact dict (scanning at most
/// `limit` entries), for [`dict_get_at`] hints.
pub fn dict_position_of(
    d: &Bound<'_, pyo3::types::PyDict>,
    key: *mut ffi::PyObject,
    limit: usize,
) -> Option<usize> {
    let mut pos: ffi::Py_ssize_t = 0;
    let mut k: *mut ffi::PyObject = std::ptr::null_mut();
    let mut v: *mut ffi::PyObject = std::ptr::null_mut();
    for _ in 0..limit {
        let before = pos;
        // SAFETY: as in dict_get_at; no Python code runs between the calls.
        if unsafe { ffi::PyDict_Next(d.as_ptr(), &mut pos, &mut k, &mut v) } == 0 {
            return None;
        }
        if k == key {
            // pos is now one past the entry found; the entry index is pos - 1 >= before.
            debug_assert!(pos > before);
            return Some(pos as usize - 1);
        }
    }
    None
}
