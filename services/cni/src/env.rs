//! The CNI_* environment: the command, the container, its namespace and interface, CNI_ARGS.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::error::{CniError, ErrorCode};

/// The longest interface name Linux accepts (IFNAMSIZ - 1).
pub const MAX_IFNAME: usize = 15;

/// CNI_COMMAND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Attach the container to the network.
    Add,
    /// Detach it; idempotent.
    Del,
    /// Verify that it is attached as ADD left it (0.4.0 and later).
    Check,
    /// Report the spec versions this plugin speaks.
    Version,
    /// CNI 1.1's readiness probe; answered as unsupported (this plugin speaks 1.0.0).
    Status,
    /// CNI 1.1's garbage collection; answered as unsupported.
    Gc,
}

impl FromStr for Command {
    type Err = CniError;

    fn from_str(text: &str) -> Result<Self, CniError> {
        match text {
            "ADD" => Ok(Self::Add),
            "DEL" => Ok(Self::Del),
            "CHECK" => Ok(Self::Check),
            "VERSION" => Ok(Self::Version),
            "STATUS" => Ok(Self::Status),
            "GC" => Ok(Self::Gc),
            other => Err(CniError::new(
                ErrorCode::InvalidEnvironment,
                format!("unknown CNI_COMMAND {other:?} (ADD, DEL, CHECK or VERSION)"),
            )),
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Version => "VERSION",
            Self::Status => "STATUS",
            Self::Gc => "GC",
        })
    }
}

/// The CNI_* variables other than CNI_COMMAND, as given (checked by the command that needs
/// them: DEL needs no namespace, VERSION nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniEnv {
    /// CNI_CONTAINERID.
    pub container_id: Option<String>,
    /// CNI_NETNS: the container's network namespace, as a path.
    pub netns: Option<PathBuf>,
    /// CNI_IFNAME: the interface to make inside the container.
    pub ifname: Option<String>,
    /// CNI_ARGS, unparsed (`K=V;K=V`).
    pub args: Option<String>,
    /// CNI_PATH; this plugin runs no other plugin, so it is only kept.
    pub path: Option<String>,
}

impl CniEnv {
    /// Reads the CNI_* variables (all but CNI_COMMAND) from `vars`; empty values count as
    /// absent, as runtimes set some of them empty (CNI_NETNS on DEL).
    pub fn from_vars(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Self {
        let mut env = Self::default();
        for (key, value) in vars {
            let Some(key) = key.to_str() else { continue };
            if value.is_empty() {
                continue;
            }
            let text = || value.to_string_lossy().into_owned();
            match key {
                "CNI_CONTAINERID" => env.container_id = Some(text()),
                "CNI_NETNS" => env.netns = Some(PathBuf::from(&value)),
                "CNI_IFNAME" => env.ifname = Some(text()),
                "CNI_ARGS" => env.args = Some(text()),
                "CNI_PATH" => env.path = Some(text()),
                _ => {}
            }
        }
        env
    }

    /// CNI_CONTAINERID, checked as the spec says: ASCII letters, digits, `_`, `.`, `-`,
    /// starting with a letter or digit.
    pub fn container_id(&self) -> Result<&str, CniError> {
        let id = self
            .container_id
            .as_deref()
            .ok_or_else(|| missing("CNI_CONTAINERID"))?;
        let valid = id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !valid {
            return Err(CniError::new(
                ErrorCode::InvalidEnvironment,
                format!("CNI_CONTAINERID {id:?} is not [A-Za-z0-9][A-Za-z0-9_.-]*"),
            ));
        }
        Ok(id)
    }

    /// CNI_IFNAME, checked as Linux checks interface names.
    pub fn ifname(&self) -> Result<&str, CniError> {
        let name = self
            .ifname
            .as_deref()
            .ok_or_else(|| missing("CNI_IFNAME"))?;
        check_ifname(name).map_err(|why| {
            CniError::new(
                ErrorCode::InvalidEnvironment,
                format!("CNI_IFNAME {name:?} {why}"),
            )
        })?;
        Ok(name)
    }

    /// CNI_NETNS (required by ADD and CHECK).
    pub fn netns(&self) -> Result<&std::path::Path, CniError> {
        self.netns.as_deref().ok_or_else(|| missing("CNI_NETNS"))
    }

    /// CNI_ARGS, parsed.
    pub fn cni_args(&self) -> Result<CniArgs, CniError> {
        CniArgs::parse(self.args.as_deref().unwrap_or(""))
    }
}

/// Why `name` is no valid Linux interface name, if it is not.
pub fn check_ifname(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.len() > MAX_IFNAME {
        return Err("is longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return Err("is . or ..");
    }
    if name
        .bytes()
        .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err("holds '/', ':', whitespace or a control character");
    }
    Ok(())
}

fn missing(var: &str) -> CniError {
    CniError::new(
        ErrorCode::InvalidEnvironment,
        format!("{var} is not set (or empty)"),
    )
}

/// CNI_ARGS: the Kubernetes pod, and whether unknown keys are to be ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// K8S_POD_NAMESPACE.
    pub pod_namespace: Option<String>,
    /// K8S_POD_NAME.
    pub pod_name: Option<String>,
}

