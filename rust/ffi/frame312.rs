//! CPython 3.12 frame internals: `#[repr(C)]` mirrors and the version-specific frame protocol.
//!
//! On 3.12 `_PyEval_EvalFrameDefault` clears the frame it was given and pops it from the
//! thread's data stack itself (RETURN_VALUE / exit_unwind -> `_PyEvalFrameClearAndPop`), and
//! `_PyEval_Vector` does not. So when the hook runs other code in the frame's place it must do
//! the same: drop the frame's references (`_PyFrame_ClearExceptCode` + the code) and pop it
//! (`_PyThreadState_PopFrame`, Python/pystate.c). Neither function is exported, so both are
//! reimplemented here for the one kind of frame the hook replaces: owned by the thread, with
//! no frame object and no locals dict, on top of the data stack (checked before replacing).
use std::os::raw::{c_char, c_int, c_uint, c_ulong, c_void};

use pyo3::ffi;

use super::datastack::{self, DataStack, StackChunk};

/// Mirror of `_PyInterpreterFrame`, Include/internal/pycore_frame.h (CPython 3.12.1).
/// Verified from Python by tests/test_ffi_layout.py.
#[repr(C)]
pub struct InterpreterFrame {
    pub f_code: *mut ffi::PyObject,
    pub previous: *mut InterpreterFrame,
    pub f_funcobj: *mut ffi::PyObject,
    pub f_globals: *mut ffi::PyObject,
    pub f_builtins: *mut ffi::PyObject,
    pub f_locals: *mut ffi::PyObject,
    pub frame_obj: *mut ffi::PyObject,
    pub prev_instr: *mut u16,
    pub stacktop: c_int,
    pub return_offset: u16,
    pub owner: c_char,
    pub localsplus: [*mut ffi::PyObject; 1],
}

/// Mirror of the head of `PyCodeObject` (`_PyCode_DEF`), Include/cpython/code.h (3.12.1), up
/// to `co_nfreevars`. Verified by tests/test_ffi_layout.py via `_debug_code_fields`.
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

/// Mirror of `struct _ts` (PyThreadState), Include/cpython/pystate.h (3.12.1), up to
/// `datastack_limit`. Verified by tests/test_ffi_layout.py (`thread_id` and
/// `native_thread_id` against `threading`, and the data-stack check on every replaced frame).
#[repr(C)]
pub struct ThreadStateHead {
    pub prev: *mut c_void,
    pub next: *mut c_void,
    pub interp: *mut c_void,
    pub _status: c_uint,
    pub py_recursion_remaining: c_int,
    pub py_recursion_limit: c_int,
    pub c_recursion_remaining: c_int,
    pub recursion_headroom: c_int,
    pub tracing: c_int,
    pub what_event: c_int,
    pub cframe: *mut c_void,
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
    pub trash_delete_nesting: c_int,
    pub trash_delete_later: *mut ffi::PyObject,
    pub on_delete: *mut c_void,
    pub on_delete_data: *mut c_void,
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

/// The frame's `localsplus` array (plain object pointers on 3.12).
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
    (*f).f_funcobj
}

///
/// # Safety
/// `f` / `ts` / `c` point at the live frame, thread state or code the hook was given,
/// with the GIL held.
#[inline]
pub unsafe fn code_framesize(c: *const CodeHead) -> i64 {
    (*c).co_framesize as i64
}

/// `frame + co_framesize == tstate->datastack_top`: the frame was the last one pushed (the
/// invariant `clear_thread_frame` asserts). Checked before any frame is replaced; a frame that
/// fails it runs the default evaluator.
///
/// # Safety
/// `f` / `ts` / `c` point at the live frame, thread state or code the hook was given,
/// with the GIL held.
#[inline]
pub unsafe fn frame_is_stack_top(ts: *mut ffi::PyThreadState, f: *mut InterpreterFrame) -> bool {
    let code = (*f).f_code as *const CodeHead;
    let end = (f as *mut *mut ffi::PyObject).add((*code).co_framesize as usize);
    let ts = ts as *mut ThreadStateHead;
    end == (*ts).datastack_top
}

/// Clear the frame (its references) and pop it from the data stack: what
/// `_PyEvalFrameClearAndPop` -> `clear_thread_frame` does for a thread-owned frame without a
/// frame object (Python/ceval.c, 3.12.1).
///
/// # Safety
/// `f` / `ts` / `c` point at the live frame, thread state or code the hook was given,
/// with the GIL held.
pub unsafe fn finish_replaced_frame(ts: *mut ffi::PyThreadState, f: *mut InterpreterFrame) {
    // `_PyFrame_ClearExceptCode`: frame_obj is NULL (checked before the frame was replaced; the
    // frame is never linked into the thread's frame chain, so nothing can have created one).
    debug_assert!((*f).frame_obj.is_null());
    let n = (*f).stacktop.max(0) as usize;
    datastack::clear_locals((*f).localsplus.as_mut_ptr(), n, &mut (*f).f_locals);
    (*f).stacktop = 0;
    let func = std::mem::replace(&mut (*f).f_funcobj, std::ptr::null_mut());
    ffi::Py_XDECREF(func);
    let code = (*f).f_code;
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
