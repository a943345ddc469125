//! The IPAM flags. Cilium's names where Cilium has them (`--ipam`, `--ipv4-alloc-cidr`); the
//! `--eni-*` and `--ipam-*` ones name the CiliumNode spec fields the agent declares
//! (`spec.eni.*`, `spec.ipam.*`), which Cilium's agent fills from its own config.

use std::collections::HashMap;
use std::path::PathBuf;

use meshwork_ipam::{Ipv4Cidr, Mode};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::args::ArgsError;

/// `--ipam`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IpamMode {
    /// Pod IPs from the ENIs the operator allocates (`--operator-addr`).
    Eni,
    /// Pod IPs from the node's pod CIDR (`--ipv4-alloc-cidr`), host-local.
    ClusterPool,
}

impl From<IpamMode> for Mode {
    fn from(mode: IpamMode) -> Self {
        match mode {
            IpamMode::Eni => Mode::Eni,
            IpamMode::ClusterPool => Mode::ClusterPool,
        }
    }
}

/// A `key=value` of a tag list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    /// The key.
    pub key: String,
    /// The value (may be empty).
    pub value: String,
}

fn tag(text: &str) -> Result<Tag, String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok(Tag {
            key: key.to_owned(),
            value: value.to_owned(),
        }),
        _ => Err(format!("{text:?} is not key=value")),
    }
}

/// The IPAM flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct IpamArgs {
    /// IP address management for this node's pods, served on the API socket
    /// (`meshwork.agent.v1.Ipam`) for the CNI plugin: `eni` hands out the IPs the
    /// operator allocates on the instance's ENIs (needs `--operator-addr` and
    /// `--eni-instance-id`); `cluster-pool` hands out `--ipv4-alloc-cidr` host-locally.
    /// Default: off (no Ipam service).
    #[arg(long, value_enum, value_name = "MODE")]
    pub ipam: Option<IpamMode>,

    /// The operator's IPAM API (`meshwork.ipam.v1.NodeIpam`), `http://HOST:PORT` or
    /// `https://HOST:PORT` (then `--operator-tls-ca` is required). The agent registers its
    /// node, watches its snapshots and reports its usage there, reconnecting with backoff
    /// and allocating from the last snapshot meanwhile.
    #[arg(long, value_name = "URL")]
    pub operator_addr: Option<String>,

    /// CA (PEM) that signed the operator's certificate.
    #[arg(long, value_name = "FILE")]
    pub operator_tls_ca: Option<PathBuf>,

    /// Client certificate (PEM) for mTLS with the operator; its CN must be this node's name
    /// (`--node-name`). Requires `--operator-tls-key`.
    #[arg(long, value_name = "FILE")]
    pub operator_tls_cert: Option<PathBuf>,

    /// Private key (PEM) of `--operator-tls-cert`.
    #[arg(long, value_name = "FILE")]
    pub operator_tls_key: Option<PathBuf>,

    /// This node's EC2 instance (`spec.eni.instance-id`, i-…); default: asked of the
    /// instance metadata service (`--eni-metadata-endpoint`) before registering, as
    /// Cilium's agent does.
    #[arg(long, value_name = "ID")]
    pub eni_instance_id: Option<String>,

    /// The EC2 instance metadata service (IMDSv2), asked for this node's instance ID when
    /// `--eni-instance-id` is not given.
    #[arg(long, value_name = "URL", default_value = super::imds::DEFAULT_ENDPOINT)]
    pub eni_metadata_endpoint: String,

    /// The instance type (`spec.eni.instance-type`, e.g. m5.large); default: the operator
    /// describes the instance.
    #[arg(long, value_name = "TYPE")]
    pub eni_instance_type: Option<String>,

    /// New ENIs go into subnets carrying all these tags (`spec.eni.subnet-tags`),
    /// `k=v,k=v`.
    #[arg(long, value_name = "K=V,…", value_delimiter = ',', value_parser = tag)]
    pub eni_subnet_tags: Vec<Tag>,

    /// New ENIs go into one of these subnets (`spec.eni.subnet-ids`, before the tags),
    /// `subnet-…,subnet-…`.
    #[arg(long, value_name = "ID,…", value_delimiter = ',')]
    pub eni_subnet_ids: Vec<String>,

    /// New ENIs get the security groups carrying all these tags
    /// (`spec.eni.security-group-tags`), `k=v,k=v`.
    #[arg(long, value_name = "K=V,…", value_delimiter = ',', value_parser = tag)]
    pub eni_security_group_tags: Vec<Tag>,

    /// New ENIs get these security groups (`spec.eni.security-groups`, before the tags).
    #[arg(long, value_name = "ID,…", value_delimiter = ',')]
    pub eni_security_groups: Vec<String>,

    /// ENIs carrying all these tags are never used (`spec.eni.exclude-interface-tags`).
    #[arg(long, value_name = "K=V,…", value_delimiter = ',', value_parser = tag)]
    pub eni_exclude_interface_tags: Vec<Tag>,

    /// The lowest device index an ENI is attached at (`spec.eni.first-interface-index`);
    /// default: the operator's (Cilium's 0).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(0..))]
    pub eni_first_interface_index: Option<i32>,

    /// Free IPs to keep ready (`spec.ipam.pre-allocate`); default: the operator's (Cilium's 8).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(0..))]
    pub ipam_pre_allocate: Option<i32>,

    /// IPs to allocate at least (`spec.ipam.min-allocate`; 0: none). The agent is ready
    /// once its pool holds this many (else pre-allocate's many, else 1).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub ipam_min_allocate: i32,

    /// IPs to allocate at most (`spec.ipam.max-allocate`; 0: no limit).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub ipam_max_allocate: i32,

    /// IPs to allocate beyond what pre-allocate asks (`spec.ipam.max-above-watermark`).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub ipam_max_above_watermark: i32,
}

