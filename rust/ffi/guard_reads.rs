//! Raw reads for the guard tree's replay path (`crate::guards::replay`): borrowed values read
//! without reference counting, allocation or any Python code, and the version stamps that prove
//! a remembered value is still the current one.
//!
//! Mirrors (one field each, read through pyo3's `#[repr(C)]` structs):
//! - `PyDictObject.ma_version_tag` (Include/cpython/dictobject.h, 3.11 and 3.12): globally
//!   unique, changed by every mutation and set afresh for every new dict, so an equal tag proves
//!   the same dict in the same state. On 3.12 its low 8 bits are dict-watcher bits (a change
//!   there only makes a spurious miss). On 3.13 the tag is no longer promised to change for every
//!   kind of store (inline-values attribute writes), so [`dict_version`] reads nothing there and
//!   every replay misses (the tree runs its full path).
//! - `PyTypeObject.tp_version_tag` with `Py_TPFLAGS_VALID_VERSION_TAG` (Include/cpython/object.h):
//!   a type's attribute-cache tag, invalidated whenever the type or a base is modified.
//! - the managed-dict slot before an object (Include/internal/pycore_object.h:
//!   `_PyObject_ManagedDictPointer`, 3.11, a `PyObject*` at word -3, NULL while the attributes
//!   live in inline values; 3.12 `_PyObject_DictOrValuesPointer`, the same word, with the values
//!   pointer tagged by its low bit); `tp_dictoffset` > 0 for other types.
//! - `PyFunctionObject.func_globals` (Include/cpython/funcobject.h), a read-only member, and
//!   `func_code` (writable through `__code__`: read afresh, never remembered).
//! - `PyWeakReference.wr_object` (Include/cpython/weakrefobject.h), the referent of an identity
//!   leaf's weak reference ([`weakref_referent`], verified on first use).
//!
//! A [`Held`] is a borrowed pointer: valid while the object that holds it is alive and unchanged
//! and no Python code runs. The replay path only makes them from a frame's argument slots or
//! from containers whose version it has just verified, and runs no Python code while it holds
//! them (its leaves are raw reads too); anything it cannot decide that way sends the check to
//! the ordinary path.
#![allow(unsafe_code)]

use std::os::raw::c_int;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use pyo3::Borrowed;

use super::slots::Slots;

extern "C" {
    // Include/cpython/object.h (3.11-3.13): a borrowed reference, no exception set; a pure lookup
    // through the MRO's dicts (assigns the type's version tag).
    fn _PyType_Lookup(t: *mut ffi::PyTypeObject, name: *mut ffi::PyObject) -> *mut ffi::PyObject;
    // Include/cpython/odictobject.h (3.11-3.13): `collections.OrderedDict`, a dict subclass
    // whose length is its dict's `ma_used`.
    static mut PyODict_Type: ffi::PyTypeObject;
}

/// A borrowed object pointer read during one replay (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Held(*mut ffi::PyObject);

impl Held {
    pub fn addr(self) -> usize {
        self.0 as usize
    }

    pub fn ptr(self) -> *mut ffi::PyObject {
        self.0
    }

    /// The object as a borrowed pyo3 handle, for reads that take one (tensor metadata).
    pub fn bound<'a, 'py>(self, py: Python<'py>) -> Borrowed<'a, 'py, PyAny> {
        // SAFETY: a Held is non-null and alive for the replay that made it (module docs).
        unsafe { Borrowed::from_ptr(py, self.0) }
    }

