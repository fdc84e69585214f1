//! `postgres://` URLs read as libpq 15 reads them (`conninfo_uri_parse_options`
//! and `conninfo_uri_parse_params` in `fe-connect.c`, then the host, hostaddr
//! and port lists as `pqConnectOptions2` splits them), or refused with a
//! [`UrlError::Param`] naming the problem. tokio-postgres's own URL parser
//! reads `?host=db1,db2` as one host named `db1,db2`, appends `?port=` to the
//! authority's ports, and takes the first `@` anywhere as the end of the
//! user-info. Here the URL is split into libpq's option values; `host`,
//! `hostaddr` and `port` are set on the config here, and every other value is
//! handed to tokio-postgres percent-encoded as a query parameter, so its parser
//! sees nothing it could split differently. What tokio-postgres cannot express
//! (libpq's default Unix socket for an empty or absent host, an empty
//! `hostaddr` item) is refused.

use std::net::IpAddr;

use percent_encoding::{percent_decode_str, percent_encode, utf8_percent_encode, NON_ALPHANUMERIC};

/// Why a URL's host list cannot be read.
#[derive(Debug)]
pub(crate) enum UrlError {
    /// tokio-postgres refused the rest of the string.
    Config(tokio_postgres::Error),
    /// A part of the URL that libpq would refuse, or read in a way tokio-postgres cannot.
    Param {
        param: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// libpq's `DEF_PGPORT`, used for an empty port item (as `pqConnectDBStart` does).
const PORT_DEFAULT: u16 = 5432;

/// Parses `s`, a URL or a keyword/value string (the latter as tokio-postgres does).
pub(crate) fn parse(s: &str) -> Result<tokio_postgres::Config, UrlError> {
    let Some(after) = s
        .strip_prefix("postgres://")
        .or_else(|| s.strip_prefix("postgresql://"))
    else {
        return s.parse().map_err(UrlError::Config);
    };
    let scheme = &s[..s.len() - after.len()];
    let (user_info, rest) = split_user_info(after);
    let mut passed = user_info.map_or(Ok(Vec::new()), credentials)?;
    let (items, tail) = authority(rest)?;
    let mut hosts = HostOpts::from_authority(&items)?;
    let (path, query) = match tail.strip_prefix('/') {
        Some(path_query) => path_query.split_once('?').unwrap_or((path_query, "")),
        None => ("", tail.strip_prefix('?').unwrap_or("")),
    };
    // libpq stores the dbname only when the path is not empty.
    if !path.is_empty() {
        passed.push(("dbname".to_string(), decode("dbname", path)?));
    }
    for (key, value) in query_pairs(query)? {
        if let Some(value) = hosts.take(&key, &value)? {
            passed.push((key, value));
        }
    }
    let mut config: tokio_postgres::Config = rebuild(scheme, &passed).parse().map_err(UrlError::Config)?;
    hosts.apply(&mut config)?;
    Ok(config)
}

/// Splits off the user-info: libpq looks for `@` only before the first `/`
/// (`while (*p && *p != '@' && *p != '/')`), so `?` does not end the search.
fn split_user_info(after: &str) -> (Option<&str>, &str) {
    let end = after.find('/').unwrap_or(after.len());
    match after[..end].find('@') {
        Some(at) => (Some(&after[..at]), &after[at + 1..]),
        None => (None, after),
    }
}

/// `user[:password]`, decoded; libpq stores neither when empty.
fn credentials(user_info: &str) -> Result<Vec<(String, Vec<u8>)>, UrlError> {
    let (user, password) = user_info.split_once(':').unwrap_or((user_info, ""));
    let mut passed = Vec::new();
    for (key, text) in [("user", user), ("password", password)] {
        if !text.is_empty() {
            passed.push((key.to_string(), decode(key, text)?));
        }
    }
    Ok(passed)
}

/// One raw `host[:port]` item of the authority (`port` empty when not given).
struct Item<'a> {
    host: &'a str,
    port: &'a str,
}

/// libpq's netloc loop: items end at a literal `,`; a host at `:`, `/`, `?` or
/// `,`; a port at `/`, `?` or `,`. Returns the items and what follows them.
fn authority(mut rest: &str) -> Result<(Vec<Item<'_>>, &str), UrlError> {
    let mut items = Vec::new();
    loop {
        let (host, after) = item_host(rest)?;
        let (port, after) = match after.strip_prefix(':') {
            Some(port) => port.split_at(port.find(['/', '?', ',']).unwrap_or(port.len())),
            None => ("", after),
        };
        items.push(Item { host, port });
        match after.strip_prefix(',') {
            Some(next) => rest = next,
            None => return Ok((items, after)),
        }
    }
}

/// An item's host: `[v6]` (libpq allows only `:`, `/`, `?`, `,` or the end
/// after `]`, and refuses `[]`), else up to `:`, `/`, `?` or `,`.
fn item_host(s: &str) -> Result<(&str, &str), UrlError> {
    let Some(v6) = s.strip_prefix('[') else {
        return Ok(s.split_at(s.find([':', '/', '?', ',']).unwrap_or(s.len())));
    };
    let refuse = |expected| param_error("host", s, expected);
    let close = v6
        .find(']')
        .ok_or_else(|| refuse("an IPv6 address closed by ]"))?;
    let after = &v6[close + 1..];
    if close == 0 {
        return Err(refuse("a non-empty IPv6 address in brackets"));
    }
    if !after.is_empty() && !after.starts_with([':', '/', '?', ',']) {
        return Err(refuse("an [IPv6 address] followed by :port, /, ? or , only"));
    }
    Ok((&v6[..close], after))
}

/// libpq's `conninfo_uri_parse_params`: each `&`-separated pair needs exactly
/// one `=`, one trailing `&` is allowed, and keys are percent-decoded too.
fn query_pairs(query: &str) -> Result<Vec<(String, Vec<u8>)>, UrlError> {
    let mut pairs: Vec<&str> = query.split('&').collect();
    if query.is_empty() || (pairs.len() > 1 && pairs.last() == Some(&"")) {
        pairs.pop();
    }
    pairs
        .into_iter()
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .filter(|(_, value)| !value.contains('='))
                .ok_or_else(|| param_error("query", pair, "a key=value pair with one ="))?;
            let key = String::from_utf8(decode("query", key)?)
                .map_err(|_| param_error("query", key, "a UTF-8 key"))?;
            Ok((key, decode("query", value)?))
        })
        .collect()
}

