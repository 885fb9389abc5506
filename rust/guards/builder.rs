//! `GuardBuilder` (the Python-facing way to build a tree) and `GuardNode` (a handle on one
//! accessor). Accessors are deduplicated by path; leaves are sorted into evaluation order at
//! `build()`.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyModule, PyString};

use super::access::{quote, Access, AccessKey, DictHint};
use super::consts::Const;
use super::global_state::Snapshot;
use super::leaves::{describe_obj, IdRef, Leaf, LeafKind};
use super::shape_leaf::{Binding, ShapeLeaf, SymRead};
use super::symexpr::Expr;
use super::tree::{GuardTree, Node};
use crate::error::{Error, Result};
use crate::tensor::TensorSpec;

static NEXT_BUILDER: AtomicU64 = AtomicU64::new(1);

/// An accessor in a tree under construction.
#[pyclass(module = "ferrodyn._C", name = "GuardNode", frozen)]
pub struct GuardNode {
    builder: u64,
    index: usize,
    source: String,
}

#[pymethods]
impl GuardNode {
    #[getter]
    fn source(&self) -> &str {
        &self.source
    }

    fn __repr__(&self) -> String {
        format!("<GuardNode {}>", self.source)
    }
}

#[pyclass(module = "ferrodyn._C", name = "GuardBuilder")]
pub struct GuardBuilder {
    id: u64,
    nodes: Vec<Node>,
    depth: Vec<usize>,
    keys: HashMap<(Option<usize>, AccessKey), usize>,
    leaves: Vec<Leaf>,
    exports: Vec<usize>,
    globals: Option<Py<PyDict>>,
    builtins: Option<Py<PyDict>>,
    built: bool,
}

impl GuardBuilder {
    fn live(&self) -> Result<()> {
        if self.built {
            Err(Error::Value(
                "this GuardBuilder has already built its tree".into(),
            ))
        } else {
            Ok(())
        }
    }

    fn own(&self, node: &GuardNode) -> Result<usize> {
        if node.builder != self.id {
            return Err(Error::Value(format!(
                "{} belongs to another GuardBuilder",
                node.source
            )));
        }
        Ok(node.index)
    }

    fn node(
        &mut self,
        parent: Option<&GuardNode>,
        key: AccessKey,
        key_repr: &str,
        access: Access,
    ) -> Result<GuardNode> {
        self.live()?;
        let p = match parent {
            Some(n) => Some(self.own(n)?),
            None => None,
        };
        let index = match self.keys.get(&(p, key.clone())) {
            Some(&i) => i,
            None => {
                let psrc = p.map(|i| self.nodes[i].source.clone()).unwrap_or_default();
                let source = key.source(&psrc, key_repr);
                let i = self.nodes.len();
                self.nodes.push(Node::new(access, p, source));
                self.depth.push(p.map(|i| self.depth[i] + 1).unwrap_or(0));
                self.keys.insert((p, key), i);
                i
            }
        };
        Ok(GuardNode {
            builder: self.id,
            index,
            source: self.nodes[index].source.clone(),
        })
    }

    fn leaf(&mut self, node: Option<&GuardNode>, kind: LeafKind, expr: String) -> Result<()> {
        self.live()?;
        let n = match node {
            Some(n) => Some(self.own(n)?),
            None => None,
        };
        let depth = n.map(|i| self.depth[i]).unwrap_or(0);
        let source = n.map(|i| self.nodes[i].source.clone()).unwrap_or_default();
        let order = (kind.class(), depth, self.leaves.len());
        self.leaves.push(Leaf {
            node: n,
            kind,
            expr,
            source,
            order,
        });
        Ok(())
    }
}

#[pymethods]
impl GuardBuilder {
    #[new]
    #[pyo3(signature = (f_globals=None, f_builtins=None))]
    fn py_new(
        py: Python<'_>,
        f_globals: Option<Bound<'_, PyDict>>,
        f_builtins: Option<Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let builtins = match f_builtins {
            Some(b) => b.unbind(),
            None => PyModule::import(py, "builtins")?.dict().unbind(),
        };
        Ok(GuardBuilder {
            id: NEXT_BUILDER.fetch_add(1, Ordering::Relaxed),
            nodes: Vec::new(),
            depth: Vec::new(),
            keys: HashMap::new(),
            leaves: Vec::new(),
            exports: Vec::new(),
            globals: f_globals.map(|g| g.unbind()),
            builtins: Some(builtins),
            built: false,
        })
    }

    // -- accessors ------------------------------------------------------------------------

