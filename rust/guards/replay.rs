//! The replay path: a whole-tree check from borrowed raw reads, for trees whose accessors and
//! leaves can all be decided that way (module parameters reached through `__dict__` /
//! `_modules` / `_parameters` chains, globals, types' methods).
//!
//! Each dict lookup an accessor made on the full path is remembered in its node
//! ([`NodeCache`]: the dict's version tag and the value's address, or a plain type's version
//! tag for an attribute of the type). Replaying, a node whose parent dict still has that
//! version *is* the remembered object (versions are unique and change with every mutation, so
//! the dict is the same, unchanged and holds it), with no hashing, no reference counting and no
//! Python code. What can change without a dict changing is read afresh every time: instance
//! `__dict__` pointers, types (`__class__` assignment), lengths, tensor metadata, torch's global
//! state. Anything the replay cannot decide (a version moved, a subclass tensor, an accessor or
//! leaf it does not know) returns None and the caller runs the full path, which refreshes the
//! caches. Every raw read lives in `crate::ffi::guard_reads`.
//!
//! The tree's [`Plan`], built once, says how: each node is a compact step (argument slot, dict
//! item, `__dict__`, type, or the generic accessor); a node whose accessor an earlier node
//! applies to the same object (its "twin": `type(m0).forward` / `type(m1).forward` for modules
//! of one class) takes that node's value; a leaf making the same check as an earlier leaf on
//! the same object is skipped; type-is, identity, None and length leaves are decided from the
//! plan; a dict-keys leaf passes at once on the dict version where it last passed; plain tensor
//! leaves are compared from packed copies of what they expect (`crate::ffi::tensor::Expect`),
//! one cache line each, after the other leaves. All of that only reuses reads made in the same
//! replay (no Python code runs in between) or versions that change with every mutation, so it
//! decides exactly what the full walk decides.
//!
//! Same-class modules: where two `type(m)` nodes each carry a `type(..) is T` leaf of one
//! class `T` (held strongly), the later one's subtree (`type(m_k).forward`,
//! `.__globals__['F']`, ...) reads the same objects as the first one's whenever the tree
//! passes, so its nodes whose leaves all repeat checks made on the first subtree are not
//! walked at all ([`Plan::new`]: `same`); the `type(m_k) is T` leaf itself, the premise, is
//! always checked. A tree passes only if every leaf does, so dropping a leaf that repeats a
//! check on an object proven identical by a kept leaf leaves the outcome unchanged.
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use pyo3::prelude::*;
use pyo3::types::PyString;

use super::access::Access;
use super::consts::Const;
use super::leaves::{IdRef, Leaf, LeafKind};
use super::shape_leaf::{PlanRead, ShapeLeaf, SymRead, PLAN_SYMS, PLAN_TENSORS};
use super::tree::{FuncAttr, GuardTree, Node};
use super::{GuardInput, Locals};
use crate::ffi::guard_reads::{self as raw, Held};
use crate::ffi::tensor::{check_expect_with, Packed};

/// What one node's accessor found last time, stamped with what proves it still holds.
#[derive(Default)]
pub(crate) struct NodeCache {
    /// The version of the dict the value was found in (or the type's version tag); 0: nothing.
    stamp: AtomicU64,
    /// The value's address.
    val: AtomicUsize,
    /// For type attributes: the type's address.
    owner: AtomicUsize,
}

impl NodeCache {
    fn hit(&self, stamp: u64, owner: usize) -> Option<Held> {
        let s = self.stamp.load(Ordering::Relaxed);
        if s == 0 || s != stamp || self.owner.load(Ordering::Relaxed) != owner {
            return None;
        }
        Some(raw::held_at(self.val.load(Ordering::Relaxed)))
    }

    /// [`NodeCache::hit`] for a dict lookup (an item or a local), whose stamps are always
    /// stored with owner 0: the version alone proves the value.
    #[inline]
    fn hit_dict(&self, stamp: u64) -> Option<Held> {
        let s = self.stamp.load(Ordering::Relaxed);
        (s != 0 && s == stamp).then(|| raw::held_at(self.val.load(Ordering::Relaxed)))
    }

