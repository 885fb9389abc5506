//! A cached entry's direct call: for an entry function that only does
//! `return graph(*inputs)[k]` (every input an argument slot of the frame or a value its guard
//! tree exported; no side effects, no graph break), the hook calls `graph` itself with those
//! values and indexes the result, instead of running the entry function's frame
//! (`crate::eval_frame::on_frame_cached`; the raw call is `crate::ffi::frame`).
//!
//! The plan is made by the Python side (`codegen.direct_call`), which knows the entry's
//! structure; this module only holds it. The entry function stays the reference: it is what
//! runs whenever the direct call is not taken (tracing or profiling on, a miss path, a
//! resume function's lookup).
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// Where one graph argument comes from: the frame's argument slot `i`, or the guard tree's
/// exported value `j`.
pub use crate::ffi::frame::DirectArg as ArgRef;

/// `graph(*args)[out]` (see the module docs).
pub struct DirectCall {
    pub graph: Py<PyAny>,
    pub args: Box<[ArgRef]>,
    /// The index taken from the graph's result.
    pub out: isize,
    /// Run the graph with this thread's callback set to run-only (what the entry's
    /// `prior = set_eval_frame(False)` ... `finally: set_eval_frame(prior)` does).
    pub fence: bool,
}

impl DirectCall {
    /// From `(graph, ((is_export, index), ...), out, fence)`.
    pub fn parse(spec: &Bound<'_, PyAny>) -> PyResult<DirectCall> {
        let bad = || {
            pyo3::exceptions::PyTypeError::new_err(
                "CacheEntry: direct must be (graph, ((is_export, index), ...), out, fence)",
            )
        };
        let t = spec.cast::<PyTuple>().map_err(|_| bad())?;
        if t.len() != 4 {
            return Err(bad());
        }
        let graph = t.get_item(0)?;
        if !graph.is_callable() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "CacheEntry: the direct call's graph must be callable",
            ));
        }
        let mut args = Vec::new();
        for a in t.get_item(1)?.try_iter()? {
            let (is_export, index): (bool, u32) = a?.extract().map_err(|_| bad())?;
            args.push(if is_export {
                ArgRef::Export(index)
            } else {
                ArgRef::Slot(index)
            });
        }
        Ok(DirectCall {
            graph: graph.unbind(),
            args: args.into_boxed_slice(),
            out: t.get_item(2)?.extract().map_err(|_| bad())?,
            fence: t.get_item(3)?.extract().map_err(|_| bad())?,
        })
    }
}
