//! The global-state leaf: torch's grad mode, default dtype, deterministic-algorithms flag and
//! autocast state (enabled and dtype) per device type, as captured at build time.
//! Read through torch's C-level functions (`torch._C.*`, no Python frames).
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::error::Result;

struct Fns {
    grad: Py<PyAny>,
    default_dtype: Py<PyAny>,
    deterministic: Py<PyAny>,
    autocast_enabled: Py<PyAny>,
    autocast_dtype: Py<PyAny>,
    cuda_available: bool,
}

static FNS: PyOnceLock<Fns> = PyOnceLock::new();

fn fns(py: Python<'_>) -> PyResult<&Fns> {
    FNS.get_or_try_init(py, || {
        let torch = py.import("torch")?;
        let c = torch.getattr("_C")?;
        Ok(Fns {
            grad: c.getattr("is_grad_enabled")?.unbind(),
            default_dtype: c.getattr("get_default_dtype")?.unbind(),
            deterministic: c.getattr("_get_deterministic_algorithms")?.unbind(),
            autocast_enabled: c.getattr("is_autocast_enabled")?.unbind(),
            autocast_dtype: c.getattr("get_autocast_dtype")?.unbind(),
            cuda_available: torch.getattr("cuda")?.call_method0("is_available")?.extract()?,
        })
    })
}

/// One device type's autocast state.
struct Autocast {
    device: &'static str,
    enabled: bool,
    dtype: Py<PyAny>,
}

pub struct Snapshot {
    grad: bool,
    default_dtype: Py<PyAny>,
    deterministic: bool,
    autocast: Vec<Autocast>,
}

struct Now<'py> {
    grad: bool,
    default_dtype: Bound<'py, PyAny>,
    deterministic: bool,
}

fn now<'py>(py: Python<'py>, f: &Fns) -> PyResult<Now<'py>> {
    Ok(Now {
        grad: f.grad.bind(py).call0()?.extract()?,
        default_dtype: f.default_dtype.bind(py).call0()?,
        deterministic: f.deterministic.bind(py).call0()?.extract()?,
    })
}

fn autocast_now<'py>(py: Python<'py>, f: &Fns, device: &str) -> PyResult<(bool, Bound<'py, PyAny>)> {
    Ok((f.autocast_enabled.bind(py).call1((device,))?.extract()?, f.autocast_dtype.bind(py).call1((device,))?))
}

fn b(x: bool) -> &'static str {
    if x {
        "True"
    } else {
        "False"
    }
}

fn s(x: &Bound<'_, PyAny>) -> String {
    x.str().map(|s| s.to_string()).unwrap_or_default()
}

impl Snapshot {
    pub fn capture(py: Python<'_>) -> Result<Snapshot> {
        let f = fns(py)?;
        let n = now(py, f)?;
        let mut autocast = Vec::new();
        let devices: &[&'static str] = if f.cuda_available { &["cpu", "cuda"] } else { &["cpu"] };
        for &d in devices {
            let (enabled, dtype) = autocast_now(py, f, d)?;
            autocast.push(Autocast { device: d, enabled, dtype: dtype.unbind() });
        }
        Ok(Snapshot { grad: n.grad, default_dtype: n.default_dtype.unbind(), deterministic: n.deterministic, autocast })
    }

    pub fn describe(&self) -> String {
        Python::attach(|py| {
            let ac: Vec<String> = self
                .autocast
                .iter()
                .map(|a| format!("autocast_{}=({}, {})", a.device, b(a.enabled), s(a.dtype.bind(py))))
                .collect();
            format!(
                "global_state(grad_enabled={}, default_dtype={}, deterministic_algorithms={}, {})",
                b(self.grad),
                s(self.default_dtype.bind(py)),
                b(self.deterministic),
                ac.join(", ")
            )
        })
    }

    pub fn check(&self, py: Python<'_>) -> bool {
        self.first_difference(py).map(|d| d.is_none()).unwrap_or(false)
    }

    /// None if the state is as captured, else "expr (got ...)".
    fn first_difference(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let f = fns(py)?;
        let n = now(py, f)?;
        if n.grad != self.grad {
            return Ok(Some(format!("torch.is_grad_enabled() == {} (got {})", b(self.grad), b(n.grad))));
        }
        if !n.default_dtype.is(self.default_dtype.bind(py)) {
            let (want, got) = (s(self.default_dtype.bind(py)), s(&n.default_dtype));
            return Ok(Some(format!("torch.get_default_dtype() == {want} (got {got})")));
        }
        if n.deterministic != self.deterministic {
            return Ok(Some(format!(
                "torch.are_deterministic_algorithms_enabled() == {} (got {})",
                b(self.deterministic),
                b(n.deterministic)
            )));
        }
        for a in &self.autocast {
            let (enabled, dtype) = autocast_now(py, f, a.device)?;
            if enabled != a.enabled {
                return Ok(Some(format!(
                    "torch.is_autocast_enabled('{}') == {} (got {})",
                    a.device,
                    b(a.enabled),
                    b(enabled)
                )));
            }
            if !dtype.is(a.dtype.bind(py)) {
                return Ok(Some(format!(
                    "torch.get_autocast_dtype('{}') == {} (got {})",
                    a.device,
                    s(a.dtype.bind(py)),
                    s(&dtype)
                )));
            }
        }
        Ok(None)
    }

    pub fn explain(&self, py: Python<'_>) -> Option<String> {
        match self.first_difference(py) {
            Ok(d) => d,
            Err(e) => Some(format!("{} (reading it raised {e})", self.describe())),
        }
    }
}