    fn store(&self, stamp: u64, owner: usize, val: usize) {
        // Invalidate first, so a reader never pairs a new stamp with an old value.
        self.stamp.store(0, Ordering::Relaxed);
        self.val.store(val, Ordering::Relaxed);
        self.owner.store(owner, Ordering::Relaxed);
        self.stamp.store(stamp, Ordering::Relaxed);
    }
}

/// A stamp taken before an accessor runs on the full path; [`Stamp::fill`] stores its result
/// only if nothing moved meanwhile (the lookup may have run Python code).
pub(crate) struct Stamp {
    stamp: u64,
    owner: usize,
}

impl Stamp {
    /// Before reading node `node` from `parent` (a dict for items and globals, a type for
    /// attributes).
    pub(crate) fn before(node: &Node, parent: &Bound<'_, PyAny>) -> Option<Stamp> {
        match &node.access {
            Access::Item { .. } | Access::Global(_) | Access::Builtin(_) => {
                raw::dict_version_of(parent).map(|stamp| Stamp { stamp, owner: 0 })
            }
            Access::Attr(_) => raw::type_version(raw::held(parent)).map(|t| Stamp {
                stamp: t as u64,
                owner: parent.as_ptr() as usize,
            }),
            _ => None,
        }
    }

    pub(crate) fn fill(
        self,
        node: &Node,
        cache: &NodeCache,
        parent: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) {
        let now = match &node.access {
            Access::Attr(name) => {
                if !raw::type_attr_is_mro_entry(parent, name.bind(parent.py()), value) {
                    return;
                }
                raw::type_version(raw::held(parent)).map(|t| t as u64)
            }
            _ => raw::dict_version_of(parent),
        };
        if now == Some(self.stamp) {
            cache.store(self.stamp, self.owner, value.as_ptr() as usize);
        }
    }
}

/// Node values during one replay: object addresses (even), or small ints tagged `n << 1 | 1`
/// (lengths).
type Val = usize;

fn int_val(n: usize) -> Val {
    (n << 1) | 1
}

fn as_obj(v: Val) -> Option<Held> {
    (v & 1 == 0 && v != 0).then(|| raw::held_at(v))
}

/// What the replay precomputes about a tree at build time.
#[derive(Default)]
pub(crate) struct Plan {
    /// The tensor leaves with a packed compare, each tagged (node, leaf index), in leaf order,
    /// one 64-byte line apart (what the check reads of a leaf with up to 2 dims is one line);
    /// they are checked after the other leaves.
    tensors: Vec<Packed<(u32, u32)>>,
    /// The other leaves, in leaf order.
    rest: Vec<RestLeaf>,
    /// Per node, how the replay reads it.
    steps: Vec<Step>,
}

