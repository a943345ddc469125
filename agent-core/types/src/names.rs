//! Names of Kubernetes objects, as Cilium's nodes carry them.

/// Checks that `name` can name a Kubernetes object (a DNS-1123 subdomain), as a node's (and
/// a CiliumNode's) name must; the error says why not.
pub fn validate_node_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > 253 {
        return Err("it is longer than 253 characters");
    }
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !name.split('.').all(|label| {
        let bytes = label.as_bytes();
        !bytes.is_empty()
            && bytes.iter().all(|&b| allowed(b) || b == b'-')
            && allowed(bytes[0])
            && allowed(bytes[bytes.len() - 1])
    }) {
        return Err(
            "it must be lower-case letters, digits, '-' and '.', starting and ending \
                    with a letter or digit",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_dns_subdomains() {
        for good in ["node-1", "ip-10-0-0-1.ec2.internal", "a"] {
            assert_eq!(validate_node_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "Node-1",
            "-node",
            "node-",
            "a..b",
            "node_1",
            &"a".repeat(254),
        ] {
            assert!(validate_node_name(bad).is_err(), "{bad:?}");
        }
    }
}
