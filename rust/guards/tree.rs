//! The immutable guard tree and its evaluation. Leaves are stored in evaluation order (cheap
//! classes first, shallow nodes first, then insertion order); node values are computed on first
//! use during one check and shared by every leaf on that node.
use std::sync::atomic::{AtomicU32, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::access::{Access, Defaults};
use super::leaves::{Leaf, LeafKind};
use super::replay::{self, Stamp};
use super::shape_leaf::ShapeLeaf;
use super::{GuardInput, Locals};
use crate::ffi::slots::Slots;

pub(crate) struct Node {
    pub access: Access,
    pub parent: Option<usize>,
    pub source: String,
    /// `.__globals__` / `.__code__` (read directly from exact functions when replaying).
    pub func_attr: Option<FuncAttr>,
}

/// A field of a function object that the replay reads directly.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum FuncAttr {
    Globals,
    Code,
}

impl Node {
    pub(crate) fn new(access: Access, parent: Option<usize>, source: String) -> Node {
        let func_attr = match &access {
            Access::Attr(name) => Python::attach(|py| match name.bind(py).to_str() {
                Ok("__globals__") => Some(FuncAttr::Globals),
                Ok("__code__") => Some(FuncAttr::Code),
                _ => None,
            }),
            _ => None,
        };
        Node {
            access,
            parent,
            source,
            func_attr,
        }
    }
}

#[pyclass(module = "ferrodyn._C", name = "GuardTree", frozen)]
pub struct GuardTree {
    pub(crate) nodes: Vec<Node>,
    pub(crate) leaves: Vec<Leaf>,
    pub(crate) globals: Option<Py<PyDict>>,
    pub(crate) builtins: Option<Py<PyDict>>,
    /// The discriminator: the first tensor leaf on an argument slot (`L[i]` itself), as
    /// (slot index, leaf index). Entries of one code compiled for different shapes/dtypes
    /// differ there, so a cache lookup rejects non-matching entries with this one leaf
    /// ([`GuardTree::quick_reject`]) before running a whole tree.
    pub(crate) disc: Option<(usize, usize)>,
    /// Nodes whose values a passing check hands to the entry function (after the argument
    /// slots and closure cells), so it does not read them again (`GuardBuilder.export`).
    pub(crate) exports: Vec<usize>,
    /// Per node: the argument slot of a root `L[i]` node, which leaves read straight from the
    /// frame's slots (borrowed, no memo) when the input has slots.
    pub(crate) slot_of: Vec<Option<usize>>,
    /// Whether every accessor and leaf can be replayed from raw reads (`replay`).
    pub(crate) replayable: bool,
    /// What the replay precomputed about this tree.
    pub(crate) plan: replay::Plan,
    /// Replays in a row that could not decide (see `GuardTree::replay`).
    pub(crate) replay_misses: AtomicU32,
}

/// `GuardTree::slot_of` for these nodes.
pub(crate) fn slots_of(nodes: &[Node]) -> Vec<Option<usize>> {
    nodes
        .iter()
        .map(|n| match (&n.access, n.parent) {
            (Access::Local { index, .. }, None) => Some(*index),
            _ => None,
        })
        .collect()
}

/// The discriminator of a tree with these nodes and (ordered) leaves (see `GuardTree::disc`).
pub(crate) fn discriminator(nodes: &[Node], leaves: &[Leaf]) -> Option<(usize, usize)> {
    leaves.iter().enumerate().find_map(|(i, l)| {
        let n = l.node?;
        match (&l.kind, &nodes[n].access, nodes[n].parent) {
            (LeafKind::Tensor(_), Access::Local { index, .. }, None) => Some((*index, i)),
            _ => None,
        }
    })
}

/// Per-check memo of one node's value: `None` not computed yet, `Some(None)` failed to read.
type Val<'py> = Option<Option<Bound<'py, PyAny>>>;