/// How the replay reads one node, with what its accessor found last time (compact, one array
/// walked in order: the walk touches a `Node` only for an accessor it does not specialise).
struct Step {
    /// `NONE` for a root.
    parent: u32,
    /// An earlier node with the same accessor (`NONE`: none), and that node's parent. When
    /// both parents hold the same object, so do both nodes (one replay runs no Python code,
    /// and every accessor it replays is a pure read): e.g. `type(m0).forward` and
    /// `type(m1).forward` for two modules of one class are read once.
    twin: u32,
    twin_parent: u32,
    op: NodeOp,
    /// For `NodeOp::Slot`: the argument slot.
    slot: u32,
    /// What the node's accessor found last time (the replay's memory; stored by the full path
    /// through [`Plan::cache`]).
    cache: NodeCache,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum NodeOp {
    /// A root `L[i]`: argument slot `Step::slot` when the input has slots.
    Slot,
    /// `parent[str key]` of an exact dict, proven current by the node's cache.
    DictItem,
    DictOf,
    TypeOf,
    /// `read_root` / `read_child`.
    Generic,
    /// Never read (see the module docs, "same-class modules").
    Skip,
}

/// One leaf other than the packed tensors.
struct RestLeaf {
    leaf: u32,
    /// The leaf's node (`NONE`: a leaf over several nodes or none).
    node: u32,
    /// The node of an earlier leaf making the same check (`NONE`: none): when both nodes hold
    /// the same object, the leaf has passed already.
    twin: u32,
    quick: Quick,
    /// For a dict-keys leaf: the version of the dict whose keys it last found equal (0:
    /// none). An unchanged dict has unchanged keys: the leaf passes again without iterating.
    keys_seen: AtomicU64,
}

/// Leaves decided from the plan alone, without visiting the `Leaf`.
#[derive(Clone, Copy)]
enum Quick {
    /// `type(v) is` the type at this address (held strongly by the leaf).
    TypeIs(usize),
    /// `len(v) == n` of an exact dict, OrderedDict, list or tuple.
    Len(usize),
    /// `v is` this object (held strongly by the leaf).
    IsPtr(usize),
    /// `v is None` / `v is not None`.
    IsNone(bool),
    /// `len(v[k]) == 0` for each key: the remembered values' lengths while `v` is unchanged
    /// (`super::dicts_empty`).
    DictsEmpty,
    Generic,
}

const NONE: u32 = u32::MAX;

impl Plan {
    /// Node `n`'s remembered lookup (every node of the tree the plan was built for has one).
    pub(crate) fn cache(&self, n: usize) -> Option<&NodeCache> {
        self.steps.get(n).map(|s| &s.cache)
    }

    /// (nodes with a twin, leaves with a twin, packed tensor leaves), for tests.
    pub(crate) fn stats(&self) -> (usize, usize, usize) {
        (
            self.steps.iter().filter(|s| s.twin != NONE).count(),
            self.rest.iter().filter(|r| r.twin != NONE).count(),
            self.tensors.len(),
        )
    }

    /// (nodes walked, leaves other than packed tensors checked), for tests.
    pub(crate) fn walked(&self) -> (usize, usize) {
        let walked = self.steps.iter().filter(|s| s.op != NodeOp::Skip).count();
        (walked, self.rest.len())
    }
}

/// A key equal for two child nodes that apply the same accessor (to possibly different
/// parents): attribute names and `str` item keys by content, other item keys by identity.
fn access_key(py: Python<'_>, a: &Access) -> Option<(u8, String, usize, Option<isize>)> {
    let key = |x: &Bound<'_, PyAny>| match x.cast_exact::<PyString>() {
        Ok(s) => s.to_str().ok().map(|s| (s.to_owned(), 0)),
        Err(_) => Some((String::new(), x.as_ptr() as usize)),
    };
    match a {
        Access::Attr(x) => key(x.bind(py).as_any()).map(|(s, p)| (0, s, p, None)),
        Access::Item { key: x, index, .. } => key(x.bind(py)).map(|(s, p)| (1, s, p, *index)),
        Access::DictOf => Some((2, String::new(), 0, None)),
        Access::TypeOf => Some((3, String::new(), 0, None)),
        Access::LenOf => Some((4, String::new(), 0, None)),
        _ => None,
    }
}

