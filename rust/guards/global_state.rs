//! The global-state leaf: torch's grad mode, default dtype, deterministic-algorithms flag and
//! autocast state (enabled and dtype) per device type, as captured at build time.
//!
//! Checked without Python calls through torch's own C++ readers (`crate::ffi::torch_state::StateFns`)
//! once each was verified against the Python API by toggling the state it reads and restoring
//! it; otherwise through torch's C-level functions (`torch._C.*`, no Python frames).
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::error::Result;
use crate::ffi::torch_state::StateFns;

struct Fns {
    grad: Py<PyAny>,
    default_dtype: Py<PyAny>,
    deterministic: Py<PyAny>,
    autocast_enabled: Py<PyAny>,
    autocast_dtype: Py<PyAny>,
    /// Device types checked (name, c10 DeviceType code).
    devices: Vec<(&'static str, i8)>,
    /// Direct readers, present only if verified.
    fast: Option<StateFns>,
}

static FNS: PyOnceLock<Fns> = PyOnceLock::new();

fn fns(py: Python<'_>) -> PyResult<&Fns> {
    FNS.get_or_try_init(py, || {
        let torch = py.import("torch")?;
        let c = torch.getattr("_C")?;
        let cuda_available: bool = torch
            .getattr("cuda")?
            .call_method0("is_available")?
            .extract()?;
        let mut devices = vec![("cpu", 0i8)];
        if cuda_available {
            devices.push(("cuda", 1));
        }
        let mut f = Fns {
            grad: c.getattr("is_grad_enabled")?.unbind(),
            default_dtype: c.getattr("get_default_dtype")?.unbind(),
            deterministic: c.getattr("_get_deterministic_algorithms")?.unbind(),
            autocast_enabled: c.getattr("is_autocast_enabled")?.unbind(),
            autocast_dtype: c.getattr("get_autocast_dtype")?.unbind(),
            devices,
            fast: None,
        };
        let lib = torch.getattr("__file__")?.extract::<String>()?;
        let lib = std::path::Path::new(&lib).with_file_name("lib");
        let path = |n: &str| lib.join(n).to_string_lossy().into_owned();
        if let Some(sf) = StateFns::resolve(&path("libc10.so"), &path("libtorch_cpu.so")) {
            // A reader that cannot be verified (even one whose check raised) is not used.
            // The state is put back as it was whatever happened.
            let saved = save(py, &f)?;
            let ok = verify(py, &f, &sf);
            restore(py, &f, &saved)?;
            if ok.unwrap_or(false) {
                f.fast = Some(sf);
            }
        }
        Ok(f)
    })
}

/// Whether the global-state leaf reads torch's state without Python calls.
pub fn fast_path(py: Python<'_>) -> PyResult<bool> {
    Ok(fns(py)?.fast.is_some())
}

/// Everything `verify` toggles: grad mode, default dtype, deterministic (mode, warn_only),
/// autocast (enabled, dtype) per device.
type Saved = (
    Py<PyAny>,
    Py<PyAny>,
    Py<PyAny>,
    Py<PyAny>,
    Vec<(Py<PyAny>, Py<PyAny>)>,
);

fn save(py: Python<'_>, f: &Fns) -> PyResult<Saved> {
    let c = py.import("torch")?.getattr("_C")?;
    let mut ac = Vec::new();
    for &(dev, _) in &f.devices {
        ac.push((
            f.autocast_enabled.bind(py).call1((dev,))?.unbind(),
            f.autocast_dtype.bind(py).call1((dev,))?.unbind(),
        ));
    }
    Ok((
        f.grad.bind(py).call0()?.unbind(),
        f.default_dtype.bind(py).call0()?.unbind(),
        f.deterministic.bind(py).call0()?.unbind(),
        c.call_method0("_get_deterministic_algorithms_warn_only")?
            .unbind(),
        ac,
    ))
}

fn restore(py: Python<'_>, f: &Fns, s: &Saved) -> PyResult<()> {
    let torch = py.import("torch")?;
    let c = torch.getattr("_C")?;
    c.call_method1("_set_grad_enabled", (&s.0,))?;
    torch.call_method1("set_default_dtype", (&s.1,))?;
    let kw = pyo3::types::PyDict::new(py);
    kw.set_item("warn_only", &s.3)?;
    c.call_method("_set_deterministic_algorithms", (&s.2,), Some(&kw))?;
    for (&(dev, _), (en, dt)) in f.devices.iter().zip(&s.4) {
        c.call_method1("set_autocast_enabled", (dev, en))?;
        c.call_method1("set_autocast_dtype", (dev, dt))?;
    }
    Ok(())
}

/// Each direct reader must agree with the Python API in two states of what it reads.
fn verify(py: Python<'_>, f: &Fns, sf: &StateFns) -> PyResult<bool> {
    let torch = py.import("torch")?;
    let c = torch.getattr("_C")?;
    let mut ok = true;
    // Grad mode (thread-local).
    let g: bool = f.grad.bind(py).call0()?.extract()?;
    ok &= sf.grad_enabled() == g;
    c.call_method1("_set_grad_enabled", (!g,))?;
    ok &= sf.grad_enabled() != g;
    c.call_method1("_set_grad_enabled", (g,))?;
    ok &= sf.grad_enabled() == g;
    // Default dtype: the code must change with it and come back.
    let d0 = f.default_dtype.bind(py).call0()?;
    let r0 = sf.default_dtype();
    let f64_ = torch.getattr("float64")?;
    let other = if d0.is(&f64_) {
        torch.getattr("float32")?
    } else {
        f64_
    };
    torch.call_method1("set_default_dtype", (&other,))?;
    let r1 = sf.default_dtype();
    torch.call_method1("set_default_dtype", (&d0,))?;
    ok &= r1 != r0 && sf.default_dtype() == r0;
    // Deterministic algorithms (keep warn_only as it was).
    let det: bool = f.deterministic.bind(py).call0()?.extract()?;
    let warn: bool = c
        .call_method0("_get_deterministic_algorithms_warn_only")?
        .extract()?;
    ok &= sf.deterministic() == det;
    let kw = pyo3::types::PyDict::new(py);
    kw.set_item("warn_only", warn)?;
    c.call_method("_set_deterministic_algorithms", (!det,), Some(&kw))?;
    ok &= sf.deterministic() != det;
    c.call_method("_set_deterministic_algorithms", (det,), Some(&kw))?;
    ok &= sf.deterministic() == det;
    // Autocast per device type.
    for &(dev, code) in &f.devices {
        let (en, dt) = autocast_now(py, f, dev)?;
        ok &= sf.autocast_enabled(code) == en;
        c.call_method1("set_autocast_enabled", (dev, !en))?;
        ok &= sf.autocast_enabled(code) != en;
        c.call_method1("set_autocast_enabled", (dev, en))?;
        ok &= sf.autocast_enabled(code) == en;
        let r0 = sf.autocast_dtype(code);
        let bf16 = torch.getattr("bfloat16")?;
        let other = if dt.is(&bf16) {
            torch.getattr("float16")?
        } else {
            bf16
        };
        c.call_method1("set_autocast_dtype", (dev, &other))?;
        let r1 = sf.autocast_dtype(code);
        c.call_method1("set_autocast_dtype", (dev, &dt))?;
        ok &= r1 != r0 && sf.autocast_dtype(code) == r0;
    }
    Ok(ok)
}

/// One device type's autocast state.
struct Autocast {
    device: &'static str,
    code: i8,
    enabled: bool,
    dtype: Py<PyAny>,
    dtype_raw: i8,
}

pub struct Snapshot {
    grad: bool,
    default_dtype: Py<PyAny>,
    default_dtype_raw: u16,
    deterministic: bool,
    autocast: Vec<Autocast>,
    fast: Option<StateFns>,
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

fn autocast_now<'py>(
    py: Python<'py>,
    f: &Fns,
    device: &str,
) -> PyResult<(bool, Bound<'py, PyAny>)> {
    Ok((
        f.autocast_enabled.bind(py).call1((device,))?.extract()?,
        f.autocast_dtype.bind(py).call1((device,))?,
    ))
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
        for &(d, code) in &f.devices {
            let (enabled, dtype) = autocast_now(py, f, d)?;
            let dtype_raw = f.fast.map(|sf| sf.autocast_dtype(code)).unwrap_or(0);
            autocast.push(Autocast {
                device: d,
                code,
                enabled,
                dtype: dtype.unbind(),
                dtype_raw,
            });
        }
        Ok(Snapshot {
            grad: n.grad,
            default_dtype: n.default_dtype.unbind(),
            default_dtype_raw: f.fast.map(|sf| sf.default_dtype()).unwrap_or(0),
            deterministic: n.deterministic,
            autocast,
            fast: f.fast,
        })
    }

