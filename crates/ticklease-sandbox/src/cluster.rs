//! Throwaway Postgres clusters from the local server binaries.
//!
//! `initdb` into a temp dir, a postmaster on its own port and socket dir,
//! run as user `postgres` when the test runs as root (Postgres refuses root).
//! A fresh database per test; the cluster can be signalled (SIGKILL, SIGSTOP,
//! SIGCONT) and restarted.

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Gid, Pid, Uid, User};

/// Numbers the databases of every cluster in this process: a promoted standby
/// holds its primary's databases, so per-cluster numbering would collide.
static DATABASES: AtomicU32 = AtomicU32::new(0);

/// A server certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct ServerCert {
    pub cert_pem: String,
    pub key_pem: String,
}

/// How to start a cluster beyond the defaults.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ClusterOptions {
    /// The postmaster gets SIGQUIT when the thread that spawned it exits
    /// (see [`on_lasting_thread`]).
    pub die_with_parent: bool,
    /// `ssl=on` with this certificate, and TCP connections over TLS only
    /// (`hostssl`); the Unix socket stays plain.
    pub tls: Option<ServerCert>,
    /// Accepts streaming replication from 127.0.0.1 as `postgres`: a primary
    /// for [`crate::Standby`] (see [`PgCluster::start_primary`]).
    pub replication: bool,
    /// Loads `pg_stat_statements` (`shared_preload_libraries`), so a bench can
    /// count the statements its clients send.
    pub pg_stat_statements: bool,
    /// The server's wall clock starts at this UTC instant (`YYYY-MM-DD
    /// hh:mm:ss`) and runs on from there, under libfaketime (Debian
    /// `faketime`): the database clock at a chosen instant, whatever the
    /// host's (and so the clients') clock says.
    pub fake_time: Option<String>,
}

impl ClusterOptions {
    /// These options with `pg_stat_statements` loaded (the struct is
    /// `non_exhaustive`, so other crates set it here).
    pub fn with_pg_stat_statements(mut self) -> Self {
        self.pg_stat_statements = true;
        self
    }

    /// These options with the server's clock starting at `start` (UTC,
    /// `YYYY-MM-DD hh:mm:ss`); see [`ClusterOptions::fake_time`].
    pub fn with_fake_time(mut self, start: &str) -> Self {
        self.fake_time = Some(start.to_owned());
        self
    }
}

/// Where Debian's libfaketime keeps its library.
fn libfaketime() -> Result<PathBuf, SandboxError> {
    std::fs::read_dir("/usr/lib")
        .map_err(io("look for libfaketime"))?
        .filter_map(Result::ok)
        .map(|arch| arch.path().join("faketime/libfaketime.so.1"))
        .find(|lib| lib.is_file())
        .ok_or_else(|| {
            io("find libfaketime (install the Debian package faketime)")(std::io::ErrorKind::NotFound.into())
        })
}

/// Why a cluster could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    #[error(
        "no PostgreSQL server binaries found (looked at $TICKLEASE_PG_BINDIR, `pg_config --bindir` and \
         /usr/lib/postgresql/*/bin); install the Debian package postgresql-15 or set TICKLEASE_PG_BINDIR"
    )]
    NoBinaries,
    #[error("running as root and there is no `postgres` user to run the server as")]
    NoPostgresUser,
    #[error("{what} failed")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed: {output}")]
    Command { what: String, output: String },
    #[error("the postmaster did not accept connections within {after:?}; its log: {log}")]
    StartTimeout { after: Duration, log: String },
    #[error("database statement failed: {what}")]
    Db {
        what: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SandboxError {
    let what = what.into();
    move |source| SandboxError::Io { what, source }
}

/// How long a postmaster may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest wait of a restart for its port, held by a client connection's
/// local end (`PgCluster::respawn_postmaster`).
const RESPAWN_WAIT: Duration = Duration::from_secs(10);

/// The directory holding the server binaries.
pub fn bindir() -> Result<PathBuf, SandboxError> {
    let has_postgres = |p: &Path| p.join("postgres").is_file() && p.join("initdb").is_file();
    if let Some(dir) = std::env::var_os("TICKLEASE_PG_BINDIR").map(PathBuf::from) {
        return if has_postgres(&dir) {
            Ok(dir)
        } else {
            Err(SandboxError::NoBinaries)
        };
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_postgres(&dir) {
            return Ok(dir);
        }
    }
    let mut candidates: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, p)| has_postgres(p))
        .collect();
    candidates.sort();
    candidates.pop().map(|(_, p)| p).ok_or(SandboxError::NoBinaries)
}