/// Per node, an earlier node holding the same object whenever the tree passes (None: no such
/// node known), and which nodes are premises (see the module docs, "same-class modules"): a
/// `type(m)` node fixed by a leaf to `T` (`type(m) is T` on `m`, or `type(m) is T` as an
/// identity leaf on the node; T held strongly) is the same as the first such node of the same
/// `T`; a child of a node with a same node is the same as that node's child
/// by the same accessor.
fn same_class_subtrees(
    py: Python<'_>,
    nodes: &[Node],
    leaves: &[Leaf],
) -> (Vec<Option<usize>>, Vec<bool>) {
    // `type(x)` nodes whose value a leaf fixes: `type(x) is T` on `x`, or `is T` on the node.
    let mut type_of = std::collections::HashMap::new();
    for (n, node) in nodes.iter().enumerate() {
        if let (Access::TypeOf, Some(p)) = (&node.access, node.parent) {
            type_of.entry(p).or_insert(n);
        }
    }
    let mut forced = vec![None; nodes.len()];
    for l in leaves {
        let fixed = match (&l.kind, l.node) {
            (LeafKind::TypeIs(IdRef::Strong(t)), Some(x)) => type_of.get(&x).map(|&n| (n, t)),
            (LeafKind::Is(IdRef::Strong(t)), Some(n))
                if matches!(nodes[n].access, Access::TypeOf) =>
            {
                Some((n, t))
            }
            _ => None,
        };
        if let Some((n, t)) = fixed {
            forced[n].get_or_insert(t.as_ptr() as usize);
        }
    }
    let mut same: Vec<Option<usize>> = vec![None; nodes.len()];
    let mut premise = vec![false; nodes.len()];
    let mut first_of_type = std::collections::HashMap::new();
    let mut child = std::collections::HashMap::new();
    for (n, node) in nodes.iter().enumerate() {
        let key = access_key(py, &node.access);
        if let Some(t) = forced[n] {
            match first_of_type.entry(t) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    same[n] = Some(*e.get());
                    premise[n] = true;
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(n);
                }
            }
        } else if let (Some(p), Some(k)) = (node.parent, &key) {
            if let Some(q) = same[p] {
                same[n] = child.get(&(q, k.clone())).copied();
            }
        }
        if let (Some(p), Some(k)) = (node.parent, key) {
            child.entry((p, k)).or_insert(n);
        }
    }
    (same, premise)
}

impl Plan {
    pub(crate) fn new(py: Python<'_>, nodes: &[Node], leaves: &[Leaf], exports: &[usize]) -> Plan {
        let mut plan = Plan::default();
        let (same, premise) = same_class_subtrees(py, nodes, leaves);
        // Twins: the first earlier node with the same accessor; `group` is the first node of
        // such a chain (nodes in one group may hold the same object).
        let mut group: Vec<usize> = (0..nodes.len()).collect();
        let mut first = std::collections::HashMap::new();
        for (n, node) in nodes.iter().enumerate() {
            let twin = node
                .parent
                .and_then(|_| access_key(py, &node.access))
                .and_then(|k| match first.entry(k) {
                    std::collections::hash_map::Entry::Occupied(e) => Some(*e.get()),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(n);
                        None
                    }
                });
            let (twin, twin_parent) = match twin {
                Some(m) => {
                    group[n] = group[m];
                    (m as u32, nodes[m].parent.unwrap() as u32)
                }
                None => (NONE, NONE),
            };
            let op = match &node.access {
                Access::Local { .. } if node.parent.is_none() => NodeOp::Slot,
                Access::Item { index: None, .. } => NodeOp::DictItem,
                Access::DictOf => NodeOp::DictOf,
                Access::TypeOf => NodeOp::TypeOf,
                _ => NodeOp::Generic,
            };
            plan.steps.push(Step {
                parent: node.parent.map_or(NONE, |p| p as u32),
                twin,
                twin_parent,
                op,
                slot: match &node.access {
                    Access::Local { index, .. } => *index as u32,
                    _ => 0,
                },
                cache: NodeCache::default(),
            });
        }
        // A leaf on a node with a `same` node is dropped when that node has a leaf making the
        // same check (never on a premise: its type leaf is what proves the sameness).
        let checked: std::collections::HashSet<(usize, (u8, i64))> = leaves
            .iter()
            .filter_map(|l| Some((l.node?, l.kind.check_key()?)))
            .collect();
        let dropped = |l: &Leaf| match (l.node, l.kind.check_key()) {
            (Some(n), Some(k)) if !premise[n] => same[n].is_some_and(|m| checked.contains(&(m, k))),
            _ => false,
        };
        // Nodes read by something kept: a kept leaf, an export, a symbolic-shape leaf, or a
        // walked child (children come after their parents).
        let mut needed = vec![false; nodes.len()];
        for &n in exports {
            needed[n] = true;
        }
        for l in leaves {
            match (&l.kind, l.node) {
                (LeafKind::Shape(s), _) => s.bindings.iter().for_each(|b| needed[b.node] = true),
                (_, Some(n)) if !dropped(l) => needed[n] = true,
                _ => {}
            }
        }
        for n in (0..nodes.len()).rev() {
            needed[n] |= same[n].is_none();
            if let (true, Some(p)) = (needed[n], nodes[n].parent) {
                needed[p] = true;
            }
        }
        for (st, _) in plan.steps.iter_mut().zip(&needed).filter(|(_, &n)| !n) {
            st.op = NodeOp::Skip;
        }
        let mut checks = std::collections::HashMap::new();
        for (i, l) in leaves.iter().enumerate() {
            if dropped(l) {
                continue;
            }
            match (&l.kind, l.node) {
                (LeafKind::Tensor(t), Some(n)) if t.expect().is_some() => {
                    plan.tensors.push(Packed {
                        expect: t.expect().cloned().unwrap(),
                        tag: (n as u32, i as u32),
                    })
                }
                _ => {
                    let twin = l.node.zip(l.kind.check_key()).and_then(|(n, k)| {
                        match checks.entry((group[n], k)) {
                            std::collections::hash_map::Entry::Occupied(e) => Some(*e.get()),
                            std::collections::hash_map::Entry::Vacant(e) => {
                                e.insert(n as u32);
                                None
                            }
                        }
                    });
                    let quick = match &l.kind {
                        LeafKind::TypeIs(IdRef::Strong(t)) => Quick::TypeIs(t.as_ptr() as usize),
                        LeafKind::LengthIs(n) => Quick::Len(*n),
                        LeafKind::Is(IdRef::Strong(o)) => Quick::IsPtr(o.as_ptr() as usize),
                        LeafKind::IsNone | LeafKind::Equals(Const::None) => Quick::IsNone(true),
                        LeafKind::IsNotNone => Quick::IsNone(false),
                        LeafKind::DictsEmpty(_) => Quick::DictsEmpty,
                        _ => Quick::Generic,
                    };
                    plan.rest.push(RestLeaf {
                        leaf: i as u32,
                        node: l.node.map_or(NONE, |n| n as u32),
                        twin: twin.unwrap_or(NONE),
                        quick,
                        keys_seen: AtomicU64::new(0),
                    });
                }
            }
        }
        plan
    }
}

