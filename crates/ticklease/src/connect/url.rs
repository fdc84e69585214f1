//! libpq's host list forms in a `postgres://` URL, parsed as libpq parses
//! them. tokio-postgres reads `?host=db1,db2` as one host named `db1,db2`,
//! and appends `?port=` to the ports it gave each host of the authority
//! (`postgres://u@db1,db2/d?port=5432,5433` became four ports). Here the
//! host list comes from the query's `host` when given, else from the
//! authority; the ports from the query's `port` when given, else from the
//! authority's `host:port` items; `hostaddr` from the query. The rest of the
//! URL is tokio-postgres's to parse (its authority emptied), so a URL means
//! what the keyword/value string with the same values means.

use percent_encoding::percent_decode_str;

/// Why a URL's host list cannot be read.
#[derive(Debug)]
pub(crate) enum UrlError {
    /// tokio-postgres refused the rest of the string.
    Config(tokio_postgres::Error),
    /// A `host`, `hostaddr` or `port` value libpq would refuse too.
    Param {
        param: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// The port of an authority item that names none, when another names one.
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
    // As tokio-postgres: credentials up to the first '@', then the host list
    // up to the path or the query.
    let credentials = after.find('@').map_or(0, |at| at + 1);
    let hosts_end = after[credentials..]
        .find(['/', '?'])
        .map_or(after.len(), |i| i + credentials);
    let (authority_hosts, path_query) = (&after[credentials..hosts_end], &after[hosts_end..]);
    let (path, query) = match path_query.split_once('?') {
        Some((path, query)) => (path, query),
        None => (path_query, ""),
    };
    let mut asked = Asked::default();
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (slot, name) = match key {
            "host" => (&mut asked.host, "host"),
            "hostaddr" => (&mut asked.hostaddr, "hostaddr"),
            "port" => (&mut asked.port, "port"),
            _ => {
                kept.push(pair);
                continue;
            }
        };
        *slot = Some(decode(name, value)?);
    }
    let mut rest = format!("{scheme}{}{path}", &after[..credentials]);
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    let mut config: tokio_postgres::Config = rest.parse().map_err(UrlError::Config)?;
    asked.apply(authority_items(authority_hosts)?, &mut config)?;
    Ok(config)
}

/// The query's `host`, `hostaddr` and `port`, decoded.
#[derive(Default)]
struct Asked {
    host: Option<String>,
    hostaddr: Option<String>,
    port: Option<String>,
}

impl Asked {
    /// Sets the hosts, addresses and ports on `config`: the query's, else the authority's.
    fn apply(
        self,
        authority: Vec<(String, Option<u16>)>,
        config: &mut tokio_postgres::Config,
    ) -> Result<(), UrlError> {
        let any_port = authority.iter().any(|(_, port)| port.is_some());
        let (hosts, ports): (Vec<String>, Vec<u16>) = match &self.host {
            Some(list) => (list.split(',').map(str::to_string).collect(), Vec::new()),
            None => {
                let ports = match any_port {
                    true => authority.iter().map(|(_, p)| p.unwrap_or(PORT_DEFAULT)).collect(),
                    false => Vec::new(),
                };
                (authority.into_iter().map(|(h, _)| h).collect(), ports)
            }
        };
        for host in hosts.iter().filter(|h| !h.is_empty()) {
            config.host(host);
        }
        let ports = match &self.port {
            Some(list) => list
                .split(',')
                .map(|p| port("port", p))
                .collect::<Result<_, _>>()?,
            None => ports,
        };
        for p in ports {
            config.port(p);
        }
        for addr in self.hostaddr.iter().flat_map(|list| list.split(',')) {
            let parsed = addr.parse().map_err(|_| UrlError::Param {
                param: "hostaddr",
                value: addr.to_string(),
                expected: "a comma-separated list of IP addresses",
            })?;
            config.hostaddr(parsed);
        }
        Ok(())
    }
}

/// The authority's `host[:port]` items (`[v6]:port` too), percent-decoded.
fn authority_items(list: &str) -> Result<Vec<(String, Option<u16>)>, UrlError> {
    list.split(',')
        .filter(|item| !item.is_empty())
        .map(|item| {
            let (host, port_text) = match item.strip_prefix('[') {
                Some(v6) => match v6.split_once(']') {
                    Some((host, rest)) => (host, rest.strip_prefix(':')),
                    None => {
                        return Err(UrlError::Param {
                            param: "host",
                            value: item.to_string(),
                            expected: "an IPv6 address closed by ]",
                        })
                    }
                },
                None => match item.rsplit_once(':') {
                    Some((host, p)) => (host, Some(p)),
                    None => (item, None),
                },
            };
            let port = port_text.map(|p| port("port", p)).transpose()?;
            Ok((decode("host", host)?, port))
        })
        .collect()
}

fn port(param: &'static str, text: &str) -> Result<u16, UrlError> {
    text.parse().map_err(|_| UrlError::Param {
        param,
        value: text.to_string(),
        expected: "a port number (or a comma-separated list of them)",
    })
}

fn decode(param: &'static str, text: &str) -> Result<String, UrlError> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|v| v.into_owned())
        .map_err(|_| UrlError::Param {
            param,
            value: text.to_string(),
            expected: "percent-encoded UTF-8",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts_of(s: &str) -> (Vec<tokio_postgres::config::Host>, Vec<std::net::IpAddr>, Vec<u16>) {
        let c = parse(s).unwrap_or_else(|e| panic!("{s}: {e:?}"));
        (
            c.get_hosts().to_vec(),
            c.get_hostaddrs().to_vec(),
            c.get_ports().to_vec(),
        )
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
            match parse(url) {
                Err(UrlError::Param { param, .. }) => assert_eq!(param, named, "{url}"),
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
