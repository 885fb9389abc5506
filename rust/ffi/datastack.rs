//! The thread's data stack (3.12 and later): the `_PyStackChunk` mirror and the two steps CPython
//! takes when a thread-owned frame finishes, reimplemented because neither is exported:
//! dropping the frame's references (`_PyFrame_ClearExceptCode`, Python/frame.c) and popping it
//! (`_PyThreadState_PopFrame`, Python/pystate.c). Shared by `frame312.rs` and `frame313.rs`;
//! each passes its own `PyThreadState` mirror's data-stack fields as a [`DataStack`].
//!
//! Only for the one kind of frame the hook replaces: owned by the thread, with no frame object,
//! on top of the data stack (checked before replacing).
use std::os::raw::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::ffi;

/// Mirror of `_PyStackChunk`, Include/cpython/pystate.h (identical in 3.12.1 and 3.13.0).
#[repr(C)]
pub struct StackChunk {
    pub previous: *mut StackChunk,
    pub size: usize,
    pub top: usize,
    pub data: [*mut ffi::PyObject; 1],
}

/// The three data-stack fields of `PyThreadState` (`datastack_chunk`, `datastack_top`,
/// `datastack_limit`), borrowed from a version's thread-state mirror.
pub struct DataStack<'a> {
    pub chunk: &'a mut *mut StackChunk,
    pub top: &'a mut *mut *mut ffi::PyObject,
    pub limit: &'a mut *mut *mut ffi::PyObject,
}

/// How many replaced frames were the first of their data-stack chunk (so popping them freed
/// the chunk); tests use it to prove that branch ran.
pub static CHUNK_POPS: AtomicU64 = AtomicU64::new(0);

/// `_PyFrame_ClearLocals` for a frame without a frame object: release the `stacktop` slots of
/// `localsplus` and the locals dict, leaving the slots NULL.
///
/// # Safety
/// `slots` points at the frame's `localsplus`, of which the first `stacktop` are NULL or owned
/// references; `locals` is the frame's `f_locals` field. GIL held.
pub unsafe fn clear_locals(
    slots: *mut *mut ffi::PyObject,
    stacktop: usize,
    locals: &mut *mut ffi::PyObject,
) {
    for i in 0..stacktop {
        let p = std::mem::replace(&mut *slots.add(i), std::ptr::null_mut());
        ffi::Py_XDECREF(p);
    }
    let l = std::mem::replace(locals, std::ptr::null_mut());
    ffi::Py_XDECREF(l);
}

/// `_PyThreadState_PopFrame`: pop the frame starting at `base`, the last one pushed, freeing its
/// chunk when it was the chunk's first frame.
///
/// # Safety
/// `base` is the address of the thread's top frame on its data stack, `ds` that thread's
/// data-stack fields; GIL held. The root chunk is never popped (CPython's `push_chunk` puts a
/// frame-less sentinel first), so a frame at a chunk's start always has a previous chunk.
pub unsafe fn pop_frame(ds: DataStack<'_>, base: *mut *mut ffi::PyObject) {
    let chunk = *ds.chunk;
    if base == (*chunk).data.as_mut_ptr() {
        let previous = (*chunk).previous;
        *ds.top = (*previous).data.as_mut_ptr().add((*previous).top);
        *ds.chunk = previous;
        *ds.limit = (previous as *mut u8).add((*previous).size) as *mut *mut ffi::PyObject;
        let mut alloc = std::mem::MaybeUninit::<ffi::PyObjectArenaAllocator>::zeroed();
        ffi::PyObject_GetArenaAllocator(alloc.as_mut_ptr());
        let alloc = alloc.assume_init();
        if let Some(free) = alloc.free {
            free(alloc.ctx, chunk as *mut c_void, (*chunk).size);
        }
        CHUNK_POPS.fetch_add(1, Ordering::Relaxed);
    } else {
        *ds.top = base;
    }
}

/// Replaced frames whose pop freed a chunk (see [`CHUNK_POPS`]).
pub fn chunk_pops() -> u64 {
    CHUNK_POPS.load(Ordering::Relaxed)
}
