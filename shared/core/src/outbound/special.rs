//! The IANA IPv4 and IPv6 Special-Purpose Address Registries
//! (<https://www.iana.org/assignments/iana-ipv4-special-registry>,
//! <https://www.iana.org/assignments/iana-ipv6-special-registry>), entry by entry, with each
//! entry's "Globally Reachable", and the few ranges outside them the guard refuses as well
//! (multicast, IPv6 site-local). An address is refused when any entry that holds it is not
//! globally reachable (`False` or `N/A`), even where a smaller entry inside says `True`
//! (e.g. 192.0.0.9, PCP anycast, inside 192.0.0.0/24): a tenant's endpoint is never one of
//! those. Prefixes that carry an IPv4 address (mapped, NAT64, 6to4, compatible) are judged by
//! the address they carry, in `outbound`, before this table.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An entry's "Globally Reachable" column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    Global,
    NotGlobal,
    /// `N/A` in the registry (deprecated or tunnelling prefixes): refused.
    NotApplicable,
}

/// One range: network, prefix length, why it is refused (name and range), its reach.
#[derive(Debug, Clone, Copy)]
pub struct Entry<A> {
    pub net: A,
    pub bits: u8,
    pub name: &'static str,
    pub reach: Reach,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, bits: u8, name: &'static str, reach: Reach) -> Entry<Ipv4Addr> {
    Entry { net: Ipv4Addr::new(a, b, c, d), bits, name, reach }
}

const fn v6(s: [u16; 8], bits: u8, name: &'static str, reach: Reach) -> Entry<Ipv6Addr> {
    Entry { net: Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]), bits, name, reach }
}

use Reach::{Global, NotApplicable as Na, NotGlobal as No};

/// The IANA IPv4 Special-Purpose Address Registry.
pub const IPV4: &[Entry<Ipv4Addr>] = &[
    v4(0, 0, 0, 0, 8, "\"this network\" (0.0.0.0/8)", No),
    v4(0, 0, 0, 0, 32, "\"this host on this network\" (0.0.0.0/32)", No),
    v4(10, 0, 0, 0, 8, "private-use (10.0.0.0/8)", No),
    v4(100, 64, 0, 0, 10, "shared address space (100.64.0.0/10)", No),
    v4(127, 0, 0, 0, 8, "loopback (127.0.0.0/8)", No),
    v4(169, 254, 0, 0, 16, "link-local, cloud metadata (169.254.0.0/16)", No),
    v4(172, 16, 0, 0, 12, "private-use (172.16.0.0/12)", No),
    v4(192, 0, 0, 0, 24, "IETF protocol assignments (192.0.0.0/24)", No),
    v4(192, 0, 0, 0, 29, "IPv4 service continuity prefix (192.0.0.0/29)", No),
    v4(192, 0, 0, 8, 32, "IPv4 dummy address (192.0.0.8/32)", No),
    v4(192, 0, 0, 9, 32, "port control protocol anycast (192.0.0.9/32)", Global),
    v4(192, 0, 0, 10, 32, "TURN anycast (192.0.0.10/32)", Global),
    v4(192, 0, 0, 170, 32, "NAT64/DNS64 discovery (192.0.0.170/32)", No),
    v4(192, 0, 0, 171, 32, "NAT64/DNS64 discovery (192.0.0.171/32)", No),
    v4(192, 0, 2, 0, 24, "documentation, TEST-NET-1 (192.0.2.0/24)", No),
    v4(192, 31, 196, 0, 24, "AS112-v4 (192.31.196.0/24)", Global),
    v4(192, 52, 193, 0, 24, "AMT (192.52.193.0/24)", Global),
    v4(192, 88, 99, 0, 24, "deprecated 6to4 relay anycast (192.88.99.0/24)", Na),
    v4(192, 88, 99, 2, 32, "6a44-relay anycast (192.88.99.2/32)", No),
    v4(192, 168, 0, 0, 16, "private-use (192.168.0.0/16)", No),
    v4(192, 175, 48, 0, 24, "direct delegation AS112 service (192.175.48.0/24)", Global),
    v4(198, 18, 0, 0, 15, "benchmarking (198.18.0.0/15)", No),
    v4(198, 51, 100, 0, 24, "documentation, TEST-NET-2 (198.51.100.0/24)", No),
    v4(203, 0, 113, 0, 24, "documentation, TEST-NET-3 (203.0.113.0/24)", No),
    v4(240, 0, 0, 0, 4, "reserved (240.0.0.0/4)", No),
    v4(255, 255, 255, 255, 32, "limited broadcast (255.255.255.255/32)", No),
];

