//! The PEP 523 frame hook: `extern "C"` declarations of CPython's eval-frame API, the eval
//! function itself, and [`InterceptedFrame`], the safe view of a frame that the hook hands to
//! `crate::eval_frame` to decide what runs.
//!
//! Version differences (struct layouts, field accessors, who clears a replaced frame) are in
//! `frame311.rs` / `frame312.rs` / `frame313.rs`; this file is the same on all of them and
//! reads the frame only through the `version` module's accessors (`frame_code`,
//! `frame_stacktop`, `frame_slots`, `frame_func`, ...), so a new minor is a new module.
//!
//! The hook never replaces a frame it cannot give back correctly: a frame is only offered to
//! `eval_frame` when it is thread-owned, has no frame object and no locals dict (so it is a plain
//! function call), is not resumed with `throwflag`, belongs to neither a generator nor a
//! coroutine, and (3.12+) sits on top of the thread's data stack. Everything else runs
//! `_PyEval_EvalFrameDefault` unchanged.
use std::os::raw::c_int;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCode, PyDict, PyTuple};
use pyo3::Borrowed;

use super::slots::Slots;

/// Where one argument of [`InterceptedFrame::call_direct`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectArg {
    /// The frame's argument slot `i`.
    Slot(u32),
    /// Exported value `j`.
    Export(u32),
}
use crate::cache::CodeState;

#[cfg(not(Py_3_12))]
pub use super::frame311 as version;
#[cfg(all(Py_3_12, not(Py_3_13)))]
pub use super::frame312 as version;
#[cfg(all(Py_3_13, not(Py_3_14)))]
pub use super::frame313 as version;

use version::{CodeHead, InterpreterFrame};

type EvalFrameFn = unsafe extern "C" fn(
    *mut ffi::PyThreadState,
    *mut InterpreterFrame,
    c_int,
) -> *mut ffi::PyObject;

extern "C" {
    fn _PyEval_EvalFrameDefault(
        tstate: *mut ffi::PyThreadState,
        frame: *mut InterpreterFrame,
        throwflag: c_int,
    ) -> *mut ffi::PyObject;
    fn _PyInterpreterState_SetEvalFrameFunc(
        interp: *mut ffi::PyInterpreterState,
        f: Option<EvalFrameFn>,
    );
    fn _PyInterpreterState_GetEvalFrameFunc(
        interp: *mut ffi::PyInterpreterState,
    ) -> Option<EvalFrameFn>;
}

/// `co_flags` bits whose frames are never replaced (Include/cpython/code.h).
const CO_VARARGS: c_int = 0x0004;
const CO_VARKEYWORDS: c_int = 0x0008;
const CO_GENERATOR: c_int = 0x0020;
const CO_COROUTINE: c_int = 0x0080;
const CO_ITERABLE_COROUTINE: c_int = 0x0100;
const CO_ASYNC_GENERATOR: c_int = 0x0200;
const CO_RESUMABLE: c_int =
    CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR;
/// `FRAME_OWNED_BY_THREAD` (enum _frameowner, Include/internal/pycore_frame.h, 3.11 to 3.13).
const FRAME_OWNED_BY_THREAD: std::os::raw::c_char = 0;

/// Frames the hook saw and handed to `eval_frame` (for tests).
static OFFERED: AtomicU64 = AtomicU64::new(0);

/// What `eval_frame` decided for a frame.
pub enum FrameAction {
    /// Run the frame with CPython's default evaluator.
    RunDefault,
    /// The frame's result was computed in its place (a cache entry ran, or an error).
    Return(PyResult<Py<PyAny>>),
}

/// Install the hook for the whole interpreter (idempotent).
pub fn install(_py: Python<'_>) {
    // SAFETY: GIL held; the interpreter is live.
    unsafe {
        let interp = ffi::PyInterpreterState_Get();
        let cur = _PyInterpreterState_GetEvalFrameFunc(interp);
        if cur.map(|f| f as usize) != Some(ferrodyn_eval_frame as EvalFrameFn as usize) {
            _PyInterpreterState_SetEvalFrameFunc(interp, Some(ferrodyn_eval_frame));
        }
    }
}