/// Whether a tree with these nodes and leaves can be replayed at all.
pub(crate) fn replayable(nodes: &[Node], leaves: &[Leaf]) -> bool {
    let access_ok = nodes
        .iter()
        .all(|n| !matches!(n.access, Access::TensorSize(_) | Access::TensorStride(_)));
    let leaf_ok = leaves.iter().all(|l| match &l.kind {
        LeafKind::Equals(c) => matches!(c, Const::None | Const::Bool(_) | Const::Int(_)),
        LeafKind::Aliasing(_) => false,
        LeafKind::Shape(s) => s.bindings.iter().all(|b| b.read != SymRead::StorageOffset),
        LeafKind::GlobalState(s) => s.check_raw().is_some(),
        _ => l.node.is_some(),
    });
    access_ok && leaf_ok
}

/// Replay the check. `Some(pass)` when decided; on a pass the exported nodes' values are
/// appended to `out`. None: the full path must decide.
pub(crate) fn replay<'py>(
    py: Python<'py>,
    tree: &GuardTree,
    input: &GuardInput<'_, 'py>,
    defaults: (Option<&Bound<'py, PyAny>>, Option<&Bound<'py, PyAny>>),
    out: Option<&mut Vec<Bound<'py, PyAny>>>,
) -> Option<bool> {
    let (nodes, leaves, plan, exports) = (&tree.nodes, &tree.leaves, &tree.plan, &tree.exports);
    // Zeroed per check: small trees take the small array.
    const SMALL: usize = 32;
    const STACK: usize = 128;
    let mut small = [0usize; SMALL];
    let mut stack;
    let mut heap;
    let memo: &mut [Val] = if nodes.len() <= SMALL {
        &mut small[..nodes.len()]
    } else if nodes.len() <= STACK {
        stack = [0usize; STACK];
        &mut stack[..nodes.len()]
    } else {
        heap = vec![0usize; nodes.len()];
        &mut heap[..]
    };
    // The version of a name->value locals dict, read once for all its lookups.
    let locals_version = match &input.locals {
        Locals::Mapping(m) => raw::dict_version(raw::held(m)),
        Locals::Slots(_) => None,
    };
    for (i, (node, st)) in nodes.iter().zip(&plan.steps).enumerate() {
        if st.op == NodeOp::Skip {
            continue;
        }
        memo[i] = if st.parent == NONE {
            match (&input.locals, st.op) {
                (Locals::Slots(s), NodeOp::Slot) => raw::slot(s, st.slot as usize)?.addr(),
                // An unchanged locals dict holds the value found last time.
                (Locals::Mapping(_), NodeOp::Slot) => {
                    match locals_version.and_then(|v| st.cache.hit_dict(v)) {
                        Some(h) => h.addr(),
                        None => read_root(node, &st.cache, input, defaults, locals_version)?.addr(),
                    }
                }
                _ => read_root(node, &st.cache, input, defaults, locals_version)?.addr(),
            }
        } else {
            let pv = memo[st.parent as usize];
            if st.twin != NONE && memo[st.twin_parent as usize] == pv {
                memo[st.twin as usize]
            } else {
                match st.op {
                    NodeOp::DictItem => st.cache.hit_dict(raw::dict_version(as_obj(pv)?)?)?.addr(),
                    NodeOp::DictOf => as_obj(pv)?.instance_dict()?.addr(),
                    NodeOp::TypeOf => as_obj(pv)?.type_of().addr(),
                    NodeOp::Generic | NodeOp::Slot | NodeOp::Skip => {
                        read_child(node, &st.cache, pv)?
                    }
                }
            }
        };
    }
    let layout = if plan.tensors.is_empty() {
        None
    } else {
        crate::ffi::tensor::layout()
    };
    for r in &plan.rest {
        let v = if r.node == NONE {
            0
        } else {
            memo[r.node as usize]
        };
        if r.twin != NONE && memo[r.twin as usize] == v {
            continue; // the same check passed on the same value
        }
        let ok = match r.quick {
            Quick::TypeIs(t) => as_obj(v)?.type_of().addr() == t,
            Quick::Len(n) => as_obj(v)?.exact_len()? == n,
            Quick::IsPtr(p) => as_obj(v)?.addr() == p,
            Quick::IsNone(none) => {
                if v & 1 == 1 {
                    !none // a length is never None
                } else {
                    as_obj(v)?.is_none() == none
                }
            }
            Quick::DictsEmpty => match &leaves[r.leaf as usize].kind {
                LeafKind::DictsEmpty(e) => e.replay(as_obj(v)?)?,
                _ => return None,
            },
            Quick::Generic => {
                let leaf = &leaves[r.leaf as usize];
                let ok = match (leaf.node, &leaf.kind) {
                    (None, LeafKind::GlobalState(s)) => s.check_raw(),
                    (None, LeafKind::Shape(s)) => check_shape(py, s, memo),
                    (Some(_), LeafKind::DictKeys(keys)) => {
                        check_by_version(v, &r.keys_seen, |h| raw::dict_keys_are(h, keys))
                    }
                    (Some(_), LeafKind::DictLacks(key)) => {
                        check_by_version(v, &r.keys_seen, |h| raw::dict_lacks_str(h, key))
                    }
                    (Some(_), kind) => check_leaf(py, kind, v),
                    _ => None,
                };
                ok?
            }
        };
        if !ok {
            return Some(false);
        }
    }
    // (a plan has packed tensors only where a layout is installed)
    for t in plan.tensors.iter().filter(|_| layout.is_some()) {
        let (n, i) = t.tag;
        let v = memo[n as usize];
        let h = as_obj(v)?;
        let ok = match check_expect_with(&h.bound(py), &t.expect, layout?) {
            Some(ok) => ok,
            None => check_leaf(py, &leaves[i as usize].kind, v)?,
        };
        if !ok {
            return Some(false);
        }
    }
    if let Some(out) = out {
        let start = out.len();
        out.reserve(exports.len());
        for &n in exports {
            match as_obj(memo[n]) {
                Some(h) => out.push(h.to_owned(py)),
                None => {
                    out.truncate(start);
                    return None;
                }
            }
        }
    }
    Some(true)
}

