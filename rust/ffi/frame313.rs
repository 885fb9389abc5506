//! CPython 3.13 frame internals: `#[repr(C)]` mirrors and the version-specific frame protocol.
//!
//! Changes from 3.12 that matter here: the frame's code is `f_executable` (a strong reference
//! to a code object, or None for the interpreter's own shim frames, which never reach an eval
//! function), `prev_instr` became `instr_ptr`, and `PyThreadState` gained fields before the
//! data stack (`eval_breaker`, `_whence`, `state`, `current_frame`, `critical_section`, ...).
//! `stacktop` is still an `int` offset (the `_PyStackRef` stack pointer is 3.14's).
//!
//! Who clears the frame is unchanged from 3.12: `_PyEval_Vector` (Python/ceval.c, 3.13.0)
//! pushes the frame and returns what `_PyEval_EvalFrame` -> the eval function returns, and it is
//! `_PyEval_EvalFrameDefault` that clears and pops its entry frame on return or unwind
//! (`_PyEvalFrameClearAndPop` -> `clear_thread_frame`: `_PyFrame_ClearExceptCode`, drop
//! `f_executable`, `_PyThreadState_PopFrame`). So code run in the frame's place must do the
//! same; the shared steps are in `datastack.rs`.
use std::os::raw::{c_char, c_int, c_uint, c_ulong, c_void};

use pyo3::ffi;

use super::datastack::{self, DataStack, StackChunk};

/// Mirror of `_PyInterpreterFrame`, Include/internal/pycore_frame.h (CPython 3.13.0).
/// Verified from Python by tests/test_ffi_layout.py.
#[repr(C)]
pub struct InterpreterFrame {
    pub f_executable: *mut ffi::PyObject,
    pub previous: *mut InterpreterFrame,
    pub f_funcobj: *mut ffi::PyObject,
    pub f_globals: *mut ffi::PyObject,
    pub f_builtins: *mut ffi::PyObject,
    pub f_locals: *mut ffi::PyObject,
    pub frame_obj: *mut ffi::PyObject,
    pub instr_ptr: *mut u16,
    pub stacktop: c_int,
    pub return_offset: u16,
    pub owner: c_char,
    pub localsplus: [*mut ffi::PyObject; 1],
}

/// Mirror of the head of `PyCodeObject` (`_PyCode_DEF`), Include/cpython/code.h (3.13.0), up
/// to `co_nfreevars` (unchanged from 3.12.1). Verified by tests/test_ffi_layout.py via
/// `_debug_code_fields`.
#[repr(C)]
pub struct CodeHead {
    pub ob_base: ffi::PyVarObject,
    pub co_consts: *mut ffi::PyObject,
    pub co_names: *mut ffi::PyObject,
    pub co_exceptiontable: *mut ffi::PyObject,
    pub co_flags: c_int,
    pub co_argcount: c_int,
    pub co_posonlyargcount: c_int,
    pub co_kwonlyargcount: c_int,
    pub co_stacksize: c_int,
    pub co_firstlineno: c_int,
    pub co_nlocalsplus: c_int,
    pub co_framesize: c_int,
    pub co_nlocals: c_int,
    pub co_ncellvars: c_int,
    pub co_nfreevars: c_int,
}

/// Mirror of `struct _ts` (PyThreadState), Include/cpython/pystate.h (3.13.0, default build:
/// this crate refuses free-threaded builds), up to `datastack_limit`. Verified by
/// tests/test_ffi_layout.py (`thread_id` and `native_thread_id` against `threading`, and the
/// data-stack check on every replaced frame).
#[repr(C)]
pub struct ThreadStateHead {
    pub prev: *mut c_void,
    pub next: *mut c_void,
    pub interp: *mut c_void,
    pub eval_breaker: usize,
    pub _status: c_uint,
    pub _whence: c_int,
    pub state: c_int,
    pub py_recursion_remaining: c_int,
    pub py_recursion_limit: c_int,
    pub c_recursion_remaining: c_int,
    pub recursion_headroom: c_int,
    pub tracing: c_int,
    pub what_event: c_int,
    pub current_frame: *mut InterpreterFrame,
    pub c_profilefunc: *mut c_void,
    pub c_tracefunc: *mut c_void,
    pub c_profileobj: *mut ffi::PyObject,
    pub c_traceobj: *mut ffi::PyObject,
    pub current_exception: *mut ffi::PyObject,
    pub exc_info: *mut c_void,
    pub dict: *mut ffi::PyObject,
    pub gilstate_counter: c_int,
    pub async_exc: *mut ffi::PyObject,
    pub thread_id: c_ulong,
    pub native_thread_id: c_ulong,
    pub delete_later: *mut ffi::PyObject,
    pub critical_section: usize,
    pub coroutine_origin_tracking_depth: c_int,
    pub async_gen_firstiter: *mut ffi::PyObject,
    pub async_gen_finalizer: *mut ffi::PyObject,
    pub context: *mut ffi::PyObject,
    pub context_ver: u64,
    pub id: u64,
    pub datastack_chunk: *mut StackChunk,
    pub datastack_top: *mut *mut ffi::PyObject,
    pub datastack_limit: *mut *mut ffi::PyObject,
}