    pub fn describe(&self) -> String {
        Python::attach(|py| {
            let ac: Vec<String> = self
                .autocast
                .iter()
                .map(|a| {
                    format!(
                        "autocast_{}=({}, {})",
                        a.device,
                        b(a.enabled),
                        s(a.dtype.bind(py))
                    )
                })
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

    /// The check from torch's state read directly; None when that path is off.
    #[inline]
    pub fn check_raw(&self) -> Option<bool> {
        let sf = self.fast.as_ref()?;
        Some(
            sf.grad_enabled() == self.grad
                && sf.default_dtype() == self.default_dtype_raw
                && sf.deterministic() == self.deterministic
                && self.autocast.iter().all(|a| {
                    sf.autocast_enabled(a.code) == a.enabled
                        && sf.autocast_dtype(a.code) == a.dtype_raw
                }),
        )
    }

    #[inline]
    pub fn check(&self, py: Python<'_>) -> bool {
        if let Some(ok) = self.check_raw() {
            return ok;
        }
        self.first_difference(py)
            .map(|d| d.is_none())
            .unwrap_or(false)
    }

    /// None if the state is as captured, else "expr (got ...)".
    fn first_difference(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let f = fns(py)?;
        let n = now(py, f)?;
        if n.grad != self.grad {
            return Ok(Some(format!(
                "torch.is_grad_enabled() == {} (got {})",
                b(self.grad),
                b(n.grad)
            )));
        }
        if !n.default_dtype.is(self.default_dtype.bind(py)) {
            let (want, got) = (s(self.default_dtype.bind(py)), s(&n.default_dtype));
            return Ok(Some(format!(
                "torch.get_default_dtype() == {want} (got {got})"
            )));
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
