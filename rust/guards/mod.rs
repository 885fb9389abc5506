//! Guard trees: accessors (local slot, global, builtin, attribute, item, type, len, closure cell,
//! `__dict__`, tensor size/stride) with leaf checks, built from Python through `GuardBuilder`.
//!
//! PLACEHOLDER (owned by the guards work): the types and signatures below are the contract the
//! cache uses (`GuardTree::check_input`); the implementation here passes every check.
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::ffi::slots::Slots;

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

#[pyclass(module = "ferrodyn._C", name = "GuardTree", frozen)]
pub struct GuardTree {}

impl GuardTree {
    /// The hot-path check: true if every guard passes. Never raises (errors count as failure).
    pub fn check_input(&self, _py: Python<'_>, _input: &GuardInput<'_, '_>) -> bool {
        true
    }
}

#[pyclass(module = "ferrodyn._C", name = "GuardBuilder")]
pub struct GuardBuilder {}

#[pymethods]
impl GuardBuilder {
    #[new]
    #[pyo3(signature = (f_globals=None, f_builtins=None))]
    fn py_new(f_globals: Option<Bound<'_, PyDict>>, f_builtins: Option<Bound<'_, PyDict>>) -> Self {
        let _ = (f_globals, f_builtins);
        GuardBuilder {}
    }

    fn build(&mut self) -> GuardTree {
        GuardTree {}
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GuardTree>()?;
    m.add_class::<GuardBuilder>()?;
    Ok(())
}