    fn local(&mut self, py: Python<'_>, index: usize, name: &str) -> Result<GuardNode> {
        let access = Access::Local {
            index,
            name: PyString::intern(py, name).unbind(),
            hint: DictHint::new(),
        };
        self.node(None, AccessKey::Local(index, name.to_owned()), "", access)
    }

    fn global_(&mut self, py: Python<'_>, name: &str) -> Result<GuardNode> {
        let access = Access::Global(PyString::intern(py, name).unbind());
        self.node(None, AccessKey::Global(name.to_owned()), "", access)
    }

    fn builtin(&mut self, py: Python<'_>, name: &str) -> Result<GuardNode> {
        let access = Access::Builtin(PyString::intern(py, name).unbind());
        self.node(None, AccessKey::Builtin(name.to_owned()), "", access)
    }

    fn closure_cell(&mut self, index: usize, name: &str) -> Result<GuardNode> {
        self.node(
            None,
            AccessKey::Closure(index),
            &quote(name),
            Access::Closure(index),
        )
    }

    fn attr(
        &mut self,
        py: Python<'_>,
        parent: PyRef<'_, GuardNode>,
        name: &str,
    ) -> Result<GuardNode> {
        let access = Access::Attr(PyString::intern(py, name).unbind());
        self.node(Some(&parent), AccessKey::Attr(name.to_owned()), "", access)
    }

    fn item(&mut self, parent: PyRef<'_, GuardNode>, key: &Bound<'_, PyAny>) -> Result<GuardNode> {
        let repr = key.repr()?.to_string();
        let dedup = match Const::from_py(key) {
            Ok(_) => format!("{}:{}", super::leaves::type_name(key), repr),
            Err(_) => format!("id:{:#x}", key.as_ptr() as usize),
        };
        let index = if key.is_exact_instance_of::<PyInt>() {
            key.extract::<isize>().ok()
        } else {
            None
        };
        let access = Access::Item {
            key: key.clone().unbind(),
            index,
            hint: DictHint::new(),
        };
        self.node(Some(&parent), AccessKey::Item(dedup), &repr, access)
    }

    fn dict_item(
        &mut self,
        parent: PyRef<'_, GuardNode>,
        key: &Bound<'_, PyAny>,
    ) -> Result<GuardNode> {
        let repr = key.repr()?.to_string();
        let dedup = match Const::from_py(key) {
            Ok(_) => format!("{}:{}", super::leaves::type_name(key), repr),
            Err(_) => format!("id:{:#x}", key.as_ptr() as usize),
        };
        let access = Access::DictItem(key.clone().unbind());
        self.node(Some(&parent), AccessKey::DictItem(dedup), &repr, access)
    }

    fn dict_of(&mut self, parent: PyRef<'_, GuardNode>) -> Result<GuardNode> {
        self.node(Some(&parent), AccessKey::DictOf, "", Access::DictOf)
    }

    fn type_of(&mut self, parent: PyRef<'_, GuardNode>) -> Result<GuardNode> {
        self.node(Some(&parent), AccessKey::TypeOf, "", Access::TypeOf)
    }

    fn len_of(&mut self, parent: PyRef<'_, GuardNode>) -> Result<GuardNode> {
        self.node(Some(&parent), AccessKey::LenOf, "", Access::LenOf)
    }

    /// The `index`-th element of a set or frozenset, or key of an exact dict, in iteration
    /// order (a failed access, another type or a shorter set, fails every leaf below).
    fn set_item(&mut self, parent: PyRef<'_, GuardNode>, index: usize) -> Result<GuardNode> {
        self.node(
            Some(&parent),
            AccessKey::SetItem(index),
            "",
            Access::SetItem(index),
        )
    }

    /// The `index`-th value of an exact dict in insertion order (another type or a shorter
    /// dict fails every leaf below).
    fn dict_value(&mut self, parent: PyRef<'_, GuardNode>, index: usize) -> Result<GuardNode> {
        self.node(
            Some(&parent),
            AccessKey::DictValue(index),
            "",
            Access::DictValue(index),
        )
    }

    fn tensor_size(&mut self, parent: PyRef<'_, GuardNode>, dim: i64) -> Result<GuardNode> {
        self.node(
            Some(&parent),
            AccessKey::TensorSize(dim),
            "",
            Access::TensorSize(dim),
        )
    }

    fn tensor_stride(&mut self, parent: PyRef<'_, GuardNode>, dim: i64) -> Result<GuardNode> {
        self.node(
            Some(&parent),
            AccessKey::TensorStride(dim),
            "",
            Access::TensorStride(dim),
        )
    }

