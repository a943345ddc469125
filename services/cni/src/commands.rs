//! ADD, DEL and CHECK: the agent's calls and the plumbing, in the order that keeps a
//! failure from leaving anything behind.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use meshwork_proto::agent::v1 as pb;

use crate::agent::Agent;
use crate::config::NetConf;
use crate::env::CniEnv;
use crate::error::{CniError, ErrorCode};
use crate::naming;
use crate::netlink::format_mac;
use crate::netns::{HostNetns, Netns, NetnsError};
use crate::plumbing::{self, PlumbingError, PodNetwork};
use crate::result::{CniResult, Interface, IpConfig, PrevAddress, RouteConfig};

/// The attachment's names, from CNI_CONTAINERID and CNI_IFNAME.
struct Attachment {
    ifname: String,
    owner: String,
    host_ifname: String,
    endpoint_id: u64,
}

impl Attachment {
    fn from_env(env: &CniEnv) -> Result<Self, CniError> {
        let container_id = env.container_id()?;
        let ifname = env.ifname()?;
        Ok(Self {
            ifname: ifname.to_owned(),
            owner: naming::owner(container_id, ifname),
            host_ifname: naming::host_ifname(container_id, ifname),
            endpoint_id: naming::endpoint_id(container_id, ifname),
        })
    }
}

/// What an ADD works on, all checked before the agent is asked for an IP.
struct AddPlan<'a> {
    conf: &'a NetConf,
    attachment: Attachment,
    labels: Vec<String>,
    /// The pod's namespace and name, both or neither (the agent refuses a name alone).
    pod_ref: Option<(String, String)>,
    host: Arc<HostNetns>,
    pod: Arc<Netns>,
}

/// ADD: an IP from the agent, the veth and its addresses and routes, the endpoint; on a
/// failure after the IP was handed out, all of it is undone before the error is returned.
pub async fn add(env: &CniEnv, conf: &NetConf) -> Result<CniResult, CniError> {
    let attachment = Attachment::from_env(env)?;
    let args = env.cni_args()?;
    let labels = conf.labels_for(args.pod_namespace.as_deref());
    if conf.identity.is_none() && labels.is_empty() {
        return Err(CniError::new(
            ErrorCode::InvalidConfig,
            "the endpoint needs an identity: set `identity`, or give `labels` (or a pod \
             namespace in CNI_ARGS) for the apiserver to allocate one",
        ));
    }
    let pod_path = env.netns()?;
    let pod = Arc::new(Netns::open(pod_path).map_err(|e| pod_netns_error(&e))?);
    let host = Arc::new(open_host(conf)?);
    // Connected before any namespace is compared or changed: without an agent nothing is done.
    let mut agent = Agent::connect(&conf.agent_socket).await?;
    // Neither the node's namespace, nor the plugin's own, nor the machine's (PID 1's): a pod
    // end, its address and routes made there would change the host's network.
    // PID 1's may be closed to us (a sandbox can deny it even to root): then it is not compared.
    let own = Netns::current().map_err(|e| netns_io(&e))?;
    let init = Netns::open("/proc/1/ns/net").ok();
    let hostish = host.is(&pod).map_err(|e| netns_io(&e))?
        || own.same_as(&pod).map_err(|e| netns_io(&e))?
        || match &init {
            Some(init) => init.same_as(&pod).map_err(|e| netns_io(&e))?,
            None => false,
        };
    if hostish {
        return Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            format!(
                "CNI_NETNS {} is a host namespace (the node's, the plugin's or PID 1's), not a \
                 container's",
                pod_path.display()
            ),
        ));
    }
    let plan = AddPlan {
        conf,
        attachment,
        labels,
        pod_ref: args.pod_namespace.clone().zip(args.pod_name.clone()),
        host,
        pod,
    };

    let allocation = agent.allocate(&plan.attachment.owner, args.pod()).await?;
    let mut progress = Progress::default();
    match attach(&mut agent, &plan, &allocation, &mut progress).await {
        Ok(result) => Ok(result),
        Err(mut err) => {
            undo(&mut agent, &plan, &allocation, progress, &mut err).await;
            Err(err)
        }
    }
}

