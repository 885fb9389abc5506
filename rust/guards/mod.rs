//! Guard trees: accessors (local slot, global, builtin, attribute, item, type, len, closure cell,
//! `__dict__`, tensor size/stride) with leaf checks, built from Python through `GuardBuilder`.
//!
//! Files: `access` (how a node's value is read from its parent), `consts` (the constants of
//! `equals`), `leaves` (the checks and their explanations), `dicts_empty` (one leaf for a module's empty
//! hook dicts, replayed from remembered addresses), `tree` (the immutable tree and its
//! evaluation), `builder` (the Python-facing builder and node handles), `global_state` (torch's
//! grad mode / default dtype / determinism / autocast snapshot), `aliasing` (identity and
//! storage relations between several values), `symexpr` (the symbolic-shape expression IR,
//! pyo3-free) and `shape_leaf` (the leaf that evaluates one over frame values). Tensor metadata reads live in
//! `crate::tensor`. No leaf ever calls back into user Python code on purpose; errors raised by
//! user code during accessors (a property raising) count as guard failure.
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::ffi::slots::Slots;

mod access;
mod aliasing;
mod builder;
mod consts;
mod dicts_empty;
pub mod global_state;
mod leaves;
mod replay;
mod shape_leaf;
pub mod symexpr;
mod tree;

pub use builder::{GuardBuilder, GuardNode};
pub use tree::GuardTree;

/// The argument locals a tree reads: a frame's slots, or a name->value mapping from Python.
pub enum Locals<'a, 'py> {
    Slots(Slots<'a>),
    Mapping(&'a Bound<'py, PyAny>),
}

/// Everything a guard tree may read for one check.
pub struct GuardInput<'a, 'py> {
    pub locals: Locals<'a, 'py>,
    pub globals: Option<&'a Bound<'py, PyDict>>,
    pub builtins: Option<&'a Bound<'py, PyDict>>,
    pub closure: Option<&'a Bound<'py, PyTuple>>,
}

/// Whether the global-state leaf reads torch's state directly (diagnostics and tests).
#[pyfunction]
fn _global_state_fast_path(py: Python<'_>) -> PyResult<bool> {
    global_state::fast_path(py)
}

/// Whether identity leaves read a weakref's referent directly (verified at import), for tests.
#[pyfunction]
fn _weakref_direct() -> bool {
    crate::ffi::guard_reads::weakref_direct()
}

/// A dict's version tag as the replay path reads it (None where it reads none), for tests.
#[pyfunction]
fn _dict_version(d: &Bound<'_, PyDict>) -> Option<u64> {
    crate::ffi::guard_reads::dict_version_of(d.as_any())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    crate::ffi::guard_reads::verify_weakref_head(m.py());
    m.add_function(wrap_pyfunction!(_dict_version, m)?)?;
    m.add_function(wrap_pyfunction!(_weakref_direct, m)?)?;
    m.add_class::<GuardTree>()?;
    m.add_class::<GuardBuilder>()?;
    m.add_class::<GuardNode>()?;
    m.add_function(wrap_pyfunction!(_global_state_fast_path, m)?)?;
    m.add_function(wrap_pyfunction!(aliasing::_aliasing_fast_path, m)?)?;
    Ok(())
}

pub(crate) use leaves::{type_name, IdRef};
