//! `memleak record`: everything that runs while a recording is made, and
//! only that; the rest of the binary builds without BPF.
//!
//! [`session`] runs a recording and is the only child that uses the
//! others; each of them does one thing:
//! * [`args`]: the command line;
//! * [`capture`]: which capture records a command (the probes or the
//!   preloaded agent), the agent's memfd and environment;
//! * [`targets`]: where each target's allocator probes go;
//! * [`dataset`]: where `--dataset` puts a recording;
//! * [`inject`]: `--capture inject`, the agent into a running process;
//! * [`probes`]: loading and attaching the BPF program, the only module
//!   that touches libbpf;
//! * [`child`]: a command memleak starts, held with ptrace;
//! * [`private_libs`]: private copies of a command's allocator libraries;
//! * [`signals`]: SIGINT, SIGTERM and the stop signals;
//! * [`status`]: the status line while recording, and [`summary`] what
//!   is said at the end;
//! * [`live_report`]: `--interval`'s reports of the top outstanding
//!   stacks;
//! * [`unwinder`]: the unwind tables, built on a thread of their own;
//! * [`scan`]: the leak scan of a stopped target.

mod args;
mod capture;
mod child;
mod dataset;
mod inject;
mod live_report;
mod private_libs;
mod probes;
mod scan;
mod session;
mod signals;
mod status;
mod summary;
mod targets;
mod unwinder;

pub use args::RecordArgs;
pub use session::run;