/// Remove the hook if it is ours (a hook installed by someone else since is left alone).
pub fn uninstall(_py: Python<'_>) {
    // SAFETY: GIL held; the interpreter is live.
    unsafe {
        let interp = ffi::PyInterpreterState_Get();
        let cur = _PyInterpreterState_GetEvalFrameFunc(interp);
        if cur.map(|f| f as usize) == Some(ferrodyn_eval_frame as EvalFrameFn as usize) {
            _PyInterpreterState_SetEvalFrameFunc(interp, Some(_PyEval_EvalFrameDefault));
        }
    }
}

/// Whether the interpreter's eval function is currently ferrodyn's.
pub fn installed(_py: Python<'_>) -> bool {
    // SAFETY: GIL held.
    unsafe {
        let cur = _PyInterpreterState_GetEvalFrameFunc(ffi::PyInterpreterState_Get());
        cur.map(|f| f as usize) == Some(ferrodyn_eval_frame as EvalFrameFn as usize)
    }
}

/// An identifier of the current thread state (its address), to tell thread states apart.
pub fn current_thread_state(_py: Python<'_>) -> usize {
    // SAFETY: GIL held, so there is a current thread state.
    unsafe { ffi::PyThreadState_Get() as usize }
}

/// The current thread state's dict (`PyThreadState_GetDict`): objects stored there are
/// released when the thread state is cleared (thread exit), with the GIL held.
pub fn thread_state_dict(py: Python<'_>) -> Option<Bound<'_, PyDict>> {
    // SAFETY: GIL held; returns a borrowed dict or NULL.
    unsafe {
        let d = ffi::PyThreadState_GetDict();
        if d.is_null() {
            None
        } else {
            Some(Bound::from_borrowed_ptr(py, d).cast_into_unchecked())
        }
    }
}

/// The PEP 523 eval function.
unsafe extern "C" fn ferrodyn_eval_frame(
    tstate: *mut ffi::PyThreadState,
    frame: *mut InterpreterFrame,
    throwflag: c_int,
) -> *mut ffi::PyObject {
    let (mode, backend_id) = crate::eval_frame::thread_hook(tstate as usize);
    if mode == crate::eval_frame::Mode::Off || throwflag != 0 {
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    let code = version::frame_code(frame);
    // 3.13's `f_executable` may be None (shim frames): only a code object has cache state.
    if code.is_null() || ffi::PyCode_Check(code) == 0 {
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    // The code's cache state; the frame keeps its code (and so the state) alive throughout.
    let state = super::code_extra::state_raw(code);
    // SKIP code (entry functions, compiled graphs), or run-only with no entries: nothing to do,
    // decided before the structural checks (which read every argument slot) and without
    // attaching.
    if !crate::eval_frame::worth_offering(mode, state) || !replaceable(tstate, frame) {
        // A tail call: frames run unchanged keep no frame of the hook on the C stack.
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    offer(tstate, frame, mode, backend_id, state)
}

/// The frame offered to `eval_frame` (kept out of the hook's own body so that the paths that
/// run a frame unchanged stay a few loads and a tail call).
#[inline(never)]
unsafe fn offer(
    tstate: *mut ffi::PyThreadState,
    frame: *mut InterpreterFrame,
    mode: crate::eval_frame::Mode,
    backend_id: i64,
    state: Option<&CodeState>,
) -> *mut ffi::PyObject {
    // GIL held: a plain load and store.
    OFFERED.store(
        OFFERED.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
    // The hit path runs under a bare token: the GIL is held (we are called by the eval loop),
    // and it drops no `Py<T>` (see `on_frame_cached`), so pyo3's attach bookkeeping (about a
    // third of a hit's cost) is only paid on the miss path, which calls Python.
    let py = Python::assume_attached();
    let view = InterceptedFrame::new(py, tstate, frame);
    let cached = std::panic::catch_unwind(AssertUnwindSafe(|| {
        crate::eval_frame::on_frame_cached(&view, state, mode, backend_id)
    }))
    .unwrap_or_else(|_| Some(panicked()));
    let action = match cached {
        Some(action) => action,
        None => Python::attach(|py| {
            let view = InterceptedFrame::new(py, tstate, frame);
            std::panic::catch_unwind(AssertUnwindSafe(|| crate::eval_frame::on_frame_miss(&view)))
                .unwrap_or_else(|_| panicked())
        }),
    };
    // None: run the default evaluator; Some(ptr): the frame's result (NULL with an error set).
    let outcome: Option<*mut ffi::PyObject> = match action {
        FrameAction::RunDefault => None,
        FrameAction::Return(Ok(obj)) => Some(obj.into_ptr()),
        FrameAction::Return(Err(e)) => {
            e.restore(py);
            Some(std::ptr::null_mut())
        }
    };
    match outcome {
        // `throwflag` is 0 here (a frame resumed with an exception is never offered).
        None => _PyEval_EvalFrameDefault(tstate, frame, 0),
        Some(ptr) => {
            version::finish_replaced_frame(tstate, frame);
            ptr
        }
    }
}

fn panicked() -> FrameAction {
    FrameAction::Return(Err(pyo3::panic::PanicException::new_err(
        "ferrodyn: internal panic in the frame hook",
    )))
}

/// The structural conditions under which a frame may be replaced (see the module docs).
#[inline]
unsafe fn replaceable(tstate: *mut ffi::PyThreadState, frame: *mut InterpreterFrame) -> bool {
    let code = version::frame_code(frame);
    // 3.13's `f_executable` may be None (shim frames); every later read assumes a code object.
    if code.is_null() || ffi::PyCode_Check(code) == 0 {
        return false;
    }
    let code = code as *const CodeHead;
    (*code).co_flags & CO_RESUMABLE == 0
        && (*frame).owner == FRAME_OWNED_BY_THREAD
        && (*frame).frame_obj.is_null()
        && (*frame).f_locals.is_null()
        && !version::frame_func(frame).is_null()
        && version::frame_is_stack_top(tstate, frame)
        && args_bound(code, frame)
}

/// Every argument slot holds a value (always true for frames made by a call; checked so that
/// the hit path and the frame view never meet an unbound slot).
#[inline]
unsafe fn args_bound(code: *const CodeHead, frame: *mut InterpreterFrame) -> bool {
    let n = arg_count(&*code);
    (n as c_int) <= version::frame_stacktop(frame) && frame_arg_slots(frame, n).all_bound()
}

/// The first `n` slots of the frame's `localsplus`, tags masked as the version requires.
///
/// # Safety
/// The frame is live and has at least `n` initialised slots, unchanged for `'a`.
#[inline]
unsafe fn frame_arg_slots<'a>(frame: *mut InterpreterFrame, n: usize) -> Slots<'a> {
    Slots::from_tagged(version::frame_slots(frame), n, version::SLOT_TAG_BITS)
}

/// Positional and keyword-only parameters, plus one each for `*args` and `**kwargs`.
#[inline]
fn arg_count(c: &CodeHead) -> usize {
    let mut n = (c.co_argcount + c.co_kwonlyargcount) as usize;
    if c.co_flags & CO_VARARGS != 0 {
        n += 1;
    }
    if c.co_flags & CO_VARKEYWORDS != 0 {
        n += 1;
    }
    n
}

/// A frame the hook is deciding about, valid for the duration of the decision: the frame is
/// alive and unchanged (not yet started) the whole time. Only built by the hook.
pub struct InterceptedFrame<'py> {
    py: Python<'py>,
    frame: *mut InterpreterFrame,
    tstate: *mut ffi::PyThreadState,
}

impl<'py> InterceptedFrame<'py> {
    fn new(py: Python<'py>, tstate: *mut ffi::PyThreadState, frame: *mut InterpreterFrame) -> Self {
        InterceptedFrame { py, frame, tstate }
    }

    pub fn py(&self) -> Python<'py> {
        self.py
    }

    fn code_head(&self) -> *const CodeHead {
        // SAFETY: the frame holds a strong reference to its code for its whole life.
        unsafe { version::frame_code(self.frame) as *const CodeHead }
    }

    /// The frame's code object.
    pub fn code(&self) -> Borrowed<'_, 'py, PyCode> {
        // SAFETY: strong reference held by the frame; it is a code object.
        unsafe { Borrowed::from_ptr(self.py, version::frame_code(self.frame)).cast_unchecked() }
    }

    /// The cache state of the frame's code, if any.
    pub fn code_state(&self) -> Option<&CodeState> {
        // SAFETY: the frame keeps its code alive for as long as `self` is borrowed.
        unsafe { super::code_extra::state_raw(version::frame_code(self.frame)) }
    }

    pub fn globals(&self) -> Borrowed<'_, 'py, PyDict> {
        // SAFETY: the function object (held by the frame) keeps its globals dict alive.
        unsafe { Borrowed::from_ptr(self.py, (*self.frame).f_globals).cast_unchecked() }
    }

    pub fn builtins(&self) -> Borrowed<'_, 'py, PyDict> {
        // SAFETY: as for globals.
        unsafe { Borrowed::from_ptr(self.py, (*self.frame).f_builtins).cast_unchecked() }
    }

    /// The frame's function object.
    pub fn function(&self) -> Borrowed<'_, 'py, PyAny> {
        // SAFETY: strong reference held by the frame (checked non-NULL by `replaceable`).
        unsafe { Borrowed::from_ptr(self.py, version::frame_func(self.frame)) }
    }

    /// The number of argument slots: positional and keyword-only parameters, plus one each for
    /// `*args` and `**kwargs` where the code has them.
    pub fn arg_count(&self) -> usize {
        // SAFETY: see code_head.
        arg_count(unsafe { &*self.code_head() })
    }

    /// The argument slots, borrowed from the frame (no references taken).
    pub fn arg_slots(&self) -> Slots<'_> {
        let n = self.arg_count();
        // SAFETY: the frame has at least co_nlocalsplus >= n slots, initialised by
        // `_PyEvalFramePushAndInit` before the eval function is called, and they stay unchanged
        // until the frame starts or is cleared, neither of which happens while `self` lives.
        unsafe { frame_arg_slots(self.frame, n) }
    }

    /// The function's closure cells (in `co_freevars` order), or None.
    pub fn closure(&self) -> Option<Borrowed<'_, 'py, PyTuple>> {
        // SAFETY: see code_head.
        if unsafe { (*self.code_head()).co_nfreevars } == 0 {
            return None;
        }
        // SAFETY: a function object; PyFunction_GetClosure returns a borrowed tuple or NULL.
        unsafe {
            let c = ffi::PyFunction_GetClosure(version::frame_func(self.frame));
            if c.is_null() || ffi::PyTuple_Check(c) == 0 {
                None
            } else {
                Some(Borrowed::from_ptr(self.py, c).cast_unchecked())
            }
        }
    }

    /// `fn(*arg_slots, *closure_cells, *extra)` by vectorcall: the slots passed as they are
    /// (no copy) when there is no closure and nothing extra (and the slots are untagged, as up
    /// to 3.13), else copied into one array of borrowed pointers (no tuple, no references
    /// taken).
    pub fn call_with_slots(
        &self,
        f: &Bound<'py, PyAny>,
        extra: &[Bound<'py, PyAny>],
    ) -> PyResult<Bound<'py, PyAny>> {
        let slots = self.arg_slots();
        let n = slots.len();
        if !slots.all_bound() {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "ferrodyn: unbound argument slot",
            ));
        }
        let args = slots.untagged();
        let closure = self.closure();
        // SAFETY: the slots are valid (see arg_slots), the cells belong to the frame's
        // function and `extra` is held by the caller: all borrowed by the callee for the call.
        unsafe {
            let res = if closure.is_none() && extra.is_empty() {
                ffi::PyObject_Vectorcall(f.as_ptr(), args.as_ptr(), n, std::ptr::null_mut())
            } else {
                let m = closure.as_ref().map_or(0, |c| c.len());
                let mut buf: Vec<*mut ffi::PyObject> = Vec::with_capacity(n + m + extra.len());
                buf.extend_from_slice(&args);
                if let Some(cells) = &closure {
                    for i in 0..m {
                        buf.push(ffi::PyTuple_GET_ITEM(cells.as_ptr(), i as ffi::Py_ssize_t));
                    }
                }
                buf.extend(extra.iter().map(|e| e.as_ptr()));
                ffi::PyObject_Vectorcall(f.as_ptr(), buf.as_ptr(), buf.len(), std::ptr::null_mut())
            };
            Bound::from_owned_ptr_or_err(self.py, res)
        }
    }

    /// Whether the thread has a trace or profile function set (they would see the frames
    /// that run in this one's place).
    pub fn thread_traced(&self) -> bool {
        // SAFETY: the thread state the hook was given, live, GIL held.
        unsafe { thread_traced(self.tstate) }
    }

    /// `graph(*args)[out]`, each argument one of the frame's argument slots or one of
    /// `exports` (`crate::ffi::func_call::call_direct`): a cached entry's direct call
    /// (`crate::cache::direct`). None (nothing called) when a slot is unbound or an index is
    /// out of range: the caller runs the entry function.
    pub fn call_direct(
        &self,
        graph: &Bound<'py, PyAny>,
        args: &[DirectArg],
        exports: &[Bound<'py, PyAny>],
        out: isize,
    ) -> Option<PyResult<Bound<'py, PyAny>>> {
        super::func_call::call_direct(self.py, &self.arg_slots(), graph, args, exports, out)
    }

    /// Raw fields read through the frame mirror, for tests/test_ffi_layout.py.
    pub fn debug_fields(&self) -> Vec<(&'static str, i64)> {
        // SAFETY: reads of the live frame and its code.
        unsafe {
            let f = &*self.frame;
            let c = &*self.code_head();
            vec![
                ("owner", f.owner as i64),
                ("stacktop", version::frame_stacktop(self.frame) as i64),
                ("co_nlocalsplus", c.co_nlocalsplus as i64),
                ("frame_obj_is_null", f.frame_obj.is_null() as i64),
                ("f_locals_is_null", f.f_locals.is_null() as i64),
                (
                    "stack_top_ok",
                    version::frame_is_stack_top(self.tstate, self.frame) as i64,
                ),
                ("co_framesize", version::code_framesize(c)),
            ]
        }
    }
}