/// The URL tokio-postgres parses: every value as an encoded query parameter, in order.
fn rebuild(scheme: &str, passed: &[(String, Vec<u8>)]) -> String {
    let mut url = scheme.to_string();
    for (i, (key, value)) in passed.iter().enumerate() {
        url.push(if i == 0 { '?' } else { '&' });
        url.extend(utf8_percent_encode(key, NON_ALPHANUMERIC));
        url.push('=');
        url.extend(percent_encode(value, NON_ALPHANUMERIC));
    }
    url
}

/// libpq's `host`, `hostaddr` and `port` values as lists; `None` when unset or
/// empty (`pqConnectOptions2` treats an empty value as unset).
#[derive(Default)]
struct HostOpts {
    host: Option<Vec<String>>,
    hostaddr: Option<Vec<String>>,
    port: Option<Vec<String>>,
}

impl HostOpts {
    /// libpq joins the items' hosts, and their ports, with `,` and stores each
    /// joined string only when it is not empty.
    fn from_authority(items: &[Item<'_>]) -> Result<Self, UrlError> {
        let single = items.len() == 1;
        let host = match single && items[0].host.is_empty() {
            true => None,
            false => Some(
                items
                    .iter()
                    .map(|i| text("host", i.host))
                    .collect::<Result<_, _>>()?,
            ),
        };
        let port = match single && items[0].port.is_empty() {
            true => None,
            false => Some(
                items
                    .iter()
                    .map(|i| text("port", i.port))
                    .collect::<Result<_, _>>()?,
            ),
        };
        Ok(HostOpts {
            host,
            hostaddr: None,
            port,
        })
    }

    /// Takes a query `host`, `hostaddr` or `port` (replacing only that value,
    /// as libpq's `conninfo_storeval` does); hands back any other value.
    fn take(&mut self, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>, UrlError> {
        let (slot, name) = match key {
            "host" => (&mut self.host, "host"),
            "hostaddr" => (&mut self.hostaddr, "hostaddr"),
            "port" => (&mut self.port, "port"),
            _ => return Ok(Some(value.to_vec())),
        };
        let value = String::from_utf8(value.to_vec())
            .map_err(|e| param_error(name, &String::from_utf8_lossy(e.as_bytes()), "UTF-8"))?;
        // pqConnectOptions2 checks `pghost[0] != '\0'`: an empty value is unset (libpq's default socket).
        *slot = (!value.is_empty()).then(|| value.split(',').map(str::to_string).collect());
        Ok(None)
    }

    /// Sets the hosts, addresses and ports on `config`, with libpq's counts.
    fn apply(self, config: &mut tokio_postgres::Config) -> Result<(), UrlError> {
        let ports = self
            .port
            .iter()
            .flatten()
            .map(|p| port(p))
            .collect::<Result<Vec<_>, _>>()?;
        let addrs = self.hostaddr.as_deref().map(addresses).transpose()?;
        // pqConnectOptions2: "could not match %d host names to %d hostaddr values".
        let count = match (&self.host, &addrs) {
            (None, None) => return Err(param_error("host", "", NO_DEFAULT_HOST)),
            (Some(hosts), Some(addrs)) if hosts.len() != addrs.len() => {
                return Err(param_error(
                    "hostaddr",
                    &self.hostaddr.unwrap_or_default().join(","),
                    ONE_ADDR_PER_HOST,
                ))
            }
            (_, Some(addrs)) => addrs.len(),
            (Some(hosts), None) => hosts.len(),
        };
        // pqConnectOptions2: one port serves every host, else one port per host.
        if ports.len() > 1 && ports.len() != count {
            return Err(param_error(
                "port",
                &self.port.unwrap_or_default().join(","),
                ONE_PORT_PER_HOST,
            ));
        }
        for host in self.host.iter().flatten() {
            config.host(checked_host(host)?);
        }
        for addr in addrs.into_iter().flatten() {
            config.hostaddr(addr);
        }
        // Only empty items (libpq's default port each) are no ports at all for tokio-postgres.
        let given = self.port.iter().flatten().any(|p| !p.is_empty());
        for p in ports.into_iter().filter(|_| given) {
            config.port(p);
        }
        Ok(())
    }
}

const NO_DEFAULT_HOST: &str = "a named host (libpq reads an empty or absent host as its default \
     Unix socket, /var/run/postgresql or /tmp by build; name it, e.g. ?host=/var/run/postgresql)";
const ONE_ADDR_PER_HOST: &str = "a list with one address per host (libpq refuses other counts)";
const ONE_PORT_PER_HOST: &str = "one port, or one per host (libpq refuses other counts)";

/// A host item tokio-postgres reads as libpq does, or why not.
fn checked_host(host: &str) -> Result<&str, UrlError> {
    let refuse = |expected| Err(param_error("host", host, expected));
    match host {
        // pqConnectOptions2: an empty host item means DEFAULT_PGSOCKET_DIR, which tokio-postgres lacks.
        "" => refuse(NO_DEFAULT_HOST),
        // libpq splits the decoded authority host string again on `,`, while its ports stay per item.
        h if h.contains(',') => refuse("a host name without %2C (libpq would split it into two hosts)"),
        // is_unixsock_path: a leading `@` is an abstract Unix socket, which tokio-postgres lacks.
        h if h.starts_with('@') => {
            refuse("a TCP host or socket directory (libpq reads a leading @ as an abstract socket)")
        }
        h => Ok(h),
    }
}

/// `hostaddr` items: libpq falls back to the host for an empty one, which tokio-postgres cannot.
fn addresses(items: &[String]) -> Result<Vec<IpAddr>, UrlError> {
    let expected = "a comma-separated list of IP addresses, none empty";
    items
        .iter()
        .map(|a| a.parse().map_err(|_| param_error("hostaddr", a, expected)))
        .collect()
}

/// libpq's port: empty is DEF_PGPORT; else `parse_int_param` (strtol, spaces
/// around allowed) in 1..=65535.
fn port(text: &str) -> Result<u16, UrlError> {
    if text.is_empty() {
        return Ok(PORT_DEFAULT);
    }
    match text
        .trim_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r'])
        .parse::<u16>()
    {
        Ok(p) if p > 0 => Ok(p),
        // An unbracketed IPv6 host leaves a `:` in what libpq then reads as the port.
        _ if text.contains(':') => Err(param_error(
            "port",
            text,
            "a port number (an IPv6 host goes in [brackets])",
        )),
        _ => Err(param_error(
            "port",
            text,
            "a port number from 1 to 65535 (or a comma-separated list of them)",
        )),
    }
}

/// libpq's `conninfo_uri_decode`: `%` must take two hex digits, and `%00` is refused.
fn decode(param: &'static str, text: &str) -> Result<Vec<u8>, UrlError> {
    for (i, _) in text.match_indices('%') {
        match text
            .get(i + 1..i + 3)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            None => {
                return Err(param_error(
                    param,
                    text,
                    "percent-encoded as % and two hex digits",
                ))
            }
            Some("00") => return Err(param_error(param, text, "free of %00")),
            Some(_) => {}
        }
    }
    Ok(percent_decode_str(text).collect())
}

/// A decoded `host` or `port` item, which must be UTF-8.
fn text(param: &'static str, raw: &str) -> Result<String, UrlError> {
    String::from_utf8(decode(param, raw)?).map_err(|_| param_error(param, raw, "percent-encoded UTF-8"))
}

fn param_error(param: &'static str, value: &str, expected: &'static str) -> UrlError {
    UrlError::Param {
        param,
        value: value.to_string(),
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::config::Host;

    type Hosts = (Vec<Host>, Vec<IpAddr>, Vec<u16>);

    fn hosts_of(s: &str) -> Hosts {
        let c = parse(s).unwrap_or_else(|e| panic!("{s}: {e:?}"));
        (
            c.get_hosts().to_vec(),
            c.get_hostaddrs().to_vec(),
            c.get_ports().to_vec(),
        )
    }

    /// The parameter a refused URL's error names.
    fn refused(url: &str) -> &'static str {
        match parse(url) {
            Err(UrlError::Param { param, .. }) => param,
            other => panic!("{url}: {other:?}"),
        }
    }

    fn tcp(names: &[&str]) -> Vec<Host> {
        names.iter().map(|n| Host::Tcp(n.to_string())).collect()
    }

    /// Each URL form means what the keyword/value string beside it means (libpq's rule).
    #[test]
    fn every_url_host_list_form_means_what_its_keyword_string_means() {
        for (url, keywords) in [
            (
                "postgres://u@/d?host=db,db&hostaddr=10.0.0.1,10.0.0.2&port=5432,5433",
                "user=u dbname=d host=db,db hostaddr=10.0.0.1,10.0.0.2 port=5432,5433",
            ),
            (
                "postgres://u@db1,db2/d?port=5432,5433",
                "user=u dbname=d host=db1,db2 port=5432,5433",
            ),
            (
                "postgresql://u:p@db1:5433,db2/d?sslmode=disable",
                "user=u password=p dbname=d host=db1,db2 port=5433,5432 sslmode=disable",
            ),
            (
                "postgres://u@[::1]:5433,db2:5434/d",
                "user=u dbname=d host=::1,db2 port=5433,5434",
            ),
            ("postgres://u@db1,db2/d", "user=u dbname=d host=db1,db2"),
            (
                "postgres://u@/d?host=%2Fvar%2Frun%2Fpostgresql,db&port=5432",
                "user=u dbname=d host=/var/run/postgresql,db port=5432",
            ),
            ("postgres://u@ignored/d?host=db", "user=u dbname=d host=db"),
        ] {
            assert_eq!(hosts_of(url), hosts_of(keywords), "{url}");
        }
    }

    #[test]
    fn a_bad_port_or_address_in_a_url_is_named() {
        for (url, named) in [
            ("postgres://u@db:x/d", "port"),
            ("postgres://u@/d?host=a,b&port=1,y", "port"),
            ("postgres://u@/d?host=a&hostaddr=not-an-ip", "hostaddr"),
            ("postgres://[::1/x", "host"),
        ] {
            assert_eq!(refused(url), named, "{url}");
        }
    }

    #[test]
    fn a_query_host_keeps_the_authority_port() {
        let (hosts, _, ports) = hosts_of("postgres://u@127.0.0.1:55441/d?host=x");
        assert_eq!((hosts, ports), (tcp(&["x"]), vec![55441]));
    }

    #[test]
    fn an_empty_host_item_is_refused_rather_than_shifting_the_ports() {
        for url in [
            "postgres://a,,b/d",
            "postgres://a:1,:2,b:3/d",
            "postgres://u@/d?host=a,,b&port=1,2,3",
            "postgres://a,/d",
        ] {
            assert_eq!(refused(url), "host", "{url}");
        }
    }

    #[test]
    fn an_at_sign_after_the_first_slash_is_not_user_info() {
        let c = parse("postgres://h:5/d@x?application_name=a@b").unwrap();
        assert_eq!(c.get_user(), None);
        assert_eq!(c.get_dbname(), Some("d@x"));
        assert_eq!(c.get_application_name(), Some("a@b"));
        assert_eq!((c.get_hosts(), c.get_ports()), (&tcp(&["h"])[..], &[5][..]));
    }

    /// libpq's search stops only at `/`: before any `/`, an `@` in the query ends the user-info.
    #[test]
    fn an_at_sign_before_any_slash_ends_the_user_info_as_in_libpq() {
        let c = parse("postgres://h?application_name=a@b").unwrap();
        assert_eq!(c.get_user(), Some("h?application_name=a"));
        assert_eq!(c.get_hosts(), &tcp(&["b"])[..]);
    }

    #[test]
    fn an_empty_or_absent_host_is_refused_as_libpqs_default_socket() {
        for url in ["postgres://db/d?host=", "postgres:///d", "postgres://u@:5433/d"] {
            assert_eq!(refused(url), "host", "{url}");
        }
        let (hosts, addrs, _) = hosts_of("postgres://db/d?host=&hostaddr=10.0.0.1");
        assert_eq!(
            (hosts, addrs),
            (vec![], vec!["10.0.0.1".parse::<IpAddr>().unwrap()])
        );
    }

    #[test]
    fn junk_after_an_ipv6_closing_bracket_is_refused() {
        for url in ["postgres://[::1]x:5/d", "postgres://[]/d"] {
            assert_eq!(refused(url), "host", "{url}");
        }
    }

    #[test]
    fn an_unbracketed_ipv6_host_or_a_second_colon_is_refused() {
        for url in ["postgres://::1:5432/d", "postgres://h:5432:1/d"] {
            assert_eq!(refused(url), "port", "{url}");
        }
    }

    #[test]
    fn a_port_count_other_than_one_or_the_host_count_is_refused() {
        for url in [
            "postgres://u@/d?host=a,b,c&port=1,2",
            "postgres://a:1,b:2/d?host=x",
            "postgres://a,b/d?host=x",
            "postgres://h/d?port=5433,",
        ] {
            assert_eq!(refused(url), "port", "{url}");
        }
    }

    #[test]
    fn a_hostaddr_count_other_than_the_host_count_is_refused() {
        for url in [
            "postgres://u@/d?host=a,b&hostaddr=10.0.0.1",
            "postgres://u@/d?host=a,b&hostaddr=10.0.0.1,",
        ] {
            assert_eq!(refused(url), "hostaddr", "{url}");
        }
    }

    #[test]
    fn percent_encoded_query_keys_are_decoded_as_libpq_decodes_them() {
        let c = parse("postgres://u@h/d?ho%73t=x&%61pplication_name=z").unwrap();
        assert_eq!(c.get_hosts(), &tcp(&["x"])[..]);
        assert_eq!(c.get_application_name(), Some("z"));
    }

    #[test]
    fn a_percent_encoded_comma_in_an_authority_host_is_refused() {
        for url in ["postgres://a%2Cb:5433/d", "postgres://a%2cb,c/d"] {
            assert_eq!(refused(url), "host", "{url}");
        }
        assert_eq!(hosts_of("postgres://a%2Cb/d?host=x").0, tcp(&["x"]));
        assert_eq!(hosts_of("postgres://u@/d?host=a%2Cb").0, tcp(&["a", "b"]));
    }

    #[test]
    fn a_query_pair_without_exactly_one_equals_sign_is_refused() {
        for url in [
            "postgres://h/d?host",
            "postgres://h/d?host=a=b",
            "postgres://h/d?port=5&&a=b",
            "postgres://h/d?&",
        ] {
            assert_eq!(refused(url), "query", "{url}");
        }
        assert_eq!(hosts_of("postgres://h/d?port=5&").2, vec![5]);
    }

    #[test]
    fn bad_percent_encoding_is_refused() {
        for (url, named) in [
            ("postgres://%zz/d", "host"),
            ("postgres://h/d?application_name=%00", "query"),
            ("postgres://h/d%4", "dbname"),
        ] {
            assert_eq!(refused(url), named, "{url}");
        }
    }

    #[test]
    fn ports_are_read_as_libpq_reads_them() {
        assert_eq!(hosts_of("postgres://a:1,b/d").2, vec![1, 5432]);
        assert_eq!(hosts_of("postgres://h:%35433/d").2, vec![5433]);
        assert_eq!(hosts_of("postgres://h/d?port=%205433%20").2, vec![5433]);
        assert_eq!(refused("postgres://h:0/d"), "port");
    }

    #[test]
    fn an_abstract_socket_host_is_refused() {
        assert_eq!(refused("postgres://u@/d?host=@sock"), "host");
    }

    #[test]
    fn user_password_and_dbname_are_decoded_and_the_query_overrides_them() {
        let c = parse("postgres://u%40x:p%3Aq@h/d%2Fe?dbname=f&options=-c%20a%3Db").unwrap();
        assert_eq!(c.get_user(), Some("u@x"));
        assert_eq!(c.get_password(), Some(&b"p:q"[..]));
        assert_eq!(c.get_dbname(), Some("f"));
        assert_eq!(c.get_options(), Some("-c a=b"));
        assert_eq!(parse("postgres://h/d%2Fe").unwrap().get_dbname(), Some("d/e"));
    }
}
