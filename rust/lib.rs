//! ferrodyn's native core, exposed to Python as `ferrodyn._C`.
//!
//! Table of contents only: one `mod` line per subsystem and the one `#[pymodule]`.
//! All `unsafe` code and every CPython-version `cfg` live in [`ffi`]; the rest of the crate is
//! safe Rust (enforced by `deny(unsafe_code)`).
#![deny(unsafe_code)]

pub mod cache;
pub mod error;
pub mod eval_frame;
pub mod ffi;
pub mod guards;
pub mod tensor;
pub mod weak;

use pyo3::prelude::*;

#[pymodule]
#[pyo3(name = "_C")]
fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("PYTHON_BUILT_FOR", ffi::built_for())?;
    eval_frame::register(m)?;
    cache::register(m)?;
    guards::register(m)?;
    tensor::register(m)?;
    weak::register(m)?;
    Ok(())
}
