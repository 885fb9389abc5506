//! CPython 3.11 frame internals: `#[repr(C)]` mirrors and the version-specific frame protocol.
//!
//! On 3.11 the caller of the eval function (`_PyEval_Vector` in Python/ceval.c) clears the
//! frame and pops it from the thread's data stack after the eval function returns, so code run
//! in the frame's place (a cache hit) leaves the frame alone.
use std::os::raw::{c_char, c_int, c_short};

use pyo3::ffi;

/// Mirror of `_PyInterpreterFrame`, Include/internal/pycore_frame.h (CPython 3.11.7).
/// Verified from Python by tests/test_ffi_layout.py (the FrameView read through it, and
/// `_debug_last_frame`).
#[repr(C)]
pub struct InterpreterFrame {
    pub f_func: *mut ffi::PyObject,
    pub f_globals: *mut ffi::PyObject,
    pub f_builtins: *mut ffi::PyObject,
    pub f_locals: *mut ffi::PyObject,
    pub f_code: *mut ffi::PyObject,
    pub frame_obj: *mut ffi::PyObject,
    pub previous: *mut InterpreterFrame,
    pub prev_instr: *mut u16,
    pub stacktop: c_int,
    pub is_entry: bool,
    pub owner: c_char,
    pub localsplus: [*mut ffi::PyObject; 1],
}

/// Mirror of the head of `PyCodeObject` (`_PyCode_DEF`), Include/cpython/code.h (3.11.7), up
/// to `co_nfreevars`. Verified by tests/test_ffi_layout.py via `_debug_code_fields`.
#[repr(C)]
pub struct CodeHead {
    pub ob_base: ffi::PyVarObject,
    pub co_consts: *mut ffi::PyObject,
    pub co_names: *mut ffi::PyObject,
    pub co_exceptiontable: *mut ffi::PyObject,
    pub co_flags: c_int,
    pub co_warmup: c_short,
    pub _co_linearray_entry_size: c_short,
    pub co_argcount: c_int,
    pub co_posonlyargcount: c_int,
    pub co_kwonlyargcount: c_int,
    pub co_stacksize: c_int,
    pub co_firstlineno: c_int,
    pub co_nlocalsplus: c_int,
    pub co_nlocals: c_int,
    pub co_nplaincellvars: c_int,
    pub co_ncellvars: c_int,
    pub co_nfreevars: c_int,
}

/// The frame's code object (borrowed; the frame holds a strong reference).
///
/// # Safety
/// `f` / `ts` / `c` point at the live frame, thread state or code the hook was given,
/// with the GIL held.
#[inline]
pub unsafe fn frame_code(f: *mut InterpreterFrame) -> *mut ffi::PyObject {
    (*f).f_code
}

/// Slots of `localsplus` in use (locals, then the value stack).
///
/// # Safety
/// As for [`frame_code`].
#[inline]
pub unsafe fn frame_stacktop(f: *mut InterpreterFrame) -> c_int {
    (*f).stacktop
}

/// The frame's `localsplus` array (plain object pointers on 3.11).
///
/// # Safety
/// As for [`frame_code`].
#[inline]
pub unsafe fn frame_slots(f: *mut InterpreterFrame) -> *const *mut ffi::PyObject {
    (*f).localsplus.as_ptr()
}

/// Low bits of a `localsplus` slot that tag the reference rather than address the object:
/// none here (plain `PyObject *`); 3.14's `_PyStackRef` slots have them.
pub const SLOT_TAG_BITS: usize = 0;

/// The function object of the frame (borrowed).
///
/// # Safety
/// `f` / `ts` / `c` point at the live frame, thread state or code the hook was given,
/// with the GIL held.
#[inline]
pub unsafe fn frame_func(f: *mut InterpreterFrame) -> *mut ffi::PyObject {
    (*f).f_func
}

/// 3.11 has no `co_framesize`; reported as -1 by the debug reader.
///
/// # Safety
/// `f` / `ts` / `c` point at the live frame, thread state or code the hook was given,
/// with the GIL held.
#[inline]
pub unsafe fn code_framesize(_c: *const CodeHead) -> i64 {
    -1
}

/// On 3.11 the data-stack position needs no check: this crate never pops frames there.
///
/// # Safety
/// `f` / `ts` / `c` point at the live frame, thread state or code the hook was given,
/// with the GIL held.
#[inline]
pub unsafe fn frame_is_stack_top(_ts: *mut ffi::PyThreadState, _f: *mut InterpreterFrame) -> bool {
    true
}

/// Called after code ran in the frame's place. On 3.11 the caller clears and pops the frame.
///
/// # Safety
/// `f` / `ts` / `c` point at the live frame, thread state or code the hook was given,
/// with the GIL held.
#[inline]
pub unsafe fn finish_replaced_frame(_ts: *mut ffi::PyThreadState, _f: *mut InterpreterFrame) {}

/// 3.11 never pops frames, so no chunk is ever freed by the hook.
pub fn chunk_pops() -> u64 {
    0
}

/// Mirror of the head of `struct _ts` (PyThreadState), Include/cpython/pystate.h (3.11.7),
/// up to `native_thread_id`: [`super::frame::thread_traced`] reads the trace fields. Verified by
/// tests/test_ffi_layout.py (`sys.settrace` / `sys.setprofile` seen through it, and the thread
/// ids against `threading`).
#[repr(C)]
pub struct ThreadStateHead {
    pub prev: *mut std::ffi::c_void,
    pub next: *mut std::ffi::c_void,
    pub interp: *mut std::ffi::c_void,
    pub _initialized: std::os::raw::c_int,
    pub _static: std::os::raw::c_int,
    pub recursion_remaining: std::os::raw::c_int,
    pub recursion_limit: std::os::raw::c_int,
    pub recursion_headroom: std::os::raw::c_int,
    pub tracing: std::os::raw::c_int,
    pub tracing_what: std::os::raw::c_int,
    pub cframe: *mut std::ffi::c_void,
    pub c_profilefunc: *mut std::ffi::c_void,
    pub c_tracefunc: *mut std::ffi::c_void,
    pub c_profileobj: *mut ffi::PyObject,
    pub c_traceobj: *mut ffi::PyObject,
    pub curexc_type: *mut ffi::PyObject,
    pub curexc_value: *mut ffi::PyObject,
    pub curexc_traceback: *mut ffi::PyObject,
    pub exc_info: *mut std::ffi::c_void,
    pub dict: *mut ffi::PyObject,
    pub gilstate_counter: std::os::raw::c_int,
    pub async_exc: *mut ffi::PyObject,
    pub thread_id: std::os::raw::c_ulong,
    pub native_thread_id: std::os::raw::c_ulong,
}