/// `co_*` fields of a code object read through the mirror, for tests/test_ffi_layout.py.
pub fn debug_code_fields(code: &Bound<'_, PyCode>) -> Vec<(&'static str, i64)> {
    // SAFETY: a live code object; reads of its fixed head.
    unsafe {
        let c = &*(code.as_ptr() as *const CodeHead);
        vec![
            ("co_flags", c.co_flags as i64),
            ("co_argcount", c.co_argcount as i64),
            ("co_posonlyargcount", c.co_posonlyargcount as i64),
            ("co_kwonlyargcount", c.co_kwonlyargcount as i64),
            ("co_stacksize", c.co_stacksize as i64),
            ("co_firstlineno", c.co_firstlineno as i64),
            ("co_nlocalsplus", c.co_nlocalsplus as i64),
            ("co_nlocals", c.co_nlocals as i64),
            ("co_ncellvars", c.co_ncellvars as i64),
            ("co_nfreevars", c.co_nfreevars as i64),
            ("co_framesize", version::code_framesize(c)),
        ]
    }
}

/// Counters of the hook itself, for tests: frames offered to `eval_frame`, and (3.12+)
/// replaced frames whose pop freed a data-stack chunk.
pub fn debug_counters() -> Vec<(&'static str, u64)> {
    vec![
        ("offered", OFFERED.load(Ordering::Relaxed)),
        ("chunk_pops", version::chunk_pops()),
    ]
}

