//! `meshwork-devnode eni-scene`: the ENI cluster's AWS side in the stack's moto, made once per
//! stack with the real EC2 SDK (the lab's [`EniScene`]): a VPC, a subnet, a security group
//! and one instance per node; each instance's ID is written to `<out>/<node>`, where that
//! node's PID 1 reads it (a real node would ask its instance metadata service).
//!
//! `meshwork-devnode eni-owner` asks EC2 which ENI holds an address and where it is attached.

use std::path::PathBuf;

use anyhow::Context as _;
use meshwork_lab::eni_scene::EniScene;

/// `meshwork-devnode eni-scene`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The EC2 endpoint (the stack's moto).
    #[arg(long)]
    ec2: String,
    /// The VPC's CIDR.
    #[arg(long)]
    vpc_cidr: String,
    /// The subnet's CIDR (inside the VPC's): where the ENIs and pod IPs come from.
    #[arg(long)]
    subnet_cidr: String,
    /// The instances' type.
    #[arg(long, default_value = "m5.large")]
    instance_type: String,
    /// A node (repeatable): one instance each.
    #[arg(long = "node", required = true)]
    nodes: Vec<String>,
    /// Where the instance IDs go, one file per node.
    #[arg(long)]
    out: PathBuf,
}

/// Makes the scene, unless every node already has its instance (a restarted one-shot).
pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.nodes.iter().all(|node| args.out.join(node).is_file()) {
        println!("eni-scene: every node has its instance already");
        return Ok(());
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let scene = runtime.block_on(EniScene::create_with(
        EniScene::client_at(&args.ec2),
        (&args.vpc_cidr, &args.subnet_cidr),
        &args.instance_type,
        args.nodes.len(),
    ))?;
    for (node, instance) in args.nodes.iter().zip(&scene.instances) {
        let file = args.out.join(node);
        let partial = args.out.join(format!(".{node}.partial"));
        std::fs::write(&partial, format!("{instance}\n"))?;
        std::fs::rename(&partial, &file)?;
        println!("eni-scene: {node} is {instance}");
    }
    println!(
        "eni-scene: VPC {} ({}), subnet {} ({}), security group {}",
        scene.vpc, args.vpc_cidr, scene.subnet, args.subnet_cidr, scene.security_group
    );
    Ok(())
}

/// `meshwork-devnode eni-owner`.
#[derive(Debug, clap::Args)]
pub struct OwnerArgs {
    /// The EC2 endpoint (the stack's moto).
    #[arg(long)]
    ec2: String,
    /// The address.
    #[arg(long)]
    ip: String,
}

/// Prints, as JSON, the ENI that EC2 says holds `--ip`, its instance and device index
/// (`null`s when none holds it).
pub fn owner(args: &OwnerArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let enis = runtime
        .block_on(
            EniScene::client_at(&args.ec2)
                .describe_network_interfaces()
                .send(),
        )
        .context("DescribeNetworkInterfaces")?
        .network_interfaces
        .unwrap_or_default();
    let holder = enis.iter().find(|eni| {
        eni.private_ip_addresses()
            .iter()
            .any(|a| a.private_ip_address() == Some(args.ip.as_str()))
    });
    let attachment = holder.and_then(|eni| eni.attachment());
    println!(
        "{}",
        serde_json::json!({
            "ip": args.ip,
            "eni": holder.and_then(|eni| eni.network_interface_id()),
            "instance": attachment.and_then(|a| a.instance_id()),
            "device_index": attachment.and_then(|a| a.device_index()),
        })
    );
    Ok(())
}