/// The IANA IPv6 Special-Purpose Address Registry.
pub const IPV6: &[Entry<Ipv6Addr>] = &[
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback (::1/128)", No),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified (::/128)", No),
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96, "IPv4-mapped (::ffff:0:0/96)", No),
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96, "IPv4-IPv6 translation (64:ff9b::/96)", Global),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "local-use IPv4-IPv6 translation (64:ff9b:1::/48)", No),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only (100::/64)", No),
    v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64, "dummy IPv6 prefix (100:0:0:1::/64)", No),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, "IETF protocol assignments (2001::/23)", No),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "Teredo (2001::/32)", Na),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 1], 128, "port control protocol anycast (2001:1::1/128)", Global),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 2], 128, "TURN anycast (2001:1::2/128)", Global),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 3], 128, "DNS-SD service registration anycast (2001:1::3/128)", Global),
    v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48, "benchmarking (2001:2::/48)", No),
    v6([0x2001, 3, 0, 0, 0, 0, 0, 0], 32, "AMT (2001:3::/32)", Global),
    v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48, "AS112-v6 (2001:4:112::/48)", Global),
    v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0], 28, "deprecated ORCHID (2001:10::/28)", Na),
    v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28, "ORCHIDv2 (2001:20::/28)", Global),
    v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28, "drone remote ID entity tags (2001:30::/28)", Global),
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "documentation (2001:db8::/32)", No),
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, "6to4 (2002::/16)", Na),
    v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48, "direct delegation AS112 service (2620:4f:8000::/48)", Global),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation (3fff::/20)", No),
    v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16, "segment routing SIDs (5f00::/16)", No),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique-local, cloud metadata (fc00::/7)", No),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local (fe80::/10)", No),
];

/// Refused as well, though in neither registry.
pub const OTHER_V4: &[Entry<Ipv4Addr>] = &[v4(224, 0, 0, 0, 4, "multicast (224.0.0.0/4)", No)];
pub const OTHER_V6: &[Entry<Ipv6Addr>] = &[
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "deprecated site-local (fec0::/10)", No),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast (ff00::/8)", No),
];

fn holds(net: u128, bits: u8, width: u8, ip: u128) -> bool {
    let shift = u32::from(width - bits);
    bits == 0 || (net >> shift) == (ip >> shift)
}

