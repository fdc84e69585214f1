//! TLS to Postgres: libpq's `sslmode` and `sslrootcert` over rustls.
//!
//! tokio-postgres parses only `sslmode=disable|prefer|require` and no
//! `sslrootcert`, so [`PgConnect`] takes those two parameters out of the URL
//! (or keyword/value string) itself, hands the rest to tokio-postgres, and
//! builds the rustls connector that gives each mode libpq's meaning:
//!
//! | `sslmode`     | TLS                          | server certificate checked             |
//! |---------------|------------------------------|----------------------------------------|
//! | `disable`     | never                        | –                                      |
//! | `prefer`      | if the server offers it      | chain, only when `sslrootcert` is set  |
//! | `require`     | always                       | chain, only when `sslrootcert` is set  |
//! | `verify-ca`   | always                       | chain                                  |
//! | `verify-full` | always                       | chain and host name                    |
//!
//! The chain is checked against `sslrootcert` (a PEM file), or the platform's
//! roots when it is absent or `system`. Without `sslmode` the mode is
//! `prefer`, as in libpq (`verify-full` with `sslrootcert=system`).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use percent_encoding::percent_decode_str;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How a connection uses TLS, with libpq's names and meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS when the server offers it, else plain.
    Prefer,
    /// TLS or no connection; the certificate is checked only against an explicit `sslrootcert`.
    Require,
    /// TLS with a certificate chaining to a trusted root, for any host name.
    VerifyCa,
    /// TLS with a certificate chaining to a trusted root and naming the host.
    VerifyFull,
}

impl SslMode {
    /// The `sslmode` value, as written in a URL.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// The mode tokio-postgres runs its TLS negotiation in; verification is rustls's part.
    fn negotiation(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = PgConnectError;

    fn from_str(s: &str) -> Result<Self, PgConnectError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return Err(PgConnectError::SslMode { value: s.to_string() }),
        })
    }
}

/// A connection string that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgConnectError {
    /// An unknown `sslmode`.
    #[error("sslmode {value:?} is not one of disable, prefer, require, verify-ca, verify-full")]
    SslMode {
        /// The value given.
        value: String,
    },
    /// The rest of the string is not a valid connection string.
    #[error("invalid connection string")]
    Config {
        /// tokio-postgres's parse error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A host list parameter of a URL that libpq would refuse too.
    #[error("{param} {value:?} in the URL is not {expected}")]
    UrlParam {
        /// `host`, `hostaddr` or `port`.
        param: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// The CA file cannot be read.
    #[error("could not read sslrootcert {path:?}")]
    RootCertRead {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// The CA file holds no certificate.
    #[error("sslrootcert {path:?} holds no usable PEM certificate")]
    RootCertEmpty {
        /// The file.
        path: PathBuf,
    },
    /// A verify mode without `sslrootcert`, on a machine without a CA store.
    #[error("no trusted root certificates found on this platform; name a CA file with sslrootcert")]
    NoPlatformRoots,
    /// `sslrootcert=system` with a mode that does not check the host name.
    #[error("sslrootcert=system needs sslmode=verify-full, not {mode}")]
    SystemRootsNeedVerifyFull {
        /// The mode given.
        mode: SslMode,
    },
    /// `verify-ca` without `sslrootcert`.
    #[error("sslmode=verify-ca needs sslrootcert (a CA file): against the platform's roots, without the host name check, any certificate bought for any name would pass")]
    VerifyCaNeedsRootCert,
}

/// Where to reach Postgres and how to secure the connection: a
/// `tokio_postgres::Config` plus the TLS its `sslmode` and `sslrootcert` ask for.
///
/// Parse it from a URL or keyword/value string
/// (`"postgres://app@db.internal/app?sslmode=verify-full&sslrootcert=/etc/ca.pem".parse()`);
/// a bare `tokio_postgres::Config` converts with its own `sslmode` and no
/// certificate check.
#[derive(Clone)]
pub struct PgConnect {
    config: tokio_postgres::Config,
    ssl_mode: SslMode,
    roots: Roots,
    tls: PgTls,
}

/// Which roots a certificate chain is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    Unchecked,
    File(PathBuf),
    Platform,
}

impl std::fmt::Debug for PgConnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConnect")
            .field("config", &self.config)
            .field("ssl_mode", &self.ssl_mode)
            .field("roots", &self.roots)
            .finish()
    }
}

