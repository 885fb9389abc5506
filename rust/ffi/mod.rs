//! The one FFI module: every `unsafe` block and every CPython-version `cfg` of the crate.
//!
//! Owns: `extern "C"` declarations of CPython's private eval-frame and code-extra API,
//! `#[repr(C)]` mirrors of CPython's internal structs (each says which header it mirrors), and
//! raw reads of torch's tensor objects. Safe wrappers are exported for the rest of the crate.
//! Does not own: any policy (what to guard, when to compile); that lives in the subsystems.
#![allow(unsafe_code)]

pub mod code_extra;
#[cfg(Py_3_12)]
pub mod datastack;
pub mod frame;
#[cfg(not(Py_3_12))]
pub mod frame311;
#[cfg(all(Py_3_12, not(Py_3_13)))]
pub mod frame312;
#[cfg(all(Py_3_13, not(Py_3_14)))]
pub mod frame313;
pub mod func_call;
pub mod gil_lock;
pub mod guard_reads;
pub mod handled_exc;
pub mod mapslot;
pub mod method;
pub mod object;
pub mod slots;
pub mod storage;
pub mod tensor;
pub mod torch_state;
pub mod weakkey;
pub mod weakref;

// A new minor is one more `frameXYZ.rs` (mirrors + the frame protocol that `frame.rs` calls)
// selected above and in `frame.rs`, plus its `built_for` arm; see docs/platforms.md.
#[cfg(Py_3_14)]
compile_error!("ferrodyn supports CPython 3.11, 3.12 and 3.13 only (see docs/platforms.md)");
// The frame hook, the guards' raw reads and the weak dictionaries rely on the GIL.
#[cfg(Py_GIL_DISABLED)]
compile_error!("ferrodyn does not support free-threaded CPython builds (3.13t)");

/// The CPython minor this extension was compiled for, e.g. `(3, 11)`.
pub fn built_for() -> (u8, u8) {
    #[cfg(Py_3_13)]
    return (3, 13);
    #[cfg(all(Py_3_12, not(Py_3_13)))]
    return (3, 12);
    #[cfg(not(Py_3_12))]
    return (3, 11);
}