    /// A new reference (for values handed to the entry function).
    pub fn to_owned<'py>(self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.bound(py).to_owned()
    }

    fn type_ptr(self) -> *mut ffi::PyTypeObject {
        // SAFETY: a live object's type pointer.
        unsafe { ffi::Py_TYPE(self.0) }
    }

    /// The object's type.
    pub fn type_of(self) -> Held {
        Held(self.type_ptr() as *mut ffi::PyObject)
    }

    pub fn is_none(self) -> bool {
        // SAFETY: only the address of the None singleton is read.
        self.0 == unsafe { ffi::Py_None() }
    }

    pub fn is_true(self) -> bool {
        // SAFETY: only the address of the True singleton is read.
        self.0 == unsafe { ffi::Py_True() }
    }

    pub fn is_false(self) -> bool {
        // SAFETY: only the address of the False singleton is read.
        self.0 == unsafe { ffi::Py_False() }
    }

    fn is_exact(self, t: *mut ffi::PyTypeObject) -> bool {
        self.type_ptr() == t
    }

    pub fn is_exact_dict(self) -> bool {
        self.is_exact(std::ptr::addr_of_mut!(ffi::PyDict_Type))
    }

    /// The value of an exact int that fits an i64; None otherwise (never raises).
    pub fn exact_int(self) -> Option<i64> {
        if !self.is_exact(std::ptr::addr_of_mut!(ffi::PyLong_Type)) {
            return None;
        }
        let mut overflow: c_int = 0;
        // SAFETY: an exact int; with an overflow flag the call sets no exception.
        let v = unsafe { ffi::PyLong_AsLongAndOverflow(self.0, &mut overflow) };
        (overflow == 0 && !(v == -1 && has_error())).then_some(v as i64)
    }

    /// `len()` of an exact dict, OrderedDict, list or tuple; None for anything else.
    pub fn exact_len(self) -> Option<usize> {
        let t = self.type_ptr();
        // SAFETY: the size fields of exact dict / list / tuple objects.
        unsafe {
            if t == std::ptr::addr_of_mut!(ffi::PyDict_Type)
                || t == std::ptr::addr_of_mut!(PyODict_Type)
            {
                Some((*(self.0 as *mut ffi::PyDictObject)).ma_used as usize)
            } else if t == std::ptr::addr_of_mut!(ffi::PyList_Type)
                || t == std::ptr::addr_of_mut!(ffi::PyTuple_Type)
            {
                Some(ffi::Py_SIZE(self.0) as usize)
            } else {
                None
            }
        }
    }

    /// Item `i` (negative from the end) of an exact tuple or list; None otherwise or out of
    /// range.
    pub fn exact_seq_item(self, i: isize) -> Option<Held> {
        let t = self.type_ptr();
        let is_tuple = t == std::ptr::addr_of_mut!(ffi::PyTuple_Type);
        if !is_tuple && t != std::ptr::addr_of_mut!(ffi::PyList_Type) {
            return None;
        }
        // SAFETY: exact tuple / list; the index is bounds-checked against Py_SIZE.
        unsafe {
            let n = ffi::Py_SIZE(self.0);
            let j = if i < 0 { i + n } else { i };
            if !(0..n).contains(&j) {
                return None;
            }
            let p = if is_tuple {
                ffi::PyTuple_GET_ITEM(self.0, j)
            } else {
                ffi::PyList_GET_ITEM(self.0, j)
            };
            (!p.is_null()).then_some(Held(p))
        }
    }

    /// The instance `__dict__` if it exists as a dict already (no materialising, no
    /// `__getattr__`); None when the object has none yet or keeps it somewhere else.
    pub fn instance_dict(self) -> Option<Held> {
        // SAFETY: reads of the type's flags/dictoffset and the dict slot they describe.
        unsafe {
            let t = self.type_ptr();
            let word = if (*t).tp_flags & ffi::Py_TPFLAGS_MANAGED_DICT != 0 {
                managed_dict_word(self.0)?
            } else if (*t).tp_dictoffset > 0 {
                *((self.0 as *mut u8).offset((*t).tp_dictoffset) as *mut *mut ffi::PyObject)
            } else {
                return None;
            };
            (!word.is_null()).then_some(Held(word))
        }
    }

    /// `f.__globals__` of an exact Python function.
    pub fn function_globals(self) -> Option<Held> {
        if !self.is_exact(std::ptr::addr_of_mut!(ffi::PyFunction_Type)) {
            return None;
        }
        // SAFETY: an exact function object; func_globals is never NULL.
        let g = unsafe { (*(self.0 as *mut ffi::PyFunctionObject)).func_globals };
        (!g.is_null()).then_some(Held(g))
    }

    /// `f.__code__` of an exact Python function (writable: the caller reads it afresh on
    /// every check and never remembers it).
    pub fn function_code(self) -> Option<Held> {
        if !self.is_exact(std::ptr::addr_of_mut!(ffi::PyFunction_Type)) {
            return None;
        }
        // SAFETY: an exact function object; func_code is never NULL (its setter refuses None).
        let c = unsafe { (*(self.0 as *mut ffi::PyFunctionObject)).func_code };
        (!c.is_null()).then_some(Held(c))
    }

    /// Whether the object is a type whose metatype is exactly `type`.
    pub fn is_plain_type(self) -> bool {
        self.is_exact(std::ptr::addr_of_mut!(ffi::PyType_Type))
    }
}

