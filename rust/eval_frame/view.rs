//! `FrameView`: what the callback sees of an intercepted frame on a miss (no frame object).
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCode, PyDict, PyTuple};

use crate::ffi::frame::InterceptedFrame;

#[pyclass(module = "ferrodyn._C", name = "FrameView", frozen)]
pub struct FrameView {
    code: Py<PyCode>,
    globals: Py<PyDict>,
    builtins: Py<PyDict>,
    args: Py<PyTuple>,
    closure: Option<Py<PyTuple>>,
    locals: PyOnceLock<Py<PyDict>>,
}

impl FrameView {
    /// Copy what the callback may read out of the frame (new references).
    pub fn from_frame(frame: &InterceptedFrame<'_>) -> PyResult<Self> {
        let py = frame.py();
        let slots = frame.arg_slots();
        let mut items = Vec::with_capacity(slots.len());
        for i in 0..slots.len() {
            match slots.get(py, i) {
                Some(v) => items.push(v.to_owned()),
                None => {
                    return Err(pyo3::exceptions::PyRuntimeError::new_err(
                        "ferrodyn: unbound argument slot",
                    ))
                }
            }
        }
        Ok(FrameView {
            code: frame.code().to_owned().unbind(),
            globals: frame.globals().to_owned().unbind(),
            builtins: frame.builtins().to_owned().unbind(),
            args: PyTuple::new(py, items)?.unbind(),
            closure: frame.closure().map(|c| c.to_owned().unbind()),
            locals: PyOnceLock::new(),
        })
    }
}

#[pymethods]
impl FrameView {
    #[getter]
    fn f_code(&self, py: Python<'_>) -> Py<PyCode> {
        self.code.clone_ref(py)
    }

    #[getter]
    fn f_globals(&self, py: Python<'_>) -> Py<PyDict> {
        self.globals.clone_ref(py)
    }

    #[getter]
    fn f_builtins(&self, py: Python<'_>) -> Py<PyDict> {
        self.builtins.clone_ref(py)
    }

    #[getter]
    fn args(&self, py: Python<'_>) -> Py<PyTuple> {
        self.args.clone_ref(py)
    }

    #[getter]
    fn closure(&self, py: Python<'_>) -> Option<Py<PyTuple>> {
        self.closure.as_ref().map(|c| c.clone_ref(py))
    }

    /// `dict(zip(co_varnames, args))`, built on first access.
    #[getter]
    fn f_locals(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let d = self
            .locals
            .get_or_try_init(py, || -> PyResult<Py<PyDict>> {
                let names = self.code.bind(py).getattr("co_varnames")?;
                let d = PyDict::new(py);
                for (name, value) in names.try_iter()?.zip(self.args.bind(py).iter()) {
                    d.set_item(name?, value)?;
                }
                Ok(d.unbind())
            })?;
        Ok(d.clone_ref(py))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let name = self
            .code
            .bind(py)
            .getattr("co_qualname")
            .map(|n| n.to_string())
            .unwrap_or_default();
        format!("<FrameView {name} args={}>", self.args.bind(py).len())
    }
}
