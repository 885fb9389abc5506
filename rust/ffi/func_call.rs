//! Raw pieces of running a plain function's cached entry before any frame of it exists
//! (`crate::eval_frame::cached_call`): what the hook would read from the function's frame (its
//! code, globals and builtins, from `PyFunctionObject`), read from the function itself; and the
//! direct graph call of an entry (`crate::cache::direct`) from an argument array, which the
//! frame hook also uses with a frame's argument slots.
//!
//! Mirrors `PyFunctionObject.func_code` / `func_globals` / `func_builtins` /
//! `func_closure` (Include/cpython/funcobject.h, 3.11-3.13, through pyo3's struct) and the code
//! head of `crate::ffi::frame::version` (`co_flags`, `co_argcount`, `co_kwonlyargcount`,
//! `co_nfreevars`).
#![allow(unsafe_code)]

use std::os::raw::c_int;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCode, PyDict};
use pyo3::Borrowed;

use super::frame::{version, DirectArg};
use super::guard_reads::Held;
use super::slots::Slots;

/// `co_flags` that make a function's frames ineligible (Include/cpython/code.h): `*args`,
/// `**kwargs`, generator, coroutine, iterable coroutine, async generator.
const CO_NOT_PLAIN: c_int = 0x0004 | 0x0008 | 0x0020 | 0x0080 | 0x0100 | 0x0200;

/// What a frame of a plain function reads from the function: its current code, globals and
/// builtins, and its number of argument slots.
pub struct FunctionParts<'a, 'py> {
    pub code: Borrowed<'a, 'py, PyCode>,
    pub globals: Borrowed<'a, 'py, PyDict>,
    pub builtins: Borrowed<'a, 'py, PyDict>,
    pub nargs: usize,
    /// `func_defaults` (a tuple) or NULL.
    defaults: *mut ffi::PyObject,
}

impl FunctionParts<'_, '_> {
    /// `f(slots)` with `given` as the frame's argument slots: as they are when they are all of
    /// them, else completed by the function's trailing defaults (what CPython's frame
    /// initialisation copies in for missing positional arguments); None when the defaults do
    /// not cover the missing ones (or there are too many).
    pub fn with_slots<R>(&self, given: Slots<'_>, f: impl FnOnce(Slots<'_>) -> R) -> Option<R> {
        let (n, want) = (given.len(), self.nargs);
        if n == want {
            return Some(f(given));
        }
        if n > want || self.defaults.is_null() {
            return None;
        }
        // SAFETY: `defaults` is the function's defaults tuple (checked exact), alive while the
        // function is (the caller holds it); its items and the given slots are live objects
        // borrowed for `f`.
        unsafe {
            if ffi::PyTuple_CheckExact(self.defaults) == 0 {
                return None;
            }
            // held for `f` (a guard's full path may run Python code that rebinds
            // `__defaults__`)
            let _held = Bound::from_borrowed_ptr(self.code.py(), self.defaults);
            let nd = ffi::PyTuple_GET_SIZE(self.defaults) as usize;
            let missing = want - n;
            if missing > nd {
                return None;
            }
            const INLINE: usize = 16;
            let mut inline = [std::ptr::null_mut::<ffi::PyObject>(); INLINE];
            let mut heap;
            let buf: &mut [*mut ffi::PyObject] = if want <= INLINE {
                &mut inline[..want]
            } else {
                heap = vec![std::ptr::null_mut(); want];
                &mut heap[..]
            };
            for (i, b) in buf.iter_mut().enumerate().take(n) {
                *b = given.raw(i);
            }
            for (k, b) in buf[n..].iter_mut().enumerate() {
                *b = ffi::PyTuple_GET_ITEM(self.defaults, (nd - missing + k) as ffi::Py_ssize_t);
            }
            Some(f(Slots::from_raw(buf.as_ptr(), want)))
        }
    }
}

/// The parts of `func` when it is an exact Python function whose frames take exactly their
/// positional parameters (no closure, no `*args`/`**kwargs`/keyword-only parameters, not a
/// generator or coroutine); None otherwise. `func` must be alive while the parts are used,
/// and no Python code may run meanwhile (`__code__` is writable).
pub fn plain_function_parts<'a, 'py>(
    py: Python<'py>,
    func: Held,
) -> Option<FunctionParts<'a, 'py>> {
    let f = func.ptr();
    // SAFETY: `f` is a live object; its fields are read only once its type is the exact
    // function type, whose code, globals and builtins are never NULL, and a code object's head
    // is read through the version's verified mirror.
    unsafe {
        if ffi::Py_TYPE(f) != std::ptr::addr_of_mut!(ffi::PyFunction_Type) {
            return None;
        }
        let fo = f as *mut ffi::PyFunctionObject;
        if !(*fo).func_closure.is_null() {
            return None;
        }
        let code = (*fo).func_code;
        if ffi::Py_TYPE(code) != std::ptr::addr_of_mut!(ffi::PyCode_Type) {
            return None;
        }
        let head = &*(code as *const version::CodeHead);
        if head.co_flags & CO_NOT_PLAIN != 0
            || head.co_kwonlyargcount != 0
            || head.co_nfreevars != 0
        {
            return None;
        }
        let (g, b) = ((*fo).func_globals, (*fo).func_builtins);
        if g.is_null() || b.is_null() || ffi::PyDict_Check(g) == 0 || ffi::PyDict_Check(b) == 0 {
            return None;
        }
        Some(FunctionParts {
            code: Borrowed::from_ptr(py, code).cast_unchecked(),
            globals: Borrowed::from_ptr(py, g).cast_unchecked(),
            builtins: Borrowed::from_ptr(py, b).cast_unchecked(),
            nargs: head.co_argcount as usize,
            defaults: (*fo).func_defaults,
        })
    }
}

/// Whether the current thread has a trace or profile function set.
pub fn current_thread_traced(_py: Python<'_>) -> bool {
    // SAFETY: GIL held; the current thread state is live.
    unsafe { super::frame::thread_traced(ffi::PyThreadState_Get()) }
}

/// `graph(*args)[out]`, each argument one of `slots` or one of `exports`, by vectorcall from
/// one array of borrowed pointers (no tuple, no references taken). None (nothing called) when
/// a slot is unbound or an index is out of range.
pub fn call_direct<'py>(
    py: Python<'py>,
    slots: &Slots<'_>,
    graph: &Bound<'py, PyAny>,
    args: &[DirectArg],
    exports: &[Bound<'py, PyAny>],
    out: isize,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    const INLINE: usize = 24;
    let mut inline = [std::ptr::null_mut::<ffi::PyObject>(); INLINE];
    let mut heap;
    let buf: &mut [*mut ffi::PyObject] = if args.len() <= INLINE {
        &mut inline[..args.len()]
    } else {
        heap = vec![std::ptr::null_mut(); args.len()];
        &mut heap[..]
    };
    for (b, a) in buf.iter_mut().zip(args) {
        *b = match *a {
            DirectArg::Slot(i) => {
                let i = i as usize;
                if i >= slots.len() {
                    return None;
                }
                slots.raw(i)
            }
            DirectArg::Export(j) => exports.get(j as usize)?.as_ptr(),
        };
        if b.is_null() {
            return None;
        }
    }
    // SAFETY: every pointer is a live object: a slot (live for the caller's call) or a value
    // `exports` holds; the callee borrows them for the call.
    let res = unsafe {
        let r = ffi::PyObject_Vectorcall(
            graph.as_ptr(),
            buf.as_ptr(),
            buf.len(),
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(py, r)
    };
    Some(res.and_then(|r| super::object::item_at(&r, out)))
}