/// How far an ADD got (what its undo must take back besides the IP).
#[derive(Default)]
struct Progress {
    veth: bool,
    endpoint: bool,
}

async fn attach(
    agent: &mut Agent,
    plan: &AddPlan<'_>,
    allocation: &pb::AllocateResponse,
    progress: &mut Progress,
) -> Result<CniResult, CniError> {
    let AddPlan {
        conf,
        attachment,
        labels,
        pod_ref,
        host,
        pod,
    } = plan;
    let net = PodNetwork {
        host_ifname: attachment.host_ifname.clone(),
        pod_ifname: attachment.ifname.clone(),
        ip: parse_v4("ip", &allocation.ip)?,
        prefix_len: u8::try_from(allocation.prefix_len)
            .ok()
            .filter(|len| *len <= 32)
            .ok_or_else(|| {
                answer_error(format!(
                    "the agent gave prefix length {}",
                    allocation.prefix_len
                ))
            })?,
        gateway: parse_v4("gateway", &allocation.gateway)?,
        mtu: conf.mtu,
    };

    progress.veth = true;
    let attached = {
        let (host, pod, net) = (Arc::clone(host), Arc::clone(pod), net.clone());
        tokio::task::spawn_blocking(move || plumbing::setup(&host, &pod, &net))
            .await
            .map_err(|join| {
                CniError::new(ErrorCode::Netlink, "the network setup thread failed")
                    .with_details(join.to_string())
            })?
            .map_err(|err| plumbing_error("setting up the pod's network", &err))?
    };

    let (pod_namespace, pod_name) = pod_ref.clone().unwrap_or_default();
    progress.endpoint = true;
    agent
        .put_endpoint(pb::Endpoint {
            id: attachment.endpoint_id,
            interface: attachment.host_ifname.clone(),
            netns: host.endpoint_field(),
            ips: vec![net.ip.to_string()],
            identity: conf.identity.unwrap_or(0),
            allowed_identities: conf.allowed_identities.clone(),
            host: false,
            labels: labels.clone(),
            pod_namespace,
            pod_name,
        })
        .await?;

    Ok(CniResult {
        cni_version: conf.cni_version,
        interfaces: vec![
            Interface {
                name: attached.host.name.clone(),
                mac: format_mac(&attached.host.mac),
                sandbox: None,
            },
            Interface {
                name: attached.pod.name.clone(),
                mac: format_mac(&attached.pod.mac),
                sandbox: Some(pod.path().display().to_string()),
            },
        ],
        ips: vec![IpConfig {
            ip: IpAddr::V4(net.ip),
            prefix_len: net.prefix_len,
            gateway: Some(IpAddr::V4(net.gateway)),
            interface: Some(1),
        }],
        routes: vec![RouteConfig {
            dst: "0.0.0.0/0".to_owned(),
            gw: Some(IpAddr::V4(net.gateway)),
        }],
        dns: conf.dns.clone(),
    })
}

