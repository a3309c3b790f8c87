//! The built-in components of uct-rs, linked in one place.
//!
//! Built-in components register themselves with the registry through
//! `inventory` when their crate is linked into the program, and only then:
//! a crate that nothing in the program refers to is left out by the
//! compiler, and its transports are silently absent from
//! [`Registry::global`](uct_core::Registry::global). This crate refers to
//! every built-in crate, so a program that depends on it and calls [`link`]
//! (or names anything here) gets them all:
//!
//! | crate | component | what it brings |
//! |---|---|---|
//! | uct-core | `self` | the host MD and the `self` transport (always linked) |
//! | [`tl_sm`] | `sm` | `posix` and `cma` |
//! | [`tl_tcp`] | `tcp` | `tcp` |
//! | [`md_gaudi`] | `gaudi` | Gaudi memory domains over hl-thunk |
//!
//! The rc transport is not here: it links libibverbs, so it is the
//! loadable module `libuct_ib.so`, found by the registry at run time.
//! Nor is CUDA: md-cuda and the cuda_copy transport are the module
//! `libuct_cuda.so` (crate tl-cuda), so that no program links or needs the
//! CUDA driver; without it the module loads and says why it has no GPU.
//!
//! The tools and the test suite use this crate instead of listing the
//! built-in crates themselves; the C and Python fronts are to do the same.
//!
//! ```no_run
//! uct_builtins::link();
//! let registry = uct_core::Registry::global();
//! ```
//!
//! The crates are re-exported for code that needs their types, such as
//! `uct_builtins::md_gaudi::GaudiMd`.

pub use md_gaudi;
pub use tl_sm;
pub use tl_tcp;

/// Makes sure the built-in components are linked into this program. It
/// does nothing at run time: calling it (once, anywhere, typically at the
/// top of `main`) is what keeps this crate, and through its re-exports
/// every built-in crate, in the link, so that their `inventory`
/// registrations reach the registry.
pub fn link() {}