impl PgConnect {
    /// `config` with `ssl_mode`, checking certificates against the PEM file
    /// `root_cert` (`system`, or `None` with verify-full: the platform's roots;
    /// verify-ca needs a file).
    /// The config's own `ssl_mode` is replaced.
    pub fn new(
        mut config: tokio_postgres::Config,
        ssl_mode: SslMode,
        root_cert: Option<&Path>,
    ) -> Result<Self, PgConnectError> {
        let roots = match root_cert {
            Some(path) if path == Path::new("system") => {
                // libpq refuses the weaker modes here: trusting every public CA
                // without checking the name would trust any certificate bought
                // for any name.
                if ssl_mode != SslMode::VerifyFull {
                    return Err(PgConnectError::SystemRootsNeedVerifyFull { mode: ssl_mode });
                }
                Roots::Platform
            }
            Some(path) => Roots::File(path.to_path_buf()),
            None if ssl_mode == SslMode::VerifyCa => return Err(PgConnectError::VerifyCaNeedsRootCert),
            None if ssl_mode == SslMode::VerifyFull => Roots::Platform,
            None => Roots::Unchecked,
        };
        let store = match &roots {
            Roots::Unchecked => None,
            Roots::File(path) => Some(file_roots(path)?),
            Roots::Platform => Some(platform_roots()?),
        };
        config.ssl_mode(ssl_mode.negotiation());
        Ok(PgConnect {
            config,
            ssl_mode,
            roots,
            tls: PgTls::new(ssl_mode, store),
        })
    }

    /// The tokio-postgres config, its `ssl_mode` set to the TLS negotiation to run.
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// The tokio-postgres config, to tune socket options (TLS stays as set).
    pub(crate) fn config_mut(&mut self) -> &mut tokio_postgres::Config {
        &mut self.config
    }

    /// The `sslmode` asked for.
    pub fn ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }

    /// The TLS connector, for `Config::connect` or a pool manager.
    pub fn tls(&self) -> PgTls {
        self.tls.clone()
    }

    /// This config named in `pg_stat_activity` as ticklease's, `ticklease
    /// <what> <host>:<pid>` (the holder ids of this process start with
    /// `<host>:<pid>`), unless the URL set an `application_name`.
    pub(crate) fn named(mut self, what: &str) -> Self {
        if self.config.get_application_name().is_none() {
            let name = format!(
                "ticklease {what} {}:{}",
                gethostname::gethostname().to_string_lossy(),
                std::process::id()
            );
            self.config.application_name(&name);
        }
        self
    }

    /// Opens one connection; drive the returned `Connection` on a task.
    pub async fn connect(&self) -> Result<(Client, Connection<Socket, PgTlsStream>), tokio_postgres::Error> {
        self.config.connect(self.tls()).await
    }
}

impl FromStr for PgConnect {
    type Err = PgConnectError;

    /// Parses a `postgres://` URL or a keyword/value string, with
    /// `sslmode=disable|prefer|require|verify-ca|verify-full` and `sslrootcert`.
    fn from_str(s: &str) -> Result<Self, PgConnectError> {
        let (rest, params) = take_ssl_params(s);
        let config = super::url::parse(&rest).map_err(|e| match e {
            super::url::UrlError::Config(source) => PgConnectError::Config { source },
            super::url::UrlError::Param {
                param,
                value,
                expected,
            } => PgConnectError::UrlParam {
                param,
                value,
                expected,
            },
        })?;
        let root_cert = params.root_cert.map(PathBuf::from);
        let ssl_mode = match params.mode {
            Some(mode) => mode.parse()?,
            None if root_cert.as_deref() == Some(Path::new("system")) => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        PgConnect::new(config, ssl_mode, root_cert.as_deref())
    }
}

impl From<tokio_postgres::Config> for PgConnect {
    /// Keeps the config's `sslmode` (disable, prefer or require), encrypting
    /// without a certificate check as libpq does without `sslrootcert`.
    fn from(config: tokio_postgres::Config) -> Self {
        let ssl_mode = match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => SslMode::Disable,
            tokio_postgres::config::SslMode::Prefer => SslMode::Prefer,
            // Require; tokio-postgres 0.7 parses no stronger mode.
            _ => SslMode::Require,
        };
        PgConnect {
            config,
            ssl_mode,
            roots: Roots::Unchecked,
            tls: PgTls::new(ssl_mode, None),
        }
    }
}

/// The TLS stream of a connection made with [`PgTls`].
pub type PgTlsStream = <PgTls as MakeTlsConnect<Socket>>::Stream;

/// The rustls connector of a [`PgConnect`]: a `MakeTlsConnect` for
/// tokio-postgres and deadpool-postgres.
#[derive(Clone)]
pub struct PgTls(MakeRustlsConnect);

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgTls")
    }
}