    /// Hand `node`'s value to the entry function on every passing check (appended after the
    /// argument slots and closure cells, in export order); returns its position among exports.
    fn export(&mut self, node: PyRef<'_, GuardNode>) -> Result<usize> {
        self.live()?;
        let n = self.own(&node)?;
        self.exports.push(n);
        Ok(self.exports.len() - 1)
    }

    // -- leaves ---------------------------------------------------------------------------

    fn type_is(&mut self, node: PyRef<'_, GuardNode>, typ: &Bound<'_, PyAny>) -> Result<()> {
        let t = typ.cast::<pyo3::types::PyType>().map_err(|_| {
            Error::Type(format!("type_is() needs a type, got {}", describe_obj(typ)))
        })?;
        let name = t.name()?.to_string();
        let expr = format!("type({}) is {name}", node.source);
        self.leaf(Some(&node), LeafKind::TypeIs(IdRef::strong(typ)), expr)
    }

    fn is_(&mut self, node: PyRef<'_, GuardNode>, obj: &Bound<'_, PyAny>) -> Result<()> {
        let expr = format!("{} is {}", node.source, describe_obj(obj));
        self.leaf(Some(&node), LeafKind::Is(IdRef::new(obj)), expr)
    }

    fn is_none(&mut self, node: PyRef<'_, GuardNode>) -> Result<()> {
        let expr = format!("{} is None", node.source);
        self.leaf(Some(&node), LeafKind::IsNone, expr)
    }

    fn is_not_none(&mut self, node: PyRef<'_, GuardNode>) -> Result<()> {
        let expr = format!("{} is not None", node.source);
        self.leaf(Some(&node), LeafKind::IsNotNone, expr)
    }

    fn equals(&mut self, node: PyRef<'_, GuardNode>, value: &Bound<'_, PyAny>) -> Result<()> {
        let c = Const::from_py(value)?;
        let expr = format!("{} == {}", node.source, value.repr()?);
        self.leaf(Some(&node), LeafKind::Equals(c), expr)
    }

    fn length_is(&mut self, node: PyRef<'_, GuardNode>, n: usize) -> Result<()> {
        let expr = format!("len({}) == {n}", node.source);
        self.leaf(Some(&node), LeafKind::LengthIs(n), expr)
    }

    fn dict_keys(&mut self, node: PyRef<'_, GuardNode>, keys: &Bound<'_, PyAny>) -> Result<()> {
        let keys: Vec<Bound<'_, PyAny>> = keys.try_iter()?.collect::<PyResult<_>>()?;
        let reprs = keys
            .iter()
            .map(|k| k.repr().map(|r| r.to_string()))
            .collect::<PyResult<Vec<_>>>()?;
        let expr = format!("list({}.keys()) == [{}]", node.source, reprs.join(", "));
        let keys = keys.into_iter().map(|k| k.unbind()).collect();
        self.leaf(Some(&node), LeafKind::DictKeys(keys), expr)
    }

    fn dict_lacks(&mut self, node: PyRef<'_, GuardNode>, key: &Bound<'_, PyAny>) -> Result<()> {
        let expr = format!("{} not in {}", key.repr()?, node.source);
        self.leaf(Some(&node), LeafKind::DictLacks(key.clone().unbind()), expr)
    }

    /// `len(node[k]) == 0` for every key of `keys` (a module's hook dicts), as one leaf.
    fn dicts_empty(
        &mut self,
        py: Python<'_>,
        node: PyRef<'_, GuardNode>,
        keys: Vec<String>,
    ) -> Result<()> {
        if keys.is_empty() {
            return Err(Error::Value("dicts_empty() needs at least one key".into()));
        }
        let quoted: Vec<String> = keys.iter().map(|k| quote(k)).collect();
        let expr = format!(
            "all(len({}[k]) == 0 for k in ({}{}))",
            node.source,
            quoted.join(", "),
            if keys.len() == 1 { "," } else { "" }
        );
        let leaf = super::dicts_empty::DictsEmpty::new(py, &keys);
        self.leaf(Some(&node), LeafKind::DictsEmpty(Box::new(leaf)), expr)
    }

    #[pyo3(signature = (node, example, *, dynamic_dims=Vec::new(), check_strides=true))]
    fn tensor_match(
        &mut self,
        node: PyRef<'_, GuardNode>,
        example: &Bound<'_, PyAny>,
        dynamic_dims: Vec<i64>,
        check_strides: bool,
    ) -> Result<()> {
        let spec = TensorSpec::new(example, &dynamic_dims, check_strides)?;
        let expr = spec.describe(&node.source);
        self.leaf(Some(&node), LeafKind::Tensor(Box::new(spec)), expr)
    }