/// The frame's code object (`f_executable`, borrowed). Not necessarily a code object in
/// general (shim frames hold None); the hook checks `PyCode_Check` before reading it as one.
///
/// # Safety
/// `f` / `ts` / `c` point at the live frame, thread state or code the hook was given,
/// with the GIL held.
#[inline]
pub unsafe fn frame_code(f: *mut InterpreterFrame) -> *mut ffi::PyObject {
    (*f).f_executable
}

/// Slots of `localsplus` in use (locals, then the value stack).
///
/// # Safety
/// As for [`frame_code`].
#[inline]
pub unsafe fn frame_stacktop(f: *mut InterpreterFrame) -> c_int {
    (*f).stacktop
}

/// The frame's `localsplus` array (plain object pointers on 3.13).
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
/// As for [`frame_code`].
#[inline]
pub unsafe fn frame_func(f: *mut InterpreterFrame) -> *mut ffi::PyObject {
    (*f).f_funcobj
}

/// `co_framesize` of the code (words the frame occupies on the data stack).
///
/// # Safety
/// As for [`frame_code`].
#[inline]
pub unsafe fn code_framesize(c: *const CodeHead) -> i64 {
    (*c).co_framesize as i64
}

/// `frame + co_framesize == tstate->datastack_top`: the frame was the last one pushed (the
/// invariant `clear_thread_frame` asserts). Checked before any frame is replaced; a frame that
/// fails it runs the default evaluator.
///
/// # Safety
/// As for [`frame_code`]; the frame's `f_executable` is a code object.
#[inline]
pub unsafe fn frame_is_stack_top(ts: *mut ffi::PyThreadState, f: *mut InterpreterFrame) -> bool {
    let code = (*f).f_executable as *const CodeHead;
    let end = (f as *mut *mut ffi::PyObject).add((*code).co_framesize as usize);
    let ts = ts as *mut ThreadStateHead;
    end == (*ts).datastack_top
}

/// Clear the frame (its references) and pop it from the data stack: what `clear_thread_frame`
/// (Python/ceval.c, 3.13.0) does for a thread-owned frame without a frame object.
///
/// # Safety
/// As for [`frame_is_stack_top`], and the frame passed the hook's `replaceable` checks.
pub unsafe fn finish_replaced_frame(ts: *mut ffi::PyThreadState, f: *mut InterpreterFrame) {
    // `_PyFrame_ClearExceptCode`: no frame object (checked before replacing; the frame was
    // never linked into the thread's frame chain, so nothing can have created one).
    debug_assert!((*f).frame_obj.is_null());
    let n = (*f).stacktop.max(0) as usize;
    datastack::clear_locals((*f).localsplus.as_mut_ptr(), n, &mut (*f).f_locals);
    (*f).stacktop = 0;
    let func = std::mem::replace(&mut (*f).f_funcobj, std::ptr::null_mut());
    ffi::Py_XDECREF(func);
    let code = (*f).f_executable;
    let ts = ts as *mut ThreadStateHead;
    let ds = DataStack {
        chunk: &mut (*ts).datastack_chunk,
        top: &mut (*ts).datastack_top,
        limit: &mut (*ts).datastack_limit,
    };
    datastack::pop_frame(ds, f as *mut *mut ffi::PyObject);
    // The code last (after the pop: nothing reads the frame now).
    ffi::Py_DECREF(code);
}

/// Replaced frames whose pop freed a data-stack chunk.
pub fn chunk_pops() -> u64 {
    datastack::chunk_pops()
}
