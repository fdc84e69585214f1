//! PgBouncer in transaction mode in front of a test cluster, with a small
//! server pool (2 by default) so server connections are swapped between
//! statements. PgBouncer refuses to run as root: as root it runs as `postgres`.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, User};

use ticklease_sandbox::{PgCluster, SandboxError as KitError};

/// A running pgbouncer; stopped on drop.
pub struct PgBouncer {
    dir: tempfile::TempDir,
    port: u16,
    child: Mutex<Option<Child>>,
    binary: PathBuf,
    user: Option<(Uid, Gid)>,
}

impl std::fmt::Debug for PgBouncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBouncer").field("port", &self.port).finish()
    }
}

fn binary() -> Result<PathBuf, KitError> {
    for dir in ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"] {
        let p = PathBuf::from(dir).join("pgbouncer");
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(KitError::Command {
        what: "find pgbouncer".into(),
        output: "install the Debian package pgbouncer".into(),
    })
}

impl PgBouncer {
    /// Starts pgbouncer in transaction mode with `pool_size` server connections
    /// per database, forwarding every database name to `cluster`.
    pub fn start(cluster: &PgCluster, pool_size: u32) -> Result<PgBouncer, KitError> {
        PgBouncer::start_inner(cluster, pool_size, "", false)
    }

    /// As [`PgBouncer::start`], with `settings` (lines of `[pgbouncer]`
    /// settings, as docs/runbook.md gives them) added to its configuration.
    pub fn start_with(cluster: &PgCluster, pool_size: u32, settings: &str) -> Result<PgBouncer, KitError> {
        PgBouncer::start_inner(cluster, pool_size, settings, false)
    }

    /// As [`PgBouncer::start`], in front of the server on `127.0.0.1:pg_port`
    /// (a Patroni member's, say).
    pub fn start_for_port(pg_port: u16, pool_size: u32) -> Result<PgBouncer, KitError> {
        PgBouncer::start_port(pg_port, pool_size, "", false)
    }

    pub(crate) fn start_inner(
        cluster: &PgCluster,
        pool_size: u32,
        settings: &str,
        die_with_parent: bool,
    ) -> Result<PgBouncer, KitError> {
        PgBouncer::start_port(cluster.port(), pool_size, settings, die_with_parent)
    }

    fn start_port(
        pg_port: u16,
        pool_size: u32,
        settings: &str,
        die_with_parent: bool,
    ) -> Result<PgBouncer, KitError> {
        let io = |what: &str| {
            let what = what.to_string();
            move |source| KitError::Io { what, source }
        };
        let binary = binary()?;
        let dir = tempfile::Builder::new()
            .prefix("ticklease-bouncer-")
            .tempdir()
            .map_err(io("create a temp dir"))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(io("pick a free port"))?
            .port();
        let config = format!(
            "[databases]\n* = host=127.0.0.1 port={pg} user=postgres\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = any\npool_mode = transaction\ndefault_pool_size = {pool_size}\n\
             max_client_conn = 1000\nmax_db_connections = 0\nserver_round_robin = 0\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             logfile = {log}\npidfile = {pid}\nadmin_users = postgres\n{settings}\n",
            pg = pg_port,
            log = dir.path().join("pgbouncer.log").display(),
            pid = dir.path().join("pgbouncer.pid").display(),
        );
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(&ini, config).map_err(io("write pgbouncer.ini"))?;
        let user = if Uid::effective().is_root() {
            let user = User::from_name("postgres")
                .ok()
                .flatten()
                .ok_or(KitError::NoPostgresUser)?;
            chown_all(&dir, user.uid, user.gid)?;
            Some((user.uid, user.gid))
        } else {
            None
        };
        let bouncer = PgBouncer {
            dir,
            port,
            child: Mutex::new(None),
            binary,
            user,
        };
        bouncer.spawn(die_with_parent)?;
        Ok(bouncer)
    }

    fn spawn(&self, die_with_parent: bool) -> Result<(), KitError> {
        let mut cmd = Command::new(&self.binary);
        cmd.arg(self.dir.path().join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        if die_with_parent {
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
                });
            }
        }
        let child = cmd.spawn().map_err(|source| KitError::Io {
            what: "spawn pgbouncer".into(),
            source,
        })?;
        *self.child.lock().expect("child lock") = Some(child);
        self.wait_listening()
    }

    /// Kills pgbouncer (every client connection drops) and starts it again on the same port.
    pub fn restart(&self) -> Result<(), KitError> {
        self.stop();
        // The old process may hold the port for a moment after it dies.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn(false) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn wait_listening(&self) -> Result<(), KitError> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Some(child) = self.child.lock().expect("child lock").as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(KitError::Command {
                        what: format!("pgbouncer exited ({status})"),
                        output: self.log(),
                    });
                }
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(KitError::StartTimeout {
            after: Duration::from_secs(10),
            log: self.log(),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    /// A client config for `dbname` through the bouncer.
    pub fn config(&self, dbname: &str) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        c.host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(dbname);
        c
    }

    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().expect("child lock").take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn chown_all(dir: &tempfile::TempDir, uid: Uid, gid: Gid) -> Result<(), KitError> {
    let err = |e: nix::Error| KitError::Io {
        what: "chown the bouncer dir".into(),
        source: e.into(),
    };
    nix::unistd::chown(dir.path(), Some(uid), Some(gid)).map_err(err)?;
    for entry in std::fs::read_dir(dir.path()).map_err(|source| KitError::Io {
        what: "list".into(),
        source,
    })? {
        let entry = entry.map_err(|source| KitError::Io {
            what: "list".into(),
            source,
        })?;
        nix::unistd::chown(&entry.path(), Some(uid), Some(gid)).map_err(err)?;
    }
    Ok(())
}
