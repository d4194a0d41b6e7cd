//! The outbound address guard of remotes (SEMANTICS.md §13 "Security"): checked when a remote is
//! registered or changed (`crate::api::remotes`) and on every dial ([`super::client::connect`]),
//! so a name that later resolves somewhere else is still refused.

use std::net::{IpAddr, Ipv6Addr};

/// Whether `ip` lies in the CIDR `cidr` (`a.b.c.d/n` or `v6/n`; a bare address is /32 or /128).
fn in_cidr(ip: IpAddr, cidr: &str) -> bool {
    let (net, bits) = match cidr.split_once('/') {
        Some((n, b)) => (n, b.parse::<u32>().ok()),
        None => (cidr, None),
    };
    match (ip, net.parse::<IpAddr>()) {
        (IpAddr::V4(a), Ok(IpAddr::V4(n))) => {
            let bits = bits.unwrap_or(32).min(32);
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), Ok(IpAddr::V6(n))) => {
            let bits = bits.unwrap_or(128).min(128);
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Loopback, link-local (cloud metadata included), unspecified and IPv4-mapped forms of them are
/// refused unless `remotes.allow_addresses` (`allow`) names them.
pub fn address_allowed(ip: IpAddr, allow: &[String]) -> bool {
    if allow.iter().any(|c| in_cidr(ip, c)) {
        return true;
    }
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let refused = match ip {
        IpAddr::V4(a) => a.is_loopback() || a.is_link_local() || a.is_unspecified(),
        IpAddr::V6(a) => {
            a.is_loopback()
                || a.is_unspecified()
                || (a.segments()[0] & 0xffc0) == 0xfe80
                || a == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
        }
    };
    !refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_guard_refuses_loopback_link_local_and_metadata() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        for bad in [
            "127.0.0.1",
            "::1",
            "169.254.169.254",
            "0.0.0.0",
            "fe80::1",
            "::ffff:127.0.0.1",
            "fd00:ec2::254",
        ] {
            assert!(!address_allowed(ip(bad), &[]), "{bad}");
        }
        for good in ["192.0.2.10", "10.1.2.3", "2001:db8::1"] {
            assert!(address_allowed(ip(good), &[]), "{good}");
        }
        let allow = vec!["127.0.0.0/8".to_string(), "fe80::/10".to_string()];
        assert!(address_allowed(ip("127.0.0.1"), &allow));
        assert!(address_allowed(ip("fe80::1"), &allow));
        assert!(!address_allowed(ip("169.254.169.254"), &allow));
        assert!(in_cidr(ip("10.1.2.3"), "10.0.0.0/8") && !in_cidr(ip("11.1.2.3"), "10.0.0.0/8"));
    }
}
