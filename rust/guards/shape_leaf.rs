//! The symbolic-shape guard leaf: one `symexpr::Expr` whose symbols are bound to values read
//! from the frame at guard time (a tensor's size/stride at a dim or storage offset, read
//! natively; or a Python int). Evaluated by the tree after the tensor leaves (so the tensors'
//! ranks are already checked); no Python callback. Its explanation names the sources:
//! `2 <= L['x'].size()[0] (got 1)`.
use pyo3::prelude::*;
use pyo3::types::PyInt;

use super::symexpr::{Expr, NAry, Program};

/// What a symbol's value is read from, on its node's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SymRead {
    Size(i64),
    Stride(i64),
    StorageOffset,
    /// The node's value is an exact Python int.
    Int,
}

impl SymRead {
    #[inline]
    pub(crate) fn read(self, v: &Bound<'_, PyAny>) -> Option<i64> {
        match self {
            SymRead::Size(d) => crate::tensor::size_or_stride(v, d, false),
            SymRead::Stride(d) => crate::tensor::size_or_stride(v, d, true),
            SymRead::StorageOffset => {
                if !crate::tensor::torch(v.py()).ok()?.is_tensor(v) {
                    return None;
                }
                v.call_method0("storage_offset").ok()?.extract().ok()
            }
            SymRead::Int => {
                if v.is_exact_instance_of::<PyInt>() {
                    v.extract().ok()
                } else {
                    None
                }
            }
        }
    }

    /// [`SymRead::read`] from raw reads alone (no Python call, no allocation): None when only
    /// the Python API can answer (the replay path then defers to the full path).
    #[inline]
    pub(crate) fn read_raw(self, v: &Bound<'_, PyAny>) -> Option<i64> {
        match self {
            SymRead::Size(d) => crate::tensor::size_or_stride_raw(v, d, false),
            SymRead::Stride(d) => crate::tensor::size_or_stride_raw(v, d, true),
            SymRead::StorageOffset => None,
            SymRead::Int => crate::ffi::guard_reads::held(v).exact_int(),
        }
    }

    /// The symbol's source text given its node's source.
    pub(crate) fn name(self, source: &str) -> String {
        match self {
            SymRead::Size(d) => format!("{source}.size()[{d}]"),
            SymRead::Stride(d) => format!("{source}.stride()[{d}]"),
            SymRead::StorageOffset => format!("{source}.storage_offset()"),
            SymRead::Int => source.to_owned(),
        }
    }
}

pub(crate) struct Binding {
    pub node: usize,
    pub read: SymRead,
    pub name: String,
}

pub(crate) struct ShapeLeaf {
    pub expr: Expr,
    /// `expr` compiled for the hot path (same outcome as `expr.holds`).
    pub prog: Program,
    pub bindings: Vec<Binding>,
    /// The replay path's reading plan (None: it reads symbol by symbol).
    pub plan: Option<ReadPlan>,
}

/// Bindings read into a stack buffer up to this many symbols.
pub(crate) const INLINE_SYMS: usize = 16;

/// Distinct tensors a [`ReadPlan`] reads the sizes and strides of, at most.
pub(crate) const PLAN_TENSORS: usize = 8;

/// Symbols a [`ReadPlan`] reads into its stack buffer, at most (three 3-d tensors' sizes and
/// strides are 18).
pub(crate) const PLAN_SYMS: usize = 48;

/// How the replay path reads every symbol of a leaf: each distinct tensor's sizes and strides
/// once (`tensors`: node indices), then each symbol as an index into them.
pub(crate) struct ReadPlan {
    pub tensors: Vec<usize>,
    pub reads: Vec<PlanRead>,
}

#[derive(Clone, Copy)]
pub(crate) enum PlanRead {
    /// `size()[dim]` of `tensors[t]`.
    Size { t: usize, dim: i64 },
    /// `stride()[dim]` of `tensors[t]`.
    Stride { t: usize, dim: i64 },
    /// The exact Python int at this node.
    Int { node: usize },
}

