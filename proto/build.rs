//! Generates the gRPC code from `meshwork/**/*.proto` with protox (a Rust protobuf compiler),
//! so building the workspace never needs a system `protoc`; and writes the compiled
//! descriptor set (with the files' comments) that server reflection serves.

use std::error::Error;
use std::path::PathBuf;

use prost::Message as _;

/// The API's files, relative to this crate's root (which is also the include path).
const PROTOS: &[&str] = &[
    "meshwork/agent/v1/agent.proto",
    "meshwork/agent/v1/datapath.proto",
    "meshwork/agent/v1/encrypt.proto",
    "meshwork/agent/v1/ipam.proto",
    "meshwork/apiserver/v1/export.proto",
    "meshwork/kvstoremesh/v1/kvstoremesh.proto",
    "meshwork/ipam/v1/ipam.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    // prost-build only emits rerun hints when it runs protoc itself; here it doesn't.
    println!("cargo:rerun-if-changed=meshwork");
    let fds = protox::compile(PROTOS, ["."])?;
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    std::fs::write(out.join("meshwork_descriptor_set.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