/// Takes back a failed ADD: the endpoint (if it was asked for), the veth, then the IP;
/// what happened goes into the error's details. The IP stays when the endpoint could not be
/// deleted (it may still map the IP: the runtime's DEL finishes the job), and when the owner
/// held it before this ADD (a repeated ADD of a running pod must not free its address).
async fn undo(
    agent: &mut Agent,
    plan: &AddPlan<'_>,
    allocation: &pb::AllocateResponse,
    progress: Progress,
    err: &mut CniError,
) {
    let attachment = &plan.attachment;
    if progress.endpoint
        && let Err(undo) = agent.delete_endpoint(attachment.endpoint_id).await
    {
        err.add_detail(&format!(
            "undo: deleting the endpoint failed, so its IP stays allocated until DEL: {undo}"
        ));
        return;
    }
    if progress.veth {
        let (host, name) = (Arc::clone(&plan.host), attachment.host_ifname.clone());
        let removed = tokio::task::spawn_blocking(move || plumbing::teardown(&host, &name)).await;
        match removed {
            Ok(Ok(_)) => {}
            Ok(Err(undo)) => err.add_detail(&format!("undo: removing the veth failed: {undo}")),
            Err(join) => err.add_detail(&format!("undo: removing the veth failed: {join}")),
        }
    }
    if allocation.existing {
        err.add_detail("the IP was the attachment's before this ADD: it stays allocated");
        return;
    }
    match agent.release(&attachment.owner).await {
        Ok(released) if released.released => {
            err.add_detail(&format!("undone: IP {} released", released.ip));
        }
        Ok(_) => err.add_detail("undone: the agent held no IP for the attachment"),
        Err(undo) => err.add_detail(&format!("undo: releasing the IP failed: {undo}")),
    }
}

/// DEL: the endpoint, the veth, then the IP; each missing piece counts as done. It stops at
/// the first failure (and the runtime retries), so an IP is never handed back while its
/// endpoint may still hold it.
pub async fn del(env: &CniEnv, conf: &NetConf) -> Result<(), CniError> {
    let attachment = Attachment::from_env(env)?;
    // CNI_ARGS are not needed to find what ADD made: a DEL must not fail on them.
    // A host namespace that is gone took the veth with it.
    let host = match HostNetns::open(conf.host_netns.as_deref()) {
        Ok(host) => Some(Arc::new(host)),
        Err(NetnsError::NotFound { .. }) => None,
        Err(err) => return Err(host_netns_error(&err)),
    };
    let mut agent = Agent::connect(&conf.agent_socket).await?;
    agent.delete_endpoint(attachment.endpoint_id).await?;
    if let Some(host) = host {
        let name = attachment.host_ifname.clone();
        tokio::task::spawn_blocking(move || plumbing::teardown(&host, &name))
            .await
            .map_err(|join| {
                CniError::new(ErrorCode::Netlink, "the network teardown thread failed")
                    .with_details(join.to_string())
            })?
            .map_err(|err| plumbing_error("removing the pod's veth", &err))?;
    }
    agent.release(&attachment.owner).await?;
    Ok(())
}