impl GuardTree {
    /// The hot-path check: true if every guard passes. Never raises (errors count as failure).
    pub fn check_input(&self, py: Python<'_>, input: &GuardInput<'_, '_>) -> bool {
        if let Some(ok) = self.replay(py, input, None) {
            return ok;
        }
        self.first_failure(py, input).is_none()
    }

    /// The replay path (see `replay`): None when it cannot decide.
    #[inline]
    fn replay<'py>(
        &self,
        py: Python<'py>,
        input: &GuardInput<'_, 'py>,
        out: Option<&mut Vec<Bound<'py, PyAny>>>,
    ) -> Option<bool> {
        if !self.replayable {
            return None;
        }
        // A tree whose replays keep missing (an accessor on a changing object) tries again only
        // every 32nd check.
        let misses = self.replay_misses.load(Ordering::Relaxed);
        if misses >= 8 && !misses.is_multiple_of(32) {
            self.replay_misses
                .store(misses.wrapping_add(1), Ordering::Relaxed);
            return None;
        }
        let g = self.globals.as_ref().map(|g| g.bind(py).as_any());
        let b = self.builtins.as_ref().map(|b| b.bind(py).as_any());
        let r = replay::replay(py, self, input, (g, b), out);
        let next = if r.is_some() {
            0
        } else {
            misses.wrapping_add(1)
        };
        if next != misses {
            self.replay_misses.store(next, Ordering::Relaxed);
        }
        r
    }

    /// `Some(errored)` when the discriminator leaf fails on `input` (so the tree would fail):
    /// one slot read and one tensor check; `errored` when a Python error raised while reading
    /// a tensor subclass was cleared (the caller releases it as for a failed tree). None when
    /// it passes, when the tree has none, or for a `Mapping` input. Never raises.
    #[inline]
    pub fn quick_reject(&self, py: Python<'_>, input: &GuardInput<'_, '_>) -> Option<bool> {
        let (index, leaf) = self.disc?;
        let Locals::Slots(s) = &input.locals else {
            return None;
        };
        let Some(v) = s.get(py, index) else {
            return Some(false);
        };
        match &self.leaves[leaf].kind {
            LeafKind::Tensor(t) if !t.check(&v) => Some(PyErr::take(py).is_some()),
            _ => None,
        }
    }

    /// Whether the tree has exported nodes (see [`GuardTree::check_export`]).
    #[inline]
    pub fn has_exports(&self) -> bool {
        !self.exports.is_empty()
    }

    /// `check_input`, and on a pass the values of the exported nodes appended to `out`, in
    /// export order (read during the check: the same objects the entry would read). A node
    /// that cannot be read fails the check.
    pub fn check_export<'py>(
        &self,
        py: Python<'py>,
        input: &GuardInput<'_, 'py>,
        out: &mut Vec<Bound<'py, PyAny>>,
    ) -> bool {
        if let Some(ok) = self.replay(py, input, Some(out)) {
            return ok;
        }
        const STACK: usize = 24;
        let mut heap;
        let mut stack: [Val<'py>; STACK];
        let memo: &mut [Val<'py>] = if self.nodes.len() <= STACK {
            stack = std::array::from_fn(|_| None);
            &mut stack[..self.nodes.len()]
        } else {
            heap = (0..self.nodes.len()).map(|_| None).collect::<Vec<_>>();
            &mut heap[..]
        };
        if self.run(py, input, memo).is_some() {
            return false;
        }
        let defaults = Defaults {
            globals: self.globals.as_ref().map(|g| g.bind(py)),
            builtins: self.builtins.as_ref().map(|b| b.bind(py)),
        };
        for &n in &self.exports {
            self.ensure(py, input, &defaults, memo, n);
            match memo[n].take().flatten() {
                Some(v) => {
                    out.push(v.clone());
                    memo[n] = Some(Some(v));
                }
                None => {
                    drop(PyErr::take(py));
                    out.clear();
                    return false;
                }
            }
        }
        true
    }

    fn first_failure<'py>(
        &self,
        py: Python<'py>,
        input: &GuardInput<'_, 'py>,
    ) -> Option<(usize, Vec<Val<'py>>)> {
        // Small trees keep their per-check memo on the stack (no allocation per check).
        const STACK: usize = 24;
        if self.nodes.len() <= STACK {
            let mut memo: [Val<'py>; STACK] = std::array::from_fn(|_| None);
            let i = self.run(py, input, &mut memo[..self.nodes.len()])?;
            return Some((
                i,
                memo[..self.nodes.len()]
                    .iter_mut()
                    .map(std::mem::take)
                    .collect(),
            ));
        }
        let mut memo: Vec<Val<'py>> = (0..self.nodes.len()).map(|_| None).collect();
        let i = self.run(py, input, &mut memo)?;
        Some((i, memo))
    }

    /// Evaluate the leaves in order; the index of the first failing one.
    #[inline]
    fn run<'py>(
        &self,
        py: Python<'py>,
        input: &GuardInput<'_, 'py>,
        memo: &mut [Val<'py>],
    ) -> Option<usize> {
        let defaults = Defaults {
            globals: self.globals.as_ref().map(|g| g.bind(py)),
            builtins: self.builtins.as_ref().map(|b| b.bind(py)),
        };
        let slots = match &input.locals {
            Locals::Slots(s) => Some(s),
            Locals::Mapping(_) => None,
        };
        for (i, leaf) in self.leaves.iter().enumerate() {
            let ok = match (leaf.node, &leaf.kind) {
                (None, LeafKind::Aliasing(a)) => {
                    let vals = self.values_of(py, input, &defaults, memo, &a.nodes);
                    a.check(py, &vals)
                }
                (None, LeafKind::Shape(s)) => self.check_shape(py, input, &defaults, memo, s),
                (None, _) => leaf.check(py, None),
                (Some(n), _) if slots.is_some() && self.slot_of[n].is_some() => {
                    // An argument slot: borrowed from the frame for the whole check.
                    let (Some(s), Some(k)) = (slots, self.slot_of[n]) else {
                        unreachable!()
                    };
                    match s.get(py, k) {
                        Some(v) => leaf.check(py, Some(&v)),
                        None => leaf.check(py, None),
                    }
                }
                (Some(n), _) => {
                    if memo[n].is_none() {
                        self.ensure(py, input, &defaults, memo, n);
                    }
                    leaf.check(py, memo[n].as_ref().and_then(|v| v.as_ref()))
                }
            };
            if !ok {
                // A Python error raised while checking counts as failure, and must not leak.
                drop(PyErr::take(py));
                return Some(i);
            }
        }
        None
    }

    /// A symbolic-shape leaf: read each bound symbol from its node, evaluate natively.
    #[inline]
    fn check_shape<'py>(
        &self,
        py: Python<'py>,
        input: &GuardInput<'_, 'py>,
        defaults: &Defaults<'_, 'py>,
        memo: &mut [Val<'py>],
        leaf: &ShapeLeaf,
    ) -> bool {
        leaf.check(|b| {
            self.ensure(py, input, defaults, memo, b.node);
            memo[b.node].as_ref()?.as_ref().and_then(|v| b.read.read(v))
        })
    }

    /// Compute node `n`'s value (and its ancestors') into the memo if not there yet.
    fn ensure<'py>(
        &self,
        py: Python<'py>,
        input: &GuardInput<'_, 'py>,
        defaults: &Defaults<'_, 'py>,
        memo: &mut [Val<'py>],
        n: usize,
    ) {
        if memo[n].is_some() {
            return;
        }
        let node = &self.nodes[n];
        let v = match node.parent {
            None => {
                // Globals and builtins lookups are remembered for the replay path.
                let dict = match &node.access {
                    Access::Global(_) => input.globals.or(defaults.globals),
                    Access::Builtin(_) => input.builtins.or(defaults.builtins),
                    _ => None,
                };
                let stamp = dict.and_then(|d| Stamp::before(node, d.as_any()));
                let v = node.access.read_root(py, input, defaults);
                if let (Some(st), Some(c), Some(d), Some(v)) = (stamp, self.plan.cache(n), dict, &v)
                {
                    st.fill(node, c, d.as_any(), v);
                }
                v
            }
            Some(p) => {
                self.ensure(py, input, defaults, memo, p);
                match &memo[p] {
                    Some(Some(pv)) => {
                        let stamp = if self.replayable {
                            Stamp::before(node, pv)
                        } else {
                            None
                        };
                        let v = node.access.read_child(pv);
                        if let (Some(st), Some(c), Some(v)) = (stamp, self.plan.cache(n), &v) {
                            st.fill(node, c, pv, v);
                        }
                        v
                    }
                    _ => None,
                }
            }
        };
        memo[n] = Some(v);
    }

    /// The values of several nodes (a multi-accessor leaf), None where one could not be read.
    fn values_of<'py>(
        &self,
        py: Python<'py>,
        input: &GuardInput<'_, 'py>,
        defaults: &Defaults<'_, 'py>,
        memo: &mut [Val<'py>],
        nodes: &[usize],
    ) -> Vec<Option<Bound<'py, PyAny>>> {
        nodes
            .iter()
            .map(|&n| {
                self.ensure(py, input, defaults, memo, n);
                memo[n].clone().flatten()
            })
            .collect()
    }

    /// The explanation of the first failing leaf, or None if every leaf passes.
    pub fn explain_input(&self, py: Python<'_>, input: &GuardInput<'_, '_>) -> Option<String> {
        let (i, mut memo) = self.first_failure(py, input)?;
        let leaf = &self.leaves[i];
        if let Some(n) = leaf.node {
            // Argument-slot nodes are not memoised by the check: read it now.
            let defaults = Defaults {
                globals: self.globals.as_ref().map(|g| g.bind(py)),
                builtins: self.builtins.as_ref().map(|b| b.bind(py)),
            };
            self.ensure(py, input, &defaults, &mut memo, n);
        }
        let msg = match (leaf.node, &leaf.kind) {
            (None, LeafKind::Aliasing(a)) => {
                let vals: Vec<_> = a.nodes.iter().map(|&n| memo[n].clone().flatten()).collect();
                a.explain(py, &vals)
            }
            (None, LeafKind::Shape(s)) => {
                let values: Vec<Option<i64>> = s
                    .bindings
                    .iter()
                    .map(|b| memo[b.node].clone().flatten().and_then(|v| b.read.read(&v)))
                    .collect();
                s.explain(&values)
            }
            (None, _) => leaf.explain(py, &py.None().into_bound(py)),
            (Some(n), _) => match memo[n].clone().flatten() {
                Some(v) => leaf.explain(py, &v),
                None => {
                    // Find the first node on the path that could not be read.
                    let mut path = vec![n];
                    let mut cur = n;
                    while let Some(p) = self.nodes[cur].parent {
                        path.push(p);
                        cur = p;
                    }
                    let bad = path
                        .iter()
                        .rev()
                        .find(|&&k| matches!(memo[k], Some(None)))
                        .copied()
                        .unwrap_or(n);
                    format!(
                        "{} ({} could not be read)",
                        leaf.expr, self.nodes[bad].source
                    )
                }
            },
        };
        drop(PyErr::take(py));
        Some(msg)
    }
}

