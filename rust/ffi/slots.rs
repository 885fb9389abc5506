//! `Slots`: a borrowed view of argument values (a frame's `localsplus` prefix, or a tuple's items)
//! that guard trees read without allocating or touching reference counts.
//!
//! A frame's slots may carry tag bits in the low bits of each pointer (CPython 3.14's
//! `_PyStackRef`); the frame module of the running minor says which (`SLOT_TAG_BITS`, 0 up to
//! 3.13) and `get` masks them off, so guard code never sees a tagged pointer.
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{ffi, Borrowed};

/// Borrowed argument slots. Only constructible from places whose pointers stay valid for `'a`
/// (a live frame held by the caller, or a tuple borrowed for `'a`), so `get` is safe.
#[derive(Clone, Copy)]
pub struct Slots<'a> {
    ptrs: &'a [*mut ffi::PyObject],
    tag_bits: usize,
}

impl<'a> Slots<'a> {
    /// # Safety
    /// `ptr` must point at `len` object pointers (each NULL or a live object) that stay valid and
    /// unchanged for `'a`, with the GIL held throughout.
    pub unsafe fn from_raw(ptr: *const *mut ffi::PyObject, len: usize) -> Slots<'a> {
        Self::from_tagged(ptr, len, 0)
    }

    /// As [`Slots::from_raw`], for slots whose low `tag_bits` are reference tags, not address.
    ///
    /// # Safety
    /// As for `from_raw`, of each pointer with its tag bits cleared.
    pub unsafe fn from_tagged(
        ptr: *const *mut ffi::PyObject,
        len: usize,
        tag_bits: usize,
    ) -> Slots<'a> {
        if len == 0 {
            return Slots {
                ptrs: &[],
                tag_bits,
            };
        }
        Slots {
            ptrs: std::slice::from_raw_parts(ptr, len),
            tag_bits,
        }
    }

    /// Slot `i` as a plain object pointer (tag bits cleared; NULL when unbound). Panics if
    /// out of range.
    #[inline]
    pub fn raw(&self, i: usize) -> *mut ffi::PyObject {
        (self.ptrs[i] as usize & !self.tag_bits) as *mut ffi::PyObject
    }

    /// Whether every slot holds a value.
    #[inline]
    pub fn all_bound(&self) -> bool {
        (0..self.ptrs.len()).all(|i| !self.raw(i).is_null())
    }

    /// The slots as an array of plain object pointers for a vectorcall: borrowed as they are
    /// when untagged, else copied with the tags cleared.
    pub fn untagged(&self) -> std::borrow::Cow<'a, [*mut ffi::PyObject]> {
        if self.tag_bits == 0 {
            std::borrow::Cow::Borrowed(self.ptrs)
        } else {
            std::borrow::Cow::Owned((0..self.ptrs.len()).map(|i| self.raw(i)).collect())
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
        let p = (*self.ptrs.get(i)? as usize & !self.tag_bits) as *mut ffi::PyObject;
        // SAFETY: constructor contract: each pointer is NULL or a live object for 'a.
        unsafe { Borrowed::from_ptr_or_opt(py, p) }
    }
}