impl PgTls {
    fn new(mode: SslMode, roots: Option<RootCertStore>) -> Self {
        // ring explicitly, not the process default: the default panics when
        // another crate in the binary enables a second provider.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions");
        let config = match (mode, roots) {
            (SslMode::VerifyFull, Some(roots)) => builder.with_root_certificates(roots),
            (_, roots) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly {
                    roots: roots.map(Arc::new),
                    provider,
                })),
        }
        .with_no_client_auth();
        PgTls(MakeRustlsConnect::new(config))
    }
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        MakeTlsConnect::<S>::make_tls_connect(&mut self.0, domain)
    }
}

/// `verify-ca`, and `prefer`/`require` (with `roots: None`, no check at all):
/// the chain is checked, the host name is not. The handshake signatures are
/// always checked, so the peer holds the key of the certificate it sent.
#[derive(Debug)]
struct ChainOnly {
    roots: Option<Arc<RootCertStore>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &ParsedCertificate::try_from(end_entity)?,
                roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn file_roots(path: &Path) -> Result<RootCertStore, PgConnectError> {
    let pem = std::fs::read(path).map_err(|source| PgConnectError::RootCertRead {
        path: path.to_path_buf(),
        source,
    })?;
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(CertificateDer::pem_slice_iter(&pem).flatten());
    if roots.is_empty() {
        return Err(PgConnectError::RootCertEmpty {
            path: path.to_path_buf(),
        });
    }
    Ok(roots)
}

fn platform_roots() -> Result<RootCertStore, PgConnectError> {
    // Unreadable entries are skipped, as a browser would; only none at all is an error.
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(PgConnectError::NoPlatformRoots);
    }
    Ok(roots)
}

/// The `sslmode` and `sslrootcert` values, taken out of a connection string.
#[derive(Debug, Default, PartialEq, Eq)]
struct SslParams {
    mode: Option<String>,
    root_cert: Option<String>,
}

impl SslParams {
    /// Keeps `value` if `key` is ours; the last occurrence wins, as in libpq.
    /// Drops the options other drivers read from a URL the service shares
    /// with ticklease ([`FOREIGN_OPTIONS`]).
    fn take(&mut self, key: &str, value: String) -> bool {
        match key {
            "sslmode" => self.mode = Some(value),
            "sslrootcert" => self.root_cert = Some(value),
            _ if FOREIGN_OPTIONS.contains(&key) => {}
            _ => return false,
        }
        true
    }
}

/// URL options of other Rust drivers that a connection string shared with
/// the application may carry, accepted and ignored: sqlx's statement cache
/// size (ticklease prepares no named statements). Any other unknown option
/// is refused by name.
pub const FOREIGN_OPTIONS: &[&str] = &["statement-cache-capacity"];

/// Splits `s` into the string tokio-postgres should parse and our parameters.
/// A string this cannot tokenize is returned whole, for tokio-postgres to
/// report its error.
fn take_ssl_params(s: &str) -> (String, SslParams) {
    let mut params = SslParams::default();
    let rest = match ["postgres://", "postgresql://"].iter().any(|p| s.starts_with(p)) {
        true => take_from_url(s, &mut params),
        false => take_from_keywords(s, &mut params),
    };
    match rest {
        Some(rest) => (rest, params),
        None => (s.to_string(), SslParams::default()),
    }
}

fn take_from_url(s: &str, params: &mut SslParams) -> Option<String> {
    // As libpq (and url.rs): credentials end at an '@' met before the first
    // '/' after the scheme; the query starts at the next '?'.
    let authority = s.find("://").map_or(0, |i| i + 3);
    let after_credentials = s[authority..]
        .find(['@', '/'])
        .filter(|&i| s[authority + i..].starts_with('@'))
        .map_or(authority, |i| authority + i + 1);
    let Some(q) = s[after_credentials..].find('?').map(|q| q + after_credentials) else {
        return Some(s.to_string());
    };
    let mut kept = Vec::new();
    for pair in s[q + 1..].split('&') {
        let taken = pair.split_once('=').is_some_and(|(key, value)| {
            let key = percent_decode_str(key).decode_utf8_lossy();
            let value = percent_decode_str(value).decode_utf8_lossy().into_owned();
            params.take(&key, value)
        });
        if !taken {
            kept.push(pair);
        }
    }
    let mut rest = s[..q].to_string();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    Some(rest)
}