impl IpamArgs {
    /// Refuses missing and contradictory IPAM flags; `ipv4_alloc_cidr` is
    /// `--ipv4-alloc-cidr` (validated as a CIDR already).
    pub fn validate(&self, ipv4_alloc_cidr: Option<&str>) -> Result<(), ArgsError> {
        let eni_flags = self.eni_flags_given();
        match self.ipam {
            None => {
                if let Some(flag) = self.operator_flag_given().or(eni_flags) {
                    return Err(ArgsError::new(flag, &"needs --ipam eni"));
                }
            }
            Some(IpamMode::ClusterPool) => {
                if let Some(flag) = self.operator_flag_given().or(eni_flags) {
                    return Err(ArgsError::new(
                        flag,
                        &"is for --ipam eni; --ipam cluster-pool allocates from --ipv4-alloc-cidr alone",
                    ));
                }
                let Some(cidr) = ipv4_alloc_cidr else {
                    return Err(ArgsError::new(
                        "ipam",
                        &"cluster-pool needs --ipv4-alloc-cidr (the node's pod CIDR)",
                    ));
                };
                self.cluster_cidr(cidr)?;
            }
            Some(IpamMode::Eni) => {
                let Some(addr) = &self.operator_addr else {
                    return Err(ArgsError::new(
                        "ipam",
                        &"eni needs --operator-addr (the operator's http(s)://HOST:PORT)",
                    ));
                };
                if self.eni_instance_id.as_deref() == Some("") {
                    return Err(ArgsError::new(
                        "eni-instance-id",
                        &"is empty (leave it out to ask the instance metadata service)",
                    ));
                }
                if self.eni_instance_id.is_none() {
                    super::imds::authority(&self.eni_metadata_endpoint)
                        .map_err(|err| ArgsError::new("eni-metadata-endpoint", &err))?;
                }
                self.check_operator(addr)?;
                if self.ipam_max_allocate > 0 && self.ipam_min_allocate > self.ipam_max_allocate {
                    return Err(ArgsError::new(
                        "ipam-min-allocate",
                        &format!(
                            "{} is above --ipam-max-allocate {}",
                            self.ipam_min_allocate, self.ipam_max_allocate
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The first ENI-only flag given, if any.
    fn eni_flags_given(&self) -> Option<&'static str> {
        [
            ("eni-instance-id", self.eni_instance_id.is_some()),
            ("eni-instance-type", self.eni_instance_type.is_some()),
            ("eni-subnet-tags", !self.eni_subnet_tags.is_empty()),
            ("eni-subnet-ids", !self.eni_subnet_ids.is_empty()),
            (
                "eni-security-group-tags",
                !self.eni_security_group_tags.is_empty(),
            ),
            ("eni-security-groups", !self.eni_security_groups.is_empty()),
            (
                "eni-exclude-interface-tags",
                !self.eni_exclude_interface_tags.is_empty(),
            ),
            (
                "eni-first-interface-index",
                self.eni_first_interface_index.is_some(),
            ),
            ("ipam-pre-allocate", self.ipam_pre_allocate.is_some()),
            ("ipam-min-allocate", self.ipam_min_allocate != 0),
            ("ipam-max-allocate", self.ipam_max_allocate != 0),
            (
                "ipam-max-above-watermark",
                self.ipam_max_above_watermark != 0,
            ),
        ]
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag))
    }

    fn operator_flag_given(&self) -> Option<&'static str> {
        [
            ("operator-addr", self.operator_addr.is_some()),
            ("operator-tls-ca", self.operator_tls_ca.is_some()),
            ("operator-tls-cert", self.operator_tls_cert.is_some()),
            ("operator-tls-key", self.operator_tls_key.is_some()),
        ]
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag))
    }

    fn check_operator(&self, addr: &str) -> Result<(), ArgsError> {
        let https = match addr.split_once("://") {
            Some(("https", rest)) if !rest.is_empty() => true,
            Some(("http", rest)) if !rest.is_empty() => false,
            _ => {
                return Err(ArgsError::new(
                    "operator-addr",
                    &format!("{addr:?} is not http://HOST:PORT or https://HOST:PORT"),
                ));
            }
        };
        if let Err(err) = tonic::transport::Endpoint::from_shared(addr.to_owned()) {
            return Err(ArgsError::new("operator-addr", &format!("{addr:?}: {err}")));
        }
        match (https, &self.operator_tls_ca) {
            (true, None) => {
                return Err(ArgsError::new(
                    "operator-addr",
                    &format!("{addr:?} is https: add --operator-tls-ca (the operator's CA)"),
                ));
            }
            (false, Some(_)) => {
                return Err(ArgsError::new(
                    "operator-tls-ca",
                    &format!("TLS needs an https:// --operator-addr, not {addr:?}"),
                ));
            }
            _ => {}
        }
        match (&self.operator_tls_cert, &self.operator_tls_key) {
            (Some(_), None) => Err(ArgsError::new(
                "operator-tls-cert",
                &"needs --operator-tls-key",
            )),
            (None, Some(_)) => Err(ArgsError::new(
                "operator-tls-key",
                &"needs --operator-tls-cert",
            )),
            _ => Ok(()),
        }
    }

    /// `--ipv4-alloc-cidr` as the cluster pool's CIDR.
    pub fn cluster_cidr(&self, cidr: &str) -> Result<Ipv4Cidr, ArgsError> {
        let parsed: Ipv4Cidr = cidr
            .parse()
            .map_err(|e| ArgsError::new("ipv4-alloc-cidr", &e))?;
        if parsed.hosts() < 2 {
            return Err(ArgsError::new(
                "ipv4-alloc-cidr",
                &format!("{cidr}: too small for --ipam cluster-pool (at most /30)"),
            ));
        }
        Ok(parsed)
    }

    /// The TLS to the operator, read from the `--operator-tls-*` files; `None` without
    /// `--operator-tls-ca`.
    pub fn operator_tls(&self) -> Result<Option<ClientTlsConfig>, ArgsError> {
        let Some(ca) = &self.operator_tls_ca else {
            return Ok(None);
        };
        let read = |flag: &'static str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| ArgsError::new(flag, &format!("{}: {e}", path.display())))
        };
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read("operator-tls-ca", ca)?));
        if let (Some(cert), Some(key)) = (&self.operator_tls_cert, &self.operator_tls_key) {
            config = config.identity(Identity::from_pem(
                read("operator-tls-cert", cert)?,
                read("operator-tls-key", key)?,
            ));
        }
        Ok(Some(config))
    }

    /// The CiliumNode spec this node declares (`RegisterNode`).
    pub fn register_request(&self, node: &str) -> meshwork_proto::ipam::v1::RegisterNodeRequest {
        let tags = |tags: &[Tag]| -> HashMap<String, String> {
            tags.iter()
                .map(|t| (t.key.clone(), t.value.clone()))
                .collect()
        };
        meshwork_proto::ipam::v1::RegisterNodeRequest {
            node: node.to_owned(),
            instance_id: self.eni_instance_id.clone().unwrap_or_default(),
            instance_type: self.eni_instance_type.clone().unwrap_or_default(),
            subnet_tags: tags(&self.eni_subnet_tags),
            security_group_tags: tags(&self.eni_security_group_tags),
            first_interface_index: self.eni_first_interface_index,
            pre_allocate: self.ipam_pre_allocate,
            min_allocate: self.ipam_min_allocate,
            max_allocate: self.ipam_max_allocate,
            max_above_watermark: self.ipam_max_above_watermark,
            subnet_ids: self.eni_subnet_ids.clone(),
            security_groups: self.eni_security_groups.clone(),
            exclude_interface_tags: tags(&self.eni_exclude_interface_tags),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::args::Args;

    fn validate(flags: &[&str]) -> Result<Args, String> {
        let mut argv = vec!["meshwork-agent", "--node-name", "node-1"];
        argv.extend_from_slice(flags);
        let args = Args::try_parse_from(argv).map_err(|e| e.to_string())?;
        args.validate().map_err(|e| e.to_string())?;
        Ok(args)
    }

    const ENI: [&str; 6] = [
        "--ipam",
        "eni",
        "--operator-addr",
        "http://127.0.0.1:9",
        "--eni-instance-id",
        "i-0123",
    ];

    #[test]
    fn missing_and_contradictory_flags_are_refused_naming_the_flag() {
        let with_eni = |more: &[&'static str]| -> Vec<&'static str> {
            ENI.iter().chain(more).copied().collect()
        };
        // (flags → the error's start)
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (vec!["--ipam", "eni"], "--ipam: eni needs --operator-addr"),
            (
                vec![
                    "--ipam",
                    "eni",
                    "--operator-addr",
                    "http://127.0.0.1:9",
                    "--eni-instance-id",
                    "",
                ],
                "--eni-instance-id: is empty",
            ),
            (
                vec![
                    "--ipam",
                    "eni",
                    "--operator-addr",
                    "http://127.0.0.1:9",
                    "--eni-metadata-endpoint",
                    "https://169.254.169.254",
                ],
                "--eni-metadata-endpoint: --eni-metadata-endpoint \"https://169.254.169.254\" is not",
            ),
            (
                vec!["--ipam", "cluster-pool"],
                "--ipam: cluster-pool needs --ipv4-alloc-cidr",
            ),
            (
                vec!["--ipam", "cluster-pool", "--ipv4-alloc-cidr", "10.0.0.0/31"],
                "--ipv4-alloc-cidr: 10.0.0.0/31: too small",
            ),
            (
                vec![
                    "--ipam",
                    "cluster-pool",
                    "--ipv4-alloc-cidr",
                    "10.0.0.0/24",
                    "--operator-addr",
                    "http://127.0.0.1:9",
                ],
                "--operator-addr: is for --ipam eni",
            ),
            (
                vec!["--eni-instance-id", "i-1"],
                "--eni-instance-id: needs --ipam eni",
            ),
            (
                vec!["--ipam-pre-allocate", "4"],
                "--ipam-pre-allocate: needs --ipam eni",
            ),
            (
                vec!["--operator-addr", "http://127.0.0.1:9"],
                "--operator-addr: needs --ipam eni",
            ),
            (
                vec![
                    "--ipam",
                    "eni",
                    "--operator-addr",
                    "127.0.0.1:9",
                    "--eni-instance-id",
                    "i-1",
                ],
                "--operator-addr: \"127.0.0.1:9\" is not http://HOST:PORT",
            ),
            (
                vec![
                    "--ipam",
                    "eni",
                    "--operator-addr",
                    "https://127.0.0.1:9",
                    "--eni-instance-id",
                    "i-1",
                ],
                "--operator-addr: \"https://127.0.0.1:9\" is https: add --operator-tls-ca",
            ),
            (
                with_eni(&["--operator-tls-ca", "/ca.pem"]),
                "--operator-tls-ca: TLS needs an https://",
            ),
            (
                with_eni(&["--ipam-min-allocate", "9", "--ipam-max-allocate", "8"]),
                "--ipam-min-allocate: 9 is above --ipam-max-allocate 8",
            ),
        ];
        for (flags, expected) in cases {
            let err = validate(&flags).expect_err(&format!("{flags:?} was accepted"));
            assert!(err.starts_with(expected), "{flags:?}: {err}");
        }
        let https_cert_without_key = [
            "--ipam",
            "eni",
            "--operator-addr",
            "https://127.0.0.1:9",
            "--eni-instance-id",
            "i-1",
            "--operator-tls-ca",
            "/ca.pem",
            "--operator-tls-cert",
            "/c.pem",
        ];
        assert_eq!(
            validate(&https_cert_without_key).unwrap_err(),
            "--operator-tls-cert: needs --operator-tls-key"
        );
        // Malformed values are clap's to refuse.
        for flags in [
            with_eni(&["--eni-subnet-tags", "novalue"]),
            with_eni(&["--ipam-pre-allocate", "-1"]),
            vec!["--ipam", "dhcp"],
        ] {
            assert!(validate(&flags).is_err(), "{flags:?}");
        }
        // Without --ipam the agent runs as before.
        assert!(validate(&[]).unwrap().ipam.ipam.is_none());
    }

    #[test]
    fn the_eni_flags_become_the_registered_spec() {
        let flags: Vec<&str> = ENI
            .iter()
            .copied()
            .chain([
                "--eni-instance-type",
                "m5.large",
                "--eni-subnet-tags",
                "kubernetes.io/role/internal-elb=1,team=net",
                "--eni-security-group-tags",
                "app=mesh",
                "--eni-first-interface-index",
                "1",
                "--ipam-pre-allocate",
                "4",
                "--ipam-min-allocate",
                "2",
                "--ipam-max-allocate",
                "16",
                "--ipam-max-above-watermark",
                "3",
            ])
            .collect();
        let args = validate(&flags).unwrap();
        let spec = args.ipam.register_request("node-1");
        assert_eq!(spec.node, "node-1");
        assert_eq!(
            (spec.instance_id.as_str(), spec.instance_type.as_str()),
            ("i-0123", "m5.large")
        );
        assert_eq!(spec.subnet_tags.len(), 2);
        assert_eq!(spec.subnet_tags["kubernetes.io/role/internal-elb"], "1");
        assert_eq!(spec.security_group_tags["app"], "mesh");
        assert_eq!(spec.first_interface_index, Some(1));
        assert_eq!(spec.pre_allocate, Some(4));
        assert_eq!(
            (
                spec.min_allocate,
                spec.max_allocate,
                spec.max_above_watermark
            ),
            (2, 16, 3)
        );
        // Absent: the operator's defaults.
        let spec = validate(&ENI).unwrap().ipam.register_request("node-1");
        assert_eq!(
            (spec.pre_allocate, spec.first_interface_index),
            (None, None)
        );
    }
}
