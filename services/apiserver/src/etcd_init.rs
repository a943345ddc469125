//! `meshwork-apiserver etcd-init`: Cilium's etcd users and roles for a cluster
//! (cilium-semantics §8), so that with client-certificate auth (the certificate's CN is the
//! user) each reader can read exactly what it needs and only the apiserver can write.
//!
//! - `root` and `admin-<cluster>` (the apiserver's own user): role `root`;
//! - `local-<cluster>` (agents of this cluster reading through kvstoremesh): role `local`,
//!   read `cilium/.heartbeat`, `cilium/cache/`, `cilium/cluster-config/`, `cilium/synced/`;
//! - `remote` (agents and kvstoremeshes of other clusters): role `remote`, read-only on
//!   `cilium/.heartbeat`, `cilium/state/`, the key `cilium/cluster-config/<cluster>` and
//!   `cilium/synced/<cluster>/`.
//!
//! Idempotent: what exists is kept, what is missing is added, and auth is enabled.

use etcd_client::{Client, Permission, UserAddOptions};
use meshwork_types::keys::{HAS_CLUSTER_CONFIG_KEY, HEARTBEAT_KEY};

/// One read permission: a key, or every key under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The key or prefix.
    pub key: String,
    /// `key` is a prefix.
    pub prefix: bool,
}

fn key(key: &str) -> Read {
    Read {
        key: key.to_owned(),
        prefix: false,
    }
}

fn prefix(prefix: &str) -> Read {
    Read {
        key: prefix.to_owned(),
        prefix: true,
    }
}

/// The roles (other than etcd's built-in `root`) and what each may read. Beyond the list
/// of the contract (§8), both read `cilium/.has-cluster-config`: the agent reads the marker
/// with the cluster config in one transaction (§2), which etcd refuses whole when one key
/// of it is not granted.
pub fn roles(cluster: &str) -> Vec<(&'static str, Vec<Read>)> {
    vec![
        (
            "local",
            vec![
                key(HAS_CLUSTER_CONFIG_KEY),
                key(HEARTBEAT_KEY),
                prefix("cilium/cache/"),
                prefix("cilium/cluster-config/"),
                prefix("cilium/synced/"),
            ],
        ),
        (
            "remote",
            vec![
                key(HAS_CLUSTER_CONFIG_KEY),
                key(HEARTBEAT_KEY),
                prefix("cilium/state/"),
                key(&format!("cilium/cluster-config/{cluster}")),
                prefix(&format!("cilium/synced/{cluster}/")),
            ],
        ),
    ]
}

/// The users and their role.
pub fn users(cluster: &str) -> Vec<(String, &'static str)> {
    vec![
        ("root".to_owned(), "root"),
        (format!("admin-{cluster}"), "root"),
        (format!("local-{cluster}"), "local"),
        ("remote".to_owned(), "remote"),
    ]
}

/// Creates what is missing of [`roles`] and [`users`] (users without a password: they log
/// in with their client certificate) and enables auth. Returns one line per thing done.
pub async fn init(client: &mut Client, cluster: &str) -> Result<Vec<String>, etcd_client::Error> {
    let mut done = Vec::new();
    let existing_roles = client.role_list().await?.roles().to_vec();
    for (role, reads) in roles(cluster) {
        if existing_roles.iter().any(|r| r == role) {
            done.push(format!("role {role}: present"));
        } else {
            client.role_add(role).await?;
            done.push(format!("role {role}: added"));
        }
        // Granting what is granted already changes nothing.
        for read in reads {
            let permission = Permission::read(read.key.as_bytes());
            let permission = if read.prefix {
                permission.with_prefix()
            } else {
                permission
            };
            client.role_grant_permission(role, permission).await?;
        }
    }
    let existing_users = client.user_list().await?.users().to_vec();
    for (user, role) in users(cluster) {
        if existing_users.contains(&user) {
            done.push(format!("user {user}: present"));
        } else {
            client
                .user_add(user.as_str(), "", Some(UserAddOptions::new().with_no_pwd()))
                .await?;
            done.push(format!("user {user}: added"));
        }
        client.user_grant_role(user.as_str(), role).await?;
    }
    client.auth_enable().await?;
    done.push("auth: enabled".to_owned());
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_reads_only_this_clusters_config_and_canaries() {
        let roles = roles("c1");
        let remote = &roles.iter().find(|(r, _)| *r == "remote").unwrap().1;
        assert!(remote.contains(&key("cilium/cluster-config/c1")));
        assert!(remote.contains(&key("cilium/.has-cluster-config")));
        assert!(remote.contains(&prefix("cilium/synced/c1/")));
        assert!(!remote.iter().any(|r| r.key == "cilium/cluster-config/"));
        assert_eq!(users("c1")[1], ("admin-c1".to_owned(), "root"));
    }
}