impl ReadPlan {
    /// None where the leaf has a symbol only the Python API reads (storage offsets), more than
    /// `PLAN_SYMS` symbols or more than `PLAN_TENSORS` tensors.
    fn of(bindings: &[Binding]) -> Option<ReadPlan> {
        if bindings.len() > PLAN_SYMS {
            return None;
        }
        let mut tensors: Vec<usize> = Vec::new();
        let mut reads = Vec::with_capacity(bindings.len());
        for b in bindings {
            let mut slot = || match tensors.iter().position(|&n| n == b.node) {
                Some(t) => t,
                None => {
                    tensors.push(b.node);
                    tensors.len() - 1
                }
            };
            reads.push(match b.read {
                SymRead::Size(dim) => PlanRead::Size { t: slot(), dim },
                SymRead::Stride(dim) => PlanRead::Stride { t: slot(), dim },
                SymRead::Int => PlanRead::Int { node: b.node },
                SymRead::StorageOffset => return None,
            });
        }
        (tensors.len() <= PLAN_TENSORS).then_some(ReadPlan { tensors, reads })
    }
}

impl ShapeLeaf {
    pub(crate) fn new(expr: Expr, bindings: Vec<Binding>) -> ShapeLeaf {
        ShapeLeaf {
            prog: Program::compile(&expr),
            plan: ReadPlan::of(&bindings),
            expr,
            bindings,
        }
    }

    fn names(&self) -> Vec<String> {
        self.bindings.iter().map(|b| b.name.clone()).collect()
    }

    /// The guard's text in source terms.
    pub(crate) fn text(&self) -> String {
        self.expr.render(&self.names())
    }

    /// The top-level conjuncts (a conjunction of guards shares one reading of its symbols).
    fn conjuncts(&self) -> Vec<&Expr> {
        match &self.expr {
            Expr::NAry(NAry::And, xs) => xs.iter().collect(),
            e => vec![e],
        }
    }

    /// One text per conjunct (what `GuardTree.leaves()` lists).
    pub(crate) fn texts(&self) -> Vec<String> {
        let names = self.names();
        self.conjuncts().iter().map(|e| e.render(&names)).collect()
    }

    /// Whether the expression holds, reading symbol k with `value(k)`.
    #[inline]
    pub(crate) fn check(&self, mut value: impl FnMut(&Binding) -> Option<i64>) -> bool {
        let n = self.bindings.len();
        if n <= INLINE_SYMS {
            let mut buf = [0i64; INLINE_SYMS];
            for (slot, b) in buf.iter_mut().zip(&self.bindings) {
                match value(b) {
                    Some(v) => *slot = v,
                    None => return false,
                }
            }
            return self.prog.holds(&buf[..n]);
        }
        let mut vals = Vec::with_capacity(n);
        for b in &self.bindings {
            match value(b) {
                Some(v) => vals.push(v),
                None => return false,
            }
        }
        self.prog.holds(&vals)
    }

    /// Why the guard fails, given the symbols' values (None: could not be read).
    pub(crate) fn explain(&self, values: &[Option<i64>]) -> String {
        let names = self.names();
        if let Some(k) = values.iter().position(|v| v.is_none()) {
            let first = self.conjuncts()[0].render(&names);
            let more = if self.conjuncts().len() > 1 {
                " and ..."
            } else {
                ""
            };
            return format!(
                "{first}{more} ({} could not be read)",
                self.bindings[k].name
            );
        }
        let vals: Vec<i64> = values.iter().map(|v| v.unwrap_or(0)).collect();
        // The first conjunct that fails, with the values of its own symbols.
        let failing = self
            .conjuncts()
            .into_iter()
            .find(|e| !e.holds(&vals))
            .unwrap_or(&self.expr);
        let text = failing.render(&names);
        let used = failing.symbols();
        let got: Vec<String> = used
            .iter()
            .filter_map(|&k| Some((self.bindings.get(k)?, values.get(k)?.as_ref()?)))
            .map(|(b, v)| (b.name.clone(), *v))
            .map(|(name, v)| {
                if used.len() == 1 {
                    v.to_string()
                } else {
                    format!("{name} = {v}")
                }
            })
            .collect();
        format!("{text} (got {})", got.join(", "))
    }
}
