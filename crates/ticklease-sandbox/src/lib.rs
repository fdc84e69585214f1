//! # ticklease-sandbox: the system on one machine
//!
//! What `ticklease demo`, the end-to-end tests and the chaos run stand on: a
//! throwaway Postgres cluster ([`PgCluster`]) and its streaming standby
//! ([`Standby`]), in-process network peers (a payment provider and webhook
//! receivers, [`HttpPeer`]; an SMTP sink, [`SmtpSink`]), reference-worker
//! processes ([`WorkerProcess`]), and the
//! effects audit that checks what the stores say against what the peers
//! received ([`audit`]).

pub mod audit;
pub mod cluster;
pub mod patroni;
pub mod peers;
pub mod standby;
pub mod worker;

pub use audit::{Audit, AuditError, Violation};
pub use cluster::{connect, on_lasting_thread, ClusterOptions, PgCluster, SandboxError, ServerCert};
pub use patroni::{FrozenLoop, PatroniCluster};
pub use peers::{HttpPeer, SmtpSink};
pub use standby::{config_for_hosts, url_for_hosts, Standby};
pub use worker::WorkerProcess;

/// Sends `signal` to a child process (if it still has a pid).
pub fn signal(child: &tokio::process::Child, signal: nix::sys::signal::Signal) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
    }
}
