//! `Slots`: a borrowed view of argument values (a frame's `localsplus` prefix, or a tuple's items)
//! that guard trees read without allocating or touching reference counts.
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{ffi, Borrowed};

/// Borrowed argument slots. Only constructible from places whose pointers stay valid for `'a`
/// (a live frame held by the caller, or a tuple borrowed for `'a`), so `get` is safe.
#[derive(Clone, Copy)]
pub struct Slots<'a> {
    ptrs: &'a [*mut ffi::PyObject],
}

impl<'a> Slots<'a> {
    /// # Safety
    /// `ptr` must point at `len` object pointers (each NULL or a live object) that stay valid and
    /// unchanged for `'a`, with the GIL held throughout.
    pub unsafe fn from_raw(ptr: *const *mut ffi::PyObject, len: usize) -> Slots<'a> {
        if len == 0 {
            return Slots { ptrs: &[] };
        }
        Slots {
            ptrs: std::slice::from_raw_parts(ptr, len),
        }
    }

    /// The items of a tuple, borrowed for as long as the tuple is.
    pub fn from_tuple(t: &'a Bound<'_, PyTuple>) -> Slots<'a> {
        let n = t.len();
        // SAFETY: a tuple's item array is immutable after creation and lives as long as the
        // tuple, which the caller borrows for 'a. ob_item is the array of `n` item pointers
        // (Include/cpython/tupleobject.h: PyTupleObject { PyObject_VAR_HEAD; ob_item[1]; }).
        unsafe {
            let tp = t.as_ptr() as *mut ffi::PyTupleObject;
            Slots::from_raw((*tp).ob_item.as_ptr(), n)
        }
    }

    pub fn len(&self) -> usize {
        self.ptrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ptrs.is_empty()
    }

    /// Slot `i`, or None if out of range or unbound (NULL).
    #[inline]
    pub fn get<'py>(&self, py: Python<'py>, i: usize) -> Option<Borrowed<'a, 'py, PyAny>> {
        let p = *self.ptrs.get(i)?;
        // SAFETY: constructor contract: each pointer is NULL or a live object for 'a.
        unsafe { Borrowed::from_ptr_or_opt(py, p) }
    }
}
