//! Safe RAII wrapper over the IREE runtime C API (`iree-sys`): instance,
//! device by URI, session, vmfb modules, calls by function name, typed buffer
//! views in and out, parameters (weights) from `.safetensors`/`.irpa` files or
//! host memory served through the `io_parameters` module, and parameter encoder
//! modules run once to store a module's parameters in their final layout
//! ([`encode_parameters`]).
//!
//! Every IREE object has one Rust type; `Clone` retains and `Drop` releases.
//! Every `iree_status_t` becomes an owned [`Error`] at once (code + IREE's
//! formatted message), and the status is freed.
//!
//! # Threads
//! None of the handle types is `Send` or `Sync`. They wrap raw IREE pointers;
//! although IREE reference counts are atomic and many IREE objects are
//! internally synchronised, this crate does not audit that, so the compiler
//! keeps every handle on the thread that created it.
//!
//! Separate stacks (instance, device, session) on separate threads may run at
//! the same time, also while other threads load theirs: the process has one
//! IREE runtime instance and one driver per driver name, both created once
//! under a lock (see [`Instance`] for the IREE globals that make this
//! necessary). No lock is taken around calls.
//!
//! # Example
//! ```no_run
//! # fn main() -> Result<(), iree_hal::Error> {
//! use iree_hal::{Instance, Parameters, Session};
//! let instance = Instance::new()?;
//! let device = instance.device("local-task")?;
//! let mut session = Session::new(&instance, &device)?;
//! let mut weights = Parameters::new("model")?;
//! weights.add_file("model.safetensors")?;
//! session.append_parameters(&[&weights])?; // before the module that reads them
//! session.load_vmfb_file("model.vmfb")?;
//! let x = device.upload(&[4], &[1.0f32, 2.0, 3.0, 4.0])?;
//! let y = session.call("module.matvec", &[&x])?;
//! let y: Vec<f32> = y[0].to_vec()?;
//! # let _ = y; Ok(()) }
//! ```

mod aligned;
mod buffer_view;
mod device;
mod element;
mod encoder;
mod error;
mod instance;
mod module;
mod parameters;
mod session;

pub use buffer_view::BufferView;
pub use device::Device;
pub use element::{Element, ElementType};
pub use encoder::{EncodeReport, encode_parameters};
pub use error::{Error, Result, StatusCode};
pub use instance::{DriverInfo, Instance};
pub use module::Module;
pub use parameters::Parameters;
pub use session::{Function, Session};

pub use half;
/// Re-export of the raw bindings, for what this crate does not wrap.
pub use iree_sys as sys;
