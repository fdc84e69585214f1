//! Who holds a term: `hostname:pid:nonce`. Observability only: never part of
//! the fence, which is the token alone.

use std::fmt;
use std::str::FromStr;

use crate::error::HolderIdError;

/// The holder of a term, as written to `leader_leases.holder_id`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HolderId {
    host: String,
    pid: u32,
    nonce: u32,
}

impl HolderId {
    /// This process: its host name, its pid and a random nonce (two managers
    /// in one process are two holders).
    pub fn new() -> Self {
        HolderId {
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            pid: std::process::id(),
            nonce: rand::random(),
        }
    }

    /// The host name the holder ran on.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The holder's process id on its host.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl Default for HolderId {
    fn default() -> Self {
        HolderId::new()
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{:08x}", self.host, self.pid, self.nonce)
    }
}

impl FromStr for HolderId {
    type Err = HolderIdError;

    /// Parses from the right, so a host name is taken whole.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || HolderIdError {
            text: text.to_string(),
        };
        let mut parts = text.rsplitn(3, ':');
        let nonce = parts.next().ok_or_else(invalid)?;
        let pid = parts.next().ok_or_else(invalid)?;
        let host = parts.next().filter(|h| !h.is_empty()).ok_or_else(invalid)?;
        Ok(HolderId {
            host: host.to_string(),
            pid: pid.parse().map_err(|_| invalid())?,
            nonce: u32::from_str_radix(nonce, 16).map_err(|_| invalid())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::HolderId;

    #[test]
    fn a_holder_id_round_trips_through_its_text() {
        let id = HolderId::new();
        assert_eq!(id.to_string().parse::<HolderId>().unwrap(), id);
        let parsed: HolderId = "web-1.internal:4242:00c0ffee".parse().unwrap();
        assert_eq!((parsed.host(), parsed.pid()), ("web-1.internal", 4242));
        for bad in [
            "",
            "host",
            "host:12",
            ":12:00000001",
            "host:x:00000001",
            "host:12:zz",
        ] {
            assert!(bad.parse::<HolderId>().is_err(), "{bad:?}");
        }
    }
}