/// The uid/gid to run the server as: `postgres` when we are root, else ourselves.
pub(crate) fn server_user() -> Result<Option<(Uid, Gid)>, SandboxError> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    let user = User::from_name("postgres")
        .ok()
        .flatten()
        .ok_or(SandboxError::NoPostgresUser)?;
    Ok(Some((user.uid, user.gid)))
}

pub(crate) fn free_port() -> Result<u16, SandboxError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("bind a free port"))?;
    Ok(listener.local_addr().map_err(io("read the bound port"))?.port())
}

/// A running Postgres cluster in a temp dir; stopped and removed on drop.
pub struct PgCluster {
    bindir: PathBuf,
    root: tempfile::TempDir,
    port: u16,
    user: Option<(Uid, Gid)>,
    postmaster: Mutex<Option<Child>>,
    /// The postmaster gets SIGQUIT when the thread that spawned it exits.
    die_with_parent: bool,
    /// The server's clock starts here (libfaketime).
    fake_time: Option<String>,
}

impl std::fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCluster")
            .field("root", &self.root.path())
            .field("port", &self.port)
            .finish()
    }
}

impl PgCluster {
    /// Starts a cluster of its own (for tests that kill or restart it).
    pub fn start() -> Result<PgCluster, SandboxError> {
        PgCluster::start_with(&ClusterOptions::default())
    }

    /// Starts a cluster of its own with `options`.
    pub fn start_with(options: &ClusterOptions) -> Result<PgCluster, SandboxError> {
        let cluster = PgCluster::prepare(options)?;
        cluster.initdb()?;
        if let Some(cert) = &options.tls {
            cluster.enable_tls(cert)?;
        }
        if options.replication {
            cluster.enable_replication()?;
        }
        if options.pg_stat_statements {
            append(
                &cluster.data_dir().join("postgresql.conf"),
                "shared_preload_libraries = 'pg_stat_statements'\n",
            )?;
        }
        cluster.spawn_postmaster()?;
        Ok(cluster)
    }

    /// Starts a cluster that a [`crate::Standby`] can stream from.
    pub fn start_primary() -> Result<PgCluster, SandboxError> {
        PgCluster::start_with(&ClusterOptions {
            replication: true,
            ..ClusterOptions::default()
        })
    }

    /// A cluster handle with its temp dir and socket dir made (owned by
    /// `postgres` when we are root), no data dir yet and no postmaster.
    pub(crate) fn prepare(options: &ClusterOptions) -> Result<PgCluster, SandboxError> {
        sweep_stale();
        let bindir = bindir()?;
        let user = server_user()?;
        let root = tempfile::Builder::new()
            .prefix("ticklease-pg-")
            .tempdir()
            .map_err(io("create a temp dir"))?;
        if let Some((uid, gid)) = user {
            nix::unistd::chown(root.path(), Some(uid), Some(gid))
                .map_err(|e| io("chown the temp dir to postgres")(e.into()))?;
        }
        let cluster = PgCluster {
            bindir,
            port: free_port()?,
            root,
            user,
            postmaster: Mutex::new(None),
            die_with_parent: options.die_with_parent,
            fake_time: options.fake_time.clone(),
        };
        std::fs::create_dir_all(cluster.socket_dir()).map_err(io("create the socket dir"))?;
        if let Some((uid, gid)) = user {
            nix::unistd::chown(&cluster.socket_dir(), Some(uid), Some(gid))
                .map_err(|e| io("chown the socket dir")(e.into()))?;
        }
        Ok(cluster)
    }