/// Keys that runtimes pass and this plugin accepts (only the pod's namespace and name are
/// used).
const KNOWN_ARGS: [&str; 5] = [
    "IgnoreUnknown",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
];

impl CniArgs {
    /// Parses `K=V;K=V`. A key other than `IgnoreUnknown` and `K8S_POD_*` (NAMESPACE, NAME,
    /// INFRA_CONTAINER_ID, UID) is an error unless
    /// `IgnoreUnknown` is `1` or `true` (the CNI convention).
    pub fn parse(text: &str) -> Result<Self, CniError> {
        let mut args = Self::default();
        let mut unknown = Vec::new();
        let mut ignore_unknown = false;
        for pair in text.split(';').filter(|p| !p.is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(CniError::new(
                    ErrorCode::InvalidEnvironment,
                    format!("CNI_ARGS: {pair:?} is not KEY=VALUE"),
                ));
            };
            match key {
                "IgnoreUnknown" => {
                    ignore_unknown = matches!(value.to_ascii_lowercase().as_str(), "1" | "true");
                }
                "K8S_POD_NAMESPACE" => args.pod_namespace = non_empty(value),
                "K8S_POD_NAME" => args.pod_name = non_empty(value),
                _ if KNOWN_ARGS.contains(&key) => {}
                _ => unknown.push(key.to_owned()),
            }
        }
        if !unknown.is_empty() && !ignore_unknown {
            return Err(CniError::new(
                ErrorCode::InvalidEnvironment,
                format!(
                    "CNI_ARGS: unknown keys {} (set IgnoreUnknown=1 to ignore them)",
                    unknown.join(", ")
                ),
            ));
        }
        Ok(args)
    }

    /// `namespace/name` when both are known (what the agent's IPAM records).
    pub fn pod(&self) -> Option<String> {
        match (&self.pod_namespace, &self.pod_name) {
            (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
            _ => None,
        }
    }
}

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> CniEnv {
        CniEnv::from_vars(pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())))
    }

    #[test]
    fn commands_parse_and_unknown_ones_are_invalid_environment() {
        assert_eq!("ADD".parse::<Command>().unwrap(), Command::Add);
        assert_eq!("GC".parse::<Command>().unwrap(), Command::Gc);
        let err = "add".parse::<Command>().unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidEnvironment);
    }

    #[test]
    fn variables_are_read_and_checked_when_asked_for() {
        let e = env(&[
            ("CNI_CONTAINERID", "abc-1.2_3"),
            ("CNI_NETNS", ""),
            ("CNI_IFNAME", "eth0"),
            ("HOME", "/root"),
        ]);
        assert_eq!(e.container_id().unwrap(), "abc-1.2_3");
        assert_eq!(e.ifname().unwrap(), "eth0");
        assert_eq!(e.netns().unwrap_err().code, ErrorCode::InvalidEnvironment);

        for bad in ["-x", "a/b", "a b", ""] {
            let e = env(&[("CNI_CONTAINERID", bad)]);
            assert_eq!(
                e.container_id().unwrap_err().code,
                ErrorCode::InvalidEnvironment
            );
        }
        for bad in ["0123456789abcdef", "a/b", "..", "a:b", "a b"] {
            let e = env(&[("CNI_IFNAME", bad)]);
            assert_eq!(
                e.ifname().unwrap_err().code,
                ErrorCode::InvalidEnvironment,
                "{bad}"
            );
        }
    }

    #[test]
    fn cni_args_give_the_pod_and_refuse_unknown_keys_unless_told() {
        let args = CniArgs::parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;FOO=bar;K8S_POD_UID=u",
        )
        .unwrap();
        assert_eq!(args.pod().as_deref(), Some("default/web-0"));

        let err = CniArgs::parse("K8S_POD_NAME=web-0;FOO=bar").unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidEnvironment);
        assert!(err.msg.contains("FOO"), "{}", err.msg);

        let args = CniArgs::parse("K8S_POD_NAME=web-0").unwrap();
        assert_eq!(args.pod(), None, "no namespace, no pod");
        assert_eq!(
            CniArgs::parse("nokey").unwrap_err().code,
            ErrorCode::InvalidEnvironment
        );
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
    }
}