/// Whether the current thread has a trace or profile function, read through the mirror.
pub fn debug_thread_traced(_py: Python<'_>) -> bool {
    // SAFETY: GIL held; the current thread state is live.
    unsafe { thread_traced(ffi::PyThreadState_Get()) }
}

/// `(thread_id, native_thread_id)` of the current thread state read through the mirror.
pub fn debug_thread_ids(_py: Python<'_>) -> Option<(u64, u64)> {
    // SAFETY: GIL held; the current thread state is live.
    unsafe { thread_ids(ffi::PyThreadState_Get()) }
}

/// Whether a trace or profile function (`sys.settrace` / `sys.setprofile`) is set on the
/// thread, read through the minor's `ThreadStateHead` mirror (`version::ThreadStateHead`:
/// every minor names the two fields alike).
///
/// # Safety
/// `ts` is the current thread state, GIL held.
#[inline]
pub unsafe fn thread_traced(ts: *mut ffi::PyThreadState) -> bool {
    let ts = ts as *mut version::ThreadStateHead;
    !(*ts).c_tracefunc.is_null() || !(*ts).c_profilefunc.is_null()
}

/// `(thread_id, native_thread_id)` read through the mirror, for the layout test.
///
/// # Safety
/// `ts` is the current thread state, GIL held.
#[allow(clippy::useless_conversion)] // c_ulong is u64 on the supported platforms
unsafe fn thread_ids(ts: *mut ffi::PyThreadState) -> Option<(u64, u64)> {
    let ts = ts as *mut version::ThreadStateHead;
    Some((
        u64::from((*ts).thread_id),
        u64::from((*ts).native_thread_id),
    ))
}