    fn initdb(&self) -> Result<(), SandboxError> {
        let out = self
            .command("initdb")
            .args(["-D"])
            .arg(self.data_dir())
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ])
            .output()
            .map_err(io("run initdb"))?;
        check_output("initdb", &out)
    }

    /// Spells out what streaming replication needs rather than trusting the
    /// server's defaults (which allow it in 15), and keeps WAL around so a
    /// standby that fell behind can still catch up.
    fn enable_replication(&self) -> Result<(), SandboxError> {
        let data = self.data_dir();
        append(
            &data.join("postgresql.conf"),
            "wal_level = replica\nmax_wal_senders = 10\nwal_keep_size = '256MB'\nhot_standby = on\n",
        )?;
        append(
            &data.join("pg_hba.conf"),
            "host replication postgres 127.0.0.1/32 trust\n",
        )
    }

    /// Writes the certificate and key where the server looks by default, turns
    /// `ssl` on and replaces pg_hba.conf with `hostssl` lines for TCP.
    fn enable_tls(&self, cert: &ServerCert) -> Result<(), SandboxError> {
        let data = self.data_dir();
        let files = [
            ("server.crt", cert.cert_pem.as_str(), 0o644),
            // The server refuses a key that group or others can read.
            ("server.key", cert.key_pem.as_str(), 0o600),
            (
                "pg_hba.conf",
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n",
                0o600,
            ),
        ];
        for (name, contents, mode) in files {
            let path = data.join(name);
            std::fs::write(&path, contents).map_err(io(format!("write {name}")))?;
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(io(format!("chmod {name}")))?;
            if let Some((uid, gid)) = self.user {
                nix::unistd::chown(&path, Some(uid), Some(gid))
                    .map_err(|e| io(format!("chown {name} to postgres"))(e.into()))?;
            }
        }
        append(&data.join("postgresql.conf"), "ssl = on\n")
    }

    /// One cluster shared by the tests of this process, started on first use.
    /// Tests get a fresh database each; tests that signal the postmaster use
    /// [`PgCluster::start`] instead.
    ///
    /// # Panics
    /// When the cluster cannot be started: tests have no better answer.
    pub fn shared() -> &'static PgCluster {
        static SHARED: OnceLock<PgCluster> = OnceLock::new();
        let options = ClusterOptions {
            die_with_parent: true,
            ..ClusterOptions::default()
        };
        SHARED.get_or_init(
            || match on_lasting_thread(move || PgCluster::start_with(&options)) {
                Ok(c) => c,
                Err(e) => panic!("could not start the shared Postgres cluster: {e}"),
            },
        )
    }

    pub(crate) fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bindir.join(program));
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        cmd.env_remove("PGDATA").env("LC_ALL", "C");
        cmd
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }
    pub fn socket_dir(&self) -> PathBuf {
        self.root.path().join("sock")
    }
    pub fn port(&self) -> u16 {
        self.port
    }
    /// The cluster's temp dir, removed with it.
    pub fn root_dir(&self) -> &Path {
        self.root.path()
    }
    fn log_path(&self) -> PathBuf {
        self.root.path().join("postmaster.log")
    }

    pub(crate) fn spawn_postmaster(&self) -> Result<(), SandboxError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(io("open the postmaster log"))?;
        let mut cmd = self.command("postgres");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.socket_dir())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
            ])
            .args([
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=400",
                "-c",
                "shared_buffers=64MB",
                // Tests prepare transactions (the fence must refuse it).
                "-c",
                "max_prepared_transactions=8",
            ])
            .args(["-c", "log_min_messages=warning"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io("dup the log"))?)
            .stderr(log);
        // Our own process group: a ^C at the terminal must not reach the server
        // before the test that owns it decides to stop it.
        cmd.process_group(0);
        if let Some(start) = &self.fake_time {
            // Backends are forked from the postmaster and keep its clock; the
            // monotonic clock (timeouts, sleeps) stays real.
            cmd.env("LD_PRELOAD", libfaketime()?)
                .env("FAKETIME", format!("@{start}"))
                .env("FAKETIME_DONT_RESET", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("TZ", "UTC");
        }
        if self.die_with_parent {
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    nix::sys::prctl::set_pdeathsig(Signal::SIGQUIT).map_err(std::io::Error::from)
                });
            }
        }
        let child = cmd.spawn().map_err(io("spawn postgres"))?;
        *self.postmaster.lock().expect("postmaster lock") = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&self) -> Result<(), SandboxError> {
        let started = Instant::now();
        let socket = self.socket_dir().join(format!(".s.PGSQL.{}", self.port));
        while started.elapsed() < START_TIMEOUT {
            if let Some(child) = self.postmaster.lock().expect("postmaster lock").as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(SandboxError::Command {
                        what: format!("postgres exited ({status})"),
                        output: self.log(),
                    });
                }
            }
            let ready = self
                .command("pg_isready")
                .args(["-q", "-h"])
                .arg(self.socket_dir())
                .args(["-p", &self.port.to_string(), "-U", "postgres"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if socket.exists() && ready {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(SandboxError::StartTimeout {
            after: START_TIMEOUT,
            log: self.log(),
        })
    }

    /// The postmaster's log so far.
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.log_path()) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// The postmaster's pid, while it runs.
    pub fn postmaster_pid(&self) -> Option<Pid> {
        self.postmaster
            .lock()
            .expect("postmaster lock")
            .as_ref()
            .map(|c| Pid::from_raw(c.id() as i32))
    }

    /// Sends `signal` to the postmaster (SIGKILL, SIGSTOP, SIGCONT, ...).
    pub fn signal(&self, signal: Signal) -> Result<(), SandboxError> {
        let pid = self.postmaster_pid().ok_or(SandboxError::Command {
            what: "signal the postmaster".into(),
            output: "not running".into(),
        })?;
        kill(pid, signal).map_err(|e| io(format!("send {signal} to the postmaster"))(e.into()))
    }

    /// Stops the postmaster immediately (SIGQUIT; SIGKILL after 10 s) and waits for it.
    pub fn stop(&self) {
        self.stop_with(Signal::SIGQUIT, Duration::from_secs(10));
    }

    /// Stops the postmaster cleanly (SIGINT, a fast shutdown: a checkpoint,
    /// and connected standbys get every WAL record first; SIGKILL after 30 s)
    /// and waits for it.
    pub fn stop_fast(&self) {
        self.stop_with(Signal::SIGINT, Duration::from_secs(30));
    }

    fn stop_with(&self, signal: Signal, grace: Duration) {
        let child = self.postmaster.lock().expect("postmaster lock").take();
        if let Some(mut child) = child {
            let pid = Pid::from_raw(child.id() as i32);
            let _ = kill(pid, Signal::SIGCONT);
            let _ = kill(pid, signal);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops and starts the postmaster on the same port and data dir.
    pub fn restart(&self) -> Result<(), SandboxError> {
        self.stop();
        self.respawn_postmaster()
    }

    /// As [`PgCluster::restart`], stopping with a fast shutdown ([`PgCluster::stop_fast`]).
    pub fn restart_fast(&self) -> Result<(), SandboxError> {
        self.stop_fast();
        self.respawn_postmaster()
    }

    /// Starts the postmaster again on its port. The port is from the
    /// kernel's ephemeral range, so while the server was down any client
    /// connection of this machine may have been given it as its local
    /// port; the bind then fails until that connection closes (seen in CI:
    /// "could not bind IPv4 address: Address already in use"). Retried
    /// for at most [`RESPAWN_WAIT`].
    fn respawn_postmaster(&self) -> Result<(), SandboxError> {
        let started = Instant::now();
        loop {
            match self.spawn_postmaster() {
                Err(SandboxError::Command { output, .. })
                    if output.contains("Address already in use") && started.elapsed() < RESPAWN_WAIT =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }

    /// A client config for `dbname` as the superuser, over TCP on 127.0.0.1.
    pub fn config(&self, dbname: &str) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        c.host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(dbname)
            .application_name("ticklease-test");
        c
    }

    /// The same as a URL, for child processes and the CLI.
    pub fn url(&self, dbname: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{dbname}", self.port)
    }

    /// Terminates every backend connected to `dbname` (as a crashed or
    /// restarted server would drop them). Returns how many were terminated.
    pub async fn terminate_backends(&self, dbname: &str) -> Result<i64, SandboxError> {
        let client = connect(&self.config("postgres")).await?;
        let row = client
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1",
                &[&dbname],
            )
            .await
            .map_err(|source| SandboxError::Db {
                what: "pg_terminate_backend".into(),
                source,
            })?;
        Ok(row.get(0))
    }

    /// Creates an empty database with a fresh name.
    pub async fn create_database(&self) -> Result<String, SandboxError> {
        let n = DATABASES.fetch_add(1, Ordering::Relaxed);
        let name = format!("t{}_{n}", std::process::id());
        let client = connect(&self.config("postgres")).await?;
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .map_err(|source| SandboxError::Db {
                what: format!("CREATE DATABASE {name}"),
                source,
            })?;
        Ok(name)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Appends `text` to a config file of the data dir.
pub(crate) fn append(path: &Path, text: &str) -> Result<(), SandboxError> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io(format!("append to {}", path.display())))
}

/// `Ok` when a server tool exited 0, else its stderr as the error.
pub(crate) fn check_output(what: &str, out: &std::process::Output) -> Result<(), SandboxError> {
    if out.status.success() {
        return Ok(());
    }
    Err(SandboxError::Command {
        what: what.into(),
        output: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs `start` on a thread that lives as long as the process and returns its
/// result. A server spawned there with a parent-death signal ends with the
/// process (a static is never dropped), not with the test thread that asked.
pub fn on_lasting_thread<T: Send + 'static>(start: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(start());
        loop {
            std::thread::park();
        }
    });
    rx.recv().expect("starter thread")
}

/// Removes cluster dirs left by test processes that died without cleaning up:
/// no live postmaster, untouched for ten minutes.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_name().to_string_lossy().starts_with("ticklease-pg-") {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(600));
        let alive = std::fs::read_to_string(path.join("data/postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next()?.trim().parse::<i32>().ok())
            .is_some_and(|pid| kill(Pid::from_raw(pid), None).is_ok());
        if old && !alive {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Connects one client and drives its connection on a task. TLS as the
/// config's `sslmode` says (by default: if the server offers it, unverified).
pub async fn connect(config: &tokio_postgres::Config) -> Result<tokio_postgres::Client, SandboxError> {
    let (client, connection) = ticklease::PgConnect::from(config.clone())
        .connect()
        .await
        .map_err(|source| SandboxError::Db {
            what: "connect".into(),
            source,
        })?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}