#[cfg(not(Py_3_12))]
unsafe fn managed_dict_word(obj: *mut ffi::PyObject) -> Option<*mut ffi::PyObject> {
    // 3.11 `_PyObject_ManagedDictPointer`: NULL while the values are inline.
    Some(*((obj as *mut *mut ffi::PyObject).offset(-3)))
}

#[cfg(all(Py_3_12, not(Py_3_13)))]
unsafe fn managed_dict_word(obj: *mut ffi::PyObject) -> Option<*mut ffi::PyObject> {
    // 3.12 `_PyObject_DictOrValuesPointer`: a values pointer has its low bit set.
    let w = *((obj as *mut usize).offset(-3));
    (w & 1 == 0).then_some(w as *mut ffi::PyObject)
}

#[cfg(Py_3_13)]
unsafe fn managed_dict_word(_obj: *mut ffi::PyObject) -> Option<*mut ffi::PyObject> {
    None // dict versions are not read on 3.13 (module docs): nothing to replay through
}

fn has_error() -> bool {
    // SAFETY: reads the thread's current exception (the GIL is held by every caller).
    unsafe { !ffi::PyErr_Occurred().is_null() }
}

/// The version tag of an exact dict (see the module docs); None on 3.13 or for anything else.
#[inline]
pub fn dict_version(d: Held) -> Option<u64> {
    if !d.is_exact_dict() {
        return None;
    }
    #[cfg(not(Py_3_13))]
    {
        // SAFETY: an exact dict (Include/cpython/dictobject.h `PyDictObject`).
        #[allow(deprecated)]
        let v = unsafe { (*(d.0 as *mut ffi::PyDictObject)).ma_version_tag };
        Some(v)
    }
    #[cfg(Py_3_13)]
    None
}

/// [`dict_version`] of a pyo3 dict handle.
pub fn dict_version_of(d: &Bound<'_, PyAny>) -> Option<u64> {
    dict_version(Held(d.as_ptr()))
}

/// The valid attribute-cache tag of a type object (0 is never returned).
#[inline]
pub fn type_version(t: Held) -> Option<u32> {
    // SAFETY: `t` is checked to be a type (its metatype is exactly `type`).
    unsafe {
        if !t.is_plain_type() {
            return None;
        }
        let tp = t.0 as *mut ffi::PyTypeObject;
        let tag = (*tp).tp_version_tag;
        ((*tp).tp_flags & ffi::Py_TPFLAGS_VALID_VERSION_TAG != 0 && tag != 0).then_some(tag)
    }
}

/// Whether `getattr(t, name)` on a plain type returned `value` as the MRO's own entry (a
/// value without `__get__`, or a plain function, which `__get__(None, t)` returns unchanged)
/// and the metatype `type` defines no attribute of that name: then the result is fixed while
/// the type's version tag is.
pub fn type_attr_is_mro_entry(
    t: &Bound<'_, PyAny>,
    name: &Bound<'_, PyString>,
    value: &Bound<'_, PyAny>,
) -> bool {
    let th = Held(t.as_ptr());
    if !th.is_plain_type() {
        return false;
    }
    // SAFETY: `t` is a type; `_PyType_Lookup` returns a borrowed pointer or NULL (no exception).
    unsafe {
        let meta = _PyType_Lookup(std::ptr::addr_of_mut!(ffi::PyType_Type), name.as_ptr());
        if !meta.is_null() {
            return false;
        }
        let found = _PyType_Lookup(t.as_ptr() as *mut ffi::PyTypeObject, name.as_ptr());
        if found.is_null() || found != value.as_ptr() {
            return false;
        }
        let vt = ffi::Py_TYPE(found);
        (*vt).tp_descr_get.is_none() || vt == std::ptr::addr_of_mut!(ffi::PyFunction_Type)
    }
}