/// Holds whatever a Python-side `check` call converted its arguments into.
enum LocalsArg<'py> {
    Tuple(Bound<'py, PyTuple>),
    Mapping(Bound<'py, PyAny>),
}

fn locals_arg<'py>(f_locals: &Bound<'py, PyAny>) -> PyResult<LocalsArg<'py>> {
    if let Ok(t) = f_locals.cast::<PyTuple>() {
        Ok(LocalsArg::Tuple(t.clone()))
    } else if let Ok(l) = f_locals.cast::<PyList>() {
        Ok(LocalsArg::Tuple(l.to_tuple()))
    } else {
        Ok(LocalsArg::Mapping(f_locals.clone()))
    }
}

macro_rules! with_input {
    ($f_locals:expr, $g:expr, $b:expr, $c:expr, |$input:ident| $body:expr) => {{
        let arg = locals_arg($f_locals)?;
        let locals = match &arg {
            LocalsArg::Tuple(t) => Locals::Slots(Slots::from_tuple(t)),
            LocalsArg::Mapping(m) => Locals::Mapping(m),
        };
        let $input = GuardInput {
            locals,
            globals: $g.as_ref(),
            builtins: $b.as_ref(),
            closure: $c.as_ref(),
        };
        $body
    }};
}

#[pymethods]
impl GuardTree {
    #[pyo3(signature = (f_locals, f_globals=None, f_builtins=None, closure=None))]
    fn check(
        &self,
        py: Python<'_>,
        f_locals: &Bound<'_, PyAny>,
        f_globals: Option<Bound<'_, PyDict>>,
        f_builtins: Option<Bound<'_, PyDict>>,
        closure: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<bool> {
        with_input!(f_locals, f_globals, f_builtins, closure, |input| Ok(
            self.check_input(py, &input)
        ))
    }

    #[pyo3(signature = (f_locals, f_globals=None, f_builtins=None, closure=None))]
    fn explain(
        &self,
        py: Python<'_>,
        f_locals: &Bound<'_, PyAny>,
        f_globals: Option<Bound<'_, PyDict>>,
        f_builtins: Option<Bound<'_, PyDict>>,
        closure: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Option<String>> {
        with_input!(f_locals, f_globals, f_builtins, closure, |input| Ok(
            self.explain_input(py, &input)
        ))
    }

    /// What the replay path alone decides on this input (None: it cannot), for tests.
    #[pyo3(signature = (f_locals, f_globals=None, f_builtins=None, closure=None))]
    fn _replay(
        &self,
        py: Python<'_>,
        f_locals: &Bound<'_, PyAny>,
        f_globals: Option<Bound<'_, PyDict>>,
        f_builtins: Option<Bound<'_, PyDict>>,
        closure: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Option<bool>> {
        with_input!(f_locals, f_globals, f_builtins, closure, |input| Ok(
            self.replay(py, &input, None)
        ))
    }

    /// The full path's outcome alone (it also refreshes the replay caches), for tests.
    #[pyo3(signature = (f_locals, f_globals=None, f_builtins=None, closure=None))]
    fn _full_check(
        &self,
        py: Python<'_>,
        f_locals: &Bound<'_, PyAny>,
        f_globals: Option<Bound<'_, PyDict>>,
        f_builtins: Option<Bound<'_, PyDict>>,
        closure: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<bool> {
        with_input!(f_locals, f_globals, f_builtins, closure, |input| Ok(self
            .first_failure(py, &input)
            .is_none()))
    }

    /// What the replay plan shares or packs: (nodes read through an earlier twin, leaves
    /// skipped after an earlier identical one, tensor leaves checked from packed copies).
    fn _plan_stats(&self) -> (usize, usize, usize) {
        self.plan.stats()
    }

    /// (nodes the replay walks, leaves other than packed tensors it checks), for tests.
    fn _plan_walked(&self) -> (usize, usize) {
        self.plan.walked()
    }

    /// Whether every accessor and leaf of this tree can be replayed from raw reads.
    #[getter]
    fn replayable(&self) -> bool {
        self.replayable
    }

    /// The accessors' source expressions, in node order.
    fn _nodes(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.source.clone()).collect()
    }

    fn leaves(&self) -> Vec<String> {
        self.leaves
            .iter()
            .flat_map(|l| match &l.kind {
                LeafKind::Shape(s) => s.texts(),
                _ => vec![l.expr.clone()],
            })
            .collect()
    }

    fn __len__(&self) -> usize {
        self.leaves.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<GuardTree: {} leaves on {} accessors>",
            self.leaves.len(),
            self.nodes.len()
        )
    }
}