/// Cuts our parameters out of a keyword/value string, tokenized as
/// tokio-postgres (and libpq) do: `key = value`, values optionally in single
/// quotes, a backslash escaping the next character.
fn take_from_keywords(s: &str, params: &mut SslParams) -> Option<String> {
    let mut rest = String::new();
    let mut it = s.char_indices().peekable();
    let mut kept_from = 0;
    loop {
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = it.peek() else { break };
        let mut key = String::new();
        while let Some((_, c)) = it.next_if(|(_, c)| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        it.next_if(|(_, c)| *c == '=')?;
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        let quoted = it.next_if(|(_, c)| *c == '\'').is_some();
        loop {
            match it.next() {
                Some((_, '\'')) if quoted => break,
                Some((_, c)) if c.is_whitespace() && !quoted => break,
                Some((_, '\\')) => value.extend(it.next().map(|(_, c)| c)),
                Some((_, c)) => value.push(c),
                None if quoted => return None,
                None => break,
            }
        }
        if !quoted && value.is_empty() {
            return None;
        }
        let end = it.peek().map_or(s.len(), |&(i, _)| i);
        if params.take(&key, value) {
            rest.push_str(&s[kept_from..start]);
            kept_from = end;
        }
    }
    rest.push_str(&s[kept_from..]);
    Some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> (String, Option<&'static str>, Option<&'static str>) {
        let (rest, p) = take_ssl_params(s);
        let leak = |v: Option<String>| v.map(|v| &*v.leak());
        (rest, leak(p.mode), leak(p.root_cert))
    }

    #[test]
    fn url_parameters_are_taken_out_and_the_others_kept_in_order() {
        assert_eq!(
            split("postgres://u:p%3F@h:5/db?application_name=a&sslmode=verify-full&sslrootcert=%2Fca%20dir%2Fr.pem&connect_timeout=3"),
            (
                "postgres://u:p%3F@h:5/db?application_name=a&connect_timeout=3".into(),
                Some("verify-full"),
                Some("/ca dir/r.pem")
            )
        );
        assert_eq!(
            split("postgresql://h/db?sslmode=require"),
            ("postgresql://h/db".into(), Some("require"), None)
        );
        assert_eq!(split("postgres://h/db"), ("postgres://h/db".into(), None, None));
        // An '@' after the first '/' is no credential's end (libpq's rule).
        assert_eq!(
            split("postgres://h/d?application_name=a@b&sslmode=require"),
            (
                "postgres://h/d?application_name=a@b".into(),
                Some("require"),
                None
            )
        );
    }

    #[test]
    fn a_url_shared_with_sqlx_parses_and_other_unknown_options_are_refused() {
        let shared: PgConnect = "postgres://u@h/db?sslmode=disable&statement-cache-capacity=0"
            .parse()
            .unwrap();
        assert_eq!(shared.config().get_dbname(), Some("db"));
        let err = "postgres://u@h/db?statement_cache=0"
            .parse::<PgConnect>()
            .unwrap_err();
        assert!(
            crate::error::chain(&err).contains("statement_cache"),
            "{}",
            crate::error::chain(&err)
        );
    }

    #[test]
    fn keyword_parameters_are_cut_out_quoted_or_not() {
        assert_eq!(
            split(r"host=h sslmode = 'verify-ca' sslrootcert='/a b/it\'s.pem' dbname=x"),
            (
                "host=h   dbname=x".into(),
                Some("verify-ca"),
                Some("/a b/it's.pem")
            )
        );
        assert_eq!(
            split(r"sslrootcert=/c\ d.pem user=u"),
            ("user=u".into(), None, Some("/c d.pem"))
        );
    }

    #[test]
    fn an_untokenizable_keyword_string_is_left_to_tokio_postgres() {
        let (rest, params) = take_ssl_params("host=h sslmode='require");
        assert_eq!(rest, "host=h sslmode='require");
        assert_eq!(params, SslParams::default());
        let err = "host=h sslmode='require".parse::<PgConnect>().unwrap_err();
        assert!(matches!(err, PgConnectError::Config { .. }), "{err:?}");
    }

    #[test]
    fn the_mode_maps_to_the_negotiation_tokio_postgres_runs() {
        for (url, mode, negotiation) in [
            (
                "postgres://h/db",
                SslMode::Prefer,
                tokio_postgres::config::SslMode::Prefer,
            ),
            (
                "postgres://h/db?sslmode=disable",
                SslMode::Disable,
                tokio_postgres::config::SslMode::Disable,
            ),
            (
                "host=h sslmode=require",
                SslMode::Require,
                tokio_postgres::config::SslMode::Require,
            ),
        ] {
            let pg: PgConnect = url.parse().unwrap();
            assert_eq!(pg.ssl_mode(), mode, "{url}");
            assert_eq!(pg.config().get_ssl_mode(), negotiation, "{url}");
        }
    }

    #[test]
    fn system_roots_refuse_the_modes_weaker_than_verify_full() {
        let err = "postgres://h/db?sslmode=require&sslrootcert=system"
            .parse::<PgConnect>()
            .unwrap_err();
        assert!(matches!(
            err,
            PgConnectError::SystemRootsNeedVerifyFull {
                mode: SslMode::Require
            }
        ));
    }
}