#[inline]
fn read_root<'py>(
    node: &Node,
    cache: &NodeCache,
    input: &GuardInput<'_, 'py>,
    defaults: (Option<&Bound<'py, PyAny>>, Option<&Bound<'py, PyAny>>),
    locals_version: Option<u64>,
) -> Option<Held> {
    match &node.access {
        Access::Local { index, name, hint } => match &input.locals {
            Locals::Slots(s) => raw::slot(s, *index),
            Locals::Mapping(m) => {
                // An unchanged dict (same version) holds the value found last time.
                let d = raw::held(m);
                let version = locals_version;
                if let Some(h) = version.and_then(|v| cache.hit(v, 0)) {
                    return Some(h);
                }
                let h = raw::dict_get_at_held(d, name.bind(m.py()).as_any(), hint.position()?)?;
                if let Some(v) = version {
                    cache.store(v, 0, h.addr());
                }
                Some(h)
            }
        },
        Access::Global(_) => {
            let g = input.globals.map(|g| g.as_any()).or(defaults.0)?;
            let h = raw::held(g);
            cache.hit(raw::dict_version(h)?, 0)
        }
        Access::Builtin(_) => {
            let b = input.builtins.map(|b| b.as_any()).or(defaults.1)?;
            let h = raw::held(b);
            cache.hit(raw::dict_version(h)?, 0)
        }
        Access::Closure(index) => {
            let cells = raw::held(input.closure?.as_any());
            raw::cell_contents_held(cells.exact_seq_item(*index as isize)?)
        }
        _ => None,
    }
}

