//! Torch's global state (grad mode, default dtype, deterministic algorithms, autocast) read
//! through torch's exported C++ functions found with `dlsym`; the global-state leaf uses them
//! only after `crate::guards::global_state` verified each against the Python API.
#![allow(unsafe_code)]

type BoolFn = unsafe extern "C" fn() -> bool;
type U16Fn = unsafe extern "C" fn() -> u16;
type PtrFn = unsafe extern "C" fn() -> *const std::ffi::c_void;
type CtxBoolFn = unsafe extern "C" fn(*const std::ffi::c_void) -> bool;
type DevBoolFn = unsafe extern "C" fn(i8) -> bool;
type DevI8Fn = unsafe extern "C" fn(i8) -> i8;

/// Torch's own readers of the state the global-state leaf guards, found with dlsym:
/// `c10::GradMode::is_enabled()`, `c10::get_default_dtype()` (a `TypeMeta`, one u16),
/// `at::globalContext().deterministicAlgorithms()`, `at::autocast::is_autocast_enabled(
/// DeviceType)` and `at::autocast::get_autocast_dtype(DeviceType)` (a `ScalarType`, one i8).
/// All take/return trivially copyable scalars, so the C calling convention matches. They are
/// only used after `crate::guards::global_state` verified each against the Python API.
#[derive(Clone, Copy)]
pub struct StateFns {
    grad: BoolFn,
    default_dtype: U16Fn,
    ctx: *const std::ffi::c_void,
    deterministic: CtxBoolFn,
    autocast_enabled: DevBoolFn,
    autocast_dtype: DevI8Fn,
}

// SAFETY: plain function pointers and the address of torch's process-wide Context singleton.
unsafe impl Send for StateFns {}
unsafe impl Sync for StateFns {}

fn sym(lib: *mut std::ffi::c_void, name: &std::ffi::CStr) -> Option<*mut std::ffi::c_void> {
    // SAFETY: lib is a live handle from dlopen; dlsym only looks the name up.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn open_loaded(path: &str) -> Option<*mut std::ffi::c_void> {
    let c = std::ffi::CString::new(path).ok()?;
    // SAFETY: RTLD_NOLOAD only returns a handle to a library torch already loaded (no
    // initialisers run); the handle is intentionally never closed.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    (!h.is_null()).then_some(h)
}

impl StateFns {
    /// Look the functions up in torch's already-loaded `libc10.so` and `libtorch_cpu.so`.
    pub fn resolve(libc10: &str, libtorch_cpu: &str) -> Option<StateFns> {
        let c10 = open_loaded(libc10)?;
        let cpu = open_loaded(libtorch_cpu)?;
        let grad = sym(c10, c"_ZN3c108GradMode10is_enabledEv")?;
        let dd = sym(c10, c"_ZN3c1017get_default_dtypeEv")?;
        let gc = sym(cpu, c"_ZN2at13globalContextEv")?;
        let det = sym(cpu, c"_ZNK2at7Context23deterministicAlgorithmsEv")?;
        let ace = sym(
            cpu,
            c"_ZN2at8autocast19is_autocast_enabledEN3c1010DeviceTypeE",
        )?;
        let acd = sym(
            cpu,
            c"_ZN2at8autocast18get_autocast_dtypeEN3c1010DeviceTypeE",
        )?;
        // SAFETY: the symbols are the functions named above, whose C++ signatures match these
        // types (no arguments or scalar arguments, scalar results, no exceptions for the
        // device types we pass: those verified through Python first).
        unsafe {
            let gc: PtrFn = std::mem::transmute::<*mut std::ffi::c_void, PtrFn>(gc);
            let ctx = gc();
            if ctx.is_null() {
                return None;
            }
            Some(StateFns {
                grad: std::mem::transmute::<*mut std::ffi::c_void, BoolFn>(grad),
                default_dtype: std::mem::transmute::<*mut std::ffi::c_void, U16Fn>(dd),
                ctx,
                deterministic: std::mem::transmute::<*mut std::ffi::c_void, CtxBoolFn>(det),
                autocast_enabled: std::mem::transmute::<*mut std::ffi::c_void, DevBoolFn>(ace),
                autocast_dtype: std::mem::transmute::<*mut std::ffi::c_void, DevI8Fn>(acd),
            })
        }
    }

    #[inline]
    pub fn grad_enabled(&self) -> bool {
        // SAFETY: see `resolve`.
        unsafe { (self.grad)() }
    }

    #[inline]
    pub fn default_dtype(&self) -> u16 {
        // SAFETY: see `resolve`.
        unsafe { (self.default_dtype)() }
    }

    #[inline]
    pub fn deterministic(&self) -> bool {
        // SAFETY: see `resolve`; ctx is torch's global Context, which lives for the process.
        unsafe { (self.deterministic)(self.ctx) }
    }

    /// `device_type` must be one verified through the Python API (cpu, cuda).
    #[inline]
    pub fn autocast_enabled(&self, device_type: i8) -> bool {
        // SAFETY: see `resolve`.
        unsafe { (self.autocast_enabled)(device_type) }
    }

    #[inline]
    pub fn autocast_dtype(&self, device_type: i8) -> i8 {
        // SAFETY: see `resolve`.
        unsafe { (self.autocast_dtype)(device_type) }
    }
}

/// `torch::jit::tracer::getTracingState()` (libtorch_cpu, torch/csrc/jit/frontend/tracer.h):
/// returns a reference to this thread's `std::shared_ptr<TracingState>`, whose first word
/// (libstdc++'s `_M_ptr`) is non-null while a JIT trace runs; `torch._C._is_tracing()` is
/// `static_cast<bool>` of it. Read directly it costs a call instead of a Python call.
#[derive(Clone, Copy)]
pub struct TracingReader {
    state: PtrFn,
}

// SAFETY: a plain function pointer.
unsafe impl Send for TracingReader {}
unsafe impl Sync for TracingReader {}

impl TracingReader {
    /// Look the function up in torch's already-loaded `libtorch_cpu.so`.
    pub fn resolve(libtorch_cpu: &str) -> Option<TracingReader> {
        let cpu = open_loaded(libtorch_cpu)?;
        let f = sym(cpu, c"_ZN5torch3jit6tracer15getTracingStateEv")?;
        // SAFETY: the symbol is the function named above: no arguments, returns a reference
        // (an address) to a thread-local shared_ptr, never throws.
        Some(TracingReader {
            state: unsafe { std::mem::transmute::<*mut std::ffi::c_void, PtrFn>(f) },
        })
    }

    /// Whether a JIT trace is running on this thread.
    #[inline]
    pub fn is_tracing(&self) -> bool {
        // SAFETY: see `resolve`; the reference is to a live thread-local shared_ptr whose
        // first word is its stored pointer.
        unsafe {
            let sp = (self.state)() as *const *const std::ffi::c_void;
            !sp.is_null() && !(*sp).is_null()
        }
    }
}