    /// A symbolic-shape guard: `expr` in the prefix form of `symexpr` (symbol `s<k>` is
    /// `symbols[k]`), each symbol a `(node, kind, dim)` with kind "size", "stride",
    /// "storage_offset" (tensor nodes) or "int" (an exact Python int node).
    fn shape_guard(
        &mut self,
        expr: &str,
        symbols: Vec<(PyRef<'_, GuardNode>, String, i64)>,
    ) -> Result<()> {
        let parsed =
            Expr::parse(expr).map_err(|e| Error::Value(format!("shape_guard({expr:?}): {e}")))?;
        if let Some(&k) = parsed.symbols().iter().next_back() {
            if k >= symbols.len() {
                return Err(Error::Value(format!(
                    "shape_guard({expr:?}): symbol s{k} has no binding ({} given)",
                    symbols.len()
                )));
            }
        }
        let mut bindings = Vec::with_capacity(symbols.len());
        for (node, kind, dim) in &symbols {
            let read = match kind.as_str() {
                "size" => SymRead::Size(*dim),
                "stride" => SymRead::Stride(*dim),
                "storage_offset" => SymRead::StorageOffset,
                "int" => SymRead::Int,
                other => {
                    return Err(Error::Value(format!(
                        "shape_guard: unknown symbol kind {other:?} (size, stride, \
                         storage_offset or int)"
                    )))
                }
            };
            bindings.push(Binding {
                node: self.own(node)?,
                read,
                name: read.name(&node.source),
            });
        }
        let leaf = ShapeLeaf::new(parsed, bindings);
        let text = leaf.text();
        let depth = leaf
            .bindings
            .iter()
            .map(|b| self.depth[b.node])
            .max()
            .unwrap_or(0);
        self.live()?;
        let order = (4, depth, self.leaves.len());
        self.leaves.push(Leaf {
            node: None,
            kind: LeafKind::Shape(Box::new(leaf)),
            expr: text,
            source: String::new(),
            order,
        });
        Ok(())
    }

    /// A leaf that passes while the frame's caller handles no exception (`sys.exception() is
    /// None`): the trace decided what a raise chains to, or what `sys.exc_info()` and a bare
    /// `raise` see, with none from outside.
    fn no_handled_exception(&mut self) -> Result<()> {
        let expr = "sys.exception() is None".to_string();
        self.leaf(None, LeafKind::NoHandledException, expr)
    }

    fn global_state(&mut self, py: Python<'_>) -> Result<()> {
        let snap = Snapshot::capture(py)?;
        let expr = snap.describe();
        self.leaf(None, LeafKind::GlobalState(Box::new(snap)), expr)
    }

    /// One leaf over `nodes`: identity groups `groups` (equal: same object) and, for tensors,
    /// `storages` entries `(group, storage_offset)` (equal group: same storage), as traced.
    fn aliasing(
        &mut self,
        nodes: Vec<PyRef<'_, GuardNode>>,
        groups: Vec<u32>,
        storages: Vec<Option<(u32, i64)>>,
    ) -> Result<()> {
        if nodes.len() != groups.len() || nodes.len() != storages.len() {
            return Err(Error::Value(
                "aliasing: nodes, groups and storages differ in length".into(),
            ));
        }
        let idx = nodes
            .iter()
            .map(|n| self.own(n))
            .collect::<Result<Vec<_>>>()?;
        let sources = nodes.iter().map(|n| n.source.clone()).collect();
        let spec = super::aliasing::AliasSpec {
            nodes: idx,
            sources,
            groups,
            storages,
        };
        let expr = spec.describe();
        self.leaf(None, LeafKind::Aliasing(Box::new(spec)), expr)
    }

    fn build(&mut self) -> Result<GuardTree> {
        self.live()?;
        self.built = true;
        let mut leaves = std::mem::take(&mut self.leaves);
        leaves.sort_by_key(|l| l.order);
        let nodes = std::mem::take(&mut self.nodes);
        let disc = super::tree::discriminator(&nodes, &leaves);
        let slot_of = super::tree::slots_of(&nodes);
        let replayable = super::replay::replayable(&nodes, &leaves);
        let exports = std::mem::take(&mut self.exports);
        let plan = Python::attach(|py| super::replay::Plan::new(py, &nodes, &leaves, &exports));
        Ok(GuardTree {
            plan,
            replayable,
            replay_misses: Default::default(),
            slot_of,
            disc,
            exports,
            nodes,
            leaves,
            globals: self.globals.take(),
            builtins: self.builtins.take(),
        })
    }
}