/// Argument slot `i` of a frame (or tuple) as a Held; None when unbound.
#[inline]
pub fn slot(s: &Slots<'_>, i: usize) -> Option<Held> {
    if i >= s.len() {
        return None;
    }
    let p = s.raw(i);
    (!p.is_null()).then_some(Held(p))
}

/// `d[key]` at entry position `hint` of an exact dict when the key stored there is `key` itself.
pub fn dict_get_at_held(d: Held, key: &Bound<'_, PyAny>, hint: usize) -> Option<Held> {
    if !d.is_exact_dict() {
        return None;
    }
    let (mut pos, mut k, mut v) = (
        hint as ffi::Py_ssize_t,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: as `object::dict_get_at` (borrowed key/value; no Python code runs).
    unsafe {
        if pos < 0 || ffi::PyDict_Next(d.0, &mut pos, &mut k, &mut v) == 0 || k != key.as_ptr() {
            return None;
        }
    }
    Some(Held(v))
}

/// Whether the keys of exact dict `d` are, in order, exactly the objects `keys` (identity).
pub fn dict_keys_are(d: Held, keys: &[Py<PyAny>]) -> Option<bool> {
    if !d.is_exact_dict() {
        return None;
    }
    if d.exact_len() != Some(keys.len()) {
        return Some(false);
    }
    let (mut pos, mut k, mut v) = (
        0 as ffi::Py_ssize_t,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    for e in keys {
        // SAFETY: iteration of a live exact dict; borrowed key/value pointers, no Python code.
        if unsafe { ffi::PyDict_Next(d.0, &mut pos, &mut k, &mut v) } == 0 {
            return Some(false);
        }
        if k != e.as_ptr() {
            return None; // maybe equal but not identical: the full path compares with ==
        }
    }
    Some(true)
}

/// Whether exact dict `d` lacks the exact-str `key`, scanning its keys without running Python
/// code: None (undecided) when `d` is not an exact dict, or `key` or a stored key is not an
/// exact str.
pub fn dict_lacks_str(d: Held, key: &Py<PyAny>) -> Option<bool> {
    let key = key.as_ptr();
    // SAFETY: type checks of live objects.
    if !d.is_exact_dict() || unsafe { ffi::PyUnicode_CheckExact(key) } == 0 {
        return None;
    }
    let (mut pos, mut k, mut v) = (
        0 as ffi::Py_ssize_t,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: iteration of a live exact dict with borrowed key/value pointers; comparing two
    // exact strs runs no Python code.
    unsafe {
        while ffi::PyDict_Next(d.0, &mut pos, &mut k, &mut v) != 0 {
            if k == key {
                return Some(false);
            }
            if ffi::PyUnicode_CheckExact(k) == 0 {
                return None;
            }
            if ffi::PyUnicode_Compare(k, key) == 0 {
                return Some(false);
            }
        }
    }
    Some(true)
}

/// A pyo3 dict handle as a Held (the caller holds the dict for the replay).
pub fn held_dict(d: &Bound<'_, PyDict>) -> Held {
    Held(d.as_ptr())
}

/// A pyo3 handle as a Held (the caller keeps the object alive for the replay).
pub fn held(o: &Bound<'_, PyAny>) -> Held {
    Held(o.as_ptr())
}

/// A Held from an address remembered by a replay cache, once the cache's stamp proved that the
/// object is still held where it was found (see `crate::guards::replay`).
pub fn held_at(addr: usize) -> Held {
    Held(addr as *mut ffi::PyObject)
}

/// The contents of a cell (borrowed), None when empty or not a cell.
pub fn cell_contents_held(cell: Held) -> Option<Held> {
    if !cell.is_exact(std::ptr::addr_of_mut!(ffi::PyCell_Type)) {
        return None;
    }
    // SAFETY: an exact cell object (Include/cpython/cellobject.h `PyCellObject.ob_ref`).
    let p = unsafe { (*(cell.0 as *mut ffi::PyCellObject)).ob_ref };
    (!p.is_null()).then_some(Held(p))
}

/// The head of a weak reference as Include/cpython/weakrefobject.h lays it out on 3.11-3.13
/// (`struct _PyWeakReference { PyObject_HEAD; PyObject *wr_object; ... }`): `wr_object` is the
/// referent, or `Py_None` once it died. Verified on a live and a dead reference at import
/// ([`verify_weakref_head`], called by `crate::guards::register`); until verified (or if that
/// failed) the public API answers. Never verified lazily: a check must not allocate (a
/// collection could run finalizers while the replay holds borrowed pointers).
#[repr(C)]
struct WeakrefHead {
    ob_base: ffi::PyObject,
    wr_object: *mut ffi::PyObject,
}

/// 0: not verified yet, 1: direct reads verified, 2: verification failed.
static WEAKREF_DIRECT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn weakref_field(wr: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: `wr` is a live weakref.ref (callers), at least a `WeakrefHead` long.
    unsafe { (*(wr as *const WeakrefHead)).wr_object }
}

/// Verify [`WeakrefHead`] on a live and a dead reference and enable direct reads if it holds.
#[cold]
pub fn verify_weakref_head(py: Python<'_>) -> bool {
    let check = || -> PyResult<bool> {
        let obj = pyo3::types::PySet::empty(py)?;
        let wr = pyo3::types::PyWeakrefReference::new(&obj)?;
        let live = weakref_field(wr.as_ptr()) == obj.as_ptr();
        drop(obj);
        // SAFETY: only the address of the None singleton is read.
        let dead = weakref_field(wr.as_ptr()) == unsafe { ffi::Py_None() };
        Ok(live && dead)
    };
    let ok = check().unwrap_or(false);
    drop(PyErr::take(py));
    WEAKREF_DIRECT.store(if ok { 1 } else { 2 }, std::sync::atomic::Ordering::Relaxed);
    ok
}

/// Whether [`weakref_referent`] reads the field directly.
pub fn weakref_direct() -> bool {
    WEAKREF_DIRECT.load(std::sync::atomic::Ordering::Relaxed) == 1
}

/// The referent of weakref.ref `wr` as a borrowed address, null once it died: the
/// `wr_object` field read directly (no call) where [`WeakrefHead`] was verified, else
/// through `crate::ffi::weakref::referent_ptr`. Allocates nothing, runs no Python code.
#[inline]
pub fn weakref_referent(
    py: Python<'_>,
    wr: &Py<pyo3::types::PyWeakrefReference>,
) -> *mut ffi::PyObject {
    if WEAKREF_DIRECT.load(std::sync::atomic::Ordering::Relaxed) != 1 {
        return super::weakref::referent_ptr(py, wr);
    }
    let p = weakref_field(wr.as_ptr());
    // SAFETY: only the address of the None singleton is read.
    if p == unsafe { ffi::Py_None() } {
        std::ptr::null_mut()
    } else {
        p
    }
}

#[cfg(test)]
mod tests {
    use pyo3::ffi;

    /// The fields read here sit where the CPython headers put them (Include/cpython/dictobject.h:
    /// `PyObject_HEAD; Py_ssize_t ma_used; uint64_t ma_version_tag;`).
    #[test]
    #[allow(deprecated)]
    fn dict_layout_matches_the_header() {
        assert_eq!(std::mem::offset_of!(ffi::PyDictObject, ma_used), 16);
        #[cfg(not(Py_3_13))]
        assert_eq!(std::mem::offset_of!(ffi::PyDictObject, ma_version_tag), 24);
    }
}
