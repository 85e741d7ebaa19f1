//! The operator's allow-list (`RELAY_CALLBACK_ALLOW`): addresses and host names the address
//! guard lets through anyway.

use std::net::IpAddr;
use std::str::FromStr;

/// An entry of `RELAY_CALLBACK_ALLOW` that does not parse; the message quotes the entry.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllowListError {
    #[error("{0:?}: bad prefix length")]
    BadPrefix(String),
    #[error("{item:?}: prefix longer than {max}")]
    PrefixTooLong { item: String, max: u8 },
    #[error("{0:?}: not an address")]
    NotAnAddress(String),
}

/// Addresses and host names the guard lets through anyway (`RELAY_CALLBACK_ALLOW`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllowList {
    nets: Vec<(IpAddr, u8)>,
    hosts: Vec<String>,
}

impl AllowList {
    /// Comma-separated CIDRs (`127.0.0.1/32`, `10.0.0.0/8`, `::1/128`), addresses, or host names.
    pub fn parse(s: &str) -> Result<AllowList, AllowListError> {
        let mut out = AllowList::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (addr, bits) = match item.split_once('/') {
                Some((a, b)) => (a, Some(b.parse::<u8>().map_err(|_| AllowListError::BadPrefix(item.to_owned()))?)),
                None => (item, None),
            };
            match IpAddr::from_str(addr) {
                Ok(ip) => {
                    let max = if ip.is_ipv4() { 32 } else { 128 };
                    let bits = bits.unwrap_or(max);
                    if bits > max {
                        return Err(AllowListError::PrefixTooLong { item: item.to_owned(), max });
                    }
                    out.nets.push((ip, bits));
                }
                Err(_) if bits.is_none() => out.hosts.push(item.to_ascii_lowercase()),
                Err(_) => return Err(AllowListError::NotAnAddress(item.to_owned())),
            }
        }
        Ok(out)
    }

    pub fn allows_host(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }

    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.nets.iter().any(|(net, bits)| match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), *bits),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), *bits),
            _ => false,
        })
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let bits = usize::from(bits);
    let (whole, rest) = (bits / 8, bits % 8);
    a[..whole] == b[..whole] && (rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0)
}