/// CHECK: the endpoint is registered with prevResult's IP, the IP is still the
/// attachment's, and the veth, address and routes are in place.
pub async fn check(env: &CniEnv, conf: &NetConf) -> Result<(), CniError> {
    if !conf.cni_version.has_check() {
        return Err(CniError::new(
            ErrorCode::IncompatibleVersion,
            format!(
                "CHECK does not exist in cniVersion {}",
                conf.cni_version.as_str()
            ),
        ));
    }
    let attachment = Attachment::from_env(env)?;
    env.cni_args()?;
    let prev = conf
        .prev_result
        .as_ref()
        .ok_or_else(|| CniError::new(ErrorCode::InvalidConfig, "CHECK needs prevResult"))?;
    let prev = PrevAddress::from_prev_result(prev)?;
    let pod = Netns::open(env.netns()?).map_err(|e| pod_netns_error(&e))?;
    let host = open_host(conf)?;
    let mut agent = Agent::connect(&conf.agent_socket).await?;

    let mut problems = Vec::new();
    match agent.endpoint(attachment.endpoint_id).await? {
        None => problems.push(format!(
            "the agent has no endpoint {}",
            attachment.endpoint_id
        )),
        Some(status) => {
            let endpoint = status.endpoint.unwrap_or_default();
            if endpoint.interface != attachment.host_ifname {
                problems.push(format!(
                    "endpoint {} is on {:?}, not {}",
                    endpoint.id, endpoint.interface, attachment.host_ifname
                ));
            }
            if !endpoint.ips.contains(&prev.ip.to_string()) {
                problems.push(format!(
                    "endpoint {} has IPs {:?}, not {}",
                    endpoint.id, endpoint.ips, prev.ip
                ));
            }
            if status.state == "failed" {
                problems.push(format!(
                    "endpoint {} failed to regenerate: {}",
                    endpoint.id,
                    status.error.unwrap_or_default()
                ));
            }
        }
    }
    let ipam = agent.ipam_status().await?;
    if !ipam
        .allocations
        .iter()
        .any(|a| a.owner == attachment.owner && a.ip == prev.ip.to_string())
    {
        problems.push(format!(
            "the agent's IPAM does not hold {} for {}",
            prev.ip, attachment.owner
        ));
    }
    let net = PodNetwork {
        host_ifname: attachment.host_ifname.clone(),
        pod_ifname: attachment.ifname.clone(),
        ip: prev.ip,
        prefix_len: prev.prefix_len,
        gateway: prev.gateway.unwrap_or(Ipv4Addr::UNSPECIFIED),
        mtu: conf.mtu,
    };
    let found = tokio::task::spawn_blocking(move || plumbing::check(&host, &pod, &net))
        .await
        .map_err(|join| {
            CniError::new(ErrorCode::Netlink, "the network check thread failed")
                .with_details(join.to_string())
        })?
        .map_err(|err| plumbing_error("inspecting the pod's network", &err))?;
    problems.extend(found);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CniError::new(
            ErrorCode::CheckFailed,
            format!(
                "the pod's network is not as ADD left it ({} problems)",
                problems.len()
            ),
        )
        .with_details(problems.join("; ")))
    }
}

fn open_host(conf: &NetConf) -> Result<HostNetns, CniError> {
    HostNetns::open(conf.host_netns.as_deref()).map_err(|err| host_netns_error(&err))
}

fn host_netns_error(err: &NetnsError) -> CniError {
    match err {
        NetnsError::NotFound { .. } | NetnsError::NotANamespace { .. } => {
            CniError::new(ErrorCode::InvalidConfig, format!("host-netns: {err}"))
        }
        _ => netns_io(err),
    }
}

/// CNI_NETNS: missing is "container unknown" (3: nothing was done, no DEL needed), a path
/// that is no namespace an invalid variable (4).
fn pod_netns_error(err: &NetnsError) -> CniError {
    match err {
        NetnsError::NotFound { .. } => {
            CniError::new(ErrorCode::UnknownContainer, format!("CNI_NETNS: {err}"))
        }
        NetnsError::NotANamespace { .. } => {
            CniError::new(ErrorCode::InvalidEnvironment, format!("CNI_NETNS: {err}"))
        }
        _ => netns_io(err),
    }
}

fn netns_io(err: &NetnsError) -> CniError {
    CniError::new(ErrorCode::Io, err.to_string())
}

fn plumbing_error(what: &str, err: &PlumbingError) -> CniError {
    let code = match err {
        PlumbingError::Netns(NetnsError::NotFound { .. }) => ErrorCode::UnknownContainer,
        PlumbingError::Netns(_) => ErrorCode::Io,
        _ => ErrorCode::Netlink,
    };
    CniError::new(code, format!("{what}: {err}"))
}

fn parse_v4(what: &str, text: &str) -> Result<Ipv4Addr, CniError> {
    match text.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => Ok(ip),
        Ok(IpAddr::V6(_)) => Err(answer_error(format!(
            "the agent gave the IPv6 {what} {text}: only IPv4 is supported"
        ))),
        Err(_) => Err(answer_error(format!(
            "the agent gave an unparsable {what} {text:?}"
        ))),
    }
}

fn answer_error(msg: String) -> CniError {
    CniError::new(ErrorCode::AgentAnswer, msg)
}