#[inline]
fn read_child(node: &Node, cache: &NodeCache, parent: Val) -> Option<Val> {
    let p = as_obj(parent)?;
    let v = match &node.access {
        Access::Item { index, .. } => match index.and_then(|i| p.exact_seq_item(i)) {
            Some(v) => v,
            None => cache.hit(raw::dict_version(p)?, 0)?,
        },
        Access::Attr(_) => {
            if p.is_plain_type() {
                cache.hit(raw::type_version(p)? as u64, p.addr())?
            } else if let Some(f) = node.func_attr {
                match f {
                    FuncAttr::Globals => p.function_globals()?,
                    // writable, but read afresh on every check: always the current one
                    FuncAttr::Code => p.function_code()?,
                }
            } else {
                return None;
            }
        }
        Access::DictOf => p.instance_dict()?,
        Access::TypeOf => p.type_of(),
        Access::LenOf => return Some(int_val(p.exact_len()?)),
        _ => return None,
    };
    Some(v.addr())
}

/// A symbolic-shape leaf over the replayed values, by its [`ReadPlan`]: each tensor's sizes
/// and strides are borrowed once, each symbol is an index into them; None when a symbol cannot
/// be read raw.
fn check_shape(py: Python<'_>, s: &ShapeLeaf, memo: &[Val]) -> Option<bool> {
    let Some(plan) = &s.plan else {
        return check_shape_by_symbol(py, s, memo);
    };
    let keys = crate::tensor::torch(py).ok()?.cal.non_plain_keys;
    let mut objs = [None; PLAN_TENSORS];
    for (o, &n) in objs.iter_mut().zip(&plan.tensors) {
        *o = Some(as_obj(memo[n])?.bound(py));
    }
    let empty: (&[i64], &[i64]) = (&[], &[]);
    let mut dims = [empty; PLAN_TENSORS];
    for (d, o) in dims.iter_mut().zip(&objs[..plan.tensors.len()]) {
        *d = crate::ffi::tensor::read_dims(o.as_ref()?, keys)?;
    }
    let mut buf = [0i64; PLAN_SYMS];
    for (v, r) in buf.iter_mut().zip(&plan.reads) {
        *v = match *r {
            PlanRead::Size { t, dim } => {
                let xs = dims[t].0;
                xs[crate::tensor::dim_index(dim, xs.len())?]
            }
            PlanRead::Stride { t, dim } => {
                let xs = dims[t].1;
                xs[crate::tensor::dim_index(dim, xs.len())?]
            }
            PlanRead::Int { node } => as_obj(memo[node])?.exact_int()?,
        };
    }
    Some(s.prog.holds(&buf[..plan.reads.len()]))
}