/// Why the tables refuse this address: the first entry holding it that is not globally
/// reachable.
pub fn refused(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(a) => {
            let ip = u128::from(u32::from(a));
            IPV4.iter()
                .chain(OTHER_V4)
                .find(|e| e.reach != Global && holds(u128::from(u32::from(e.net)), e.bits, 32, ip))
                .map(|e| e.name)
        }
        IpAddr::V6(a) => {
            let ip = u128::from(a);
            IPV6.iter()
                .chain(OTHER_V6)
                .find(|e| e.reach != Global && holds(u128::from(e.net), e.bits, 128, ip))
                .map(|e| e.name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::refused as guard_refuses;

    /// The IANA IPv4 Special-Purpose Address Registry as published (its CSV, 2026-07 snapshot):
    /// address block, name, "Globally Reachable" (empty for a terminated entry). Written out here
    /// apart from `IPV4`, so that a wrong or missing entry there fails this test.
    const IANA_IPV4: &[(&str, &str, &str)] = &[
        ("0.0.0.0/8", "\"This network\"", "False"),
        ("0.0.0.0/32", "\"This host on this network\"", "False"),
        ("10.0.0.0/8", "Private-Use", "False"),
        ("100.64.0.0/10", "Shared Address Space", "False"),
        ("127.0.0.0/8", "Loopback", "False"),
        ("169.254.0.0/16", "Link Local", "False"),
        ("172.16.0.0/12", "Private-Use", "False"),
        ("192.0.0.0/24", "IETF Protocol Assignments", "False"),
        ("192.0.0.0/29", "IPv4 Service Continuity Prefix", "False"),
        ("192.0.0.8/32", "IPv4 dummy address", "False"),
        ("192.0.0.9/32", "Port Control Protocol Anycast", "True"),
        ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "True"),
        ("192.0.0.170/32", "NAT64/DNS64 Discovery", "False"),
        ("192.0.0.171/32", "NAT64/DNS64 Discovery", "False"),
        ("192.0.2.0/24", "Documentation (TEST-NET-1)", "False"),
        ("192.31.196.0/24", "AS112-v4", "True"),
        ("192.52.193.0/24", "AMT", "True"),
        ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", ""),
        ("192.88.99.2/32", "6a44-relay anycast address", "False"),
        ("192.168.0.0/16", "Private-Use", "False"),
        ("192.175.48.0/24", "Direct Delegation AS112 Service", "True"),
        ("198.18.0.0/15", "Benchmarking", "False"),
        ("198.51.100.0/24", "Documentation (TEST-NET-2)", "False"),
        ("203.0.113.0/24", "Documentation (TEST-NET-3)", "False"),
        ("240.0.0.0/4", "Reserved", "False"),
        ("255.255.255.255/32", "Limited Broadcast", "False"),
    ];

    /// The IANA IPv6 Special-Purpose Address Registry, likewise.
    const IANA_IPV6: &[(&str, &str, &str)] = &[
        ("::1/128", "Loopback Address", "False"),
        ("::/128", "Unspecified Address", "False"),
        ("::ffff:0:0/96", "IPv4-mapped Address", "False"),
        ("64:ff9b::/96", "IPv4-IPv6 Translat.", "True"),
        ("64:ff9b:1::/48", "IPv4-IPv6 Translat.", "False"),
        ("100::/64", "Discard-Only Address Block", "False"),
        ("100:0:0:1::/64", "Dummy IPv6 Prefix", "False"),
        ("2001::/23", "IETF Protocol Assignments", "False"),
        ("2001::/32", "TEREDO", "N/A"),
        ("2001:1::1/128", "Port Control Protocol Anycast", "True"),
        ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", "True"),
        ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", "True"),
        ("2001:2::/48", "Benchmarking", "False"),
        ("2001:3::/32", "AMT", "True"),
        ("2001:4:112::/48", "AS112-v6", "True"),
        ("2001:10::/28", "Deprecated (previously ORCHID)", ""),
        ("2001:20::/28", "ORCHIDv2", "True"),
        ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "True"),
        ("2001:db8::/32", "Documentation", "False"),
        ("2002::/16", "6to4", "N/A"),
        ("2620:4f:8000::/48", "Direct Delegation AS112 Service", "True"),
        ("3fff::/20", "Documentation", "False"),
        ("5f00::/16", "Segment Routing (SRv6) SIDs", "False"),
        ("fc00::/7", "Unique-Local", "False"),
        ("fe80::/10", "Link-Local Unicast", "False"),
    ];

    /// A registry block as (first, last) address of `width` bits, and its prefix length.
    fn span(block: &str, width: u32) -> (u128, u128, u8) {
        let (net, bits) = block.split_once('/').unwrap_or_else(|| panic!("{block}"));
        let net = match net.parse::<IpAddr>().unwrap_or_else(|_| panic!("{block}")) {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        };
        let bits: u8 = bits.parse().unwrap_or_else(|_| panic!("{block}"));
        let host = (u128::MAX >> (128 - width)).checked_shr(u32::from(bits)).unwrap_or(0);
        (net, net | host, bits)
    }

    /// What the guard should do with `ip`, by the registry rows above (and the few ranges outside
    /// them: multicast, site-local): refused when a row holding it is not globally reachable.
    fn registry_refuses(rows: &[(&str, &str, &str)], width: u32, ip: u128) -> bool {
        rows.iter().any(|(block, _, reach)| {
            let (first, last, _) = span(block, width);
            *reach != "True" && (first..=last).contains(&ip)
        }) || match width {
            32 => (0xe000_0000..=0xefff_ffff).contains(&ip),
            _ => ip >> 118 == 0xfec0 >> 6 || ip >> 120 == 0xff,
        }
    }

    fn v4(ip: u128) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(u32::try_from(ip).unwrap_or_else(|_| panic!("{ip:x}"))))
    }

    /// Every row of both registries is in the tables with its reach; every address of a row that
    /// is not globally reachable is refused (tried: its first and last); and the addresses just
    /// outside each row are let through where nothing else holds them.
    #[test]
    fn every_iana_special_purpose_entry_is_in_the_table_and_refused_unless_globally_reachable() {
        let mut outside_let_through = 0;
        for (rows, width) in [(IANA_IPV4, 32), (IANA_IPV6, 128)] {
            for (block, name, reach) in rows {
                let (first, last, bits) = span(block, width);
                let want = match *reach {
                    "True" => Reach::Global,
                    "False" => Reach::NotGlobal,
                    _ => Reach::NotApplicable,
                };
                let in_table = match width {
                    32 => {
                        IPV4.iter().any(|e| u128::from(u32::from(e.net)) == first && e.bits == bits && e.reach == want)
                    }
                    _ => IPV6.iter().any(|e| u128::from(e.net) == first && e.bits == bits && e.reach == want),
                };
                assert!(in_table, "{block} ({name}, globally reachable {reach:?}) is not in the table as such");
                let ip = |n: u128| if width == 32 { v4(n) } else { IpAddr::V6(Ipv6Addr::from(n)) };
                for n in [first, last] {
                    let carried = (width == 128).then(|| carries_v4(n)).flatten();
                    let refused = guard_refuses(ip(n)).is_some();
                    match carried {
                        // Judged by the IPv4 address it carries (`outbound::refused_v6`).
                        Some(v) => assert_eq!(refused, guard_refuses(v4(v)).is_some(), "{} ({name})", ip(n)),
                        None => assert_eq!(refused, registry_refuses(rows, width, n), "{} ({name})", ip(n)),
                    }
                    if *reach != "True" {
                        assert!(refused, "{} ({name}) must be refused", ip(n));
                    }
                }
                // Just outside: let through where it is global unicast and nothing holds it.
                let max = u128::MAX >> (128 - width);
                for n in [first.checked_sub(1), (last < max).then(|| last + 1)].into_iter().flatten() {
                    let judged_alone = width == 32 || (n >> 125 == 1 && carries_v4(n).is_none());
                    if judged_alone && !registry_refuses(rows, width, n) {
                        assert_eq!(guard_refuses(ip(n)), None, "{} (beside {block}, {name}) is global", ip(n));
                        outside_let_through += 1;
                    }
                }
            }
        }
        assert!(outside_let_through > 40, "only {outside_let_through} addresses beside a row were tried");
    }

    /// The IPv4 address a NAT64, 6to4, mapped or compatible IPv6 address carries.
    fn carries_v4(ip: u128) -> Option<u128> {
        let low = ip & 0xffff_ffff;
        match ip >> 32 {
            0 | 0xffff | 0xffff_0000 | 0x64_ff9b_0000_0000_0000_0000 => Some(low),
            _ if ip >> 112 == 0x2002 => Some((ip >> 80) & 0xffff_ffff),
            _ => None,
        }
    }
}