/// [`check_shape`] without a plan: each tensor's sizes and strides are read once (up to
/// `TENSORS` tensors, then per symbol).
fn check_shape_by_symbol(py: Python<'_>, s: &ShapeLeaf, memo: &[Val]) -> Option<bool> {
    const TENSORS: usize = 8;
    let mut nodes = [usize::MAX; TENSORS];
    let mut dims = [[0i64; 16]; TENSORS];
    let mut ndims = [0usize; TENSORS];
    let mut used = 0;
    let mut undecided = false;
    let ok = s.check(|b| {
        let v = (|| {
            let h = as_obj(memo[b.node])?;
            let (d, stride) = match b.read {
                SymRead::Size(d) => (d, false),
                SymRead::Stride(d) => (d, true),
                _ => return b.read.read_raw(&h.bound(py)),
            };
            let k = match nodes[..used].iter().position(|&n| n == b.node) {
                Some(k) => k,
                None if used < TENSORS => {
                    ndims[used] = crate::tensor::dims_into(&h.bound(py), &mut dims[used])?;
                    nodes[used] = b.node;
                    used += 1;
                    used - 1
                }
                None => return b.read.read_raw(&h.bound(py)),
            };
            let j = crate::tensor::dim_index(d, ndims[k])?;
            Some(dims[k][if stride { 8 + j } else { j }])
        })();
        undecided |= v.is_none();
        v
    });
    (!undecided).then_some(ok)
}

/// A dict-keys leaf (`keys`) or dict-lacks leaf (`decide` is the full check): passes at once on
/// a dict at the version where it last passed (versions are unique per dict and state), else
/// decides and remembers a pass.
fn check_by_version(
    v: Val,
    seen: &AtomicU64,
    decide: impl FnOnce(Held) -> Option<bool>,
) -> Option<bool> {
    let h = as_obj(v)?;
    let version = raw::dict_version(h).filter(|&v| v != 0);
    if version.is_some_and(|v| seen.load(Ordering::Relaxed) == v) {
        return Some(true);
    }
    let ok = decide(h)?;
    if let (true, Some(v)) = (ok, version) {
        seen.store(v, Ordering::Relaxed);
    }
    Some(ok)
}

#[inline]
fn check_leaf(py: Python<'_>, kind: &LeafKind, v: Val) -> Option<bool> {
    if v & 1 == 1 {
        // A length: only compared with ints.
        let n = (v >> 1) as i64;
        return match kind {
            LeafKind::Equals(Const::Int(i)) => Some(n == *i),
            LeafKind::IsNone => Some(false),
            LeafKind::IsNotNone => Some(true),
            _ => None,
        };
    }
    let h = as_obj(v)?;
    Some(match kind {
        LeafKind::TypeIs(id) => id.is(py, h.type_of().ptr()),
        LeafKind::Is(id) => id.is(py, h.ptr()),
        LeafKind::IsNone => h.is_none(),
        LeafKind::IsNotNone => !h.is_none(),
        LeafKind::Equals(Const::None) => h.is_none(),
        LeafKind::Equals(Const::Bool(b)) => {
            if *b {
                h.is_true()
            } else {
                h.is_false()
            }
        }
        LeafKind::Equals(Const::Int(i)) => h.exact_int() == Some(*i),
        LeafKind::LengthIs(n) => h.exact_len()? == *n,
        LeafKind::DictKeys(keys) => raw::dict_keys_are(h, keys)?,
        LeafKind::DictLacks(key) => raw::dict_lacks_str(h, key)?,
        LeafKind::Tensor(t) => t.check_raw(&h.bound(py))?,
        _ => return None,
    })
}
